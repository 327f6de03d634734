"""benchmarks/turn_cutoffs.py's cut: where between two words the pause goes (the quietest
point near where the ASR's word times meet), and the words it compares when it checks a cut."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from turn_cutoffs import quiet_cut, tokens  # noqa: E402

RATE = 16_000


def voiced(seconds: float, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return 8000 * np.sin(2 * np.pi * 180 * t) + rng.normal(0, 300, len(t))


def two_words(gap_at: float, gap_ms: int) -> np.ndarray:
    """A voiced stretch from 0 to 1 s with a near-silent gap of ``gap_ms`` starting at
    ``gap_at`` (s): two words whose real boundary is the gap."""
    rng = np.random.default_rng(7)
    x = voiced(1.0, rng)
    a, z = int(gap_at * RATE), int(gap_at * RATE) + gap_ms * RATE // 1000
    x[a:z] = rng.normal(0, 3, z - a)  # the line's floor, ~-68 dB under the voice
    return x.astype(np.int16)


def word(start: float, end: float, text: str = "w") -> SimpleNamespace:
    return SimpleNamespace(start=start, end=end, word=text)


def test_the_cut_moves_from_where_the_times_meet_to_the_silence_between_the_words():
    pcm = two_words(gap_at=0.57, gap_ms=40)  # the words' real boundary: 570-610 ms
    # the ASR's times meet at 500 ms, inside the first word's voice
    cut, level = quiet_cut(pcm, word(0.1, 0.5), word(0.5, 0.9))
    assert 0.57 * RATE <= cut <= 0.61 * RATE
    assert level < -50  # against the voice's loudest 20 ms


def test_a_silence_beyond_120_ms_of_the_meeting_point_is_not_taken():
    pcm = two_words(gap_at=0.75, gap_ms=40)  # 250 ms after the meeting point: another boundary
    cut, level = quiet_cut(pcm, word(0.1, 0.5), word(0.5, 0.9))
    assert abs(cut - 0.5 * RATE) <= 0.13 * RATE
    assert level > -10  # no quiet point there: the level the set records says so


def test_the_cut_stays_inside_the_two_words():
    pcm = two_words(gap_at=0.43, gap_ms=40)  # in the first word, 70 ms before its end
    cut, _ = quiet_cut(pcm, word(0.45, 0.5), word(0.5, 0.9))
    assert cut >= 0.5 * RATE - 0.01 * RATE  # not before the first word's start + 50 ms


def test_words_compare_without_case_or_punctuation():
    assert tokens(" Yet these thoughts affected Hester Prynne,") == [
        "yet", "these", "thoughts", "affected", "hester", "prynne"]
    assert tokens("he's in charge.")[-1:] == tokens(" charge")[-1:]
    assert tokens("Press 3 to") == ["press", "3", "to"]
    assert tokens("...") == []
