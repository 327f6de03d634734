"""RFC 4733 telephone-events (DTMF over RTP), sans-I/O: parse the 4-byte event payload and turn
a stream of event packets into one digit per key press.

A sender repeats each event's packets while the key is held and sends the end packet three
times (RFC 4733 §2.5.1.4); all of them share the event's RTP timestamp, which is how the
repeats are recognised and reported once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EVENT_CODES = "0123456789*#ABCD"
TELEPHONE_EVENT_CLOCK = 8000


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
