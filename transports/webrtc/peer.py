"""One browser call over WebRTC: an aiortc peer connection answering the browser's offer.

Caller audio arrives as Opus on the browser's microphone track and is fed to the session at
16 kHz; the agent's audio leaves on a real-time :class:`~transports.webrtc.track.PlayoutTrack`;
the browser's data channel carries the same JSON events as the WebSocket transport, and the
client's ``hangup``/``ping``. The call ends when the peer connection fails or closes, the data
channel closes, the caller's track ends, or the client hangs up; :meth:`close` is idempotent.
When the agent hangs up, the client gets a ``hangup`` event on the data channel once the agent's
last words have played out, and the call closes a moment later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE
from agent.session import Session
from transports.call_events import CallEvents, ready_event
from transports.lifecycle import CallLifecycle
from transports.ratelimit import audio_bucket
from transports.webrtc.inbound import InboundAudio
from transports.webrtc.track import PTIME_MS, PlayoutTrack, use_low_delay_opus
from transports.websocket import codec

log = logging.getLogger("voxline.webrtc")

# events held until the data channel opens, and the most the channel may buffer before events
# are dropped (counted) for a client that does not read
MAX_PENDING_EVENTS = 256
MAX_CHANNEL_BUFFER = 256 * 1024
# a browser that got its answer but never connects (ICE failed without saying so) is let go
CONNECT_TIMEOUT_S = 30.0
# an agent hang-up waits at most this long for the hangup event to leave the data channel, then
# this long for the browser's jitter buffer to play the agent's last audio
CHANNEL_DRAIN_S = 1.0
HANGUP_LINGER_S = 0.2


# aiortc holds each received audio packet until 4 more have arrived (80 ms) before decoding it.
# A voice agent hears the end of every turn that much later. An audio packet is a whole Opus
# frame, so the next one in sequence can be decoded the moment it arrives; a lost packet stalls
# the buffer until it overflows exactly as it does at aiortc's depth. The browser's jitter
# buffer handles the other direction.
class AudioJitterBuffer(JitterBuffer):
    """Releases each audio packet as soon as it is next in sequence. A missing packet is given
    up for lost once ``LOSS_AFTER`` later ones are waiting (40 ms), so a loss costs a short
    stall, not the 16-packet overflow aiortc's own buffer waits for."""

    LOSS_AFTER = 2

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        if self._origin is None:
            return None
        cap = self.capacity
        skip = 0
        while skip < cap and self._packets[(self._origin + skip) % cap] is None:
            skip += 1
        if skip == cap:
            return None
        if skip:
            waiting = sum(
                self._packets[(self._origin + k) % cap] is not None for k in range(skip, cap)
            )
            if waiting < self.LOSS_AFTER:
                return None
            self.remove(skip)  # the missing ones are lost
        packet = self._packets[self._origin % cap]
        assert packet is not None
        self.remove(1)
        return JitterFrame(data=packet._data, timestamp=packet.timestamp)  # noqa: SLF001


def shorten_jitter_buffers(pc: RTCPeerConnection) -> bool:
    """Give every audio receiver of ``pc`` an :class:`AudioJitterBuffer`; False (and aiortc's
    own kept, with a warning) where this aiortc version has no buffer where we expect it."""
    done = False
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        current = getattr(receiver, "_RTCRtpReceiver__jitter_buffer", None)
        if transceiver.kind != "audio" or type(current) is not JitterBuffer:
            continue
        receiver._RTCRtpReceiver__jitter_buffer = AudioJitterBuffer(capacity=current.capacity)  # noqa: SLF001
        done = True
    if not done:
        log.warning("aiortc's receive jitter buffer was not found: audio keeps its 80-ms depth")
    return done


