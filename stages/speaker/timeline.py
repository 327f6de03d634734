"""From labelled, overlapping windows to speaker turns: every 10-ms frame of a speech region is
won by the speaker whose windows weigh most on it (a window weighs most at its centre, so a
change between two windows of different speakers falls between their centres), then runs
shorter than the minimum turn go to the neighbour that scored higher over them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME = 160  # 10 ms at 16 kHz


@dataclass(frozen=True, slots=True)
class SpeakerTurn:
    """One speaker talking from ``start`` to ``end`` (samples, end exclusive)."""

    start: int
    end: int
    speaker: int


def _runs(labels: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) frame index pairs of the runs of equal labels."""
    cuts = np.flatnonzero(np.diff(labels)) + 1
    edges = [0, *cuts.tolist(), len(labels)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _smoothed(labels: np.ndarray, scores: np.ndarray, min_frames: int) -> np.ndarray:
    """``labels`` with every run shorter than ``min_frames`` (shortest first) handed to the
    neighbouring run whose speaker scored higher over it; a region of one run stays."""
    labels = labels.copy()
    while True:
        runs = _runs(labels)
        if len(runs) < 2:
            return labels
        i = min(range(len(runs)), key=lambda r: runs[r][1] - runs[r][0])
        a, b = runs[i]
        if b - a >= min_frames:
            return labels
        options = [labels[runs[j][0]] for j in (i - 1, i + 1) if 0 <= j < len(runs)]
        labels[a:b] = max(options, key=lambda s: scores[a:b, s].sum())


def region_turns(
    start: int, end: int, windows: list[tuple[int, int, int]], speakers: int, min_turn: int
) -> list[SpeakerTurn]:
    """The turns of the region [start, end) from its ``windows`` (start, end, speaker), which
    must cover it; ``min_turn`` is the shortest turn kept inside a region, in samples."""
    frames = -(-(end - start) // FRAME)
    scores = np.zeros((frames, speakers), np.float64)
    for ws, we, speaker in windows:
        a, b = (ws - start) // FRAME, -(-(we - start) // FRAME)
        a, b = max(a, 0), min(b, frames)
        if b <= a:
            continue
        t = np.arange(a, b) + 0.5
        centre, half = (a + b) / 2, (b - a) / 2
        scores[a:b, speaker] += 1.0 - np.abs(t - centre) / (half + 1.0)
    labels = np.argmax(scores, axis=1)
    labels = _smoothed(labels, scores, max(1, min_turn // FRAME))
    return [
        SpeakerTurn(start + a * FRAME, min(end, start + b * FRAME), int(labels[a]))
        for a, b in _runs(labels)
    ]


def first_appearance(turns: list[SpeakerTurn]) -> list[SpeakerTurn]:
    """``turns`` with speakers renumbered 0, 1, ... in the order they first speak."""
    order: dict[int, int] = {}
    return [SpeakerTurn(t.start, t.end, order.setdefault(t.speaker, len(order))) for t in turns]
