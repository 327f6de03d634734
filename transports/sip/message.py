"""SIP messages (RFC 3261 §7), sans-I/O: parse one datagram into a request or a response, and
serialize one back. Malformed input raises ``SipParseError`` carrying the status code the UAS
should answer with (400, 505, 513) and whatever headers could be read to address that answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transports.sip.digits import decimal

# 16 KiB: a generous INVITE with a large SDP is ~2 KiB; the cap bounds what one datagram may
# make us allocate and parse, and bigger requests get 513 as RFC 3261 §21.5.14 intends.
MAX_MESSAGE_BYTES = 16 * 1024
MAX_HEADERS = 128
SIP_VERSION = "SIP/2.0"

COMPACT_FORMS = {
    "i": "Call-ID", "f": "From", "t": "To", "v": "Via", "m": "Contact", "l": "Content-Length",
    "c": "Content-Type", "k": "Supported", "s": "Subject", "e": "Content-Encoding",
    "o": "Event", "r": "Refer-To", "u": "Allow-Events", "x": "Session-Expires",
}
REQUIRED_REQUEST_HEADERS = ("Via", "From", "To", "Call-ID", "CSeq")
_CANONICAL = {n.lower(): n for n in (
    "Call-ID", "From", "To", "Via", "Contact", "Content-Length", "Content-Type", "CSeq",
    "Max-Forwards", "Allow", "Supported", "User-Agent", "Server", "Record-Route", "Route",
    "Accept", "Require", "Subject", "Expires", "Unsupported", "Retry-After", "Warning",
)}


def canonical_name(name: str) -> str:
    low = name.strip().lower()
    if low in COMPACT_FORMS:
        return COMPACT_FORMS[low]
    return _CANONICAL.get(low, name.strip())


@dataclass(slots=True)
class SipMessage:
    """A request (``method`` and ``uri`` set) or a response (``status`` set). Header order and
    repeats are kept, since Via and Record-Route order matters."""

    method: str = ""
    uri: str = ""
    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return bool(self.method)

    def header(self, name: str, default: str = "") -> str:
        want = canonical_name(name).lower()
        for k, v in self.headers:
            if k.lower() == want:
                return v
        return default

    def header_values(self, name: str) -> list[str]:
        want = canonical_name(name).lower()
        return [v for k, v in self.headers if k.lower() == want]

    def set_header(self, name: str, value: str) -> None:
        want = canonical_name(name).lower()
        self.headers = [(k, v) for k, v in self.headers if k.lower() != want]
        self.headers.append((canonical_name(name), value))

    @property
    def call_id(self) -> str:
        return self.header("Call-ID")

    @property
    def cseq(self) -> tuple[int, str]:
        """(number, method) of the CSeq header; (0, "") when absent or unreadable."""
        num, _, method = self.header("CSeq").strip().partition(" ")
        n = decimal(num)
        return (n, method.strip()) if n is not None else (0, "")

    def to_bytes(self) -> bytes:
        """Serialize with CRLF line ends and a Content-Length that matches the body."""
        if self.is_request:
            start = f"{self.method} {self.uri} {SIP_VERSION}"
        else:
            start = f"{SIP_VERSION} {self.status} {self.reason}"
        lines = [start]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


class SipParseError(ValueError):
    """What was wrong, the status a UAS answers a bad request with, and what could be parsed."""

    def __init__(self, status: int, reason: str, partial: SipMessage | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.partial = partial


def _split_head(data: bytes) -> tuple[bytes, bytes]:
    for sep in (b"\r\n\r\n", b"\n\n"):
        head, found, body = data.partition(sep)
        if found:
            return head, body
    return data, b""  # no blank line: a header-only datagram, tolerated (no body)


def _is_token(s: str) -> bool:
    return bool(s) and all(c.isalnum() or c in "-.!%*_+`'~" for c in s)


def parse_sip(data: bytes) -> SipMessage:
    """Parse one datagram; raises ``SipParseError`` for anything a UAS must not act on."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError(513, "Message Too Large", _salvage(data[:MAX_MESSAGE_BYTES]))
    data = data.lstrip(b"\r\n")  # keep-alive CRLFs before the start line are allowed
    head, body = _split_head(data)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError(400, "Bad Request (headers are not UTF-8)") from None
    lines = text.replace("\r\n", "\n").split("\n")
    start = lines[0].strip()
    msg = SipMessage()
    parts = start.split(" ", 2)
    if len(parts) != 3:
        raise SipParseError(400, "Bad Request (malformed start line)")
    if parts[0].startswith("SIP/"):
        if parts[0] != SIP_VERSION:
            raise SipParseError(505, "Version Not Supported")
        code = decimal(parts[1], max_digits=3)
        if code is None or not 100 <= code <= 699:
            raise SipParseError(400, "Bad Request (bad status code)")
        msg.status, msg.reason = code, parts[2]
    else:
        method, uri, version = parts
        if not _is_token(method) or not method.isupper():
            raise SipParseError(400, "Bad Request (bad method)")
        if version != SIP_VERSION:
            raise SipParseError(505, "Version Not Supported")
        if ":" not in uri or " " in uri:
            raise SipParseError(400, "Bad Request (bad Request-URI)")
        msg.method, msg.uri = method, uri
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t":  # folded continuation of the previous header (RFC 3261 §7.3.1)
            if not msg.headers:
                raise SipParseError(400, "Bad Request (continuation before any header)", msg)
            k, v = msg.headers[-1]
            # (onto an empty value it is the value: no leading space, or a Call-ID would
            # differ from itself re-serialized — found by benchmarks/fuzz.py)
            msg.headers[-1] = (k, f"{v} {line.strip()}".strip())
            continue
        name, colon, value = line.partition(":")
        if not colon or not _is_token(name.strip()):
            raise SipParseError(400, "Bad Request (malformed header line)", msg)
        msg.headers.append((canonical_name(name), value.strip()))
        if len(msg.headers) > MAX_HEADERS:
            raise SipParseError(400, "Bad Request (too many headers)", msg)
    _check_length(msg, body)
    if msg.is_request:
        _check_request(msg)
    return msg


