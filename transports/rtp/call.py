"""One call's RTP media bound to a session, sans-I/O: ``receive(datagram, now)`` takes the
caller's packets (G.711 through the jitter buffer into the session, RFC 4733 DTMF), and
``tick(now)`` returns the datagrams due by ``now`` on the shared pacer's 20 ms schedule: the
agent's audio, or, while ``send_dtmf`` presses keys, RFC 4733 events in the same stream.
Malformed packets are dropped and counted; nothing a peer sends can raise out of here.

Given the offer's ``remote`` address, packets are taken only from the source the
:class:`~transports.rtp.latch.PeerLatch` admits. Within that source each kind of stream (the
audio, the telephone-events) keeps its SSRC: a packet with another SSRC is dropped and counted
unless the current one has been quiet for ``SSRC_QUIET_NS`` (a transfer or a re-INVITE starts
a new stream after the old one stops; a stream that is still sending is never taken over).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agent.control import NotSupported
from agent.frames import Dtmf, Interrupt
from agent.pacer import EARLY_NS
from agent.session import Session
from transports.g711 import G711Codec
from transports.narrowband import (
    PACKET_SAMPLES,
    NarrowbandCall,
    NarrowbandDecoder,
    NarrowbandPlayout,
)
from transports.rtp.dtmf import DtmfParseError, DtmfReceiver, DtmfSender
from transports.rtp.jitterbuffer import JitterBuffer
from transports.rtp.latch import PeerLatch
from transports.rtp.packet import Packetizer, RtpParseError, parse_rtp

# Callers stop sending RTP during silence (silence suppression, DTX, a stream that ended), but
# the VAD only ends a turn after hearing silence; when no caller audio has come for this long,
# the call feeds silence at the packet rate so the media clock, and the turn, go on.
FILL_SILENCE_AFTER_NS = 100_000_000
# a new SSRC replaces the current one only after the current one sent nothing for this long
SSRC_QUIET_NS = 500_000_000
Address = tuple[str, int]


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
    foreign: int = 0  # datagrams from a source other than the caller's (dropped)
    stray_ssrc: int = 0  # packets of another SSRC while the caller's was active (dropped)
    ssrc_changes: int = 0  # new SSRCs taken after the old one went quiet
    send_errors: int = 0  # packets the socket refused to send
    dtmf: str = ""
    dtmf_packets_out: int = 0  # RFC 4733 event packets we sent (send_dtmf)
    dtmf_sent: str = ""  # the digits we pressed


class SsrcLock:
    """One stream kind's SSRC: the first one heard, replaced only once it has gone quiet."""

    __slots__ = ("ssrc", "last_ns")

    def __init__(self) -> None:
        self.ssrc: int | None = None
        self.last_ns = 0

    def check(self, ssrc: int, now_ns: int) -> int:
        """1: the current SSRC; 2: a new one taken over; 0: a stranger, to drop."""
        if ssrc == self.ssrc:
            self.last_ns = now_ns
            return 1
        if self.ssrc is None or now_ns - self.last_ns >= SSRC_QUIET_NS:
            first = self.ssrc is None
            self.ssrc, self.last_ns = ssrc, now_ns
            return 1 if first else 2
        return 0


