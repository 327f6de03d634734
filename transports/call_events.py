"""What a browser sees of a call: the session's frames and finished turns as JSON event text.

WebSocket and WebRTC clients receive the same events (``agent.events``); this module subscribes
to a session once and hands each event, encoded, to the transport's ``send``. ``send`` always
runs on the event loop, even when a stage records a trace event from its worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from agent.events import EVENT_FRAMES, frame_event, trace_event
from agent.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame
from agent.session import Session
from transports.websocket.codec import encode_event


def ready_event(session: Session) -> dict[str, Any]:
    """The first event of every call: who the call is and the audio format both ways."""
    return {
        "type": "ready",
        "session": session.id,
        "sample_rate": SAMPLE_RATE,
        "frame_samples": FRAME_SAMPLES,
        "budgets": session.trace.budgets,
    }


class CallEvents:
    """Forwards a session's client-visible events to ``send`` until :meth:`detach`."""

    def __init__(self, session: Session, send: Callable[[str], None]) -> None:
        self.session = session
        self._send: Callable[[str], None] | None = send
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        session.listen(self._on_frame, EVENT_FRAMES)
        session.trace.listeners.append(self._on_turn)

    def emit(self, event: dict[str, Any]) -> None:
        send = self._send
        if send is None:
            return
        text = encode_event(event)
        if threading.get_ident() == self._loop_thread:
            send(text)
        else:
            self._loop.call_soon_threadsafe(self._deliver, text)

    def _deliver(self, text: str) -> None:
        if self._send is not None:
            self._send(text)

    def _on_frame(self, frame: Frame) -> None:
        if self._send is None:
            return
        ev = frame_event(frame, self.session.started_ns)
        if ev is not None:
            self.emit(ev)

    def _on_turn(self, record: dict[str, Any]) -> None:
        self.emit(trace_event(record))

    def detach(self) -> None:
        """Stop forwarding (the client is gone); the session may still emit while it closes."""
        self._send = None
        with contextlib.suppress(ValueError):
            self.session.trace.listeners.remove(self._on_turn)
