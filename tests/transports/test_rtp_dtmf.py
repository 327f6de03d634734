"""RFC 4733 DTMF: one key press per event however many repeats and end packets arrive."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.rtp.dtmf import (
    DtmfParseError,
    DtmfReceiver,
    TelephoneEvent,
    parse_telephone_event,
)


def press(rx: DtmfReceiver, ts: int, event: int, durations: list[int], ends: int = 3) -> list:
    out = []
    for d in durations:
        out += rx.feed(ts, TelephoneEvent(event, False, 10, d).to_bytes())
    for _ in range(ends):
        out += rx.feed(ts, TelephoneEvent(event, True, 10, durations[-1] + 160).to_bytes())
    return out


def test_repeated_end_packets_give_one_digit() -> None:
    rx = DtmfReceiver()
    out = press(rx, 1000, 5, [160, 320, 480])
    assert [(k.digit, k.duration_ms) for k in out] == [("5", 80)]
    assert rx.repeats == 2


def test_consecutive_presses_of_the_same_key_are_two_digits() -> None:
    rx = DtmfReceiver()
    out = press(rx, 1000, 1, [160]) + press(rx, 3000, 1, [160]) + press(rx, 5000, 11, [160])
    assert "".join(k.digit for k in out) == "11#"


def test_an_event_whose_end_packets_were_lost_is_reported_when_the_next_starts() -> None:
    rx = DtmfReceiver()
    out = press(rx, 1000, 7, [160, 320], ends=0) + press(rx, 4000, 8, [160])
    assert "".join(k.digit for k in out) == "78"


def test_parse() -> None:
    ev = parse_telephone_event(b"\x0b\x8a\x01\x40")
    assert ev == TelephoneEvent(11, True, 10, 320) and ev.digit == "#"
    with pytest.raises(DtmfParseError):
        parse_telephone_event(b"\x01\x02")


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(min_size=4, max_size=8)),
                max_size=100))
def test_any_event_stream_reports_each_timestamp_at_most_once(packets) -> None:
    rx = DtmfReceiver()
    seen = []
    for ts, payload in packets:
        for k in rx.feed(ts, payload):
            seen.append(k)
    assert len(seen) <= len({ts for ts, _ in packets})
