"""The Twilio Media Streams WebSocket messages, sans-I/O: JSON text ↔ typed messages, both ways.

Twilio → us: ``connected``, ``start``, ``media``, ``dtmf``, ``mark``, ``stop``.
Us → Twilio: ``media``, ``mark``, ``clear``. Both sides are here so a test can play Twilio.
Audio payloads are raw 8 kHz μ-law (no header) in base64; Twilio sends numbers as strings.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from transports import jsonwire

# 20 ms of μ-law is 160 bytes (216 in base64); a second of audio in one message is the most we
# accept, which bounds what one message can make us decode.
MAX_MESSAGE_CHARS = 64 * 1024


class TwilioMessageError(ValueError):
    """Not a Media Streams message we understand; the shell counts it and goes on."""


# --- Twilio → us -------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Connected:
    protocol: str = "Call"
    version: str = "1.0.0"

    def to_json(self) -> str:
        return json.dumps({"event": "connected", "protocol": self.protocol,
                           "version": self.version})


@dataclass(slots=True, frozen=True)
class Start:
    stream_sid: str
    call_sid: str = ""
    account_sid: str = ""
    tracks: tuple[str, ...] = ("inbound",)
    custom_parameters: dict[str, str] = field(default_factory=dict)
    encoding: str = "audio/x-mulaw"
    sample_rate: int = 8000
    channels: int = 1
    sequence: int = 1

    def to_json(self) -> str:
        return json.dumps({
            "event": "start", "sequenceNumber": str(self.sequence), "streamSid": self.stream_sid,
            "start": {
                "streamSid": self.stream_sid, "accountSid": self.account_sid,
                "callSid": self.call_sid, "tracks": list(self.tracks),
                "customParameters": self.custom_parameters,
                "mediaFormat": {"encoding": self.encoding, "sampleRate": self.sample_rate,
                                "channels": self.channels},
            },
        })


@dataclass(slots=True, frozen=True)
class Media:
    stream_sid: str
    payload: bytes  # raw μ-law
    chunk: int = 0
    timestamp_ms: int = 0
    track: str = "inbound"
    sequence: int = 0

    def to_json(self) -> str:
        return json.dumps({
            "event": "media", "sequenceNumber": str(self.sequence), "streamSid": self.stream_sid,
            "media": {"track": self.track, "chunk": str(self.chunk),
                      "timestamp": str(self.timestamp_ms),
                      "payload": base64.b64encode(self.payload).decode("ascii")},
        })


@dataclass(slots=True, frozen=True)
class DtmfDigit:
    stream_sid: str
    digit: str
    track: str = "inbound_track"
    sequence: int = 0

    def to_json(self) -> str:
        return json.dumps({"event": "dtmf", "sequenceNumber": str(self.sequence),
                           "streamSid": self.stream_sid,
                           "dtmf": {"track": self.track, "digit": self.digit}})


@dataclass(slots=True, frozen=True)
class MarkEcho:
    """Twilio's answer to our mark: the audio sent before it has played (or was cleared)."""

    stream_sid: str
    name: str
    sequence: int = 0

    def to_json(self) -> str:
        return json.dumps({"event": "mark", "sequenceNumber": str(self.sequence),
                           "streamSid": self.stream_sid, "mark": {"name": self.name}})


@dataclass(slots=True, frozen=True)
class Stop:
    stream_sid: str
    call_sid: str = ""
    account_sid: str = ""
    sequence: int = 0

    def to_json(self) -> str:
        return json.dumps({"event": "stop", "sequenceNumber": str(self.sequence),
                           "streamSid": self.stream_sid,
                           "stop": {"accountSid": self.account_sid, "callSid": self.call_sid}})


InboundMessage = Connected | Start | Media | DtmfDigit | MarkEcho | Stop


# --- us → Twilio -------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class SendMedia:
    stream_sid: str
    payload: bytes  # raw μ-law

    def to_json(self) -> str:
        return json.dumps({"event": "media", "streamSid": self.stream_sid,
                           "media": {"payload": base64.b64encode(self.payload).decode("ascii")}})


@dataclass(slots=True, frozen=True)
class SendMark:
    stream_sid: str
    name: str

    def to_json(self) -> str:
        return json.dumps({"event": "mark", "streamSid": self.stream_sid,
                           "mark": {"name": self.name}})


