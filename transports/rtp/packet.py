"""RTP packets (RFC 3550), sans-I/O: parse bytes into an ``RtpPacket`` and serialize it back, plus
the ``Packetizer`` that numbers an outbound stream (sequence, timestamp, SSRC, marker)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

HEADER = struct.Struct("!BBHII")
RTP_VERSION = 2
MAX_PACKET = 1500  # one Ethernet MTU; anything bigger on a voice stream is not ours


class RtpParseError(ValueError):
    """The datagram is not a well-formed RTP packet; the receiver drops and counts it."""


@dataclass(slots=True, frozen=True)
class RtpPacket:
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False
    csrcs: tuple[int, ...] = ()

    def to_bytes(self) -> bytes:
        """Serialize (no extension header, no padding: we never send either)."""
        b0 = (RTP_VERSION << 6) | len(self.csrcs)
        b1 = (0x80 if self.marker else 0) | (self.payload_type & 0x7F)
        head = HEADER.pack(b0, b1, self.sequence & 0xFFFF, self.timestamp & 0xFFFFFFFF, self.ssrc)
        if self.csrcs:
            head += struct.pack(f"!{len(self.csrcs)}I", *self.csrcs)
        return head + self.payload


def parse_rtp(data: bytes) -> RtpPacket:
    """Parse one datagram; raises ``RtpParseError`` for anything malformed.

    Header extensions are skipped, padding is removed; RTCP (payload types 72–76 with the
    marker bit, i.e. packet types 200–204) is rejected so it never reaches a codec.
    """
    n = len(data)
    if n < HEADER.size:
        raise RtpParseError(f"short packet ({n} bytes)")
    if n > MAX_PACKET:
        raise RtpParseError(f"oversized packet ({n} bytes)")
    b0, b1, seq, ts, ssrc = HEADER.unpack_from(data)
    if b0 >> 6 != RTP_VERSION:
        raise RtpParseError(f"RTP version {b0 >> 6}")
    if 200 <= b1 <= 204:
        raise RtpParseError("RTCP packet on the RTP port")
    cc = b0 & 0x0F
    off = HEADER.size + 4 * cc
    if off > n:
        raise RtpParseError("CSRC list runs past the end")
    csrcs = struct.unpack_from(f"!{cc}I", data, HEADER.size) if cc else ()
    if b0 & 0x10:  # extension header: 16-bit profile, 16-bit length in 32-bit words
        if off + 4 > n:
            raise RtpParseError("extension header runs past the end")
        (words,) = struct.unpack_from("!H", data, off + 2)
        off += 4 + 4 * words
        if off > n:
            raise RtpParseError("extension runs past the end")
    end = n
    if b0 & 0x20:
        pad = data[-1]
        if pad == 0 or off + pad > n:
            raise RtpParseError(f"bad padding length {pad}")
        end -= pad
    return RtpPacket(
        payload_type=b1 & 0x7F,
        sequence=seq,
        timestamp=ts,
        ssrc=ssrc,
        payload=bytes(data[off:end]),
        marker=bool(b1 & 0x80),
        csrcs=tuple(csrcs),
    )


class Packetizer:
    """Numbers one outbound stream: a random SSRC and random starting sequence and timestamp
    (RFC 3550 §5.1, so a restarted call is not mistaken for the old one)."""

    def __init__(self, payload_type: int, samples_per_packet: int = 160,
                 ssrc: int | None = None) -> None:
        rnd = random.SystemRandom()
        self.payload_type = payload_type
        self.samples_per_packet = samples_per_packet
        self.ssrc = ssrc if ssrc is not None else rnd.getrandbits(32)
        self.sequence = rnd.getrandbits(16)
        self.timestamp = rnd.getrandbits(32)
        self.packets = 0
        self.octets = 0

    def packet(self, payload: bytes, marker: bool = False, payload_type: int | None = None,
               timestamp: int | None = None) -> RtpPacket:
        """The next packet; the timestamp advances one packet's worth of samples. Another
        ``payload_type`` and ``timestamp`` make a packet of another format in the same stream
        (an RFC 4733 event keeps its start time while the clock goes on)."""
        pkt = RtpPacket(self.payload_type if payload_type is None else payload_type,
                        self.sequence, self.timestamp if timestamp is None else timestamp,
                        self.ssrc, payload, marker)
        self.sequence = (self.sequence + 1) & 0xFFFF
        self.timestamp = (self.timestamp + self.samples_per_packet) & 0xFFFFFFFF
        self.packets += 1
        self.octets += len(payload)
        return pkt

    def skip(self, packets: int = 1) -> None:
        """Advance the clock without sending (silence suppression): the timestamp jumps, the
        sequence does not, so the receiver sees a pause, not a loss."""
        self.timestamp = (self.timestamp + packets * self.samples_per_packet) & 0xFFFFFFFF
