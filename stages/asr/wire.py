"""The asr-serve socket protocol as a sans-I/O codec: length-prefixed binary frames in, typed
messages out, and back. It knows nothing of sockets; the server and the clients are shells.

Frame layout (big-endian)::

    length u32 | type u8 | stream u32 | payload (length - 5 bytes)

``length`` counts everything after itself, so the smallest frame is 9 bytes on the wire.
Stream ids are chosen by the client; ``0`` is the connection itself (connection-level errors).

Client → server: OPEN (JSON options), AUDIO (raw PCM16 little-endian mono 16 kHz), END,
SHM (a shared-memory segment holding PCM16: ``size u64 | samples u64 | name utf-8``), and, on a
stream opened with ``{"events": true}``, VAD events (``event u8 | at u64 | started_at u64``:
speech started, paused or stopped at stream sample ``at``; for STOPPED the second field is where
the utterance started, for PAUSED where the voice itself stopped plus one — 0: not known).
Server → client: PARTIAL and FINAL (``end u64 | start u64 | stable u32 | flags u8 | text
utf-8``: the text covers stream samples ``[start, end)``, its first ``stable`` characters
(UTF-8 bytes' characters, as Python counts them) never change; flags: SPECULATIVE — a partial
of the utterance up to a pause, LAST — no more results follow on this stream, END_P — a ``u16``
before the text carries the model's P(a sentence ends after the last word) in 65,535ths; sent
only on a stream whose OPEN asked for it, ``{"end_p": true}``, so a client that does not know
the flag never sees it), ERROR (``code u16 | message utf-8``).

Shared-memory segments are named ``voxline-asr-<pid>-<hex>`` (:func:`shm_name`): the pid is the
client process's, so a server that knows its peer's pid (``SO_PEERCRED``) reads only segments
that peer made (:func:`shm_name_ok`), never another process's, and a name has no path in it.

Memory: a :class:`Decoder` holds at most one incomplete frame, so a connection costs at most
``max_message`` bytes of buffer (default 1 MiB ≈ 32 s of PCM16) plus whatever it was fed in one
call; a length above ``max_message`` is refused as soon as its 4 header bytes arrive, before any
payload is buffered.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any

SAMPLE_RATE = 16_000
MAX_MESSAGE = 1 << 20  # 1 MiB: 32 s of PCM16 in one AUDIO frame
MAX_TEXT = 64 << 10  # options, texts and error messages stay small

_HEADER = struct.Struct(">IBI")
HEADER_SIZE = _HEADER.size  # 9
_SHM = struct.Struct(">QQ")
_RESULT = struct.Struct(">QQIB")
_END_P = struct.Struct(">H")
END_P_SCALE = 0xFFFF
_EVENT = struct.Struct(">BQQ")
_ERROR = struct.Struct(">H")
_MAX_STREAM = 0xFFFF_FFFF
SHM_PREFIX = "voxline-asr-"
_SHM_NAME = re.compile(r"voxline-asr-([0-9]{1,10})-[0-9a-f]{8,64}")


class Kind(IntEnum):
    OPEN = 1
    AUDIO = 2
    END = 3
    SHM = 4
    PARTIAL = 5
    FINAL = 6
    ERROR = 7
    EVENT = 8


class SpeechEvent(IntEnum):
    STARTED = 1
    PAUSED = 2
    STOPPED = 3


class Flag(IntFlag):
    NONE = 0
    SPECULATIVE = 1  # a partial: the utterance up to a pause, sent before its end is confirmed
    LAST = 2  # the stream's last result: the server has released it
    END_P = 4  # the result carries the model's P(a sentence ends after its last word)


class ErrorCode(IntEnum):
    PROTOCOL = 1  # malformed frame: the connection is closed after this error
    CAPACITY = 2  # the slot pool is full: this stream is refused, the connection stays
    UNKNOWN_STREAM = 3  # AUDIO/END for a stream that is not open
    BAD_REQUEST = 4  # a well-formed frame asking for something invalid (bad options, bad shm)
    INTERNAL = 5  # the engine failed on this stream's audio
    LIMIT = 6  # a per-connection limit (streams held, audio buffered): this stream is refused
    FORBIDDEN = 7  # this peer may not use the server: the connection is closed after this error


@dataclass(slots=True, frozen=True)
class Open:
    stream: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class Audio:
    stream: int
    pcm: bytes  # PCM16 little-endian mono 16 kHz; always an even number of bytes


@dataclass(slots=True, frozen=True)
class End:
    stream: int


@dataclass(slots=True, frozen=True)
class SharedMemoryFile:
    stream: int
    name: str  # a multiprocessing.shared_memory segment name
    size: int  # bytes the client wrote into the segment
    samples: int  # PCM16 samples in those bytes (size // 2)


@dataclass(slots=True, frozen=True)
class VADEvent:
    stream: int
    event: SpeechEvent
    at: int  # stream sample
    started_at: int = 0  # STOPPED: where that utterance started; PAUSED: voice_end + 1 (0: unknown)

    @property
    def voice_end(self) -> int:
        """PAUSED: where the voice itself stopped (SpeechPaused.voice_end), -1 if not known."""
        return self.started_at - 1


@dataclass(slots=True, frozen=True)
class Partial:
    stream: int
    text: str
    samples: int  # the end of the audio the text covers (stream samples)
    start: int = 0
    stable: int = 0  # leading characters that never change
    flags: Flag = Flag.NONE
    end_p: float | None = None  # P(a sentence ends after the last word), where told

    @property
    def speculative(self) -> bool:
        return bool(self.flags & Flag.SPECULATIVE)


@dataclass(slots=True, frozen=True)
class Final:
    stream: int
    text: str
    samples: int
    start: int = 0
    stable: int = 0
    flags: Flag = Flag.NONE
    end_p: float | None = None

    @property
    def last(self) -> bool:
        return bool(self.flags & Flag.LAST)


@dataclass(slots=True, frozen=True)
class Error:
    stream: int  # 0: the whole connection
    code: ErrorCode
    message: str


Message = Open | Audio | End | SharedMemoryFile | VADEvent | Partial | Final | Error


class ProtocolError(Exception):
    """The byte stream broke the framing rules; the peer's connection should be closed."""