def _salvage(data: bytes) -> SipMessage:
    """Best-effort headers of a message we refuse to parse, so the refusal can be addressed."""
    msg = SipMessage()
    head, _ = _split_head(data)
    for line in head.decode("utf-8", "replace").replace("\r\n", "\n").split("\n")[1:]:
        name, colon, value = line.partition(":")
        if colon and _is_token(name.strip()) and len(msg.headers) < MAX_HEADERS:
            msg.headers.append((canonical_name(name), value.strip()))
    return msg


def _check_length(msg: SipMessage, body: bytes) -> None:
    raw = msg.header("Content-Length")
    if not raw:
        msg.body = body  # allowed over UDP: the datagram ends the body
        return
    n = decimal(raw)
    if n is None:
        raise SipParseError(400, "Bad Request (Content-Length is not a number)", msg)
    if n > len(body):
        # RFC 3261 §18.3: a datagram that ends before the body does is an error
        raise SipParseError(400, "Bad Request (Content-Length larger than the body)", msg)
    msg.body = body[:n]  # bytes past the declared body are discarded (§18.3)


def _check_request(msg: SipMessage) -> None:
    for name in REQUIRED_REQUEST_HEADERS:
        if not msg.header(name):
            raise SipParseError(400, f"Missing Header: {name}", msg)
    num, method = msg.cseq
    if num <= 0 or num >= 2**31 or method != msg.method:
        raise SipParseError(400, "Bad Request (CSeq does not match the request)", msg)
    mf = msg.header("Max-Forwards")
    if mf and decimal(mf) is None:
        raise SipParseError(400, "Bad Request (Max-Forwards is not a number)", msg)


def uri_user(uri: str) -> str:
    """The user part of a SIP URI (``sip:echo@host:5060;transport=udp`` → ``echo``); "" when
    it names none. The user is compared as sent: escapes stay (RFC 3261 19.1.4)."""
    scheme, sep, rest = uri.strip().partition(":")
    if not sep or scheme.lower() not in ("sip", "sips"):
        return ""
    user, at, _ = rest.partition("@")
    return user.partition(";")[0].partition(":")[0] if at else ""


def header_tag(value: str) -> str:
    """The ``tag`` parameter of a From or To header value (``""`` when it has none). Only the
    parameters after the address count: a ``;tag=`` inside ``<...>`` belongs to the URI."""
    _, bracket, rest = value.rpartition(">")
    params = rest if bracket else value
    for param in params.split(";")[1:]:
        name, _, arg = param.partition("=")
        if name.strip().lower() == "tag":
            return arg.strip()
    return ""


def response_to(request: SipMessage, status: int, reason: str, to_tag: str = "",
                extra: list[tuple[str, str]] | None = None, body: bytes = b"") -> SipMessage:
    """A response that mirrors the request's Via, From, To, Call-ID and CSeq (RFC 3261 §8.2.6),
    adding ``to_tag`` to the To header when it has none yet."""
    headers = [(k, v) for k, v in request.headers if k in ("Via", "Record-Route")]
    for name in ("From", "To", "Call-ID", "CSeq"):
        value = request.header(name)
        if name == "To" and to_tag and value and not header_tag(value):
            value = f"{value};tag={to_tag}"
        if value:
            headers.append((name, value))
    headers += extra or []
    return SipMessage(status=status, reason=reason, headers=headers, body=body)
