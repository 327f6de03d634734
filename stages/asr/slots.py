"""The state-slot pool: all per-stream ASR state, preallocated at start-up.

A call takes a slot and gives it back zeroed on hang-up; steady-state streaming allocates
nothing. Memory: ``capacity × max_seconds × 16 000 × 4`` bytes of float32 audio (64 slots of
30 s: 123 MB), paid once, up front.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from agent.errors import CapacityError


@dataclass(slots=True)
class SlotStats:
    chunks_in: int = 0  # speech chunks that went into the ring while an utterance was open
    chunks_bypassed: int = 0  # silent chunks that never entered a batch
    requests: int = 0


@dataclass(slots=True, eq=False)
class Slot:
    """One stream's state: its audio ring (a preallocated buffer the stream core,
    :class:`stages.asr.stream.ASRStream`, writes as a ring indexed by media sample) and, for a
    stateful backend, the backend's own state for the stream (opened and closed by the engine,
    opaque to everyone else)."""

    index: int
    audio: np.ndarray  # float32, preallocated, capacity samples
    generation: int = 0  # bumped on release: results for an older generation are discarded
    in_use: bool = False
    stream_state: object | None = None  # a StatefulASRBackend's state; None for the others
    stats: SlotStats = field(default_factory=SlotStats)

    @property
    def capacity(self) -> int:
        return len(self.audio)

    def zero(self) -> None:
        self.audio.fill(0.0)
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
    def slot_samples(self) -> int:
        """How many samples each slot's audio buffer holds."""
        return len(self._slots[0].audio)

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