def shm_name(pid: int, tag: str) -> str:
    """The name a client gives a segment it makes: its own ``pid`` and a random hex ``tag``."""
    name = f"{SHM_PREFIX}{pid}-{tag}"
    if not _SHM_NAME.fullmatch(name):
        raise ValueError(f"a segment tag is 8-64 lowercase hex digits, got {tag!r}")
    return name


def shm_name_ok(name: str, pid: int | None) -> bool:
    """Whether ``name`` is a segment name of :func:`shm_name`'s form made by process ``pid``
    (``None``: any process — where the peer's pid cannot be known)."""
    m = _SHM_NAME.fullmatch(name)
    return m is not None and (pid is None or int(m.group(1)) == pid)


# --- encoding ----------------------------------------------------------------------------------


def _frame(kind: Kind, stream: int, payload: bytes = b"") -> bytes:
    if not 0 <= stream <= _MAX_STREAM:
        raise ValueError(f"stream id {stream} is outside 0..{_MAX_STREAM}")
    return _HEADER.pack(len(payload) + 5, kind, stream) + payload


def encode_open(stream: int, options: dict[str, Any] | None = None) -> bytes:
    return _frame(Kind.OPEN, stream, json.dumps(options or {}, separators=(",", ":")).encode())


def encode_audio(stream: int, pcm: bytes | memoryview) -> bytes:
    """One AUDIO frame; ``pcm`` must fit in one message (see :func:`encode_audio_chunks`)."""
    if len(pcm) % 2:
        raise ValueError("PCM16 audio must be an even number of bytes")
    return _frame(Kind.AUDIO, stream, bytes(pcm))


def encode_audio_chunks(stream: int, pcm: bytes | memoryview, max_message: int = MAX_MESSAGE) -> list[bytes]:
    """AUDIO frames for ``pcm`` of any length, each within ``max_message``."""
    step = (max_message - 5) & ~1
    view = memoryview(pcm)
    return [encode_audio(stream, view[i : i + step]) for i in range(0, len(view), step)]


