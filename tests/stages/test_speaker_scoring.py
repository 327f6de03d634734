"""Tests for stages/speaker/scoring.py: the diarization error rate on hand-made cases whose
answer is worked out by hand (collar, optimal mapping, overlap)."""

from __future__ import annotations

import pytest

from stages.speaker import der

pytest.importorskip("scipy")

REF = [(0.0, 10.0, "alice"), (12.0, 20.0, "bob"), (21.0, 25.0, "alice")]


def test_a_perfect_hypothesis_scores_zero():
    r = der(REF, REF, collar=0.0)
    assert (r.der, r.miss, r.false_alarm, r.confusion) == (0.0, 0.0, 0.0, 0.0)
    assert r.scored == pytest.approx(22.0)
    assert r.mapping == {"alice": "alice", "bob": "bob"}


def test_labels_are_matched_not_compared():
    swapped = [(a, b, {"alice": 7, "bob": 3}[s]) for a, b, s in REF]
    r = der(REF, swapped)
    assert r.der == 0.0
    assert r.mapping == {"alice": 7, "bob": 3}


def test_missed_speech_is_miss():
    hyp = [(0.0, 10.0, "A"), (21.0, 25.0, "A")]  # bob's 8 s never found
    r = der(REF, hyp, collar=0.0)
    assert r.miss == pytest.approx(8 / 22)
    assert r.false_alarm == 0.0 and r.confusion == 0.0
    assert r.der == pytest.approx(8 / 22)


def test_speech_where_nobody_spoke_is_false_alarm():
    hyp = [*REF, (30.0, 32.2, "bob")]
    r = der(REF, hyp, collar=0.0)
    assert r.false_alarm == pytest.approx(2.2 / 22)
    assert r.miss == 0.0 and r.confusion == 0.0


def test_the_wrong_speaker_is_confusion_under_the_best_mapping():
    # alice's second turn given to bob: 4 s confused; the mapping alice→A, bob→B is the best
    hyp = [(0.0, 10.0, "A"), (12.0, 20.0, "B"), (21.0, 25.0, "B")]
    r = der(REF, hyp, collar=0.0)
    assert r.confusion == pytest.approx(4 / 22)
    assert r.mapping == {"alice": "A", "bob": "B"}


def test_boundary_slips_inside_the_collar_are_not_scored():
    late = [(0.2, 10.2, "A"), (12.24, 19.8, "B"), (21.1, 25.0, "A")]
    assert der(REF, late, collar=0.25).der == 0.0
    r = der(REF, late, collar=0.0)
    assert r.der > 0.0
    # the collar leaves 0.25 s of speech unscored inside each of the 6 reference boundaries
    assert der(REF, REF, collar=0.25).scored == pytest.approx(22.0 - 6 * 0.25)


def test_a_slip_past_the_collar_counts_only_the_excess():
    hyp = [(1.0, 10.0, "A"), (12.0, 20.0, "B"), (21.0, 25.0, "A")]  # alice found 1 s late
    r = der(REF, hyp, collar=0.25)
    assert r.miss * r.scored == pytest.approx(0.75)


def test_overlapped_speech_counts_once_per_speaker():
    ref = [(0.0, 10.0, "a"), (5.0, 10.0, "b")]  # 15 s of speaker time
    one = [(0.0, 10.0, "x")]  # only one voice found in the overlap
    r = der(ref, one, collar=0.0)
    assert r.scored == pytest.approx(15.0)
    assert r.miss == pytest.approx(5 / 15)


def test_an_empty_hypothesis_misses_everything_and_empty_both_scores_zero():
    assert der(REF, [], collar=0.0).miss == pytest.approx(1.0)
    assert der([], []).der == 0.0
    assert der([], [(0.0, 1.0, "x")]).der == float("inf")
