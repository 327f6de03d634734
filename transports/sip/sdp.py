"""SDP offer/answer (RFC 3264) for one G.711 audio stream, sans-I/O: read the caller's offer,
pick PCMU or PCMA and telephone-event, and write our answer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

STATIC_CODECS = {0: "PCMU", 8: "PCMA"}


class SdpError(ValueError):
    """The offer cannot be answered (no audio stream, no codec in common): a 488."""


@dataclass(slots=True, frozen=True)
class MediaOffer:
    address: str
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
            if len(fields) >= 3 and fields[0] == "IN" and fields[1] in ("IP4", "IP6"):
                if media is None:
                    session_addr = fields[2].split("/")[0]
                else:
                    addr = fields[2].split("/")[0]
        elif kind == "a" and media is not None:
            name, _, arg = value.partition(":")
            if name == "rtpmap":
                pt, _, enc = arg.partition(" ")
                if pt.isdigit():
                    rtpmap[int(pt)] = enc.strip()
            elif name == "ptime" and arg.strip().isdigit():
                ptime = int(arg.strip())
    if media is None:
        raise SdpError("no audio stream in the offer")
    if not media[1].split("/")[0].isdigit():
        raise SdpError(f"bad media port {media[1]!r}")
    port = int(media[1].split("/")[0])
    if not 0 < port < 65536:
        raise SdpError("the audio stream is disabled (port 0) or out of range")
    if not media[2].startswith("RTP/AVP"):
        raise SdpError(f"unsupported media profile {media[2]} (only RTP/AVP; no SRTP yet)")
    pts = tuple(int(p) for p in media[3:] if p.isdigit() and int(p) < 128)
    address = addr or session_addr
    if not address:
        raise SdpError("no connection address (c=) in the offer")
    return MediaOffer(address, port, pts, rtpmap, ptime)


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
