"""The fuzz targets of ``benchmarks/fuzz.py``: one per sans-I/O parser, each calling the parser
the way its shell does, swallowing only the errors the parser's module documents, and checking
the invariants that are cheap to check (what parses re-serializes and re-parses to the same
thing; an incremental parser gives the same result however its input is split).

A target's check raises for a finding: :class:`Violation` when an invariant breaks, any other
exception when the parser raised something its module does not document. ``fuzz.py`` adds the
third kind, a hang: an input that takes longer than the limit (1 s of CPU by default).

Documented errors, per target (from each module's docstrings):

=========  =====================================  ===============================================
target     parser                                 may raise (anything else is a crash)
=========  =====================================  ===============================================
wire       stages/asr/wire.py ``Decoder.feed``    nothing: bad input sets ``Decoder.error`` (a
                                                  ``ProtocolError``); its catch-all for parser
                                                  bugs ("undecodable frame: …") counts as a crash
sip        transports/sip/message.py              ``SipParseError`` (status 400, 505 or 513)
           ``parse_sip``
sdp        transports/sip/sdp.py ``parse_offer``,  ``SdpError`` (the UAS answers 488)
           ``choose``
rtp        transports/rtp/packet.py ``parse_rtp``  ``RtpParseError``
dtmf       transports/rtp/dtmf.py ``DtmfReceiver`` ``DtmfParseError``
           ``.feed``, ``parse_telephone_event``
twilio     transports/twilio/messages.py          ``TwilioMessageError``
           ``parse_message``, ``parse_command``
browser    transports/websocket/codec.py          nothing: bad input is a ``BadMessage``
           ``decode`` (binary and text)
sse        stages/llm/sse.py ``SSEParser.feed``,   ``SSEProtocolError`` (a line or an event over
           ``.close``                             ``max_size``)
=========  =====================================  ===============================================

Incremental parsers (``wire``, ``sse``) take their input as :func:`split_input` lays it out, so
the fuzzer chooses the split points along with the bytes.

Byte mutations alone rarely reach two classes of bug that text protocols have: characters
that Python's ``str`` methods accept and ``int()`` or the grammar does not (``"²".isdigit()``,
``"\x85"`` and ``"\u2028"`` for ``strip()`` and ``splitlines()``), and JSON that the standard
library parses into trouble (a thousand nested arrays, ``Infinity``, ``1e999``). Coverage cannot
guide the fuzzer to them (the checks are C calls it does not see), so the text and JSON targets
add :data:`TEXT_MUTATIONS` and :data:`JSON_MUTATIONS` to libFuzzer's own, a structure-aware
custom mutator that ``fuzz.py`` applies to one mutated input in three.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

Check = Callable[[bytes], None]
Mutation = Callable[[bytes, random.Random, int], bytes]  # (input, rng, max_size) -> input


class Violation(Exception):
    """A parser accepted an input but broke an invariant it promises. ``key`` names the
    invariant (findings with the same key are one finding)."""

    def __init__(self, key: str, detail: str = "") -> None:
        super().__init__(f"{key}: {detail}" if detail else key)
        self.key = key


@dataclass(slots=True, frozen=True)
class Target:
    name: str
    parser: str  # what is fuzzed, for the table
    imports: tuple[str, ...]  # the parser modules, imported under coverage instrumentation
    instrument: tuple[str, ...]  # packages whose code gives coverage feedback
    documented: tuple[str, ...]  # the exceptions the module documents
    build: Callable[[], Check]
    max_len: int = 4096  # the largest input libFuzzer makes (it grows towards it)
    incremental: bool = False  # seeds are raw streams, laid out by split_input
    mutations: tuple[Mutation, ...] = ()  # structure-aware mutations on top of libFuzzer's

    def seed_inputs(self, raw: bytes) -> list[bytes]:
        """The fuzz inputs a captured seed becomes: itself, or for an incremental parser the
        stream whole, cut at a few uneven points, and (a short one) byte by byte."""
        if not self.incremental:
            return [raw]
        cuts = [bytes([0]) + raw, bytes([3, 6, 0, 40]) + raw]
        return cuts + [bytes([1, 0]) + raw] if len(raw) <= 256 else cuts

    def mutate(self, data: bytes, rnd: random.Random, max_size: int) -> bytes:
        """One of the target's own mutations (the stream only, for an incremental target)."""
        if not self.mutations:
            return data
        head = 1 + (data[0] & 0x0F) if self.incremental and data else 0
        head = min(head, len(data))
        body = rnd.choice(self.mutations)(data[head:], rnd, max(0, max_size - head))
        return (data[:head] + body)[:max_size]


