"""Who watches the calls: process-wide observers of every session (Prometheus metrics,
OpenTelemetry spans, budget-violation logs), and the event loop's watchdog.

An observer sees a call start (:meth:`CallObserver.call_started`, where it may add a listener
to the session's trace to see each finished turn) and end (:meth:`CallObserver.call_ended`, with
the trace's summary). With no observer registered a call pays one empty loop at its start and
one at its end, and nothing per frame. An observer that raises is logged and never breaks a
call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from agent.trace import Trace

log = logging.getLogger("voxline.observe")
budget_log = logging.getLogger("voxline.budget")
stall_log = logging.getLogger("voxline.loop")


class Session(Protocol):
    """What an observer sees of a call (``agent.session.Session``, which imports this
    module)."""

    id: str
    trace: Trace
    started_ns: int


class CallObserver(Protocol):
    def call_started(self, session: Session) -> None: ...
    def call_ended(self, session: Session, summary: dict[str, Any]) -> None: ...


_observers: list[CallObserver] = []


def watch(observer: CallObserver) -> Callable[[], None]:
    """Register ``observer`` for every call that starts from now on; returns its removal."""
    _observers.append(observer)

    def unwatch() -> None:
        if observer in _observers:
            _observers.remove(observer)

    return unwatch


def observers() -> tuple[CallObserver, ...]:
    return tuple(_observers)


def call_started(session: Session) -> None:
    for obs in _observers:
        try:
            obs.call_started(session)
        except Exception:
            log.exception("observer %r failed at the start of %s", obs, session.id)


def call_ended(session: Session, summary: dict[str, Any]) -> None:
    for obs in _observers:
        try:
            obs.call_ended(session, summary)
        except Exception:
            log.exception("observer %r failed at the end of %s", obs, session.id)


def wall_offset_ns() -> int:
    """What to add to a ``time.monotonic_ns()`` stamp to get Unix-epoch nanoseconds (the trace
    stamps monotonic time; exporters speak wall time)."""
    return time.time_ns() - time.monotonic_ns()


class BudgetLog:
    """Logs every span over its budget as one JSON object on the ``voxline.budget`` logger (a
    warning): ``{"event": "budget_violation", "session", "turn", "span", "ms", "budget_ms"}``."""

    def call_started(self, session: Session) -> None:
        session.trace.listeners.append(self._turn)

    def call_ended(self, session: Session, summary: dict[str, Any]) -> None:
        pass

    @staticmethod
    def _turn(record: dict[str, Any]) -> None:
        for name, span in record["spans"].items():
            if span["over"]:
                budget_log.warning(json.dumps({
                    "event": "budget_violation", "session": record["session"],
                    "turn": record["turn"], "kind": record["type"], "span": name,
                    "ms": span["ms"], "budget_ms": span["budget_ms"],
                }, separators=(",", ":")))


# --- the event loop's watchdog -----------------------------------------------------------------
LAG_INTERVAL_S = 0.1  # how often the loop's timer is due
STALL_S = 0.25  # a loop that has not run its timer for this long is stalled: logged with a stack


class LoopWatchdog:
    """Measures the event loop's lag — how late a timer due every ``interval_s`` runs — and
    hands each measurement to ``on_lag`` (seconds). A thread beside the loop notices a stall (no
    tick for ``stall_s``) while it lasts and logs, once per stall, what the loop is running: the
    current task and the loop thread's stack. When the loop comes back, the stall's length is
    logged and handed to ``on_stall``.

    Start it on the loop it watches (:meth:`start`); :meth:`stop` ends the timer and the thread.
    """

    def __init__(
        self,
        on_lag: Callable[[float], None] | None = None,
        on_stall: Callable[[float], None] | None = None,
        interval_s: float = LAG_INTERVAL_S,
        stall_s: float = STALL_S,
    ) -> None:
        if not interval_s > 0 or not stall_s > 0:
            raise ValueError("the watchdog's interval and stall threshold must be positive")
        self.on_lag = on_lag
        self.on_stall = on_stall
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.max_lag_s = 0.0
        self.stalls = 0
        self._tick = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def start(self) -> LoopWatchdog:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._tick = time.monotonic()
        self._task = loop.create_task(self._timer(), name="loop-watchdog")
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    async def _timer(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self._tick = now
            lag = max(0.0, now - due)
            self.max_lag_s = max(self.max_lag_s, lag)
            if self.on_lag is not None:
                self.on_lag(lag)

    def _watch(self) -> None:
        stalled_since = 0.0
        check = min(self.stall_s / 2, self.interval_s)
        while not self._stop.wait(check):
            tick = self._tick
            late = time.monotonic() - tick - self.interval_s
            if late > self.stall_s and not stalled_since:
                stalled_since = tick
                self.stalls += 1
                stall_log.warning("event loop stalled for %.0f ms so far; it is running %s",
                                  late * 1000, self.running())
            elif stalled_since and tick > stalled_since:
                length = tick - stalled_since - self.interval_s
                stall_log.warning("event loop stall over after %.0f ms", length * 1000)
                if self.on_stall is not None:
                    self.on_stall(length)
                stalled_since = 0.0

    def running(self) -> str:
        """The loop's current task and its thread's stack, innermost call last."""
        task = None
        if self._loop is not None:
            try:
                task = asyncio.current_task(self._loop)
            except RuntimeError:
                task = None
        frame = sys._current_frames().get(self._loop_thread)
        stack = "".join(traceback.format_stack(frame, limit=12)) if frame is not None else ""
        name = task.get_name() if task is not None else "no task (a callback)"
        return f"task {name!r}:\n{stack}"
