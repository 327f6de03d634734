"""benchmarks/voice_turn.py's own arithmetic for the noisy runs: where each turn's voice ended
(the caller frame whose arrival is the trace's origin), and a noisy run's turns measured from
the voice ends of the clean run of the same clip; a set's share of the words model's counts;
the slowest turns listed under the table, with where the p95 lies among them; and the cores
kept busy after the voice's end."""

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
    cores_busy,
    cores_summary,
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


def test_the_p95_lies_between_the_two_slowest_turns_it_names() -> None:
    from voice_turn import p95_ranks

    rng = np.random.default_rng(7)
    for n in (1, 2, 19, 20, 21, 58, 61, 62, 74, 200):
        v = np.sort(rng.uniform(300, 1600, n))[::-1]  # slowest first
        lo, hi = p95_ranks(n)
        assert 1 <= lo <= hi <= n and hi - lo <= 1
        assert v[hi - 1] <= np.percentile(v, 95) <= v[lo - 1]
    assert p95_ranks(58) == (3, 4) and p95_ranks(61) == (4, 4) and p95_ranks(62) == (4, 5)


def test_the_slowest_turns_name_their_readers_and_what_they_waited_for() -> None:
    from voice_turn import ordinal, slowest_turns, turn_row

    def turn(v2v: float, decision: float, reply: float, **info: float) -> dict:
        return {"kind": "turn", "complete": True, "text": f"said {v2v:.0f}", "info": info,
                "spans": {"voice_to_voice": {"ms": v2v}},
                "events_ms": {"vad_decision": decision, "tts_first_audio": reply}}

    rows = [turn_row("held", turn(1_540.0, 1_520.0, 480.0, p_complete=0.02, p_words=0.001,
                                  p_asr_end=0.14)),
            turn_row("quick", turn(450.0, 300.0, 430.0, p_complete=0.97)),
            turn_row("long", turn(860.0, 670.0, 840.0, p_complete=0.76, p_words=0.62))]
    got = slowest_turns(rows, 2)
    assert [r["id"] for r in got] == ["held", "long"]
    assert got[0]["waited_for"] == "decision" and got[1]["waited_for"] == "reply"
    assert got[0]["p_asr_end"] == 0.14 and "p_asr_end" not in got[1]
    assert got[0]["text"] == "said 1540"
    untimed = turn(900.0, 700.0, 0.0)
    del untimed["events_ms"]["tts_first_audio"]  # the trace lacks the reply's first audio
    assert "waited_for" not in turn_row("untimed", untimed)
    # the median turn's timeline counts the same waits
    from voice_turn import timeline

    tl = timeline([t["events_ms"] for t in (turn(1_540.0, 1_520.0, 480.0), turn(450.0, 300.0, 430.0),
                                            untimed)])
    assert (tl["turns"], tl["with_both"], tl["waited_for_decision"]) == (3, 2, 1)
    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]


def test_cores_busy_is_cpu_time_over_wall_time_per_stretch_up_to_the_first_audio() -> None:
    r = clip([10])
    t0 = int(r["clock_ns"][10])
    # CPU time: one core busy for the first 200 ms after t0, then two cores, then none
    def used(t: float) -> float:
        d = t - t0
        if d <= 0:
            return 0.0
        return min(d, 200 * MS) + 2 * max(0.0, min(d, 500 * MS) - 200 * MS)
    r["cpu_ns"] = np.array([int(used(t)) for t in r["clock_ns"]], dtype=np.int64)
    got = cores_busy(r, t0, t0 + 650 * MS)
    assert got == [1.0, 1.0, 2.0, 2.0, 2.0, 0.0]  # six whole stretches end before 650 ms
    assert cores_busy(r, t0, int(r["clock_ns"][-1]) + 1) == []  # past the last frame: unknown
    summary = cores_summary([got, [1.5, 0.5], []])
    assert summary["0-100"] == {"median": 1.25, "turns": 2}
    assert summary["100-200"] == {"median": 0.75, "turns": 2}
    assert summary["500-600"] == {"median": 0.0, "turns": 1}
    assert len(summary) == 6
