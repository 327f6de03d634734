"""Who spoke when in a mono recording: embed sliding windows inside the VAD's speech regions,
cluster them into speakers, and cut each region into turns where the speaker changes.

Windows are 1.5 s, at most 1 s apart (a region shorter than a window is one window), and a
change inside a region is placed between the centres of the windows on either side of it. On
CAM++ one window costs 16-20 ms on one core: diarization alone ran at ~50x real time here.
Windows shorter than a second carry too little voice to shape the clusters: they join the
nearest speaker afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stages.speaker.cluster import THRESHOLD, centroids, cluster
from stages.speaker.embedder import RATE, Embedder
from stages.speaker.timeline import SpeakerTurn, first_appearance, region_turns

# Average-linkage cosine distance at which clustering stops merging, per kind of embedding
# model (by its front end; each sits in its own similarity ranges): CAM++ and GE2E, tuned on the
# constructed recordings of the speech set.
THRESHOLDS = {"kaldi-fbank": THRESHOLD, "ge2e-mel": 0.45}


@dataclass(frozen=True, slots=True)
class DiarizationOptions:
    window_s: float = 1.5
    # windows side by side: on the 24 recordings of benchmarks/diarization.py a step of 1.5 s
    # gave the DER and speaker counts of 1.0 s (6.4%, 15/24) for 27% less embedding time
    step_s: float = 1.5
    min_cluster_s: float = 1.0  # shorter windows join the nearest speaker after clustering
    min_turn_s: float = 0.5  # a shorter stretch inside a region goes to a neighbouring turn
    threshold: float | None = None  # None: THRESHOLDS[embedder.frontend]


def merged_regions(regions: Sequence[tuple[int, int]], total: int) -> list[tuple[int, int]]:
    """``regions`` clipped to [0, total), sorted, with overlapping ones joined (padded VAD
    regions can overlap), so turns never do."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((max(0, int(a)), min(total, int(b))) for a, b in regions):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def windows_of(start: int, end: int, window: int, step: int) -> list[tuple[int, int]]:
    """Windows of ``window`` samples covering [start, end), evenly spread at most ``step``
    apart, the first at ``start`` and the last ending at ``end``."""
    length = end - start
    if length <= window:
        return [(start, end)]
    n = -(-(length - window) // step) + 1
    starts = start + np.round(np.linspace(0, length - window, n)).astype(np.int64)
    return [(int(s), int(s) + window) for s in starts]


def diarize(
    audio: np.ndarray,
    regions: Sequence[tuple[int, int]],
    embedder: Embedder,
    speakers: int | None = None,
    min_speakers: int = 1,
    max_speakers: int = 8,
    options: DiarizationOptions | None = None,
) -> list[SpeakerTurn]:
    """Speaker turns (samples; sorted, non-overlapping, covering exactly the speech
    ``regions``) of 16-kHz mono ``audio`` (float32 in [-1, 1], or int16). Speakers are numbered
    0, 1, ... in order of first speech; their count is ``speakers`` when given, otherwise
    estimated within [min_speakers, max_speakers]."""
    opt = options or DiarizationOptions()
    spans = merged_regions(regions, len(audio))
    if not spans:
        return []
    wins = speech_windows(spans, opt)
    vecs = embedder.embed([audio[a:b] for _, a, b in wins])
    threshold = opt.threshold if opt.threshold is not None else THRESHOLDS[embedder.frontend]
    long = long_windows(wins, opt)
    labels = np.zeros(len(wins), np.int64)
    labels[long] = cluster(vecs[long], speakers, min_speakers, max_speakers, threshold)
    k = int(labels[long].max()) + 1
    if not long.all():
        labels[~long] = np.argmax(vecs[~long] @ centroids(vecs[long], labels[long], k).T, axis=1)
    return first_appearance(speaker_turns(spans, wins, labels, k, opt))


def speech_windows(spans: Sequence[tuple[int, int]], opt: DiarizationOptions) -> list[tuple[int, int, int]]:
    """The embedding windows (span index, start, end) over each span."""
    window, step = round(opt.window_s * RATE), round(opt.step_s * RATE)
    return [(r, a, b) for r, (s, e) in enumerate(spans) for a, b in windows_of(s, e, window, step)]


def long_windows(wins: Sequence[tuple[int, int, int]], opt: DiarizationOptions) -> np.ndarray:
    """Which windows are long enough to shape the clusters (all, if none is)."""
    long = np.array([b - a >= opt.min_cluster_s * RATE for _, a, b in wins], bool)
    if not long.any():
        long[:] = True
    return long


def speaker_turns(spans: Sequence[tuple[int, int]], wins: Sequence[tuple[int, int, int]],
                  labels: np.ndarray, k: int, opt: DiarizationOptions) -> list[SpeakerTurn]:
    """Each span cut into turns where its labelled windows change speaker."""
    by_region: list[list[tuple[int, int, int]]] = [[] for _ in spans]
    for (r, a, b), label in zip(wins, labels.tolist(), strict=True):
        by_region[r].append((a, b, label))
    min_turn = round(opt.min_turn_s * RATE)
    return [
        t
        for (s, e), ws in zip(spans, by_region, strict=True)
        for t in region_turns(s, e, ws, k, min_turn)
    ]