@dataclass(slots=True, frozen=True)
class Clear:
    stream_sid: str

    def to_json(self) -> str:
        return json.dumps({"event": "clear", "streamSid": self.stream_sid})


OutboundMessage = SendMedia | SendMark | Clear


# --- parsing -----------------------------------------------------------------------------------


def _load(text: str | bytes) -> dict[str, Any]:
    if len(text) > MAX_MESSAGE_CHARS:
        raise TwilioMessageError(f"message of {len(text)} characters is too large")
    try:
        data = jsonwire.loads(text)
    except ValueError as exc:
        raise TwilioMessageError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise TwilioMessageError("not a Media Streams message (no 'event')")
    return data


def _obj(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise TwilioMessageError(f"'{data['event']}' message without a '{key}' object")
    return value


def _str(d: dict[str, Any], key: str, default: str | None = None) -> str:
    value = d.get(key, default)
    if value is None or not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TwilioMessageError(f"field '{key}' missing or not a string")
    return str(value)


def _int(d: dict[str, Any], key: str, default: int = 0) -> int:
    value = d.get(key)
    if value is None:
        return default
    try:
        return int(value)  # Twilio sends sequence numbers, chunks and timestamps as strings
    except (TypeError, ValueError, OverflowError):
        raise TwilioMessageError(f"field '{key}' is not a number: {value!r}") from None


def _payload(media: dict[str, Any]) -> bytes:
    raw = _str(media, "payload")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise TwilioMessageError("media payload is not base64") from None


def parse_message(text: str | bytes) -> InboundMessage:
    """A message from Twilio; raises ``TwilioMessageError`` for anything else."""
    data = _load(text)
    event = data["event"]
    if event == "connected":
        return Connected(_str(data, "protocol", "Call"), _str(data, "version", ""))
    if event == "start":
        s = _obj(data, "start")
        fmt = s.get("mediaFormat") or {}
        params = s.get("customParameters") or {}
        tracks = s.get("tracks") or ["inbound"]
        if not isinstance(fmt, dict) or not isinstance(params, dict) or not isinstance(
            tracks, list
        ):
            raise TwilioMessageError("malformed 'start' message")
        return Start(
            stream_sid=_str(s, "streamSid", data.get("streamSid")),
            call_sid=_str(s, "callSid", ""), account_sid=_str(s, "accountSid", ""),
            tracks=tuple(str(t) for t in tracks),
            custom_parameters={str(k): str(v) for k, v in params.items()},
            encoding=_str(fmt, "encoding", "audio/x-mulaw"),
            sample_rate=_int(fmt, "sampleRate", 8000), channels=_int(fmt, "channels", 1),
            sequence=_int(data, "sequenceNumber"),
        )
    if event == "media":
        m = _obj(data, "media")
        return Media(_str(data, "streamSid", ""), _payload(m), _int(m, "chunk"),
                     _int(m, "timestamp"), _str(m, "track", "inbound"),
                     _int(data, "sequenceNumber"))
    if event == "dtmf":
        d = _obj(data, "dtmf")
        return DtmfDigit(_str(data, "streamSid", ""), _str(d, "digit"),
                         _str(d, "track", "inbound_track"), _int(data, "sequenceNumber"))
    if event == "mark":
        return MarkEcho(_str(data, "streamSid", ""), _str(_obj(data, "mark"), "name"),
                        _int(data, "sequenceNumber"))
    if event == "stop":
        raw_stop = data.get("stop")
        stop: dict[str, Any] = raw_stop if isinstance(raw_stop, dict) else {}
        return Stop(_str(data, "streamSid", ""), _str(stop, "callSid", ""),
                    _str(stop, "accountSid", ""), _int(data, "sequenceNumber"))
    raise TwilioMessageError(f"unknown event {event!r}")


def parse_command(text: str | bytes) -> OutboundMessage:
    """A message to Twilio (what a Twilio stand-in receives from the bot)."""
    data = _load(text)
    event = data["event"]
    sid = _str(data, "streamSid")
    if event == "media":
        return SendMedia(sid, _payload(_obj(data, "media")))
    if event == "mark":
        return SendMark(sid, _str(_obj(data, "mark"), "name"))
    if event == "clear":
        return Clear(sid)
    raise TwilioMessageError(f"unknown command {event!r}")
