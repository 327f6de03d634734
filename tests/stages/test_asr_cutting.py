"""Where long audio is cut (stages/asr/cutting.py): the quietest point of a span, the energy
chunker long audio uses, the pause chunker offline transcription uses, and Segment."""

import numpy as np
import pytest
import speech

from stages.asr.cutting import (
    FRAME,
    RATE,
    Segment,
    chunk_regions,
    cut_points,
    joined,
    quietest_point,
)


def noise(n: int, level: float = 3000.0, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * level).astype(np.int16)


def test_the_quietest_window_centre_is_found_in_int16_and_float_alike():
    audio = noise(RATE * 2)
    audio[10_240:10_560] //= 100  # one quiet 20-ms frame: the 32nd
    assert quietest_point(audio, 0, len(audio)) == 10_400
    assert quietest_point(audio / np.float32(32768), 0, len(audio)) == 10_400
    # windows start every step from lo: from 40 that frame is not one of them, but overlaps two
    assert quietest_point(audio, 40, len(audio)) in (10_120, 10_440)
    # a 100-ms window over 20-ms steps (the streaming stage's long-utterance cut)
    audio[20_480:22_080] //= 50
    assert quietest_point(audio, 0, len(audio), window=1600, step=320) == 21_280
    assert quietest_point(audio, 0, 20_000) == 10_400  # only [lo, hi) is judged


def test_a_strided_slice_or_a_copy_of_a_span_gives_the_same_answer():
    audio = noise(RATE * 3, seed=1)
    audio[30_000:31_600] = 0
    span = audio[16_000:40_000].copy()
    assert quietest_point(span, 0, len(span), 1600, 320) + 16_000 == quietest_point(audio, 16_000, 40_000, 1600, 320)
    wide = np.stack([audio, audio], axis=1)[:, 0]  # not contiguous
    assert quietest_point(wide, 16_000, 40_000, 1600, 320) == quietest_point(audio, 16_000, 40_000, 1600, 320)


def test_energies_are_exact_so_the_answer_does_not_depend_on_rounding():
    # two loud frames one unit of energy apart: in float32 they would tie (and the first win)
    a = np.full(FRAME, 30_000, np.int16)
    a[0] = 1
    b = a.copy()
    b[0] = 0
    assert np.float32((a.astype(np.float32) ** 2).sum()) == np.float32((b.astype(np.float32) ** 2).sum())
    assert quietest_point(np.concatenate([a, b]), 0, 2 * FRAME) == FRAME + FRAME // 2
    # equally quiet windows: the first wins
    assert quietest_point(np.zeros(10 * FRAME, np.int16), 0, 10 * FRAME) == FRAME // 2


def test_short_spans_and_bad_arguments():
    audio = noise(RATE)
    assert quietest_point(audio, 100, 100 + FRAME - 1) == 100 + FRAME - 1  # under one step: hi
    # shorter than the window: judged as one window of its whole steps
    assert quietest_point(audio, 0, 3 * FRAME + 5, window=5 * FRAME, step=FRAME) == 3 * FRAME // 2
    with pytest.raises(ValueError, match="whole number of steps"):
        quietest_point(audio, 0, len(audio), window=500, step=320)
    with pytest.raises(ValueError, match="not inside"):
        quietest_point(audio, 0, len(audio) + 1)
    with pytest.raises(ValueError, match="1-D"):
        quietest_point(np.stack([audio, audio], axis=1), 0, 100)


def test_long_audio_is_cut_in_its_pauses_into_chunks_within_the_limit():
    gap = np.zeros(RATE // 2, np.int16)
    clips = [speech.load(n) for n in ("kittens", "quilter", "honest", "wizard")]
    audio = np.concatenate([p for c in clips * 2 for p in (c, gap)])
    cuts = cut_points(audio)
    assert cuts[0][0] == 0 and cuts[-1][1] == len(audio)
    assert all(a == b for (_, a), (b, _) in zip(cuts, cuts[1:], strict=False))  # no gap, no overlap
    assert all(0 < b - a <= 12 * RATE for a, b in cuts)
    assert all(not audio[b - FRAME // 2 : b + FRAME // 2].any() for _, b in cuts[:-1])  # in silence
    assert cut_points(audio[: 5 * RATE]) == [(0, 5 * RATE)]
    assert cut_points(audio[:0]) == [(0, 0)]
    with pytest.raises(ValueError, match="max_chunk_s"):
        cut_points(audio, max_chunk_s=0.01)


def test_chunks_cut_only_at_pauses_and_respect_the_limit():
    s = RATE
    regions = [(0, 5 * s), (6 * s, 12 * s), (13 * s, 20 * s), (21 * s, 70 * s)]
    chunks = chunk_regions(regions, max_chunk_s=15, total=80 * s)
    assert chunks[0] == (0, 12 * s) and chunks[1] == (13 * s, 20 * s)
    long = chunks[2:]
    assert all(b - a <= 15 * s for a, b in long) and long[0][0] == 21 * s and long[-1][1] == 70 * s
    assert all(b - a <= 15 * s for a, b in chunks)


def test_a_segment_is_samples_and_says_its_seconds():
    seg = Segment("hello", 8000, 24000)
    assert (seg.start_s, seg.end_s) == (0.5, 1.5)
    assert joined([seg, Segment("", 24000, 30000), Segment("there", 30000, 40000)]) == "hello there"