def encode_end(stream: int) -> bytes:
    return _frame(Kind.END, stream)


def encode_shm(stream: int, name: str, size: int, samples: int) -> bytes:
    return _frame(Kind.SHM, stream, _SHM.pack(size, samples) + name.encode())


def encode_event(stream: int, event: SpeechEvent, at: int, started_at: int = 0) -> bytes:
    return _frame(Kind.EVENT, stream, _EVENT.pack(event, at, started_at))


def encode_pause(stream: int, at: int, voice_end: int = -1) -> bytes:
    """A PAUSED event at ``at``; ``voice_end`` (-1: unknown) where the voice stopped before it."""
    return encode_event(stream, SpeechEvent.PAUSED, at, max(voice_end + 1, 0))


def _result(kind: Kind, stream: int, text: str, samples: int, start: int, stable: int,
            flags: Flag, end_p: float | None) -> bytes:
    data = text.encode()
    if len(data) > MAX_TEXT:  # cut at a character boundary, and the stable prefix with it
        text = data[:MAX_TEXT].decode(errors="ignore")
        data, stable = text.encode(), min(stable, len(text))
    flags &= ~Flag.END_P  # the flag says what the payload holds: set here, from end_p alone
    if end_p is None:
        return _frame(kind, stream, _RESULT.pack(samples, start, stable, flags) + data)
    told = _END_P.pack(round(min(max(end_p, 0.0), 1.0) * END_P_SCALE))
    return _frame(kind, stream, _RESULT.pack(samples, start, stable, flags | Flag.END_P) + told + data)


def encode_partial(stream: int, text: str, samples: int, start: int = 0, stable: int = 0,
                   flags: Flag = Flag.NONE, end_p: float | None = None) -> bytes:
    return _result(Kind.PARTIAL, stream, text, samples, start, stable, flags, end_p)


def encode_final(stream: int, text: str, samples: int, start: int = 0, stable: int | None = None,
                 flags: Flag = Flag.LAST, end_p: float | None = None) -> bytes:
    """A FINAL; ``end_p`` (sent with the END_P flag) only to a stream that asked for it."""
    return _result(Kind.FINAL, stream, text, samples, start,
                   len(text) if stable is None else stable, flags, end_p)


def encode_error(stream: int, code: ErrorCode, message: str) -> bytes:
    return _frame(Kind.ERROR, stream, _ERROR.pack(code) + message.encode()[:MAX_TEXT])


def encode(msg: Message) -> bytes:
    """Any message back to its frame (the inverse of :class:`Decoder`)."""
    match msg:
        case Open():
            return encode_open(msg.stream, msg.options)
        case Audio():
            return encode_audio(msg.stream, msg.pcm)
        case End():
            return encode_end(msg.stream)
        case SharedMemoryFile():
            return encode_shm(msg.stream, msg.name, msg.size, msg.samples)
        case VADEvent():
            return encode_event(msg.stream, msg.event, msg.at, msg.started_at)
        case Partial():
            return encode_partial(msg.stream, msg.text, msg.samples, msg.start, msg.stable,
                                  msg.flags, msg.end_p)
        case Final():
            return encode_final(msg.stream, msg.text, msg.samples, msg.start, msg.stable,
                                msg.flags, msg.end_p)
        case Error():
            return encode_error(msg.stream, msg.code, msg.message)
    raise TypeError(f"not a wire message: {msg!r}")


# --- decoding ----------------------------------------------------------------------------------


def _text(payload: bytes, what: str) -> str:
    if len(payload) > MAX_TEXT:
        raise ProtocolError(f"{what} of {len(payload)} bytes is over the {MAX_TEXT}-byte limit")
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not valid UTF-8") from None


