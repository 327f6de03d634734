"""benchmarks/reply_gaps.py's measure: for each chunk after a reply's first, the agent audio
still queued when its audio arrived, or (negative) the silence the caller heard before it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from reply_gaps import ChunkWatch, summary  # noqa: E402

from agent.frames import FRAME_SAMPLES  # noqa: E402
from agent.playout import Playout  # noqa: E402


def speak(p: Playout, frames: int, last: bool = True) -> None:
    p.write(np.ones(frames * FRAME_SAMPLES, np.int16), last=last)


def test_lead_and_gap_of_each_later_chunk() -> None:
    p = Playout(lambda _f: None)
    watch = ChunkWatch(p)
    p.begin_text("I'm sorry", reply=1)
    speak(p, 25)  # 500 ms
    for _ in range(10):
        p.pull()
    p.begin_text("for any misunderstanding,", reply=1)
    speak(p, 10)  # arrives with 15 frames (300 ms) still queued
    for _ in range(25 + 6):  # plays both out, then 6 frames (120 ms) of silence
        p.pull()
    p.begin_text("but as a voice assistant, I can help.", reply=1)
    speak(p, 20)
    p.pull()  # the audio resumes: the playout counts the gap
    p.begin_text("Hello.", reply=2)  # a new reply's first chunk: not measured
    speak(p, 5)
    assert watch.rows == [{"index": 1, "words": 3, "ahead_ms": 300},
                          {"index": 2, "words": 8, "ahead_ms": -120}]
    assert p.gaps == 1 and p.gap_samples == 6 * FRAME_SAMPLES  # the playout's own count agrees

    s = summary([{"chunks": watch.rows, "v2v_ms": [500.0], "gaps": p.gaps, "gap_ms": 120.0}])
    assert s["later_chunks"] == 2 and s["gaps"] == 1 and s["longest_gap_ms"] == 120
    assert s["second_ahead_ms"]["p50"] == 300 and s["under_200_ms"] == 1
