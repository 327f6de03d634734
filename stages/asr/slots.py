"""The state-slot pool: all per-stream ASR state, preallocated at start-up.

A call takes a slot and gives it back zeroed on hang-up; steady-state streaming allocates
nothing. Memory: ``capacity × max_seconds × 16 000 × 4`` bytes of float32 audio (64 slots of
30 s: 123 MB), paid once, up front.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from agent.audio import FROM_INT16
from agent.errors import CapacityError


@dataclass(slots=True)
class SlotStats:
    chunks_in: int = 0  # speech chunks appended
    chunks_bypassed: int = 0  # silent chunks that never entered a batch
    samples_trimmed: int = 0
    requests: int = 0


@dataclass(slots=True, eq=False)
class Slot:
    """One stream's state: its utterance audio (speech only), its hypothesis state and, for a
    stateful backend, the backend's own state for the stream (opened and closed by the
    engine, opaque to everyone else)."""

    index: int
    audio: np.ndarray  # float32, preallocated, capacity samples
    length: int = 0  # valid samples in ``audio``
    start: int = 0  # media sample of audio[0]
    committed: str = ""  # text committed (stable or segment-final) for this utterance
    last_words: tuple[str, ...] = ()
    generation: int = 0  # bumped on release: results for an older generation are discarded
    in_use: bool = False
    stream_state: object | None = None  # a StatefulASRBackend's state; None for the others
    stats: SlotStats = field(default_factory=SlotStats)

    @property
    def capacity(self) -> int:
        return len(self.audio)

    @property
    def end(self) -> int:
        return self.start + self.length

    def append(self, pcm: np.ndarray) -> int:
        """Append int16 or float32 audio; returns how many samples did not fit (dropped)."""
        n = min(len(pcm), self.capacity - self.length)
        if n > 0:
            seg = pcm[:n]
            if seg.dtype == np.int16:
                np.multiply(seg, FROM_INT16, out=self.audio[self.length : self.length + n],
                            casting="unsafe")
            else:
                self.audio[self.length : self.length + n] = seg
            self.length += n
        self.stats.chunks_in += 1
        return len(pcm) - max(n, 0)

    def view(self, upto: int | None = None) -> np.ndarray:
        """A copy of the audio from the start up to media sample ``upto`` (all when None).

        A copy, because the worker thread reads it while the event loop keeps appending."""
        n = self.length if upto is None else max(0, min(self.length, upto - self.start))
        return self.audio[:n].copy()

    def trim(self, upto: int) -> None:
        """Drop the audio before media sample ``upto`` (after committing its text)."""
        k = max(0, min(self.length, upto - self.start))
        if k == 0:
            return
        rest = self.length - k
        self.audio[:rest] = self.audio[k : self.length]
        self.length = rest
        self.start += k
        self.stats.samples_trimmed += k

    def begin_utterance(self, at: int) -> None:
        self.length = 0
        self.start = at
        self.committed = ""
        self.last_words = ()

    def zero(self) -> None:
        self.audio.fill(0.0)
        self.length = 0
        self.start = 0
        self.committed = ""
        self.last_words = ()
        self.stats = SlotStats()


class SlotPool:
    """A fixed number of slots. ``acquire`` on a full pool raises CapacityError at once: a new
    call is refused, the calls already running are never slowed down."""

    def __init__(self, capacity: int = 64, max_seconds: float = 30.0, rate: int = 16_000) -> None:
        if capacity < 1:
            raise ValueError("an ASR slot pool needs at least one slot")
        n = int(max_seconds * rate)
        self._slots = [Slot(i, np.zeros(n, dtype=np.float32)) for i in range(capacity)]
        self._free = list(reversed(range(capacity)))
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return len(self._slots)

    @property
    def in_use(self) -> int:
        return len(self._slots) - len(self._free)

    def acquire(self) -> Slot:
        with self._lock:
            if not self._free:
                raise CapacityError(
                    f"all {len(self._slots)} ASR slots are in use — the call is refused; raise "
                    "--asr-slots or add a replica"
                )
            slot = self._slots[self._free.pop()]
            slot.in_use = True
            return slot

    def release(self, slot: Slot) -> None:
        with self._lock:
            if not slot.in_use:
                return
            slot.zero()
            slot.generation += 1
            slot.in_use = False
            self._free.append(slot.index)
