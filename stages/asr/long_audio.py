"""Long audio through the engine as batches: cut into chunks of at most 12 s at the quietest
moment near each limit (a cheap energy minimum, no VAD model), then transcribe the chunks together.

asr-serve uses it for shared-memory files, whole-file socket streams and HTTP uploads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.audio import int16_to_float
from stages.asr.engine import ASREngine
from stages.asr.slots import Slot

RATE = 16_000
# Whisper sees 30 s, but tiny.en without timestamps skips or repeats whole sentences in long
# windows, and whether it does flips with the smallest change of input. Measured on 40-60 s
# files of four LibriSpeech clips in four orders, each also with ±1 LSB dither (WER per file):
# 20-s chunks 0-36% (mean 14%), 14-s 0-20% (8 runs), 12-s 0-10% (mean 0.6%, 15 of 16 exact).
# Shorter windows are cheaper too (benchmarks/long_audio_chunks.py: 11-37% faster per run).
MAX_CHUNK_S = 12.0
SEARCH_S = 4.0  # the cut is the quietest 20 ms in the last SEARCH_S seconds before the limit
FRAME = 320  # 20 ms


@dataclass(slots=True, frozen=True)
class Segment:
    start: float  # seconds from the start of the audio
    end: float
    text: str


def cut_points(pcm: np.ndarray, max_chunk_s: float = MAX_CHUNK_S, search_s: float = SEARCH_S) -> list[tuple[int, int]]:
    """(start, end) sample ranges covering ``pcm``, each at most ``max_chunk_s`` long.

    Each cut falls in the middle of the lowest-energy 20 ms frame of the ``search_s`` seconds
    before the limit, so a word is rarely split; there is no overlap to reconcile afterwards.
    Cost: one sum of squares over ``search_s`` of audio per cut."""
    limit = int(max_chunk_s * RATE)
    search = min(int(search_s * RATE), limit - FRAME) // FRAME * FRAME
    n = len(pcm)
    cuts: list[tuple[int, int]] = []
    at = 0
    while n - at > limit:
        lo = at + limit - search
        frames = pcm[lo : at + limit].reshape(-1, FRAME).astype(np.float32)
        quietest = int(np.argmin(np.einsum("ij,ij->i", frames, frames)))
        end = lo + quietest * FRAME + FRAME // 2
        cuts.append((at, end))
        at = end
    if n > at or not cuts:
        cuts.append((at, n))
    return cuts


async def transcribe_long(
    engine: ASREngine,
    slot: Slot,
    pcm: np.ndarray,
    on_segment: Callable[[Segment], None] | None = None,
) -> list[Segment]:
    """Transcribe int16 ``pcm`` of any length on ``slot``; one Segment per chunk, in order.

    Chunks go to the engine a batch at a time (``engine.max_batch``), so the float32 copies alive
    at once are bounded (16 × 12 s × 4 bytes ≈ 12 MB) however long the audio is. The event loop
    converts one chunk (≤ 12 s, well under a millisecond) between yields."""
    segments: list[Segment] = []
    ranges = cut_points(pcm)
    for wave_at in range(0, len(ranges), engine.max_batch):
        wave = ranges[wave_at : wave_at + engine.max_batch]
        chunks = []
        for a, b in wave:
            chunks.append(int16_to_float(pcm[a:b]))  # a copy the engine's worker may keep
            await asyncio.sleep(0)
        # submitted back to back, so the engine's window sees the whole wave as one batch
        futures = [engine.submit(slot, chunk, final=True) for chunk in chunks]
        del chunks
        for (a, b), fut in zip(wave, futures, strict=True):
            hyp = await fut
            if hyp is None:  # the slot was released: the caller went away
                raise asyncio.CancelledError
            seg = Segment(round(a / RATE, 3), round(b / RATE, 3), hyp.text.strip())
            segments.append(seg)
            if on_segment is not None:
                on_segment(seg)
    return segments


def joined(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments if s.text)
