"""SIP requests for the SIP tests, written the way sipp sends them."""

from __future__ import annotations

SDP_OFFER = (
    "v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\n"
    "t=0 0\r\nm=audio 6000 RTP/AVP 0 8 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-11,16\r\n"
)


def request(method: str, call_id: str = "abc@127.0.0.1", cseq: int = 1, body: str = "",
            to_tag: str = "", drop: tuple[str, ...] = (), content_length: int | None = None,
            content_type: str = "application/sdp", user: str = "agent") -> bytes:
    to = f"<sip:{user}@127.0.0.1:5060>" + (f";tag={to_tag}" if to_tag else "")
    headers = [
        ("Via", "SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1-0"),
        ("From", "sipp <sip:sipp@127.0.0.1:5061>;tag=42"),
        ("To", to),
        ("Call-ID", call_id),
        ("CSeq", f"{cseq} {method}"),
        ("Contact", "sip:sipp@127.0.0.1:5061"),
        ("Max-Forwards", "70"),
    ]
    if body:
        headers.append(("Content-Type", content_type))
    n = len(body.encode()) if content_length is None else content_length
    headers.append(("Content-Length", str(n)))
    lines = [f"{method} sip:{user}@127.0.0.1:5060 SIP/2.0"]
    lines += [f"{k}: {v}" for k, v in headers if k not in drop]
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()
