"""One browser call over an aiohttp WebSocket: the thin asyncio shell around the codec.

Three loops per call: the reader feeds caller audio into the session, a 20 ms ticker pulls the
agent's audio from the session's playout in real time, and the writer drains the bounded
:class:`~transports.websocket.outbox.Outbox` to the socket. When the client goes away (or hangs
up, or errs) every loop is cancelled and the session closed, releasing its ASR slot and tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE
from agent.playout import Playout
from agent.session import Session
from transports.call_events import CallEvents, ready_event
from transports.websocket import codec
from transports.websocket.outbox import Outbox

log = logging.getLogger("voxline.websocket")

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
MAX_BAD_MESSAGES = 50  # a client that keeps sending garbage is cut off


@dataclass(slots=True)
class CallStats:
    frames_in: int = 0
    frames_out: int = 0
    bad_messages: int = 0
    dropped_audio: int = 0
    dropped_events: int = 0
    end_reason: str = ""


class WebSocketCall:
    def __init__(self, ws: web.WebSocketResponse, session: Session, outbox: Outbox | None = None):
        self.ws = ws
        self.session = session
        self.outbox = outbox or Outbox()
        self.stats = CallStats()

    async def run(self) -> CallStats:
        """Serve the call until the client leaves; always closes the session."""
        events = CallEvents(self.session, self.outbox.put_event)
        tasks: list[asyncio.Task[Any]] = []
        reason = "disconnect"
        try:
            await self.session.start()
            events.emit(ready_event(self.session))
            tasks = [
                asyncio.create_task(self._write(), name=f"{self.session.id}-ws-writer"),
                asyncio.create_task(self._tick(), name=f"{self.session.id}-ws-ticker"),
            ]
            reason = await self._read(events)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            events.detach()
            await self.session.close(reason)
            self.stats.end_reason = reason
            self.stats.dropped_audio = self.outbox.dropped_audio
            self.stats.dropped_events = self.outbox.dropped_events
            if not self.ws.closed:
                await self.ws.close()
        return self.stats

    async def _read(self, events: CallEvents) -> str:
        session = self.session
        async for msg in self.ws:
            if msg.type is WSMsgType.BINARY:
                m: codec.ClientMessage = codec.decode_audio(msg.data)
            elif msg.type is WSMsgType.TEXT:
                m = codec.decode_text(msg.data)
            elif msg.type is WSMsgType.ERROR:
                # aiohttp reports a frame over max_msg_size here and closes the socket with 1009
                events.emit(codec.error_event(f"connection error: {self.ws.exception()}", True))
                return "error"
            else:
                break
            if isinstance(m, codec.AudioMessage):
                now = time.monotonic_ns()
                pcm = m.pcm
                for i in range(0, len(pcm), FRAME_SAMPLES):
                    session.send_audio(pcm[i : i + FRAME_SAMPLES], now)
                    self.stats.frames_in += 1
            elif isinstance(m, codec.ControlMessage):
                if m.type == "hangup":
                    return "hangup"
                if m.type == "ping":
                    events.emit({"type": "pong", "t": m.data.get("t")})
            else:
                self.stats.bad_messages += 1
                events.emit(codec.error_event(m.reason))
                if self.stats.bad_messages >= MAX_BAD_MESSAGES:
                    await self.ws.close(
                        code=WSCloseCode.POLICY_VIOLATION, message=b"too many bad messages"
                    )
                    return "bad messages"
        return "disconnect"

    async def _write(self) -> None:
        ws, playout = self.ws, self.session.playout
        while True:
            item = await self.outbox.get()
            if isinstance(item, bytes):
                await ws.send_bytes(item)
                playout.sent(time.monotonic_ns())
                self.stats.frames_out += 1
            else:
                await ws.send_str(item)

    async def _tick(self) -> None:
        await pace_playout(self.session.playout, self.outbox)


# The first frames of each stretch of agent audio go out at once: the page then holds this
# much audio ahead of its playhead, so network jitter up to it costs no gap, and the page can
# start playback with a 10-ms margin instead of waiting out a jitter buffer.
LEAD_FRAMES = 3


async def pace_playout(playout: Playout, outbox: Outbox) -> None:
    """Send agent audio in real time, one 20 ms frame per tick on an absolute schedule (no
    drift). A stretch of audio starts the moment it arrives (not at the next tick) with a lead
    of ``LEAD_FRAMES`` frames sent at once."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    playout.on_ready = ready.set
    due = loop.time()
    talking = False
    try:
        while True:
            pcm = playout.pull()
            if pcm is None:
                talking = False
            else:
                outbox.put_audio(codec.encode_audio(pcm))
                if not talking:
                    talking = True
                    for _ in range(LEAD_FRAMES - 1):
                        more = playout.pull()
                        if more is None:
                            break
                        outbox.put_audio(codec.encode_audio(more))
            due += FRAME_S
            delay = due - loop.time()
            if delay < -5 * FRAME_S:
                due = loop.time()  # the loop stalled: resync instead of sending a burst
                delay = 0.0
            if talking:
                await asyncio.sleep(max(delay, 0.0))
                continue
            # Quiet: wake at the next tick, or as soon as audio arrives.
            ready.clear()
            timer = loop.call_later(max(delay, 0.0), ready.set)
            await ready.wait()
            timer.cancel()
            now = loop.time()
            if now < due - 0.001:
                due = now  # audio arrived between ticks: the schedule starts now
    finally:
        playout.on_ready = None
