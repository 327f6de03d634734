"""The pipeline graph: a chain of stages, with optional side branches (a recorder, a second ASR).

Frames travel by direct call. ``Pipeline.push`` feeds the head; frames pushed upstream past the
head reach ``on_upstream`` (the transport listens there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from agent.frames import Direction, Frame
from agent.stage import DOWN, Stage, StageContext


class _Head(Stage):
    name = "head"

    def __init__(self, on_upstream: Callable[[Frame], None]) -> None:
        super().__init__()
        self.on_upstream = on_upstream

    def process(self, frame: Frame, direction: Direction) -> None:
        if direction is DOWN:
            self.push(frame, DOWN)
        else:
            self.on_upstream(frame)


class _Tail(Stage):
    name = "tail"

    def __init__(self, on_downstream: Callable[[Frame], None]) -> None:
        super().__init__()
        self.on_downstream = on_downstream

    def process(self, frame: Frame, direction: Direction) -> None:
        if direction is DOWN:
            self.on_downstream(frame)
        else:
            self.push(frame, direction)


def _ignore(frame: Frame) -> None:
    pass


class Pipeline:
    """A chain of stages plus branches.

    ``branches`` maps a stage of the chain to a list of stages that receive (in order, as a
    chain of their own) every frame that stage emits downstream, beside the main successor.
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        branches: Mapping[Stage, Sequence[Stage]] | None = None,
        on_output: Callable[[Frame], None] = _ignore,
        on_upstream: Callable[[Frame], None] = _ignore,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages: list[Stage] = list(stages)
        self._head = _Head(on_upstream)
        self._tail = _Tail(on_output)
        chain = [self._head, *self.stages, self._tail]
        for a, b in zip(chain, chain[1:], strict=False):
            a.link(b)
        self.branch_stages: list[Stage] = []
        for at, branch in (branches or {}).items():
            if at not in self.stages:
                raise ValueError(f"branch point {at.name!r} is not a stage of the chain")
            prev = at
            for st in branch:
                prev.link(st)
                prev = st
            self.branch_stages.extend(branch)
        self.push: Callable[[Frame, Direction], None] = self._head.process

    @property
    def all_stages(self) -> list[Stage]:
        return [*self.stages, *self.branch_stages]

    def set_output(self, fn: Callable[[Frame], None]) -> None:
        self._tail.on_downstream = fn

    def set_upstream(self, fn: Callable[[Frame], None]) -> None:
        self._head.on_upstream = fn

    def inject_upstream(self, frame: Frame) -> None:
        """Send ``frame`` upstream from the end of the chain (what the output transport does)."""
        self._tail.push(frame, Direction.UPSTREAM)

    def find(self, kind: type) -> Stage | None:
        return next((s for s in self.all_stages if isinstance(s, kind)), None)

    async def start(self, ctx: StageContext) -> None:
        for st in self.all_stages:
            await st.start(ctx)

    async def stop(self) -> None:
        for st in reversed(self.all_stages):
            await st.stop()


def chain(*stages: Stage | Iterable[Stage]) -> list[Stage]:
    out: list[Stage] = []
    for s in stages:
        if isinstance(s, Stage):
            out.append(s)
        else:
            out.extend(s)
    return out