def _parse(kind: int, stream: int, payload: bytes) -> Message:
    if kind == Kind.AUDIO:
        if len(payload) % 2:
            raise ProtocolError(f"AUDIO payload of {len(payload)} bytes is not whole PCM16 samples")
        return Audio(stream, payload)
    if kind == Kind.OPEN:
        text = _text(payload, "OPEN options")
        try:
            options = json.loads(text) if text else {}
        except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
            raise ProtocolError("OPEN options are not valid JSON") from None
        if not isinstance(options, dict):
            raise ProtocolError("OPEN options must be a JSON object")
        return Open(stream, options)
    if kind == Kind.END:
        if payload:
            raise ProtocolError("END carries no payload")
        return End(stream)
    if kind == Kind.SHM:
        if len(payload) <= _SHM.size:
            raise ProtocolError("SHM payload too short: expected size, samples and a name")
        size, samples = _SHM.unpack_from(payload)
        return SharedMemoryFile(stream, _text(payload[_SHM.size :], "SHM name"), size, samples)
    if kind == Kind.EVENT:
        if len(payload) != _EVENT.size:
            raise ProtocolError(f"EVENT payload is {_EVENT.size} bytes (got {len(payload)})")
        event, at, started_at = _EVENT.unpack_from(payload)
        try:
            ev = SpeechEvent(event)
        except ValueError:
            raise ProtocolError(f"unknown speech event {event}") from None
        return VADEvent(stream, ev, at, started_at)
    if kind in (Kind.PARTIAL, Kind.FINAL):
        if len(payload) < _RESULT.size:
            raise ProtocolError(f"{Kind(kind).name} payload too short")
        samples, start, stable, flags = _RESULT.unpack_from(payload)
        at, end_p = _RESULT.size, None
        if flags & Flag.END_P:
            if len(payload) < at + _END_P.size:
                raise ProtocolError(f"{Kind(kind).name} with END_P has no room for it")
            (told,) = _END_P.unpack_from(payload, at)
            at, end_p = at + _END_P.size, told / END_P_SCALE
        text = _text(payload[at:], f"{Kind(kind).name} text")
        if stable > len(text) or flags & ~int(Flag.SPECULATIVE | Flag.LAST | Flag.END_P):
            raise ProtocolError(f"{Kind(kind).name} has a bad stable count or flags")
        # END_P is the payload's layout, told by end_p itself: the message's flags are the rest
        return (Partial if kind == Kind.PARTIAL else Final)(
            stream, text, samples, start, stable, Flag(flags & ~Flag.END_P), end_p)
    if kind == Kind.ERROR:
        if len(payload) < _ERROR.size:
            raise ProtocolError("ERROR payload too short")
        (code,) = _ERROR.unpack_from(payload)
        try:
            err = ErrorCode(code)
        except ValueError:
            raise ProtocolError(f"unknown error code {code}") from None
        return Error(stream, err, _text(payload[_ERROR.size :], "ERROR message"))
    raise ProtocolError(f"unknown message type {kind}")


class Decoder:
    """Feed it bytes as they arrive; it returns the complete messages, in order.

    It never raises on bad input: on the first violation it sets :attr:`error` (a
    :class:`ProtocolError` saying what was wrong), returns the messages decoded before it, and
    ignores everything fed afterwards — the caller reports the error and closes the connection.
    """

    __slots__ = ("max_message", "error", "_buf")

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        if max_message < 5:
            raise ValueError("max_message must leave room for the type and the stream id")
        self.max_message = max_message
        self.error: ProtocolError | None = None
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back (a client that stops mid-frame)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        if self.error is not None:
            return []
        buf = self._buf
        buf += data
        out: list[Message] = []
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (length,) = struct.unpack_from(">I", buf, pos)
                if length < 5:
                    raise ProtocolError(f"frame length {length} is below the 5-byte minimum")
                if length > self.max_message:
                    raise ProtocolError(
                        f"frame of {length} bytes exceeds the {self.max_message}-byte message limit"
                    )
                end = pos + 4 + length
                if len(buf) < end:
                    break
                _, kind, stream = _HEADER.unpack_from(buf, pos)
                out.append(_parse(kind, stream, bytes(buf[pos + HEADER_SIZE : end])))
                pos = end
        except ProtocolError as exc:
            self.error = exc
        except Exception as exc:  # a parser bug must not take the server down either
            self.error = ProtocolError(f"undecodable frame: {exc}")
        if self.error is not None:
            buf.clear()
            return out
        del buf[:pos]
        return out
