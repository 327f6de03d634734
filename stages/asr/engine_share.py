"""One client's share of the shared ASR engine: at most ``limit`` of its model calls in the
engine at once, the rest waiting here in order.

The engine serves requests oldest first, so a client that queues a thousand chunks at once would
put every other client's request behind all of them (measured: a 3-s request went from 0.09 s to
12.7 s behind 21 minutes of audio). With every client of asr-serve — a socket connection, an
HTTP upload — going through its own share, a newcomer's request waits behind at most ``limit``
requests of each other client, however much they have queued; a client alone still keeps the
engine full when ``limit`` covers the lanes' batches.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import numpy as np

from stages.asr.backend import Hypothesis
from stages.asr.engine import ASREngine
from stages.asr.slots import Slot

Future = asyncio.Future[Hypothesis | None]


@dataclass(slots=True, eq=False)
class _Waiting:
    future: Future
    slot: Slot
    audio: np.ndarray
    final: bool
    prompt: str


class EngineShare:
    """``submit``/``cancel`` like :class:`ASREngine`'s (the futures resolve the same way: a
    Hypothesis, or None when dropped), with at most ``limit`` requests in the engine at once."""

    def __init__(self, engine: ASREngine, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"an engine share holds at least one request (got {limit})")
        self.engine = engine
        self.limit = limit
        self._inner: dict[Future, Future] = {}  # ours → the engine's, for those in the engine
        self._waiting: deque[_Waiting] = deque()

    @property
    def in_engine(self) -> int:
        return len(self._inner)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def max_batch(self) -> int:
        return self.engine.max_batch

    def submit(self, slot: Slot, audio: np.ndarray, final: bool = False, prompt: str = "") -> Future:
        fut: Future = asyncio.get_running_loop().create_future()
        if len(self._inner) < self.limit:
            self._go(fut, slot, audio, final, prompt)
        else:
            self._waiting.append(_Waiting(fut, slot, audio, final, prompt))
        return fut

    def cancel(self, fut: Future) -> bool:
        """Drop a request not yet running: waiting here, or queued in the engine."""
        inner = self._inner.get(fut)
        if inner is not None:
            return self.engine.cancel(inner)
        for w in self._waiting:
            if w.future is fut:
                self._waiting.remove(w)
                _resolve(fut, None)
                return True
        return False

    def forget(self, slot: Slot) -> None:
        """``slot`` is being released: its requests waiting here resolve to None (those in the
        engine are dropped by ``engine.close_slot``)."""
        if not self._waiting:
            return
        kept: deque[_Waiting] = deque()
        for w in self._waiting:
            if w.slot is slot:
                _resolve(w.future, None)
            else:
                kept.append(w)
        self._waiting = kept

    def close(self) -> None:
        """The client went away: nothing it left waiting goes to the engine."""
        for w in self._waiting:
            _resolve(w.future, None)
        self._waiting.clear()

    def _go(self, fut: Future, slot: Slot, audio: np.ndarray, final: bool, prompt: str) -> None:
        inner = self.engine.submit(slot, audio, final=final, prompt=prompt)
        self._inner[fut] = inner

        def done(f: Future) -> None:
            self._inner.pop(fut, None)
            if not fut.done():
                if f.cancelled():
                    fut.set_result(None)
                elif f.exception() is not None:
                    fut.set_exception(f.exception())  # type: ignore[arg-type]
                else:
                    fut.set_result(f.result())
            self._next()

        inner.add_done_callback(done)

    def _next(self) -> None:
        while self._waiting and len(self._inner) < self.limit:
            w = self._waiting.popleft()
            if not w.future.done():
                self._go(w.future, w.slot, w.audio, w.final, w.prompt)


def _resolve(fut: Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)
