"""RFC 4733 telephone-events (DTMF over RTP), sans-I/O: parse the 4-byte event payload and turn
a stream of event packets into one digit per key press (:class:`DtmfReceiver`), and play digits
as event packets on an outbound stream (:class:`DtmfSender`).

A sender repeats each event's packets while the key is held and sends the end packet three
times (RFC 4733 §2.5.1.4); all of them share the event's RTP timestamp, which is how the
repeats are recognised and reported once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transports.rtp.packet import Packetizer

EVENT_CODES = "0123456789*#ABCD"
TELEPHONE_EVENT_CLOCK = 8000
END_PACKETS = 3  # the end of an event is sent this many times (RFC 4733 §2.5.1.4)
# a key held shorter than 40 ms is not a press to many receivers (ITU-T Q.24); the event's
# 16-bit duration field caps one event at 8.19 s
MIN_TONE_MS, MAX_TONE_MS = 40, 5000
MAX_GAP_MS = 5000
DEFAULT_VOLUME = 10  # -10 dBm0, what phones send


class DtmfParseError(ValueError):
    pass


@dataclass(slots=True, frozen=True)
class TelephoneEvent:
    event: int
    end: bool
    volume: int
    duration: int  # in RTP timestamp units (1/8000 s)

    @property
    def digit(self) -> str:
        return EVENT_CODES[self.event] if self.event < len(EVENT_CODES) else f"event-{self.event}"

    def to_bytes(self) -> bytes:
        return struct.pack("!BBH", self.event, (0x80 if self.end else 0) | (self.volume & 0x3F),
                           self.duration & 0xFFFF)


def parse_telephone_event(payload: bytes) -> TelephoneEvent:
    if len(payload) < 4:
        raise DtmfParseError(f"telephone-event payload of {len(payload)} bytes (needs 4)")
    event, flags, duration = struct.unpack_from("!BBH", payload)
    return TelephoneEvent(event, bool(flags & 0x80), flags & 0x3F, duration)


@dataclass(slots=True, frozen=True)
class KeyPress:
    digit: str
    duration_ms: int


class DtmfReceiver:
    """Feeds on (RTP timestamp, payload) of telephone-event packets; ``feed`` returns a
    ``KeyPress`` once per event — at its first end packet, or when a new event starts while the
    old one never saw its end (all three end packets lost)."""

    def __init__(self) -> None:
        self._current: int | None = None  # RTP timestamp of the event in progress
        self._current_event: TelephoneEvent | None = None
        self._done: set[int] = set()  # timestamps already reported (recent ones only)
        self.repeats = 0

    def feed(self, timestamp: int, payload: bytes) -> list[KeyPress]:
        ev = parse_telephone_event(payload)
        out: list[KeyPress] = []
        if timestamp in self._done:
            self.repeats += 1
            return out
        if self._current is not None and timestamp != self._current:
            prev = self._current_event
            assert prev is not None
            out.append(self._report(self._current, prev))
        self._current, self._current_event = timestamp, ev
        if ev.end:
            out.append(self._report(timestamp, ev))
        return out

    def _report(self, timestamp: int, ev: TelephoneEvent) -> KeyPress:
        self._done.add(timestamp)
        if len(self._done) > 64:  # keep memory bounded over a long call
            self._done = {timestamp}
        self._current = self._current_event = None
        return KeyPress(ev.digit, ev.duration * 1000 // TELEPHONE_EVENT_CLOCK)


class DtmfSender:
    """Plays ``digits`` as RFC 4733 events on an outbound RTP stream, one packet time per call
    of :meth:`next`, which numbers its packets with the stream's own ``Packetizer`` (its SSRC,
    its sequence, its clock).

    Per digit: a packet every packet time for ``duration_ms``, all with the RTP timestamp of
    the event's first packet time (a new one per digit), the first with the marker bit, the
    duration rising by one packet time each; the last of them has the E bit, and the end is
    sent twice more in the next two packet times. Then ``gap_ms`` of no event (the two end
    repeats fall inside it, so the gap is at least two packet times) before the next digit.
    ``next`` returns None for the packet times of the gap: the stream sends what it sends when
    it has nothing (comfort silence, or nothing, which moves its clock on), so audio after the
    digits goes on where the last event ended.
    """

    def __init__(self, digits: str, payload_type: int, duration_ms: int = 100,
                 gap_ms: int = 80, volume: int = DEFAULT_VOLUME, packet_ms: int = 20) -> None:
        bad = [d for d in digits if d not in EVENT_CODES]
        if not digits or bad:
            raise ValueError(f"DTMF digits must be some of {EVENT_CODES}, not {digits[:32]!r}")
        if not MIN_TONE_MS <= duration_ms <= MAX_TONE_MS or not 0 <= gap_ms <= MAX_GAP_MS:
            raise ValueError(f"a DTMF digit lasts {MIN_TONE_MS}-{MAX_TONE_MS} ms with a gap of "
                             f"0-{MAX_GAP_MS} ms, not {duration_ms} and {gap_ms}")
        if not 0 <= payload_type < 128 or not 0 <= volume < 64:
            raise ValueError(f"bad payload type {payload_type} or volume {volume}")
        self.digits = digits
        self.payload_type = payload_type
        self.volume = volume
        self.samples = TELEPHONE_EVENT_CLOCK * packet_ms // 1000  # one packet time
        self.tone = -(-duration_ms // packet_ms)  # packet times a key is held (rounded up)
        self.gap = max(END_PACKETS - 1, round(gap_ms / packet_ms))
        self._digit = 0  # index into digits
        self._slot = 0  # packet time within the current digit
        self._last = len(digits) - 1  # the last digit to play (``stop`` brings it forward)
        self._timestamp = 0  # the current event's RTP timestamp
        self.packets = 0

    @property
    def done(self) -> bool:
        return self._digit > self._last

    @property
    def sent(self) -> str:
        """The digits whose events have begun."""
        return self.digits[: self._digit + (1 if self._slot else 0)]

    def stop(self) -> None:
        """Play no digit after the current one (a digit begun is ended properly)."""
        self._last = self._digit if self._slot else self._digit - 1

    def next(self, packetizer: Packetizer) -> bytes | None:
        """The packet for this packet time (numbered by ``packetizer``, whose clock it moves
        on one packet time), or None: a packet time of a gap, or done, for the stream to fill
        (a silence packet, or ``packetizer.skip()``)."""
        if self.done:
            return None
        slot = self._slot
        if slot == 0:
            self._timestamp = packetizer.timestamp
        end_at = self.tone + END_PACKETS - 1
        data: bytes | None = None
        if slot < end_at:
            tone = min(slot + 1, self.tone)
            event = TelephoneEvent(EVENT_CODES.index(self.digits[self._digit]),
                                   slot + 1 >= self.tone, self.volume, tone * self.samples)
            data = packetizer.packet(event.to_bytes(), marker=slot == 0,
                                     payload_type=self.payload_type,
                                     timestamp=self._timestamp).to_bytes()
            self.packets += 1
        self._slot += 1
        # the last digit ends with its end packets; the others with their gap
        if self._slot >= (end_at if self._digit == self._last else self.tone + self.gap):
            self._digit += 1
            self._slot = 0
        return data
