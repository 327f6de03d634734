"""benchmarks/voice_turn.py's own arithmetic for the noisy runs: where each turn's voice ended
(the caller frame whose arrival is the trace's origin), and a noisy run's turns measured from
the voice ends of the clean run of the same clip; and a set's share of the words model's
counts."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from voice_turn import (  # noqa: E402
    FRAME_SAMPLES,
    MATCH_MS,
    clean_end_summary,
    from_clean_ends,
    turn_ends,
    words_model_delta,
)

MS = 1_000_000  # ns


def clip(t0_frames: list[int], decision_ms: float = 300.0, out_ms: float = 500.0) -> dict:
    """A run_clip result: caller frames arriving every 20 ms from 1 s on, and a turn whose
    origin is the arrival of each frame in ``t0_frames``."""
    clock = np.arange(200, dtype=np.int64) * 20 * MS + 1_000 * MS
    turns = [{"kind": "turn", "complete": True, "t0_ns": int(clock[k]),
              "events_ms": {"speech_end": 0.0, "vad_decision": decision_ms, "audio_out": out_ms}}
             for k in t0_frames]
    return {"clock_ns": clock, "turns": turns}


def test_a_turns_voice_ends_with_the_frame_its_origin_arrived_with():
    r = clip([49, 120])
    r["turns"].append({"kind": "turn", "complete": False, "t0_ns": int(r["clock_ns"][60]),
                       "events_ms": {"vad_decision": 1.0, "audio_out": 2.0}})  # cut off: left out
    r["turns"].append({"kind": "greeting", "complete": True, "t0_ns": 5,
                       "events_ms": {"audio_out": 2.0}})
    ends = turn_ends(r)
    assert [t["end"] for t in ends] == [50 * FRAME_SAMPLES, 121 * FRAME_SAMPLES]
    assert ends[0]["decision_ns"] - r["clock_ns"][49] == 300 * MS
    assert ends[0]["out_ns"] - r["clock_ns"][49] == 500 * MS


def test_a_noisy_turn_is_measured_from_the_clean_runs_nearest_voice_end():
    # the VAD put the noisy turn's end 8 frames (160 ms) before the clean run's: measured from
    # the clean end, the decision and the audio come 160 ms sooner than the trace says
    noisy = clip([41])
    ends = turn_ends(noisy)
    got = from_clean_ends(ends, noisy["clock_ns"], [50 * FRAME_SAMPLES, 150 * FRAME_SAMPLES])
    assert got == [(140.0, 340.0, True)]


def test_a_noisy_turn_with_no_clean_end_near_it_keeps_its_own_origin_unmatched():
    noisy = clip([100], decision_ms=250.0, out_ms=420.0)
    ends = turn_ends(noisy)
    far = (101 * FRAME_SAMPLES) + (MATCH_MS + 20) * 16
    assert from_clean_ends(ends, noisy["clock_ns"], [far]) == [(250.0, 420.0, False)]
    assert from_clean_ends(ends, noisy["clock_ns"], []) == [(250.0, 420.0, False)]


def test_the_summary_keeps_matched_turns_apart_and_counts_the_rest():
    got = [(100.0, 300.0, True), (200.0, 400.0, True), (900.0, 1100.0, False)]
    summary = clean_end_summary(got)
    assert summary["unmatched"] == 1
    assert summary["vad_eos"]["n"] == 2 and summary["vad_eos"]["p50"] == 150.0
    assert summary["vad_eos_all"]["n"] == 3 and summary["vad_eos_all"]["p50"] == 200.0
    assert summary["voice_to_voice"]["p50"] == 350.0
    assert clean_end_summary([(1.0, 2.0, False)]) is None


def test_a_sets_words_model_counts_are_its_own() -> None:
    from stages.text_turn import TextTurnStats

    stats = TextTurnStats(requests=5, asked=4, asked_tokens=30, evaluated_tokens=90)
    before = dataclasses.asdict(stats)
    stats.requests, stats.asked, stats.asked_tokens, stats.evaluated_tokens = 9, 6, 41, 130
    got = words_model_delta(before, SimpleNamespace(stats=stats))
    assert got["requests"] == 4 and got["asked"] == 2 and got["asked_tokens"] == 11
    assert got["evaluated_tokens"] == 40 and got["warmed"] == 0
    assert words_model_delta(None, None) is None  # fixed mode: no words model
