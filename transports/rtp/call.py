"""One call's RTP media bound to a session, sans-I/O: ``receive(datagram, now)`` takes the
caller's packets (G.711 through the jitter buffer into the session, RFC 4733 DTMF), and
``tick(now)`` returns the datagrams due by ``now`` on the shared pacer's 20 ms schedule.
Malformed packets are dropped and counted; nothing a peer sends can raise out of here.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.frames import Dtmf, Interrupt
from agent.session import Session
from transports.g711 import G711Codec
from transports.narrowband import (
    PACKET_SAMPLES,
    NarrowbandCall,
    NarrowbandDecoder,
    NarrowbandPlayout,
)
from transports.rtp.dtmf import DtmfParseError, DtmfReceiver
from transports.rtp.jitterbuffer import JitterBuffer
from transports.rtp.packet import Packetizer, RtpParseError, parse_rtp

# Callers stop sending RTP during silence (silence suppression, DTX, a stream that ended), but
# the VAD only ends a turn after hearing silence; when no caller audio has come for this long,
# the call feeds silence at the packet rate so the media clock, and the turn, go on.
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
    resyncs: int = 0  # pacing stalls long enough that the schedule restarted
    silence_filled: int = 0  # 20 ms frames of silence fed while the caller sent no audio
    dtmf: str = ""


class RtpCall(NarrowbandCall):
    """``send_silence``: quiet packet times carry comfort silence (False: the RTP clock skips
    them, a pause rather than a loss to the receiver)."""

    def __init__(
        self,
        session: Session,
        codec: G711Codec,
        dtmf_payload_type: int | None = 101,
        send_silence: bool = True,
        jitter_depth: int = 4,
    ) -> None:
        self.session = session
        self.codec = codec
        self.dtmf_payload_type = dtmf_payload_type
        self.send_silence = send_silence
        self.stats = MediaStats()
        self.jitter = JitterBuffer(depth=jitter_depth)
        self.dtmf = DtmfReceiver()
        self._decoder = NarrowbandDecoder(codec)
        self._outbound = NarrowbandPlayout(session.playout, codec)
        self._packetizer = Packetizer(codec.payload_type)
        self._ssrc_in: int | None = None
        self._silence = bytes([codec.silence]) * PACKET_SAMPLES
        self._talking = False
        self._last_audio_ns = 0
        self._dropped = 0  # the pacer's dropped deadlines already skipped on the RTP clock
        # a list here collects the payloads of our own packets a peer echoes back (loopback
        # diagnostics: proves what we sent arrived, and lets a test measure its energy)
        self.echo_payloads: list[bytes] | None = None
        session.listen(self._on_frame, frozenset({Interrupt}))

    # --- caller → us -------------------------------------------------------------------------
    def receive(self, data: bytes, now_ns: int) -> None:
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
            self._last_audio_ns = now_ns
            for payload in self.jitter.push(pkt.sequence, pkt.payload):
                pcm = self._decoder.decode(payload) if payload else self._decoder.conceal()
                if len(pcm):
                    self.session.send_audio(pcm, now_ns)
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

    # --- us → caller -------------------------------------------------------------------------
    def tick(self, now_ns: int) -> list[bytes]:
        """The datagrams due by ``now_ns``: per packet time one packet of agent audio, else
        comfort silence; and caller silence into the session while the caller is quiet on
        the wire."""
        slots = self._outbound.tick(now_ns)
        pacer, stats, packetizer = self._outbound.pacer, self.stats, self._packetizer
        if pacer.dropped != self._dropped:  # a resync: the RTP clock skips what was given up
            packetizer.skip(pacer.dropped - self._dropped)
            self._dropped = pacer.dropped
        stats.late_ticks, stats.resyncs = pacer.late_ticks, pacer.resyncs
        out: list[bytes] = []
        for payloads in slots:
            if self._last_audio_ns and now_ns - self._last_audio_ns > FILL_SILENCE_AFTER_NS:
                pcm = self._decoder.conceal()
                stats.silence_filled += 1
                if len(pcm):
                    self.session.send_audio(pcm, now_ns)
            if payloads:
                for p in payloads:
                    out.append(packetizer.packet(p, marker=not self._talking).to_bytes())
                    self._talking = True
                    stats.agent_packets_out += 1
                self.session.playout.sent(now_ns)
            else:
                self._talking = False
                if self.send_silence:
                    out.append(packetizer.packet(self._silence).to_bytes())
                else:
                    packetizer.skip()
        stats.packets_out += len(out)
        return out
