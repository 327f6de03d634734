"""The ASR backend interface, shaped for batching: a batch of utterance buffers in, one
hypothesis per buffer out. The streaming stage, the batched engine, offline transcription and
asr-serve all drive a backend through this interface only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(slots=True, frozen=True)
class Word:
    text: str
    start: float  # seconds from the start of the buffer
    end: float


@dataclass(slots=True, frozen=True)
class Hypothesis:
    """What a backend heard in one buffer. Times are seconds from the start of that buffer."""

    text: str
    words: tuple[Word, ...] = ()
    tokens: tuple[int, ...] = ()
    token_times: tuple[float, ...] = ()


@runtime_checkable
class ASRBackend(Protocol):
    """A speech recogniser that transcribes many buffers in one call.

    ``transcribe_batch`` receives float32 mono audio at ``sample_rate`` (values in [-1, 1]) and
    returns one :class:`Hypothesis` per buffer, in order. It blocks: callers run it on a worker
    thread, never on the event loop. ``max_batch`` is the largest batch it takes at once.

    Two optional attributes tell the engine how to schedule: ``workers`` (default 1), how many
    ``transcribe_batch`` calls the backend runs at once (the engine gives each a worker
    thread); ``linear_batch_cost`` (default False), true when a batch costs about what its
    buffers cost one by one (Whisper on CPU), so a final is better off in a batch of its own.
    """

    name: str
    sample_rate: int
    max_batch: int

    def transcribe_batch(
        self, audio: Sequence[np.ndarray], prompts: Sequence[str] | None = None
    ) -> list[Hypothesis]: ...

    def warmup(self) -> None: ...