class RtpCall(NarrowbandCall):
    """``send_silence``: quiet packet times carry comfort silence (False: the RTP clock skips
    them, a pause rather than a loss to the receiver). ``remote``: the offer's address; with
    it, only the caller's source is listened to (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        codec: G711Codec,
        dtmf_payload_type: int | None = 101,
        send_silence: bool = True,
        jitter_depth: int = 4,
        remote: Address | None = None,
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
        self.latch = PeerLatch(remote) if remote is not None else None
        self._audio_ssrc = SsrcLock()
        self._event_ssrc = SsrcLock()
        self.last_packet_ns = 0  # the caller's last packet we took (0: none yet)
        self._silence = bytes([codec.silence]) * PACKET_SAMPLES
        self._talking = False
        self._last_audio_ns = 0
        self._dropped = 0  # the pacer's dropped deadlines already skipped on the RTP clock
        # a list here collects the payloads of our own packets a peer echoes back (loopback
        # diagnostics: proves what we sent arrived, and lets a test measure its energy)
        self.echo_payloads: list[bytes] | None = None
        # digits to press, in order; the first is playing (see ``send_dtmf``)
        self.dtmf_out: deque[DtmfSender] = deque()
        session.listen(self._on_frame, frozenset({Interrupt}))

    # --- caller → us -------------------------------------------------------------------------
    @property
    def target(self) -> Address | None:
        """Where our packets go: the latched source, else the offer's address."""
        return self.latch.target if self.latch is not None else None

    def retarget(self, remote: Address) -> None:
        """The caller's media moved (a re-INVITE): a new latch, and a new stream to hear."""
        self.latch = PeerLatch(remote)
        self._audio_ssrc, self._event_ssrc = SsrcLock(), SsrcLock()
        self.jitter = JitterBuffer(depth=self.jitter.depth)
        self.dtmf = DtmfReceiver()

    def receive(self, data: bytes, now_ns: int, source: Address | None = None) -> None:
        latch = self.latch
        if latch is not None and source is not None and not latch.admits(source):
            self.stats.foreign += 1
            return
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
        pt = pkt.payload_type
        audio = pt == self.codec.payload_type
        if not audio and pt != self.dtmf_payload_type:
            self.stats.unknown_payload += 1
            return
        new_stream = False
        if latch is not None and source is not None and latch.seen(source):
            self._audio_ssrc, self._event_ssrc = SsrcLock(), SsrcLock()
            new_stream = True
        verdict = (self._audio_ssrc if audio else self._event_ssrc).check(pkt.ssrc, now_ns)
        if not verdict:
            self.stats.stray_ssrc += 1
            return
        if verdict == 2:  # the old stream went quiet and a new one began (transfer, re-INVITE)
            self.stats.ssrc_changes += 1
            new_stream = True
        self.stats.packets_in += 1
        self.last_packet_ns = now_ns
        if audio:
            if new_stream:  # its sequence numbers start over
                self.jitter = JitterBuffer(depth=self.jitter.depth)
            self._last_audio_ns = now_ns
            for payload in self.jitter.push(pkt.sequence, pkt.payload):
                pcm = self._decoder.decode(payload) if payload else self._decoder.conceal()
                if len(pcm):
                    self.session.send_audio(pcm, now_ns)
            return
        if new_stream:
            self.dtmf = DtmfReceiver()
        try:
            presses = self.dtmf.feed(pkt.timestamp, pkt.payload)
        except DtmfParseError:
            self.stats.malformed += 1
            return
        for press in presses:
            self.stats.dtmf += press.digit
            self.session.push(Dtmf(press.digit, duration_ms=press.duration_ms))

    # --- us → caller -------------------------------------------------------------------------
    def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> DtmfSender:
        """Press ``digits`` on the line as RFC 4733 events with the payload type the offer
        gave telephone-event, after any digits already queued; the returned sender is
        ``done`` once its last end packet is out. While digits play, the agent's audio is
        held where it is (not dropped, not sent over a digit: an IVR would hear voice on top
        of its tone) and goes on after the last one; the gaps between digits carry what
        quiet packet times carry (comfort silence, or nothing)."""
        if self.dtmf_payload_type is None:
            raise NotSupported("the caller's SDP has no telephone-event: this call cannot "
                               "send keypad digits")
        sender = DtmfSender(digits, self.dtmf_payload_type, duration_ms, gap_ms)
        self.dtmf_out.append(sender)
        return sender

    def _held_slots(self, now_ns: int) -> list[list[bytes] | None]:
        """The packet times due while digits play: the pacer keeps its schedule, but the
        playout reads as paused for this tick, so nothing of the agent's audio is taken (and
        the echo reference hears silence, which is what the caller's line carries)."""
        pacer = self._outbound.pacer
        due = pacer.due_ns
        if due is not None and now_ns < due - EARLY_NS:
            return []  # (the pacer restarts an idle schedule early for waiting audio)
        playout = self.session.playout
        paused = playout.paused
        playout.paused = True
        try:
            frames = pacer.tick(now_ns)
        finally:
            playout.paused = paused
        return [None] * len(frames)

    def tick(self, now_ns: int) -> list[bytes]:
        """The datagrams due by ``now_ns``: per packet time one packet of agent audio, else
        comfort silence, or while digits play their events; and caller silence into the
        session while the caller is quiet on the wire."""
        dtmf = self.dtmf_out
        slots = self._held_slots(now_ns) if dtmf else self._outbound.tick(now_ns)
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
            if payloads is None:  # a packet time of the digits
                self._talking = False  # the agent's next packet starts a talkspurt
                event = self._dtmf_slot(packetizer) if dtmf else None
                if event is not None:
                    out.append(event)
                    stats.dtmf_packets_out += 1
                elif self.send_silence:
                    out.append(packetizer.packet(self._silence).to_bytes())
                else:
                    packetizer.skip()
            elif payloads:
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

    def _dtmf_slot(self, packetizer: Packetizer) -> bytes | None:
        """The first queued sender's packet for this packet time, or None for a gap."""
        sender = self.dtmf_out[0]
        begun = len(sender.sent)
        data = sender.next(packetizer)
        if len(sender.sent) != begun:
            self.stats.dtmf_sent += sender.sent[begun:]
        if sender.done:
            self.dtmf_out.popleft()
        return data
