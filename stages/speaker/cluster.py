"""Grouping window embeddings into speakers: average-linkage agglomerative clustering on cosine
distance, cut at a distance threshold (the speaker count estimated) or at a given count, then
refined by reassigning every window to its nearest speaker centroid.

Linkage needs all pairwise distances, so at most MAX_LINKED embeddings (evenly spaced in time)
are linked — 2,000 is 16 MB of distances and well under a second; the rest, in a long recording,
join the nearest centroid. That keeps a 90-minute file's clustering bounded in time and memory.
"""

from __future__ import annotations

import numpy as np

from agent.errors import require

MAX_LINKED = 2000
# Average-linkage cosine distance at which two groups of 1.5-s CAM++ windows stop merging. On
# the speech set, pairs of windows sit at 0.41 (same speaker) and 0.95 (different) on average,
# but two voices recorded in one room sit closer: a real two-person dialogue (moonshine-voice's
# endgame recording) merged its speakers at 0.79, and 0.8 heard one speaker. Through the
# product's path (Silero's regions, the online diarizer) 23 single-speaker recordings stay one
# speaker down to 0.58 (two split at 0.54), the dialogue is two up to 0.74 (one at 0.77), and
# the 24 constructed 2-5 speaker recordings of benchmarks/diarization.py do best at 0.66-0.70
# (DER 2.7%, 21/24 counts right, against 6.3% and 17/24 at 0.8): the middle of what all of
# them allow (benchmarks/RESULTS.md, "Speaker-aware transcription").
THRESHOLD = 0.66
REFINE_ROUNDS = 2


def centroids(x: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """[k, D] L2-normalised mean embedding of each label (zero for an empty one)."""
    sums = np.zeros((k, x.shape[1]), np.float64)
    np.add.at(sums, labels, x)
    return (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(
        np.float32
    )


def _link(x: np.ndarray, speakers: int | None, lo: int, hi: int, threshold: float) -> np.ndarray:
    """Labels 0..k-1 for the rows of ``x`` from one average-linkage tree."""
    hierarchy = require(
        "scipy.cluster.hierarchy", what="speaker clustering", extra="diarize", package="scipy"
    )
    tree = hierarchy.linkage(x.astype(np.float64), method="average", metric="cosine")
    if speakers is None:
        found = hierarchy.fcluster(tree, t=threshold, criterion="distance")
        k = int(found.max())
        if lo <= k <= hi:
            return found - 1
        speakers = min(max(k, lo), hi)
    return hierarchy.fcluster(tree, t=speakers, criterion="maxclust") - 1


def cluster(
    x: np.ndarray,
    speakers: int | None = None,
    min_speakers: int = 1,
    max_speakers: int = 8,
    threshold: float = THRESHOLD,
) -> np.ndarray:
    """Speaker labels (0..k-1, dense) for L2-normalised embeddings ``x`` [N, D]. ``speakers``
    fixes the count; otherwise it is estimated and clamped to [min_speakers, max_speakers]
    (and never more than N)."""
    n = len(x)
    if n == 0:
        return np.zeros(0, np.int64)
    hi = max(1, min(speakers or max_speakers, n))
    lo = min(max(1, speakers or min_speakers), hi)
    if n == 1 or hi == 1:
        return np.zeros(n, np.int64)
    linked = np.unique(np.linspace(0, n - 1, min(n, MAX_LINKED)).round().astype(np.int64))
    labels = np.asarray(_link(x[linked], speakers, lo, hi, threshold), np.int64)
    centres = centroids(x[linked], labels, int(labels.max()) + 1)
    full = np.argmax(x @ centres.T, axis=1)
    full[linked] = labels  # the tree's own answer where it has one
    for _ in range(REFINE_ROUNDS):
        nearest = np.argmax(x @ centres.T, axis=1)
        used = np.unique(nearest)
        if len(used) < lo:  # a speaker the count requires would vanish: keep the last labels
            break
        full = np.searchsorted(used, nearest)
        centres = centroids(x, full, len(used))
    return full