class WebRTCCall:
    def __init__(
        self,
        session: Session,
        configuration: RTCConfiguration,
        on_closed: Callable[[WebRTCCall], None] | None = None,
        ptime_ms: int = PTIME_MS,
    ) -> None:
        self.session = session
        self.life = CallLifecycle(session)
        self.pc = RTCPeerConnection(configuration=configuration)
        self.track = PlayoutTrack(session.playout, ptime_ms)
        self.low_delay_opus = False
        self.channel: RTCDataChannel | None = None
        self.events: CallEvents | None = None
        self.frames_in = 0
        self.dropped_events = 0
        self.dropped_inbound = 0  # caller frames over the real-time rate, dropped
        self.inbound_rate = audio_bucket(FRAME_SAMPLES / SAMPLE_RATE)
        self.bad_messages = 0
        self.end_reason = ""
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_closed = on_closed
        self._closing: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_state)

    async def answer(self, sdp: str, kind: str = "offer") -> RTCSessionDescription:
        """Start the session and answer the browser's offer (ICE gathered: no trickle). A start
        that fails has closed the session (``life.started`` stays false); after any failure
        here the caller closes the call."""
        await self.life.start()
        self.events = CallEvents(self.session, self._send_event)
        self.events.emit(ready_event(self.session))
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=kind))
        shorten_jitter_buffers(self.pc)
        sender = self.pc.addTrack(self.track)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        for transceiver in self.pc.getTransceivers():
            if transceiver.sender is sender and transceiver._codecs:  # noqa: SLF001
                self.low_delay_opus = use_low_delay_opus(
                    sender, transceiver._codecs[0].mimeType, self.track.ptime_ms)  # noqa: SLF001
        self._spawn(self._watch_connect())
        self._spawn(self._watch_hangup())
        return self.pc.localDescription

    async def _watch_connect(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            self.close_soon("never connected")

    async def _watch_hangup(self) -> None:
        """The agent ends the call: tell the client on the data channel, then close."""
        reason = await self.life.agent_hangup()
        if self.events is not None:
            self.events.emit(codec.hangup_event(reason))
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CHANNEL_DRAIN_S
        ch = self.channel
        while ch is not None and ch.readyState == "open" and ch.bufferedAmount and (
                loop.time() < give_up):
            await asyncio.sleep(0.01)
        await asyncio.sleep(HANGUP_LINGER_S)
        self.close_soon(reason)

    # --- events out --------------------------------------------------------------------------
    def _send_event(self, text: str) -> None:
        ch = self.channel
        if ch is None or ch.readyState != "open":
            if len(self._pending) == self._pending.maxlen:
                self.dropped_events += 1
            self._pending.append(text)
        elif ch.bufferedAmount > MAX_CHANNEL_BUFFER:
            self.dropped_events += 1
        else:
            ch.send(text)

    def _flush_pending(self) -> None:
        ch = self.channel
        while self._pending and ch is not None and ch.readyState == "open":
            ch.send(self._pending.popleft())

    # --- peer connection callbacks ---------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._consume(track))

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        self.channel = channel
        channel.on("open", self._flush_pending)
        channel.on("message", self._on_message)
        channel.on("close", lambda: self.close_soon("data channel closed"))
        if channel.readyState == "open":
            self._flush_pending()

    def _on_message(self, message: str | bytes) -> None:
        m = codec.decode_text(message) if isinstance(message, str) else codec.BadMessage(
            "binary data channel messages are not part of the protocol (audio goes on the track)"
        )
        if isinstance(m, codec.ControlMessage):
            if m.type == "hangup":
                self.close_soon("hangup")
            elif m.type == "ping" and self.events is not None:
                self.events.emit({"type": "pong", "t": m.data.get("t")})
        elif isinstance(m, codec.BadMessage):
            self.bad_messages += 1
            if self.events is not None:
                self.events.emit(codec.error_event(m.reason))

    async def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.close_soon(f"connection {self.pc.connectionState}")

    async def _consume(self, track: MediaStreamTrack) -> None:
        inbound = InboundAudio()
        session = self.session
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                self.close_soon("caller track ended")
                return
            now = time.monotonic_ns()
            for pcm in inbound.feed(frame):
                if not self.inbound_rate.take(now / 1e9):
                    self.dropped_inbound += 1  # a sender faster than real time: not a browser
                    continue
                session.send_audio(pcm, now)
                self.frames_in += 1

    # --- teardown --------------------------------------------------------------------------
    def close_soon(self, reason: str) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self.close(reason))

    async def close(self, reason: str = "hangup") -> None:
        if self.end_reason:
            await self.closed.wait()
            return
        self.end_reason = reason
        try:
            if self.events is not None:
                self.events.detach()
            self.track.stop()
            current = asyncio.current_task()
            tasks = [t for t in self._tasks if t is not current]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.pc.close()
        finally:
            await self.life.close(reason)
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self)