MAX_CUTS = 64


def split_input(data: bytes) -> tuple[int, list[bytes], bytes]:
    """An incremental target's input: byte 0 holds ``k`` (low 4 bits) and a target-specific
    variant (high 4 bits); the next ``k`` bytes are chunk sizes (``b + 1``, 1 to 256 bytes); the
    rest is the stream, cut into chunks of those sizes in turn (``k = 0``: one chunk), at most
    ``MAX_CUTS`` times: what follows the last cut is one chunk. (A split bug is local to a
    cut, and the bound keeps an input's cost — and the fuzzer's pull towards inputs that loop
    more often — from growing with its length.) Returns (variant, chunks, stream)."""
    if not data:
        return 0, [b""], b""
    k, variant = data[0] & 0x0F, data[0] >> 4
    sizes = [b + 1 for b in data[1 : 1 + k]]
    stream = data[1 + k :]
    if not sizes:
        return variant, [stream], stream
    chunks, pos = [], 0
    while pos < len(stream) and len(chunks) < MAX_CUTS:
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(stream[pos : pos + size])
        pos += size
    if pos < len(stream):
        chunks.append(stream[pos:])
    return variant, chunks or [b""], stream


# --- structure-aware mutations -----------------------------------------------------------------

# characters str.isdigit() (or isdecimal/isnumeric) accepts that are no ASCII digit
_ODD_DIGITS = [c.encode() for c in ("\u00b2", "\u00b9", "\u0663", "\uff11", "\u2070", "\U0001d7d8",
                                    "\u07c0", "\u0e53", "\u2460")]
# what str.strip()/split()/splitlines() treat as space or a line break, beyond " \t\r\n"
_ODD_SPACES = [c.encode() for c in ("\x85", "\u2028", "\u2029", "\xa0", "\x0b", "\x0c", "\x1c",
                                    "\x1e", "\u3000", "\ufeff", "\x00")]
_JSON_ODD_VALUES = [b"Infinity", b"-Infinity", b"NaN", b"1e999", b"-1e999", b"1e-999", b"-0",
                    b"1" * 4301, b"123456789012345678901234567890", b"1.5", b"true", b"null",
                    b"[]", b"{}", b'""', b'"\\ud800"', b'"\\u0000"']
_DIGIT = re.compile(rb"[0-9]")
_SEPARATOR = re.compile(rb"[\r\n:= ]")
_LINE = re.compile(rb"[^\r\n]{0,200}\r?\n")
_JSON_VALUE = re.compile(rb'-?[0-9][0-9.eE+-]*|"(?:[^"\\]|\\.)*"|true|false|null')


