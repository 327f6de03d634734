"""The stage contract: a stage receives frames and emits frames by direct call.

A stage that does slow work (ASR, LLM, TTS) subclasses :class:`QueuedStage`: it owns one task and
a bounded queue, so slow work never blocks the caller's audio. :class:`~agent.frames.Interrupt`
frames never wait in a queue: they are handled the moment they arrive. A stage declares the frame
kinds it reads (``consumes``), so the pipeline stops a kind after the last stage that wants it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agent.frames import ANY_FRAME, Direction, EndOfCall, ErrorFrame, Frame, Interrupt

if TYPE_CHECKING:
    from agent.control import CallControl, Keypad
    from agent.trace import Trace

log = logging.getLogger("voxline.stage")

DOWN = Direction.DOWNSTREAM
UP = Direction.UPSTREAM


class CallHandle(Protocol):
    """The call a stage runs in, as tools see it (:class:`agent.session.Session`)."""

    id: str
    keypad: Keypad
    control: CallControl | None

    async def wait_played(self, exclude: object = None, max_s: float = ...) -> None:
        """Return once the agent's words so far have played (no stage but ``exclude`` busy,
        the playout idle), or after ``max_s``."""
        ...


class StageContext:
    """What a running stage may use from its session: the trace, when the call started
    (monotonic ns; 0 outside a session), the call itself (its keypad and call control; None
    outside a session) and a task spawner whose tasks are all cancelled when the session
    ends."""

    def __init__(self, trace: Trace | None = None, session_id: str = "") -> None:
        self.trace = trace
        self.session_id = session_id
        self.call: CallHandle | None = None
        self.started_ns = 0
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def cancel_all(self) -> None:
        tasks = [t for t in self.tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()


class Stage:
    """A node of the pipeline graph.

    Override :meth:`process`; call :meth:`push` to send a frame on (downstream to every
    successor, upstream to the predecessor). The default ``process`` forwards everything.

    ``consumes`` names the frame kinds the stage reads, in either direction (a kind covers its
    subclasses); the default is every kind. A downstream frame whose kind no stage after this
    one consumes is not forwarded (:meth:`agent.pipeline.Pipeline.route`): caller audio stops
    after turn detection instead of visiting the LLM, the TTS and the listeners 50 times a
    second. Control frames (``CONTROL_FRAMES``) and upstream frames always go on.

    ``busy`` and ``in_speech`` are what :attr:`agent.session.Session.quiet` asks every stage;
    a stage with work in flight or an open utterance overrides them.
    """

    name: str = "stage"
    consumes: frozenset[type[Frame]] = ANY_FRAME

    def __init__(self, name: str | None = None) -> None:
        if name:
            self.name = name
        self._down: list[Stage] = []
        self._up: Stage | None = None
        self._send_down: Callable[[Frame, Direction], None] = _drop
        self.ctx: StageContext = StageContext()

    # --- graph wiring (done by Pipeline) ---------------------------------------------------
    def link(self, nxt: Stage) -> None:
        self._down.append(nxt)
        if nxt._up is None:
            nxt._up = self
        self.route([frozenset()] * len(self._down))

    @property
    def successors(self) -> tuple[Stage, ...]:
        return tuple(self._down)

    def route(self, stops: Sequence[frozenset[type[Frame]]]) -> None:
        """Rebuild the downstream send: a frame whose exact type is in ``stops[i]`` is not
        handed to successor ``i``. Done once when the graph is wired, never per frame; an edge
        that stops nothing is a plain call."""
        if len(stops) != len(self._down):
            raise ValueError(f"{self.name}: {len(stops)} stop sets for {len(self._down)} successors")
        sends = [
            _stopping(nxt.process, stop) if stop else nxt.process
            for nxt, stop in zip(self._down, stops, strict=True)
        ]
        if not sends:
            self._send_down = _drop
        elif len(sends) == 1:
            self._send_down = sends[0]
        else:
            succ = tuple(sends)

            def fan_out(frame: Frame, direction: Direction) -> None:
                for fn in succ:
                    fn(frame, direction)

            self._send_down = fan_out

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self, ctx: StageContext) -> None:
        """Allocate what the stage needs and spawn its tasks (through ``ctx.spawn``)."""
        self.ctx = ctx

    async def stop(self) -> None:
        """Release what ``start`` took. Tasks spawned through the context are cancelled by the
        session after every stage's ``stop``."""

    # --- state the session asks about ---------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Work in flight that will still push frames (a queued turn, a model call)."""
        return False

    @property
    def in_speech(self) -> bool:
        """The caller is inside an utterance, as far as this stage knows."""
        return False

    # --- frames --------------------------------------------------------------------------------
    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)

    def push(self, frame: Frame, direction: Direction = DOWN) -> None:
        if direction is DOWN:
            self._send_down(frame, DOWN)
        elif self._up is not None:
            self._up.process(frame, UP)

    def push_error(self, message: str, fatal: bool = False) -> None:
        self.push(ErrorFrame(message, stage=self.name, fatal=fatal))


