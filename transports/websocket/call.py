"""One browser call over an aiohttp WebSocket: the thin asyncio shell around the codec.

Three loops per call: the reader feeds caller audio into the session, a ticker sends the
agent's audio as the call's :class:`~agent.pacer.Pacer` releases it, and the writer drains the
bounded :class:`~transports.websocket.outbox.Outbox` to the socket. When the client goes away
(or hangs up, or errs) every loop is cancelled and the session closed, releasing its ASR slot
and tasks; a session that fails to start is closed too, and the client told why. When the agent
hangs up, the audio already queued and a ``hangup`` event go out, then a normal close (1000)
carrying the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import WSCloseCode, WSMsgType, web

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE
from agent.pacer import Pacer
from agent.session import Session
from transports.call_events import CallEvents, ready_event
from transports.lifecycle import CallLifecycle
from transports.ratelimit import audio_bucket
from transports.websocket import codec
from transports.websocket.outbox import Outbox

log = logging.getLogger("voxline.websocket")

MAX_BAD_MESSAGES = 50  # a client that keeps sending garbage is cut off
FLUSH_TIMEOUT_S = 2.0  # the most an agent hang-up waits for the outbox to reach the socket
# The page sends audio all through a call (silence too); a client that sends nothing at all for
# this long is gone or stuck, and its call's slot is given back.
IDLE_TIMEOUT_S = 30.0
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


@dataclass(slots=True)
class CallStats:
    frames_in: int = 0
    frames_out: int = 0
    bad_messages: int = 0
    dropped_audio: int = 0
    dropped_inbound: int = 0  # caller frames over the real-time rate, dropped
    dropped_events: int = 0
    end_reason: str = ""


# The first frames of each stretch of agent audio go out at once: the page then holds this
# much audio ahead of its playhead, so network jitter up to it costs no gap, and the page can
# start playback with a 10-ms margin instead of waiting out a jitter buffer.
LEAD_FRAMES = 3


class WebSocketCall:
    def __init__(self, ws: web.WebSocketResponse, session: Session, outbox: Outbox | None = None,
                 idle_timeout_s: float = IDLE_TIMEOUT_S):
        self.ws = ws
        self.session = session
        self.outbox = outbox or Outbox()
        self.pacer = Pacer(session.playout, lead=LEAD_FRAMES)
        self.stats = CallStats()
        self.idle_timeout_s = idle_timeout_s
        self.inbound = audio_bucket(FRAME_S)
        self._rate_told = -1.0  # when the client was last told its audio is too fast

    async def run(self, ended: Callable[[CallStats], None] | None = None) -> CallStats:
        """Serve the call until the client leaves; always closes the session.

        ``ended`` is called with the stats once the call is over (its session closed), before
        the socket's closing handshake: a client that hung up and stopped reading holds that
        handshake for aiohttp's close timeout, and the call's place should not wait for it."""
        life = CallLifecycle(self.session, reason="disconnect")
        events = CallEvents(self.session, self.outbox.put_event)
        try:
            await self._serve(life, events)
        except Exception as exc:
            if life.started:
                raise
            log.exception("session %s: the call could not start", self.session.id)
            if not self.ws.closed:
                await self.ws.send_str(codec.encode_event(
                    codec.error_event(f"cannot start a call: {exc}", True)))
        finally:
            events.detach()
            self.stats.end_reason = life.reason
            self.stats.dropped_audio = self.outbox.dropped_audio
            self.stats.dropped_events = self.outbox.dropped_events
            if ended is not None:
                ended(self.stats)
            if not self.ws.closed:
                await self.ws.close()
        return self.stats

    async def _serve(self, life: CallLifecycle, events: CallEvents) -> None:
        async with life:
            events.emit(ready_event(self.session))
            sid = self.session.id
            writer = asyncio.create_task(self._write(), name=f"{sid}-ws-writer")
            ticker = asyncio.create_task(self._tick(), name=f"{sid}-ws-ticker")
            reader = asyncio.create_task(self._read(events), name=f"{sid}-ws-reader")
            hangup = asyncio.create_task(life.agent_hangup(), name=f"{sid}-ws-hangup")
            tasks = (writer, ticker, reader, hangup)
            try:
                await asyncio.wait((reader, hangup), return_when=asyncio.FIRST_COMPLETED)
                if reader.done():
                    life.reason = reader.result()
                else:
                    await self._hang_up(hangup.result(), events, ticker, writer)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _hang_up(
        self, reason: str, events: CallEvents, ticker: asyncio.Task[None], writer: asyncio.Task[None]
    ) -> None:
        """The agent ended the call and its audio has left the playout: send what the outbox
        holds and the ``hangup`` event, give the page time to play the audio it holds ahead of
        its playhead, then close normally with the reason."""
        ticker.cancel()
        events.emit(codec.hangup_event(reason))
        self.outbox.close()
        await asyncio.wait((writer,), timeout=FLUSH_TIMEOUT_S)
        await asyncio.sleep(LEAD_FRAMES * FRAME_SAMPLES / SAMPLE_RATE)
        await self.ws.close(code=WSCloseCode.OK, message=reason.encode()[:120])

    async def _read(self, events: CallEvents) -> str:
        session = self.session
        while True:
            try:
                msg = await self.ws.receive(timeout=self.idle_timeout_s)
            except TimeoutError:  # (said at once: the writer stops with this loop)
                await self.ws.send_str(codec.encode_event(codec.error_event(
                    f"nothing received for {self.idle_timeout_s:g} s: ending the call", True)))
                await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"idle")
                return "idle"
            if msg.type is WSMsgType.BINARY:
                m: codec.ClientMessage = codec.decode_audio(msg.data)
            elif msg.type is WSMsgType.TEXT:
                m = codec.decode_text(msg.data)
            elif msg.type is WSMsgType.ERROR:
                # aiohttp reports a frame over max_msg_size here and closes the socket with 1009
                events.emit(codec.error_event(f"connection error: {self.ws.exception()}", True))
                return "error"
            else:  # closing, closed
                return "disconnect"
            if isinstance(m, codec.AudioMessage):
                now = time.monotonic_ns()
                pcm = m.pcm
                for i in range(0, len(pcm), FRAME_SAMPLES):
                    if not self.inbound.take(now / 1e9):
                        self._too_fast(events, now / 1e9)
                        continue
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

    def _too_fast(self, events: CallEvents, now_s: float) -> None:
        """A frame over the real-time rate is dropped; the client hears why, once a second."""
        self.stats.dropped_inbound += 1
        if now_s - self._rate_told >= 1.0:
            self._rate_told = now_s
            events.emit(codec.error_event(
                "audio arrives faster than real time: frames over the rate are dropped "
                f"({self.stats.dropped_inbound} so far)"))

    async def _write(self) -> None:
        ws, playout = self.ws, self.session.playout
        while True:
            item = await self.outbox.get()
            if item is None:
                return  # closed: the last message is out
            if isinstance(item, bytes):
                await ws.send_bytes(item)
                playout.sent(time.monotonic_ns())
                self.stats.frames_out += 1
            else:
                await ws.send_str(item)

    async def _tick(self) -> None:
        await pace_playout(self.pacer, self.outbox)


async def pace_playout(pacer: Pacer, outbox: Outbox) -> None:
    """Send agent audio as ``pacer`` releases it: one frame per packet time on its absolute
    schedule, a stretch of audio started the moment it arrives (the playout's ``on_ready``
    wakes the ticker between deadlines) with the pacer's lead sent at once."""
    playout = pacer.playout
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    playout.on_ready = ready.set
    try:
        while True:
            ready.clear()
            for pcm in pacer.tick(time.monotonic_ns()):
                if pcm is not None:
                    outbox.put_audio(codec.encode_audio(pcm))
            # wake at the next deadline, or as soon as audio arrives while nothing was queued
            timer = loop.call_later(pacer.delay(time.monotonic_ns()), ready.set)
            await ready.wait()
            timer.cancel()
    finally:
        playout.on_ready = None
