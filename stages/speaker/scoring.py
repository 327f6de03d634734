"""Diarization error rate, scored the NIST way: the timeline is cut at every boundary; time
within ``collar`` seconds of a reference segment's start or end is not scored; hypothesis
speakers are mapped one-to-one onto reference speakers to maximise the time they share (the
Hungarian algorithm); what is left is missed speech, false alarm, or speaker confusion, each a
fraction of the scored reference speech. Overlapping speech counts once per speaker.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from agent.errors import require

Segment = tuple[float, float, Hashable]  # (start s, end s, speaker)


@dataclass(frozen=True, slots=True)
class DerResult:
    der: float  # miss + false_alarm + confusion
    miss: float
    false_alarm: float
    confusion: float
    scored: float  # seconds of reference speech scored (per speaker, collars excluded)
    mapping: dict[Hashable, Hashable]  # reference speaker → hypothesis speaker


def _union(spans: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted starts and ends of the union of ``spans``."""
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.array(starts, np.float64), np.array(ends, np.float64)


def _inside(t: np.ndarray, union: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    starts, ends = union
    if len(starts) == 0:
        return np.zeros(len(t), bool)
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t < ends[np.maximum(i, 0)])


def _activity(segments: Sequence[Segment], mids: np.ndarray) -> tuple[list[Hashable], np.ndarray]:
    """The speakers of ``segments`` and a [len(mids), speakers] table of who talks at each."""
    by_speaker: dict[Hashable, list[tuple[float, float]]] = {}
    for a, b, who in segments:
        by_speaker.setdefault(who, []).append((float(a), float(b)))
    names = list(by_speaker)
    table = np.zeros((len(mids), len(names)), bool)
    for j, name in enumerate(names):
        table[:, j] = _inside(mids, _union(by_speaker[name]))
    return names, table


def der(
    reference: Sequence[Segment], hypothesis: Sequence[Segment], collar: float = 0.25
) -> DerResult:
    """The diarization error rate of ``hypothesis`` against ``reference`` (both lists of
    (start, end, speaker) in seconds), not scoring ±``collar`` s around reference boundaries."""
    optimize = require(
        "scipy.optimize", what="diarization scoring", extra="diarize", package="scipy"
    )
    edges = {float(t) for a, b, _ in (*reference, *hypothesis) for t in (a, b)}
    zones = [(float(t) - collar, float(t) + collar) for a, b, _ in reference for t in (a, b)]
    if collar > 0:
        edges.update(t for zone in zones for t in zone)
    cuts = np.array(sorted(edges), np.float64)
    if len(cuts) < 2:
        return DerResult(0.0, 0.0, 0.0, 0.0, 0.0, {})
    mids = (cuts[:-1] + cuts[1:]) / 2
    dur = np.diff(cuts)
    if collar > 0:
        dur = np.where(_inside(mids, _union(zones)), 0.0, dur)
    ref_names, ref = _activity(reference, mids)
    hyp_names, hyp = _activity(hypothesis, mids)
    n_ref, n_hyp = ref.sum(axis=1), hyp.sum(axis=1)
    shared = (ref * dur[:, None]).T.astype(np.float64) @ hyp.astype(np.float64)
    rows, cols = optimize.linear_sum_assignment(-shared) if shared.size else ([], [])
    correct = float(shared[rows, cols].sum()) if shared.size else 0.0
    total = float((dur * n_ref).sum())
    miss = float((dur * np.maximum(n_ref - n_hyp, 0)).sum())
    false_alarm = float((dur * np.maximum(n_hyp - n_ref, 0)).sum())
    confusion = float((dur * np.minimum(n_ref, n_hyp)).sum()) - correct
    mapping = {
        ref_names[r]: hyp_names[c] for r, c in zip(rows, cols, strict=True) if shared[r, c] > 0
    }
    if total == 0:
        error = 0.0 if false_alarm == 0 else float("inf")
        return DerResult(error, 0.0, error, 0.0, 0.0, mapping)
    return DerResult(
        (miss + false_alarm + confusion) / total,
        miss / total,
        false_alarm / total,
        max(confusion, 0.0) / total,
        total,
        mapping,
    )
