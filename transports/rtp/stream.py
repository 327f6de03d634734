"""The asyncio shell of one call's media: an RTP socket whose inbound G.711 goes through the jitter
buffer into the session, and whose outbound packets are paced every 20 ms from the session's
playout. Malformed packets are dropped and counted; nothing a peer sends can raise out of here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from agent.frames import Dtmf, Frame, Interrupt
from agent.session import Session
from transports.g711 import G711Codec
from transports.narrowband import NarrowbandDecoder, NarrowbandEncoder
from transports.rtp.dtmf import DtmfParseError, DtmfReceiver
from transports.rtp.jitterbuffer import JitterBuffer
from transports.rtp.packet import Packetizer, RtpParseError, parse_rtp

log = logging.getLogger("voxline.rtp")
PTIME_S = 0.020
# Callers stop sending RTP during silence (silence suppression, DTX, a stream that ended), but
# the VAD only ends a turn after hearing silence; when no caller audio has come for this long,
# the transport feeds silence at the packet rate so the media clock, and the turn, go on.
FILL_SILENCE_AFTER_NS = 100_000_000


@dataclass(slots=True)
class MediaStats:
    packets_in: int = 0
    malformed: int = 0
    unknown_payload: int = 0
    packets_out: int = 0
    agent_packets_out: int = 0  # packets that carried agent audio (not comfort silence)
    echoed_in: int = 0  # our own packets coming back (a peer in echo/loopback mode)
    late_ticks: int = 0  # pacing ticks that ran more than one packet late
    silence_filled: int = 0  # 20 ms frames of silence fed while the caller sent no audio
    dtmf: str = ""


class RtpMediaStream(asyncio.DatagramProtocol):
    """One call's RTP: ``open`` binds the socket; ``start`` begins sending to ``remote``."""

    def __init__(
        self,
        session: Session,
        codec: G711Codec,
        remote: tuple[str, int],
        dtmf_payload_type: int | None = 101,
        send_silence: bool = True,
        jitter_depth: int = 4,
    ) -> None:
        self.session = session
        self.codec = codec
        self.remote = remote
        self.dtmf_payload_type = dtmf_payload_type
        self.send_silence = send_silence
        self.stats = MediaStats()
        self.jitter = JitterBuffer(depth=jitter_depth)
        self.dtmf = DtmfReceiver()
        self._decoder = NarrowbandDecoder(codec)
        self._encoder = NarrowbandEncoder(codec)
        self._packetizer = Packetizer(codec.payload_type)
        self._ssrc_in: int | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._sender: asyncio.Task[None] | None = None
        self._silence = bytes([codec.silence]) * 160
        self._talking = False
        self._last_audio_ns = 0
        # a list here collects the payloads of our own packets a peer echoes back (loopback
        # diagnostics: proves what we sent arrived, and lets a test measure its energy)
        self.echo_payloads: list[bytes] | None = None
        session.listen(self._on_frame)

    # --- socket ------------------------------------------------------------------------------
    async def open(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))
        self._transport = transport  # type: ignore[assignment]
        return transport.get_extra_info("sockname")[:2]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable and friends
        log.debug("rtp socket error: %s", exc)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            pkt = parse_rtp(data)
        except RtpParseError:
            self.stats.malformed += 1
            return
        if pkt.ssrc == self._packetizer.ssrc:
            self.stats.echoed_in += 1
            if self.echo_payloads is not None:
                self.echo_payloads.append(pkt.payload)
            return
        self.stats.packets_in += 1
        if pkt.payload_type == self.codec.payload_type:
            if pkt.ssrc != self._ssrc_in:  # a new source (re-INVITE, another leg): start over
                self._ssrc_in = pkt.ssrc
                self.jitter = JitterBuffer(depth=self.jitter.depth)
            now = time.monotonic_ns()
            self._last_audio_ns = now
            for payload in self.jitter.push(pkt.sequence, pkt.payload):
                pcm = self._decoder.decode(payload) if payload else self._decoder.conceal()
                if len(pcm):
                    self.session.send_audio(pcm, now)
        elif pkt.payload_type == self.dtmf_payload_type:
            try:
                presses = self.dtmf.feed(pkt.timestamp, pkt.payload)
            except DtmfParseError:
                self.stats.malformed += 1
                return
            for press in presses:
                self.stats.dtmf += press.digit
                self.session.push(Dtmf(press.digit, duration_ms=press.duration_ms))
        else:
            self.stats.unknown_payload += 1

    # --- sending -----------------------------------------------------------------------------
    def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, Interrupt):
            self._encoder.reset()

    def start(self) -> None:
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())

    def _send(self, payload: bytes, marker: bool = False) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.sendto(self._packetizer.packet(payload, marker).to_bytes(), self.remote)
        self.stats.packets_out += 1

    def tick(self) -> None:
        """One 20 ms packet time: at most one packet of agent audio, else comfort silence; and
        caller silence into the session when the caller has gone quiet on the wire."""
        now = time.monotonic_ns()
        if self._last_audio_ns and now - self._last_audio_ns > FILL_SILENCE_AFTER_NS:
            pcm = self._decoder.conceal()
            self.stats.silence_filled += 1
            if len(pcm):
                self.session.send_audio(pcm, now)
        playout = self.session.playout
        frame = playout.pull()
        payloads = self._encoder.encode(frame) if frame is not None else []
        if frame is None and not payloads:
            tail = self._encoder.drain()
            if tail is not None:
                payloads = [tail]
        if payloads:
            for p in payloads:
                self._send(p, marker=not self._talking)
                self._talking = True
                self.stats.agent_packets_out += 1
            playout.sent()
        else:
            self._talking = False
            if self.send_silence:
                self._send(self._silence)
            else:
                self._packetizer.skip()

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        t_next = loop.time()
        while True:
            self.tick()
            t_next += PTIME_S
            delay = t_next - loop.time()
            if delay < -PTIME_S:
                self.stats.late_ticks += 1
                if delay < -10 * PTIME_S:  # the loop stalled: resync rather than burst
                    t_next = loop.time()
                    delay = 0.0
            await asyncio.sleep(max(delay, 0.0))

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
