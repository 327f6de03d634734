"""Drives one :class:`ASRStream` against an engine: the requests the core asks for go to the
engine (or a client's :class:`EngineShare`), the answers come back to the core, and what the core
then produces — transcripts, failures — goes to the shell's callbacks.

Every in-process shell of the stream core uses it: the call pipeline's ASR stage and the pipecat
STT service (``stages/adapters/pipecat_stt.py``). All of it runs on the event loop that made the
engine's futures; nothing here blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import numpy as np

from stages.asr.backend import Hypothesis
from stages.asr.slots import Slot
from stages.asr.stream import ASRStream, Cancel, Failure, Request, Result

Future = asyncio.Future[Hypothesis | None]


class Submitter(Protocol):
    """What the driver needs of an engine: :class:`ASREngine` and :class:`EngineShare` both."""

    def submit(self, slot: Slot, audio: np.ndarray, final: bool = False, prompt: str = "") -> Future: ...

    def cancel(self, future: Future) -> bool: ...


class StreamDriver:
    """One stream's model calls in flight, by request id, and the loop that carries out what the
    core asks for. Call :meth:`pump` after every input given to the core."""

    def __init__(self, core: ASRStream, engine: Submitter, slot: Slot,
                 on_result: Callable[[Result], None],
                 on_failure: Callable[[Failure], None]) -> None:
        self.core = core
        self.engine = engine
        self.slot = slot
        self.on_result = on_result
        self.on_failure = on_failure
        self._futures: dict[int, Future] = {}

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    def pump(self) -> None:
        for out in self.core.take():
            if isinstance(out, Request):
                self._submit(out)
            elif isinstance(out, Cancel):
                fut = self._futures.get(out.id)
                if fut is not None:
                    self.engine.cancel(fut)
            elif isinstance(out, Failure):
                self.on_failure(out)
            else:
                self.on_result(out)

    def close(self) -> None:
        """Close the core and forget every call in flight (their answers are dropped)."""
        self.core.close()
        for fut in self._futures.values():
            fut.cancel()
        self._futures.clear()

    def _submit(self, req: Request) -> None:
        fut = self.engine.submit(self.slot, req.audio, final=req.final, prompt=req.prompt)
        self._futures[req.id] = fut
        core = self.core

        def done(f: Future) -> None:
            self._futures.pop(req.id, None)
            if not core.closed:
                core.settle(req.id, f)
                self.pump()

        fut.add_done_callback(done)
