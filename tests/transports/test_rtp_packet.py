"""RTP packets: round trips, header extensions and padding, and malformed input always raising
``RtpParseError`` (never anything else)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.rtp.packet import Packetizer, RtpPacket, RtpParseError, parse_rtp

packets = st.builds(
    RtpPacket,
    payload_type=st.integers(0, 127).filter(lambda pt: not 72 <= pt <= 76),
    sequence=st.integers(0, 0xFFFF),
    timestamp=st.integers(0, 0xFFFFFFFF),
    ssrc=st.integers(0, 0xFFFFFFFF),
    payload=st.binary(max_size=400),
    marker=st.booleans(),
    csrcs=st.lists(st.integers(0, 0xFFFFFFFF), max_size=15).map(tuple),
)


@given(packets)
def test_round_trip(pkt: RtpPacket) -> None:
    assert parse_rtp(pkt.to_bytes()) == pkt


@given(st.binary(max_size=2000))
def test_arbitrary_bytes_parse_or_raise_rtp_parse_error(data: bytes) -> None:
    try:
        pkt = parse_rtp(data)
    except RtpParseError:
        return
    assert len(pkt.payload) <= len(data) - 12


def test_extension_and_padding_are_removed() -> None:
    head = struct.pack("!BBHII", 0x80 | 0x10 | 0x20, 0, 7, 160, 42)
    ext = struct.pack("!HH", 0xBEDE, 1) + b"\x01\x02\x03\x04"
    data = head + ext + b"abc" + b"\x00\x00\x03"
    pkt = parse_rtp(data)
    assert pkt.payload == b"abc" and pkt.sequence == 7 and pkt.ssrc == 42


@pytest.mark.parametrize("data", [
    b"",
    b"\x80\x00\x00",  # short
    struct.pack("!BBHII", 0x40, 0, 1, 1, 1) + b"x",  # version 1
    struct.pack("!BBHII", 0x8F, 0, 1, 1, 1),  # 15 CSRCs announced, none present
    struct.pack("!BBHII", 0x90, 0, 1, 1, 1) + b"\x00\x00\x00\x09",  # extension runs past end
    struct.pack("!BBHII", 0xA0, 0, 1, 1, 1) + b"ab\x09",  # padding longer than the packet
    struct.pack("!BBHII", 0xA0, 0, 1, 1, 1) + b"ab\x00",  # padding length 0
    struct.pack("!BBHII", 0x80, 200, 1, 1, 1),  # RTCP sender report
    struct.pack("!BBHII", 0x80, 0, 1, 1, 1) + bytes(2000),  # oversized
])
def test_malformed_packets_raise(data: bytes) -> None:
    with pytest.raises(RtpParseError):
        parse_rtp(data)


def test_packetizer_numbers_a_stream_and_wraps() -> None:
    p = Packetizer(0, ssrc=5)
    p.sequence, p.timestamp = 0xFFFF, 0xFFFFFF00
    a, b = p.packet(b"x" * 160, marker=True), p.packet(b"y" * 160)
    assert (a.sequence, b.sequence) == (0xFFFF, 0)
    assert b.timestamp == (a.timestamp + 160) & 0xFFFFFFFF
    assert a.marker and not b.marker and a.ssrc == b.ssrc == 5
    p.skip(3)
    c = p.packet(b"z")
    assert c.sequence == 1 and c.timestamp == (b.timestamp + 4 * 160) & 0xFFFFFFFF
    assert p.packets == 3 and p.octets == 321
