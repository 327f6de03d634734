"""The ASR backend interface, shaped for batching: a batch of utterance buffers in, one
hypothesis per buffer out. The streaming stage, the batched engine, offline transcription and
asr-serve all drive a backend through this interface only; what a backend can do is declared
in its :class:`ASRCapabilities`, never probed."""

from __future__ import annotations

import enum
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
    # The model's own P(a sentence ends after the last word): what it gave a full stop, a
    # question or an exclamation mark as the next token, having heard the audio. None where
    # the backend does not tell (ASRConfig.sentence_ends, Whisper only).
    end_p: float | None = None


class BatchCost(enum.Enum):
    """How the cost of one backend call grows with its batch."""

    # A batch costs about what its buffers cost one by one (Whisper on CPU): waiting for
    # company buys nothing, so the engine never makes a final share a batch with partials
    # when another lane can take the partials.
    LINEAR = "linear"
    # A batch costs much less than its parts (Parakeet; any model on a GPU): batch everything.
    SUBLINEAR = "sublinear"


@dataclass(slots=True, frozen=True, kw_only=True)
class ASRCapabilities:
    """What a backend can do, as data: the engine schedules from this and nothing else.

    ``lanes``: how many ``transcribe_batch`` calls the backend runs at once (the engine gives
    each its own worker thread). ``batch_cost``: see :class:`BatchCost`. ``max_batch``: the
    largest batch one call takes. ``prompts``: whether the text that came before a buffer
    (``prompts``) changes what the model hears; when false the engine never builds them.
    ``word_times``: whether hypotheses carry per-word times (:attr:`Hypothesis.words`).
    ``stateful``: the backend keeps per-stream state between calls and implements
    :class:`StatefulASRBackend`; the engine then opens one state per slot and feeds each
    stream's requests in order, one at a time. ``abandonable``: ``transcribe_batch`` takes a
    ``wanted`` callable (one bool per buffer) and asks it between its stages (Whisper: after
    the encoder), so a call whose requests nobody waits for any more stops there.
    ``sentence_ends``: the backend can tell :attr:`Hypothesis.end_p` once asked, and
    implements :class:`SentenceEndBackend` (Whisper; the remote backend asks its server).
    ``sample_rate``: the audio it takes, in Hz.
    """

    sample_rate: int
    max_batch: int
    lanes: int = 1
    batch_cost: BatchCost = BatchCost.SUBLINEAR
    prompts: bool = False
    word_times: bool = False
    stateful: bool = False
    abandonable: bool = False
    sentence_ends: bool = False

    def __post_init__(self) -> None:
        if self.sample_rate <= 0 or self.max_batch < 1 or self.lanes < 1:
            raise ValueError(
                f"ASR capabilities need sample_rate > 0, max_batch >= 1 and lanes >= 1; got "
                f"{self.sample_rate}, {self.max_batch} and {self.lanes} — fix the backend's "
                "`capabilities`"
            )


@runtime_checkable
class ASRBackend(Protocol):
    """A speech recogniser that transcribes many buffers in one call.

    ``transcribe_batch`` receives float32 mono audio at ``sample_rate`` (values in [-1, 1]) and
    returns one :class:`Hypothesis` per buffer, in order. It blocks: callers run it on a worker
    thread, never on the event loop. ``capabilities`` says how to schedule it;
    ``sample_rate`` and ``max_batch`` are the same numbers as in ``capabilities``.
    """

    name: str

    @property
    def capabilities(self) -> ASRCapabilities: ...

    @property
    def sample_rate(self) -> int: ...

    @property
    def max_batch(self) -> int: ...

    def transcribe_batch(
        self, audio: Sequence[np.ndarray], prompts: Sequence[str] | None = None
    ) -> list[Hypothesis]: ...

    def warmup(self) -> None: ...


StreamState = object  # whatever a stateful backend keeps per stream; opaque to everyone else


@runtime_checkable
class SentenceEndBackend(ASRBackend, Protocol):
    """A backend that can tell the model's P(a sentence ends after the last word), declared by
    ``capabilities.sentence_ends``: after :meth:`tell_sentence_ends` its hypotheses carry it
    (:attr:`Hypothesis.end_p`, None where it cannot be read)."""

    def tell_sentence_ends(self) -> None: ...


def ask_sentence_ends(backend: ASRBackend) -> bool:
    """Ask ``backend`` to tell :attr:`Hypothesis.end_p` from now on; whether it will (what its
    capabilities declare)."""
    if not backend.capabilities.sentence_ends:
        return False
    if not isinstance(backend, SentenceEndBackend):
        raise TypeError(f"ASR backend {backend.name!r} declares sentence_ends but lacks "
                        "tell_sentence_ends — implement it or declare sentence_ends=False")
    backend.tell_sentence_ends()
    return True


@runtime_checkable
class StatefulASRBackend(ASRBackend, Protocol):
    """A backend with per-stream state (a cache-aware streaming encoder and its decoder state),
    declared by ``capabilities.stateful``. The engine opens one state per slot when a stream
    takes the slot, hands it back with every request of that stream, and closes it when the
    slot is released; the slot holds it (:attr:`Slot.stream_state`).

    ``open_stream`` runs on the event loop: it must not block (hand out a preallocated state,
    zeroed). ``close_stream`` may run on the loop or on a worker thread, after the state's last
    call returned; it takes the state back (to a pool, not to the allocator).
    """

    def open_stream(self) -> StreamState: ...

    def close_stream(self, state: StreamState) -> None: ...

    def transcribe_streams(
        self,
        audio: Sequence[np.ndarray],
        states: Sequence[StreamState],
        finals: Sequence[bool],
        prompts: Sequence[str] | None = None,
    ) -> list[Hypothesis]:
        """Feed each stream ``audio[i]``, its audio since its previous call, with its
        ``states[i]``; ``finals[i]`` ends that stream's utterance (flush what the encoder holds
        back and start the next utterance afresh). Returns one hypothesis per stream: its
        utterance so far. The engine never puts two requests of one stream in one call, nor
        runs two calls with one state at once."""
        ...
