"""Long audio through the engine as batches: cut into chunks of at most 12 s at the quietest
moment near each limit (:func:`stages.asr.cutting.cut_points`, a cheap energy minimum, no VAD
model), then transcribe the chunks together.

asr-serve uses it for shared-memory files, whole-file socket streams and HTTP uploads, each
through its client's :class:`~stages.asr.engine_share.EngineShare` of the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import numpy as np

from agent.audio import RATE, int16_to_float
from stages.asr.backend import Hypothesis, Word
from stages.asr.cutting import Segment, cut_points, joined
from stages.asr.slots import Slot

__all__ = ["Segment", "cut_points", "joined", "transcribe_long"]


class Submits(Protocol):
    """What transcribing needs of the engine: an :class:`~stages.asr.engine.ASREngine`, or a
    client's :class:`~stages.asr.engine_share.EngineShare` of one."""

    @property
    def max_batch(self) -> int: ...

    def submit(self, slot: Slot, audio: np.ndarray, final: bool = False,
               prompt: str = "") -> asyncio.Future[Hypothesis | None]: ...


async def transcribe_long(
    engine: Submits,
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
            at_s = a / RATE  # word times count from the chunk: the audio's from here
            seg = Segment(hyp.text.strip(), a, b,
                          tuple(Word(w.text, w.start + at_s, w.end + at_s) for w in hyp.words))
            segments.append(seg)
            if on_segment is not None:
                on_segment(seg)
    return segments

