"""The pipeline graph: a chain of stages, with optional side branches (a recorder, a second ASR).

Frames travel by direct call. ``Pipeline.push`` feeds the head; frames pushed upstream past the
head reach ``on_upstream`` (the transport listens there). Each edge of the graph carries only the
frame kinds that some stage at or after its far end consumes (see :meth:`Pipeline.route`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from agent.frames import ANY_FRAME, CONTROL_FRAMES, Direction, Frame
from agent.stage import DOWN, Stage, StageContext

Kinds = frozenset[type[Frame]]


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

    def __init__(self, on_downstream: Callable[[Frame], None], consumes: Kinds) -> None:
        super().__init__()
        self.on_downstream = on_downstream
        self.consumes = consumes

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
    ``output_consumes`` is what ``on_output`` reads (default: every kind).
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        branches: Mapping[Stage, Sequence[Stage]] | None = None,
        on_output: Callable[[Frame], None] = _ignore,
        on_upstream: Callable[[Frame], None] = _ignore,
        output_consumes: Kinds = ANY_FRAME,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        self.stages: list[Stage] = list(stages)
        self._started: list[Stage] = []
        self._head = _Head(on_upstream)
        self._tail = _Tail(on_output, output_consumes)
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
        self.route()

    @property
    def all_stages(self) -> list[Stage]:
        return [*self.stages, *self.branch_stages]

    def set_output(self, fn: Callable[[Frame], None], consumes: Kinds = ANY_FRAME) -> None:
        """Send the frames leaving the chain to ``fn``, which reads the kinds in ``consumes``."""
        self._tail.on_downstream = fn
        if consumes != self._tail.consumes:
            self._tail.consumes = consumes
            self.route()

    def set_upstream(self, fn: Callable[[Frame], None]) -> None:
        self._head.on_upstream = fn

    def inject_upstream(self, frame: Frame) -> None:
        """Send ``frame`` upstream from the end of the chain (what the output transport does)."""
        self._tail.push(frame, Direction.UPSTREAM)

    def find(self, kind: type) -> Stage | None:
        return next((s for s in self.all_stages if isinstance(s, kind)), None)

    def route(self) -> None:
        """Wire every edge to carry only the kinds some stage at or after its far end consumes.

        Done when the pipeline is built, again at :meth:`start` (a stage may set ``consumes``
        from its configuration) and when the output's kinds change; never per frame. The kinds
        stopped are the ``Frame`` classes defined by then, less the control frames; a kind
        defined later is never stopped. An edge whose far side consumes everything is a plain
        call, so a pipeline of stages that declare nothing costs what it did before.
        """
        kinds = [k for k in _frame_kinds() if not issubclass(k, CONTROL_FRAMES)]
        wanted = _wanted(self._head)
        stops = {
            st: frozenset(k for k in kinds if not issubclass(k, tuple(want)))
            for st, want in wanted.items()
        }
        for st in wanted:
            st.route([stops[nxt] for nxt in st.successors])

    async def start(self, ctx: StageContext) -> None:
        """Start every stage in order. If one fails, the ones after it never start; ``stop``
        then stops only the stages whose start was called (the failing one included: it may
        hold what it took before it failed)."""
        self.route()
        self._started = []
        for st in self.all_stages:
            self._started.append(st)
            await st.start(ctx)

    async def stop(self) -> None:
        started, self._started = self._started, []
        for st in reversed(started):
            await st.stop()


def _frame_kinds() -> list[type[Frame]]:
    """Every subclass of ``Frame`` defined so far."""
    found: list[type[Frame]] = []
    todo: list[type[Frame]] = [Frame]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


def _wanted(root: Stage) -> dict[Stage, Kinds]:
    """For every stage reachable from ``root``: the kinds it or any stage after it consumes."""
    wanted: dict[Stage, Kinds] = {}
    stack: list[tuple[Stage, bool]] = [(root, False)]
    while stack:  # depth first, a stage after all of its successors
        st, ready = stack.pop()
        if ready:
            kinds = set(st.consumes)
            for nxt in st.successors:
                kinds |= wanted[nxt]
            wanted[st] = frozenset(kinds)
        elif st not in wanted:
            stack.append((st, True))
            stack.extend((nxt, False) for nxt in st.successors if nxt not in wanted)
    return wanted


def chain(*stages: Stage | Iterable[Stage]) -> list[Stage]:
    out: list[Stage] = []
    for s in stages:
        if isinstance(s, Stage):
            out.append(s)
        else:
            out.extend(s)
    return out
