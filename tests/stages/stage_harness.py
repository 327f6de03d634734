"""One stage in a pipeline of its own, started with a trace, collecting what it pushes out: the
harness the stage tests share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agent.frames import Frame
from agent.pipeline import Pipeline
from agent.stage import Stage, StageContext
from agent.trace import Trace


class StageHarness:
    def __init__(self, stage: Stage, timeout: float = 20.0) -> None:
        self.frames: list[Frame] = []
        self.stage = stage
        self.pipeline = Pipeline([stage], on_output=self._out)
        self.trace = Trace()
        self.ctx = StageContext(trace=self.trace)
        self.changed = asyncio.Event()
        self.timeout = timeout

    def _out(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.changed.set()

    async def __aenter__(self) -> StageHarness:
        await self.pipeline.start(self.ctx)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pipeline.stop()
        await self.ctx.cancel_all()

    async def until(self, predicate: Callable[[list[Frame]], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate(frames)`` holds (a TimeoutError after ``timeout`` seconds)."""

        async def wait() -> None:
            while not predicate(self.frames):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout or self.timeout)
