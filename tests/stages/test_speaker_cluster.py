"""Tests for stages/speaker/cluster.py on embeddings with a known grouping: the count estimated
or given, clamped to its bounds, and the linked-subset path of long recordings."""

from __future__ import annotations

import numpy as np
import pytest

from stages.speaker import cluster as cl

pytest.importorskip("scipy")


def _voices(counts: list[int], spread: float = 0.35, dim: int = 192, seed: int = 0):
    """Unit vectors around len(counts) random directions (nearly orthogonal in 192 dims); with
    this spread same-voice cosines sit near 0.9 and different-voice ones near 0."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(counts), dim))
    rows, truth = [], []
    for k, n in enumerate(counts):
        c = centres[k] / np.linalg.norm(centres[k])
        noise = rng.standard_normal((n, dim)) * spread / np.sqrt(dim)
        rows.append(c + noise)
        truth += [k] * n
    x = np.vstack(rows)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), np.array(truth)


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return len({(int(p), int(q)) for p, q in zip(a, b, strict=True)}) == len(set(a)) == len(set(b))


@pytest.mark.parametrize("counts", [[30], [20, 25], [10, 3, 40], [5, 5, 5, 5, 1]])
def test_the_count_is_found_when_not_given(counts):
    x, truth = _voices(counts)
    labels = cl.cluster(x)
    assert _same_partition(labels, truth)


def test_a_given_count_is_kept_even_where_the_threshold_would_stop():
    x, truth = _voices([20, 20])
    assert len(set(cl.cluster(x, speakers=2, threshold=0.01))) == 2
    assert len(set(cl.cluster(x, speakers=1))) == 1


def test_the_estimate_is_clamped_to_its_bounds():
    x, _ = _voices([10, 10, 10, 10])
    assert len(set(cl.cluster(x, max_speakers=2))) == 2
    x, _ = _voices([30])
    assert len(set(cl.cluster(x, min_speakers=3))) == 3
    assert len(set(cl.cluster(x[:2], min_speakers=3))) <= 2  # never more than the windows


def test_past_the_linked_limit_the_rest_join_the_nearest_speaker(monkeypatch):
    monkeypatch.setattr(cl, "MAX_LINKED", 40)
    x, truth = _voices([150, 90, 60])
    assert _same_partition(cl.cluster(x), truth)


def test_no_windows_and_one_window():
    assert cl.cluster(np.zeros((0, 8), np.float32)).tolist() == []
    assert cl.cluster(np.ones((1, 8), np.float32) / np.sqrt(8)).tolist() == [0]