def _at(data: bytes, rnd: random.Random, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
    """A match at or after a random point (or the first one): cheap on any input size."""
    return pattern.search(data, rnd.randrange(len(data) + 1)) or pattern.search(data)


def odd_digit(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """An ASCII digit becomes a Unicode digit, superscript or numeral."""
    m = _at(data, rnd, _DIGIT)
    pos = m.start() if m else rnd.randrange(len(data) + 1)
    return data[:pos] + rnd.choice(_ODD_DIGITS) + data[pos + (1 if m else 0) :]


def odd_space(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """A Unicode space or line separator, next to a line end, a colon or anywhere."""
    m = _at(data, rnd, _SEPARATOR) if rnd.random() < 0.7 else None
    pos = m.start() + rnd.choice((0, 1)) if m else rnd.randrange(len(data) + 1)
    return data[:pos] + rnd.choice(_ODD_SPACES) + data[pos:]


def line_ends(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """Every line end as one of CRLF, LF, CR, LFLF, CRCR."""
    return re.sub(rb"\r\n|\r|\n", rnd.choice((b"\r\n", b"\n", b"\r", b"\n\n", b"\r\r")), data)


def repeat_slice(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """A line (or any slice) repeated until the input nears ``max_size``: what reaches the
    count and size limits (too many headers, an over-long line, a message over its cap)."""
    line = _at(data, rnd, _LINE) if rnd.random() < 0.7 else None
    if line is not None:
        a, b = line.span()
    else:
        a = rnd.randrange(len(data) + 1)
        b = min(len(data), a + rnd.randint(1, 16))
    piece = data[a:b] or b"x"
    # mostly a little longer (a count limit is soon reached), sometimes up to max_size
    room = max(0, min(max_size, len(data) + rnd.choice((256, 1024, 4096, max_size))) - len(data))
    times = rnd.randint(2, max(2, room // len(piece)))
    return (data[:b] + piece * times + data[b:])[:max_size]


def json_odd_value(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """A JSON number or string becomes a value the standard parser takes badly (or well)."""
    m = _at(data, rnd, _JSON_VALUE)
    if m is None:
        return data
    return data[: m.start()] + rnd.choice(_JSON_ODD_VALUES) + data[m.end() :]


def json_deep(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """A value nested hundreds to thousands of arrays or objects deep."""
    # around the interpreter's recursion limit (1000), where json.loads starts to fail
    depth = rnd.choice((50, 500, 900, 990, 1000, 1100, 3000))
    opener, closer = rnd.choice(((b"[", b"]"), (b'{"a":', b"}")))
    depth = max(1, min(depth, (max_size - len(data)) // (len(opener) + 1)))
    m = _at(data, rnd, _JSON_VALUE)
    value = m.group() if m else b"0"
    nest = opener * depth + value + (closer * depth if rnd.random() < 0.5 else b"")
    if m is None:
        return nest
    return data[: m.start()] + nest + data[m.end() :]


def wire_frame(data: bytes, rnd: random.Random, max_size: int) -> bytes:
    """One frame of a well-framed stream gets another type, or JSON trouble in its payload,
    with its length fixed up (so the mutation reaches the payload parsers, not the framing)."""
    frames, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        if n < 5 or pos + 4 + n > len(data):
            break
        frames.append((pos, n))
        pos += 4 + n
    if not frames:
        return data
    pos, n = rnd.choice(frames)
    kind, stream, payload = data[pos + 4], data[pos + 5 : pos + 9], data[pos + 9 : pos + 4 + n]
    how = rnd.randrange(3)
    if how == 0:
        payload = json_deep(payload or b"{}", rnd, max(16, max_size - len(data)))
    elif how == 1:
        payload = json_odd_value(payload, rnd, max_size)
    else:
        kind = rnd.randrange(10)
    frame = (len(payload) + 5).to_bytes(4, "big") + bytes([kind]) + stream + payload
    return (data[:pos] + frame + data[pos + 4 + n :])[:max_size]


TEXT_MUTATIONS: tuple[Mutation, ...] = (odd_digit, odd_space, line_ends, repeat_slice)
JSON_MUTATIONS: tuple[Mutation, ...] = (json_odd_value, json_deep, odd_digit, odd_space,
                                        repeat_slice)


def _same(a: object, b: object) -> bool:
    """Equality that treats two NaNs (JSON's ``NaN`` in OPEN options) as equal."""
    if a == b:
        return True
    try:
        return repr(a) == repr(b)
    except RecursionError:  # too deep to tell: not a finding of the parser's
        return True


# --- ASR wire framing --------------------------------------------------------------------------


def _wire() -> Check:
    from stages.asr import wire

    def decode(max_message: int, chunks: list[bytes]) -> tuple[wire.Decoder, list[object]]:
        dec = wire.Decoder(max_message)
        out: list[object] = []
        for chunk in chunks:
            out += dec.feed(chunk)
            if dec.error is None and dec.buffered >= 4 + max_message:
                raise Violation("decoder buffered more than one frame",
                                f"{dec.buffered} bytes with max_message {max_message}")
        return dec, out

    def check(data: bytes) -> None:
        variant, chunks, stream = split_input(data)
        # variant 0: the default 1 MiB limit; else a small one, so the limit is exercised too
        max_message = wire.MAX_MESSAGE if variant == 0 else 5 + 16 * variant
        whole, messages = decode(max_message, [stream])
        split, split_messages = decode(max_message, chunks)
        if whole.error is not None and str(whole.error).startswith("undecodable frame"):
            raise Violation("Decoder's catch-all hid a parser exception", str(whole.error))
        if len(split_messages) != len(messages) or not all(
                _same(a, b) for a, b in zip(split_messages, messages, strict=True)):
            raise Violation("split feeding decoded other messages than one feed")
        if str(split.error) != str(whole.error):
            raise Violation("split feeding ended in another error than one feed",
                            f"{split.error} vs {whole.error}")
        if split.error is not None and split.feed(wire.encode_end(1)):
            raise Violation("a decoder in error decoded more input")
        for msg in messages:
            try:
                frame = wire.encode(msg)  # type: ignore[arg-type]
            except Exception as exc:
                raise Violation("a decoded message does not re-encode", repr(exc)) from None
            if isinstance(msg, wire.Open) and len(frame) - wire.HEADER_SIZE > wire.MAX_TEXT:
                continue  # json.dumps escapes more than the client did: over the text limit
            again = wire.Decoder().feed(frame)
            if len(again) != 1 or not _same(again[0], msg):
                raise Violation("a re-encoded message decodes differently", repr(msg)[:200])

    return check


# --- SIP ---------------------------------------------------------------------------------------


def _sip() -> Check:
    from transports.sip import message as sip

    def view(msg: sip.SipMessage) -> tuple[object, ...]:
        headers = [(k, v) for k, v in msg.headers if k.lower() != "content-length"]
        return msg.method, msg.uri, msg.status, msg.reason, headers, msg.body

    def reparses(msg: sip.SipMessage, what: str) -> sip.SipMessage | None:
        """``msg`` serialized and parsed again, or None when it is past a parser limit."""
        data = msg.to_bytes()
        headers = 1 + sum(k.lower() != "content-length" for k, _ in msg.headers)
        if len(data) > sip.MAX_MESSAGE_BYTES or headers > sip.MAX_HEADERS:
            return None  # CRLF line ends and our Content-Length can push it over a limit
        try:
            return sip.parse_sip(data)
        except sip.SipParseError as err:
            raise Violation(f"{what} does not parse", str(err)) from None

    def check(data: bytes) -> None:
        try:
            msg = sip.parse_sip(data)
        except sip.SipParseError as err:
            if err.status not in (400, 505, 513):
                raise Violation("SipParseError with an undocumented status", str(err)) from None
            # what the UAS does with it: answer with whatever headers could be read
            sip.response_to(err.partial or sip.SipMessage(), err.status, err.reason).to_bytes()
            return
        again = reparses(msg, "a parsed message, serialized,")
        if again is not None and view(again) != view(msg):
            diff = [(a, b) for a, b in zip(view(msg), view(again), strict=True) if a != b]
            raise Violation("a parsed message re-parses differently", repr(diff)[:300])
        if msg.is_request:
            resp = sip.response_to(msg, 200, "OK", "a1b2c3", [("Contact", "<sip:v@127.0.0.1>")])
            again = reparses(resp, "a response to a parsed request")
            if again is not None and (again.status, again.call_id) != (200, msg.call_id):
                raise Violation("a response to a parsed request re-parses differently")

    return check


def _sdp() -> Check:
    from transports.sip import sdp

    def check(data: bytes) -> None:
        try:
            offer = sdp.parse_offer(data)
        except sdp.SdpError:
            return
        if not 0 < offer.port < 65536 or not offer.address:
            raise Violation("an accepted offer has no usable port or address", repr(offer))
        if not all(0 <= pt < 128 for pt in offer.payload_types):
            raise Violation("an accepted offer lists a payload type outside 0-127")
        try:
            answer = sdp.choose(offer)
        except sdp.SdpError:
            return
        if answer.payload_type not in offer.payload_types or answer.codec not in ("PCMU", "PCMA"):
            raise Violation("the chosen codec is not one the offer lists", repr(answer))
        body = sdp.build_answer(answer, "127.0.0.1", 40000, session_id=1)
        try:
            again = sdp.choose(sdp.parse_offer(body))
        except sdp.SdpError as err:
            raise Violation("our answer to an accepted offer does not parse", str(err)) from None
        if again != answer:
            raise Violation("our answer re-parses to another codec choice", f"{again} vs {answer}")

    return check


# --- RTP and RFC 4733 --------------------------------------------------------------------------


def _rtp() -> Check:
    from transports.rtp import packet as rtp

    def check(data: bytes) -> None:
        try:
            pkt = rtp.parse_rtp(data)
        except rtp.RtpParseError:
            return
        if not 0 <= pkt.payload_type < 128 or len(pkt.csrcs) > 15:
            raise Violation("a parsed packet has an impossible header", repr(pkt)[:200])
        out = pkt.to_bytes()
        if not data[0] & 0x30 and out != data:  # no extension, no padding: byte for byte
            raise Violation("a plain packet does not re-serialize to its bytes")
        if rtp.parse_rtp(out) != pkt:
            raise Violation("a parsed packet re-parses differently")

    return check


def _dtmf() -> Check:
    from transports.rtp import dtmf

    def check(data: bytes) -> None:
        """``data``: records of (timestamp u16, length byte & 7, payload), fed in order."""
        rx = dtmf.DtmfReceiver()
        pos = 0
        while pos + 3 <= len(data):
            ts = int.from_bytes(data[pos : pos + 2], "big")
            n = data[pos + 2] & 7
            payload = data[pos + 3 : pos + 3 + n]
            pos += 3 + n
            try:
                ev = dtmf.parse_telephone_event(payload)
            except dtmf.DtmfParseError:
                ev = None
            if ev is not None and dtmf.parse_telephone_event(ev.to_bytes()) != ev:
                raise Violation("a parsed event re-parses differently", repr(ev))
            try:
                presses = rx.feed(ts, payload)
            except dtmf.DtmfParseError:
                if ev is not None:
                    raise Violation("feed refused a payload the parser accepts") from None
                continue
            if ev is None:
                raise Violation("feed accepted a payload the parser refuses")
            if len(presses) > 2 or any(p.duration_ms < 0 or not p.digit for p in presses):
                raise Violation("feed reported more than two presses or a bad one",
                                repr(presses))

    return check


# --- Twilio media streams ----------------------------------------------------------------------


def _twilio() -> Check:
    from transports.twilio import messages as tw

    def check(data: bytes) -> None:
        # websockets hands the server str for text frames and bytes for binary ones; the test
        # caller (parse_command) gets the bot's text frames
        text = data.decode("utf-8", "replace")
        for raw, parse in ((data, tw.parse_message), (text, tw.parse_message),
                           (text, tw.parse_command)):
            try:
                msg = parse(raw)
            except tw.TwilioMessageError:
                continue
            out = msg.to_json()
            if len(out) > tw.MAX_MESSAGE_CHARS:
                continue  # json.dumps' \u escapes can outgrow the sender's message
            try:
                again = parse(out)
            except tw.TwilioMessageError as err:
                raise Violation(f"{type(msg).__name__}.to_json() does not parse",
                                str(err)) from None
            if again != msg:
                raise Violation(f"{type(msg).__name__} re-parses differently",
                                repr(msg)[:200])

    return check


# --- the browser protocol ----------------------------------------------------------------------


def _browser() -> Check:
    from transports.websocket import codec

    def check(data: bytes) -> None:
        m = codec.decode(data)  # a binary message
        if isinstance(m, codec.AudioMessage):
            if codec.encode_audio(m.pcm) != data:
                raise Violation("decoded audio does not re-encode to its bytes")
        elif not isinstance(m, codec.BadMessage):
            raise Violation("a binary message decoded to something other than audio", repr(m))
        t = codec.decode(data.decode("utf-8", "replace"))  # a text message (valid UTF-8)
        if isinstance(t, codec.ControlMessage):
            if t.type not in codec.CLIENT_EVENTS or t.data.get("type") != t.type:
                raise Violation("a control message of an unknown type", t.type[:40])
            try:
                text = codec.encode_event(t.data)
            except Exception as exc:
                raise Violation("a decoded event does not re-encode", repr(exc)) from None
            if len(text) <= codec.MAX_TEXT_BYTES:
                again = codec.decode(text)
                if not isinstance(again, codec.ControlMessage) or again.type != t.type:
                    raise Violation("a re-encoded event decodes differently", repr(again)[:200])
        elif isinstance(t, codec.BadMessage):
            if len(t.reason) > 300:  # the reason goes to the client: it never echoes its input
                raise Violation("an error reason of more than 300 characters", t.reason[:80])
        else:
            raise Violation("a text message decoded to something other than an event", repr(t))

    return check


# --- Server-Sent Events ------------------------------------------------------------------------


def _sse() -> Check:
    from stages.llm import sse

    def run(chunks: list[bytes], max_size: int, empty_feeds: bool) -> tuple[object, ...] | None:
        """The events, last id and retry, or None when the stream broke a bound."""
        parser = sse.SSEParser(max_size)
        events = []
        try:
            for chunk in chunks:
                events += parser.feed(chunk)
                if empty_feeds:
                    events += parser.feed(b"")
            events += parser.close()
        except sse.SSEProtocolError:
            return None
        for e in events:
            if "\r" in e.data or "\r" in e.event or "\n" in e.event or "\n" in e.id:
                raise Violation("an event holds a line break in a field", repr(e)[:200])
        return events, parser.last_id, parser.retry_ms

    def check(data: bytes) -> None:
        variant, chunks, stream = split_input(data)
        # variant bits 1-3 pick a small max_size (so the bounds are exercised), bit 0 adds
        # empty feeds between chunks (a chunked body with an empty chunk)
        max_size = sse.MAX_SIZE if variant >> 1 == 0 else 8 * (variant >> 1)
        whole = run([stream], max_size, False)
        split = run(chunks, max_size, bool(variant & 1))
        if (whole is None) != (split is None):
            raise Violation("split feeding and one feed disagree on the size bound",
                            f"one feed {'raised' if whole is None else 'passed'}")
        if whole != split:
            raise Violation("split feeding parsed other events than one feed")

    return check


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("wire", "ASR wire framing (Decoder.feed)", ("stages.asr.wire",), ("stages.asr.wire",),
           (), _wire, max_len=2048, incremental=True, mutations=(wire_frame,)),
    Target("sip", "SIP messages (parse_sip)", ("transports.sip.message",), ("transports.sip",),
           ("SipParseError",), _sip, max_len=17 * 1024, mutations=TEXT_MUTATIONS),
    Target("sdp", "SDP offers (parse_offer, choose)", ("transports.sip.sdp",),
           ("transports.sip",), ("SdpError",), _sdp, mutations=TEXT_MUTATIONS),
    Target("rtp", "RTP packets (parse_rtp)", ("transports.rtp.packet",), ("transports.rtp",),
           ("RtpParseError",), _rtp, max_len=1600),
    Target("dtmf", "RFC 4733 events (DtmfReceiver.feed)", ("transports.rtp.dtmf",),
           ("transports.rtp",), ("DtmfParseError",), _dtmf),
    Target("twilio", "Twilio media-stream messages", ("transports.twilio.messages",),
           ("transports.twilio", "transports.jsonwire"), ("TwilioMessageError",), _twilio,
           max_len=8192, mutations=JSON_MUTATIONS),
    Target("browser", "browser WebSocket protocol (codec.decode)",
           ("transports.websocket.codec",), ("transports.websocket", "transports.jsonwire"),
           (), _browser, max_len=8192, mutations=JSON_MUTATIONS),
    Target("sse", "Server-Sent Events (SSEParser)", ("stages.llm.sse",), ("stages.llm.sse",),
           ("SSEProtocolError",), _sse, max_len=2048, incremental=True,
           mutations=TEXT_MUTATIONS),
)}
