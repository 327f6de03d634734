"""SDP offer/answer (RFC 3264) for one G.711 audio stream, sans-I/O: read the caller's offer,
pick PCMU or PCMA and telephone-event, and write our answer."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass, field

from transports.sip.digits import decimal

STATIC_CODECS = {0: "PCMU", 8: "PCMA"}


class SdpError(ValueError):
    """The offer cannot be answered (no audio stream, no codec in common, a malformed number,
    an address we cannot send to): a 488. Its text names the offending field, for the
    answer's Warning header."""


@dataclass(slots=True, frozen=True)
class MediaOffer:
    address: str  # a numeric unicast address, in its canonical form ("::1", never "0::1")
    port: int
    payload_types: tuple[int, ...]
    rtpmap: dict[int, str] = field(default_factory=dict)  # pt -> "PCMU/8000"
    ptime: int = 20

    def codec_name(self, pt: int) -> str:
        if pt in self.rtpmap:
            return self.rtpmap[pt].split("/")[0].upper()
        return STATIC_CODECS.get(pt, "")

    def telephone_event(self) -> int | None:
        for pt in self.payload_types:
            enc = self.rtpmap.get(pt, "").lower()
            if enc.startswith("telephone-event/8000"):
                return pt
        return None


def parse_offer(body: bytes) -> MediaOffer:
    """The first audio stream of an SDP offer."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SdpError("SDP is not UTF-8") from None
    session_addr = ""
    media: list[str] | None = None
    addr = ""
    rtpmap: dict[int, str] = {}
    ptime = 20
    for raw in text.splitlines():
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        kind, value = line[0], line[2:]
        if kind == "m":
            if media is not None:
                break  # only the first media section matters for an audio call
            fields = value.split()
            if len(fields) < 4 or fields[0] != "audio":
                continue
            media = fields
        elif kind == "c":
            fields = value.split()
            if len(fields) >= 3 and fields[0] == "IN":
                if media is None:
                    session_addr = value
                else:
                    addr = value
        elif kind == "a" and media is not None:
            name, _, arg = value.partition(":")
            if name == "rtpmap":
                pt, _, enc = arg.partition(" ")
                number = decimal(pt, max_digits=3)
                if number is None:
                    raise SdpError(f"bad payload type {pt[:16]!r} in a=rtpmap")
                rtpmap[number] = enc.strip()
            elif name == "ptime":
                number = decimal(arg.strip(), max_digits=4)
                if number is None:
                    raise SdpError(f"bad a=ptime {arg.strip()[:16]!r}")
                ptime = number
    if media is None:
        raise SdpError("no audio stream in the offer")
    port = decimal(media[1].split("/")[0], max_digits=5)
    if port is None:
        raise SdpError(f"bad media port {media[1][:16]!r}")
    if not 0 < port < 65536:
        raise SdpError("the audio stream is disabled (port 0) or out of range")
    if not media[2].startswith("RTP/AVP"):
        raise SdpError(f"unsupported media profile {media[2][:16]} (only RTP/AVP; no SRTP yet)")
    pts: list[int] = []
    for p in media[3:]:
        number = decimal(p, max_digits=3)
        if number is None:
            raise SdpError(f"bad payload type {p[:16]!r} in m=audio")
        if number < 128:
            pts.append(number)
    connection = addr or session_addr
    if not connection:
        raise SdpError("no connection address (c=) in the offer")
    return MediaOffer(connection_address(connection), port, tuple(pts), rtpmap, ptime)


def connection_address(value: str) -> str:
    """The address of a ``c=`` line's value (``IN IP4 192.0.2.1``) in canonical form. Only a
    numeric unicast address of the declared type will do: a name (``localhost``) would need a
    DNS lookup on the event loop and makes ``sendto`` fail; ``0.0.0.0`` (RFC 2543 hold) and
    multicast cannot receive a call's audio."""
    fields = value.split()
    if len(fields) < 3 or fields[1] not in ("IP4", "IP6"):
        raise SdpError(f"unsupported connection line c={value[:48]!r} (IN IP4 or IN IP6)")
    text = fields[2].split("/")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise SdpError(f"connection address {text[:48]!r} is not a numeric IP address") from None
    if ip.version != (4 if fields[1] == "IP4" else 6):
        raise SdpError(f"connection address {text[:48]!r} is not an {fields[1]} address")
    if ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise SdpError(f"connection address {text[:48]!r} cannot receive audio "
                       "(unspecified, multicast or broadcast)")
    return str(ip)


@dataclass(slots=True, frozen=True)
class MediaAnswer:
    codec: str  # "PCMU" | "PCMA"
    payload_type: int
    telephone_event: int | None


def choose(offer: MediaOffer, preference: tuple[str, ...] = ("PCMU", "PCMA")) -> MediaAnswer:
    """The first codec in ``preference`` the offer also lists (RFC 3264: answer a subset)."""
    offered = {offer.codec_name(pt): pt for pt in reversed(offer.payload_types)}
    for name in preference:
        if name in offered:
            return MediaAnswer(name, offered[name], offer.telephone_event())
    names = ", ".join(filter(None, (offer.codec_name(p) for p in offer.payload_types)))
    raise SdpError(f"no codec in common (offered: {names or 'none'}; we speak PCMU, PCMA)")


def build_answer(answer: MediaAnswer, address: str, port: int,
                 session_id: int | None = None) -> bytes:
    sid = session_id if session_id is not None else random.getrandbits(31)
    ip = "IP6" if ":" in address else "IP4"
    pts = [str(answer.payload_type)]
    lines = [
        "v=0",
        f"o=voxline {sid} {sid} IN {ip} {address}",
        "s=voxline",
        f"c=IN {ip} {address}",
        "t=0 0",
    ]
    if answer.telephone_event is not None:
        pts.append(str(answer.telephone_event))
    lines.append(f"m=audio {port} RTP/AVP {' '.join(pts)}")
    lines.append(f"a=rtpmap:{answer.payload_type} {answer.codec}/8000")
    if answer.telephone_event is not None:
        lines.append(f"a=rtpmap:{answer.telephone_event} telephone-event/8000")
        lines.append(f"a=fmtp:{answer.telephone_event} 0-16")
    lines += ["a=ptime:20", "a=sendrecv"]
    return ("\r\n".join(lines) + "\r\n").encode()