def _drop(frame: Frame, direction: Direction) -> None:
    """The sink at the end of a chain."""


def _stopping(
    send: Callable[[Frame, Direction], None], stop: frozenset[type[Frame]]
) -> Callable[[Frame, Direction], None]:
    """``send`` less the frames whose exact type is in ``stop`` (one set lookup per frame)."""

    def send_wanted(frame: Frame, direction: Direction) -> None:
        if frame.__class__ not in stop:
            send(frame, direction)

    return send_wanted


class QueuedStage(Stage):
    """A stage with one worker task and a bounded queue for slow work.

    ``process`` queues downstream frames that :meth:`wants` and forwards the rest at once.
    :class:`Interrupt` clears the queue, cancels the work in flight (:meth:`on_interrupt`) and is
    forwarded immediately. When the queue is full the oldest frame is dropped and counted: a
    stage never blocks its caller and never grows without bound.
    """

    queue_size: int = 64

    def __init__(self, name: str | None = None, queue_size: int | None = None) -> None:
        super().__init__(name)
        if queue_size is not None:
            self.queue_size = queue_size
        self._queue: deque[Frame] = deque()
        self._wakeup: asyncio.Event | None = None
        self._current: asyncio.Task[Any] | None = None
        self._worker: asyncio.Task[Any] | None = None
        self.dropped = 0

    def wants(self, frame: Frame) -> bool:
        """Whether ``frame`` goes to the worker (True) or straight through (False)."""
        return False

    async def handle(self, frame: Frame) -> None:
        """The slow work for one queued frame; runs in the stage's task."""

    def on_interrupt(self, frame: Interrupt) -> None:
        """Called when an interrupt arrives, after the queue is cleared and work cancelled."""

    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        self._wakeup = asyncio.Event()
        self._worker = ctx.spawn(self._run(), name=f"{self.name}-worker")

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return bool(self._queue) or (self._current is not None and not self._current.done())

    def process(self, frame: Frame, direction: Direction) -> None:
        if isinstance(frame, Interrupt):
            self.interrupt(frame)
            self.push(frame, direction)
        elif direction is DOWN and self.wants(frame):
            if len(self._queue) >= self.queue_size:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(frame)
            if self._wakeup is not None:
                self._wakeup.set()
        else:
            if isinstance(frame, EndOfCall):
                self.interrupt(None)
            self.push(frame, direction)

    def interrupt(self, frame: Interrupt | None) -> None:
        self._queue.clear()
        if self._current is not None and not self._current.done():
            self._current.cancel()
        if frame is not None:
            self.on_interrupt(frame)

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            frame = self._queue.popleft()
            self._current = asyncio.ensure_future(self.handle(frame))
            try:
                await asyncio.shield(self._current)
            except asyncio.CancelledError:
                cur = self._current
                if cur is not None and cur.cancelled() and not _task_cancelling():
                    continue  # the work was interrupted, the worker goes on
                if cur is not None and not cur.done():
                    cur.cancel()
                raise
            except Exception:  # a failing frame must not kill the stage
                log.exception("%s failed on %s", self.name, type(frame).__name__)
                # the detail is in the log; a client is told which stage failed, not why (an
                # exception's text may name hosts, paths, models)
                self.push_error(f"{self.name}: failed on {type(frame).__name__} (see the log)")
            finally:
                self._current = None


def _task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
