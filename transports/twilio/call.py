"""One Twilio media stream bound to a session, sans-I/O: inbound messages go into ``receive``,
and ``tick(now)`` returns the outbound messages due by ``now`` on the shared pacer's 20 ms
schedule (the shell sleeps until ``delay(now)`` has passed and sends them).

Marks track what the caller has actually heard: after the first packet of each agent utterance
we send a mark, and Twilio echoes it once that audio has played, so the trace's ``audio_out``
(the end of the voice-to-voice span) is the moment the caller heard the agent, not the moment
we handed bytes to the socket. Barge-in sends ``clear`` so Twilio drops its buffered audio.
The marks also say what of the agent's words the caller heard: while the agent speaks a mark goes
every ``HEARD_MARK_PACKETS`` packets, each holding the playout's position when it was sent, and
Twilio's echo of it (not one forced by a clear) confirms the audio up to there
(``Playout.confirm``); after a barge-in's clear the playout reports what was heard once every
pending mark has come back (``Playout.settle``), or after ``HEARD_SETTLE_S`` at the latest. So
the history's "heard" over Twilio means the mark came back.
The same marks tell when the agent's last words have played, so an agent hang-up closes the
stream only then (Twilio's protocol has no hang-up message: closing the stream ends
``<Connect>``, and a call whose TwiML has nothing after it ends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.frames import Dtmf, Interrupt
from agent.session import Session
from transports.g711 import PCMU
from transports.narrowband import (
    NARROWBAND_RATE,
    NarrowbandCall,
    NarrowbandDecoder,
    NarrowbandPlayout,
)
from transports.ratelimit import AUDIO_BURST_S, AUDIO_SLACK, TokenBucket
from transports.twilio.messages import (
    Clear,
    Connected,
    DtmfDigit,
    InboundMessage,
    MarkEcho,
    Media,
    OutboundMessage,
    SendMark,
    SendMedia,
    Start,
    Stop,
)

HEARD_MARK_PACKETS = 5  # a mark every 100 ms of agent audio: the resolution of "heard"
HEARD_SETTLE_S = 1.0  # after a clear, the longest wait for Twilio's echoes of pending marks


@dataclass(slots=True)
class MarkRecord:
    name: str
    sent_ns: int
    heard_ns: int = 0
    cleared: bool = False  # echoed because a clear dropped the audio, not because it played
    position: int = -1  # the playout's position (16 kHz samples) the mark stands at


@dataclass(slots=True)
class TwilioCallStats:
    media_in: int = 0
    media_dropped: int = 0  # caller media over the real-time rate (a client, not Twilio)
    media_out: int = 0
    sequence_gaps: int = 0
    clears: int = 0
    dtmf: str = ""
    marks: list[MarkRecord] = field(default_factory=list)


class TwilioCall(NarrowbandCall):
    """``start`` (the start message) must arrive before media; ``stopped`` turns true on stop.

    ``heard_from_marks``: stamp ``audio_out`` when Twilio echoes the utterance's first mark
    (what the caller heard); off, it is stamped when the first packet is handed over.
    """

    def __init__(self, session: Session, start: Start, heard_from_marks: bool = True) -> None:
        self.session = session
        self.stream_sid = start.stream_sid
        self.call_sid = start.call_sid
        self.heard_from_marks = heard_from_marks
        self.stats = TwilioCallStats()
        self.stopped = False
        self.hanging_up = ""  # the agent's reason once it ended the call
        self._decoder = NarrowbandDecoder(PCMU)
        self._outbound = NarrowbandPlayout(session.playout, PCMU)
        self._last_seq = start.sequence
        self._talking = False
        self._utterance = 0
        self._pending: dict[str, MarkRecord] = {}
        self._clear_due = False
        self._packets = 0  # packets of the utterance since its latest mark
        self._settle_by = 0  # after a clear: when the playout is told what was heard at the latest
        if heard_from_marks:
            session.playout.confirmed_heard = True
        self._inbound = TokenBucket(AUDIO_SLACK, AUDIO_BURST_S)  # seconds of audio a second
        session.listen(self._on_frame, frozenset({Interrupt}))

    def _interrupted(self) -> None:
        self._clear_due = True  # Twilio is told to drop what it buffered
        super()._interrupted()

    def hang_up(self, reason: str) -> None:
        """The agent ends the call; the shell closes the stream once :attr:`played_out`."""
        self.hanging_up = reason

    @property
    def played_out(self) -> bool:
        """Every packet of agent audio sent has played at Twilio: no utterance open, the
        encoder's tail sent, and every mark echoed."""
        return not self._talking and not self._pending and self._outbound.encoder.pending == 0

    # --- Twilio → us -------------------------------------------------------------------------
    def receive(self, msg: InboundMessage, now_ns: int) -> None:
        seq = getattr(msg, "sequence", 0)
        if seq:
            if self._last_seq and seq != self._last_seq + 1:
                self.stats.sequence_gaps += 1
            self._last_seq = seq
        if isinstance(msg, Media):
            if msg.track != "inbound" and msg.track != "inbound_track":
                return
            if not self._inbound.take(now_ns / 1e9, len(msg.payload) / NARROWBAND_RATE):
                self.stats.media_dropped += 1  # Twilio sends in real time; this is not Twilio
                return
            self.stats.media_in += 1
            pcm = self._decoder.decode(msg.payload)
            if len(pcm):
                self.session.send_audio(pcm, now_ns)
        elif isinstance(msg, MarkEcho):
            rec = self._pending.pop(msg.name, None)
            if rec is not None:
                rec.heard_ns = now_ns
                if self.heard_from_marks and not rec.cleared:
                    if rec.position >= 0:
                        self.session.playout.confirm(rec.position)
                    if rec.name.endswith(":start"):
                        self.session.playout.sent(rec.heard_ns)
                if self._settle_by and not any(r.cleared for r in self._pending.values()):
                    self._settle()
        elif isinstance(msg, DtmfDigit):
            self.stats.dtmf += msg.digit
            self.session.push(Dtmf(msg.digit))
        elif isinstance(msg, Stop):
            self.stopped = True
        elif isinstance(msg, (Connected, Start)):
            pass  # a repeat of what opened the stream

    # --- us → Twilio -------------------------------------------------------------------------
    def _settle(self) -> None:
        self._settle_by = 0
        self.session.playout.settle()

    def _mark(self, suffix: str, now_ns: int) -> SendMark:
        # where the mark stands: what the playout handed out, less the encoder's unsent tail
        position = self.session.playout.pulled_samples - 2 * self._outbound.encoder.pending
        rec = MarkRecord(f"u{self._utterance}:{suffix}", now_ns, position=position)
        self._packets = 0
        self._pending[rec.name] = rec
        self.stats.marks.append(rec)
        return SendMark(self.stream_sid, rec.name)

    def tick(self, now_ns: int) -> list[OutboundMessage]:
        """What is due by ``now_ns``: a clear after barge-in, then per packet time at most a
        packet of agent audio, and marks at the first and last packet of each utterance."""
        out: list[OutboundMessage] = []
        if self._clear_due:
            self._clear_due = False
            self.stats.clears += 1
            out.append(Clear(self.stream_sid))
            for rec in self._pending.values():
                rec.cleared = True  # Twilio echoes these now, though nobody heard them
            self._talking = False
            if self.heard_from_marks:
                if self._pending:
                    self._settle_by = now_ns + int(HEARD_SETTLE_S * 1e9)
                else:
                    self._settle()
        elif self._settle_by and now_ns >= self._settle_by:
            self._settle()  # Twilio never echoed them: what was confirmed is what was heard
        for payloads in self._outbound.tick(now_ns):
            if payloads:
                for p in payloads:
                    out.append(SendMedia(self.stream_sid, p))
                    self.stats.media_out += 1
                if not self._talking:
                    self._talking = True
                    self._utterance += 1
                    out.append(self._mark("start", now_ns))
                else:
                    self._packets += len(payloads)
                    if self.heard_from_marks and self._packets >= HEARD_MARK_PACKETS:
                        out.append(self._mark(f"h{len(self.stats.marks)}", now_ns))
                if not self.heard_from_marks:
                    self.session.playout.sent(now_ns)
            elif self._talking:
                self._talking = False
                out.append(self._mark("end", now_ns))
        return out

    @property
    def heard_lags_ms(self) -> list[float]:
        """Per utterance: from handing its first packet to Twilio to Twilio saying it played."""
        return [round((m.heard_ns - m.sent_ns) / 1e6, 1) for m in self.stats.marks
                if m.name.endswith(":start") and m.heard_ns and not m.cleared]
