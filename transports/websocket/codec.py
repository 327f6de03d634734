"""The browser protocol's wire format, sans-I/O: bytes and text in, typed messages out.

Binary messages are PCM16 little-endian mono 16 kHz, whole 20 ms frames (640 bytes each), in both
directions. Text messages are JSON objects with a ``type``. The codec never raises on bad input:
anything it cannot accept becomes a :class:`BadMessage` whose ``reason`` goes back to the client
as an ``error`` event, so a bad packet can never take a server down.

Limits, and the memory they bound: one audio message holds at most ``MAX_AUDIO_FRAMES`` frames
(10 × 640 B = 6.4 KB, 200 ms); one text message at most ``MAX_TEXT_BYTES`` (4 KB). The shell
passes ``MAX_WIRE_BYTES`` (16 KB) to the WebSocket library so much larger frames are refused
before they are even buffered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from transports import jsonwire

FRAME_BYTES = 640  # 20 ms of PCM16 at 16 kHz
MAX_AUDIO_FRAMES = 10
MAX_TEXT_BYTES = 4096
MAX_MESSAGE_BYTES = FRAME_BYTES * MAX_AUDIO_FRAMES
# What the WebSocket library may buffer of one message: a text message of MAX_TEXT_BYTES
# characters is up to 4 bytes each in UTF-8, and the library refuses a message *as large as*
# its limit, hence the byte more. Messages under it but over the codec's own limits get an
# error event that says which limit; only larger ones are cut off (close 1009).
MAX_WIRE_BYTES = 4 * MAX_TEXT_BYTES + 1

# what a client may send as text; every other type is refused with an error event
CLIENT_EVENTS = frozenset({"hello", "ping", "hangup"})


@dataclass(slots=True, frozen=True)
class AudioMessage:
    pcm: np.ndarray  # int16, mono, 16 kHz, a whole number of 20 ms frames


@dataclass(slots=True, frozen=True)
class ControlMessage:
    type: str  # one of CLIENT_EVENTS
    data: dict[str, Any]


@dataclass(slots=True, frozen=True)
class BadMessage:
    reason: str


ClientMessage = AudioMessage | ControlMessage | BadMessage


def decode_audio(data: bytes) -> AudioMessage | BadMessage:
    n = len(data)
    if n == 0 or n % FRAME_BYTES:
        return BadMessage(
            f"audio message of {n} bytes: expected whole 20 ms frames of PCM16 mono 16 kHz "
            f"({FRAME_BYTES} bytes each)"
        )
    if n > MAX_MESSAGE_BYTES:
        return BadMessage(f"audio message of {n} bytes: at most {MAX_MESSAGE_BYTES} bytes (200 ms)")
    # a copy: the array outlives the receive buffer it was read from
    return AudioMessage(np.frombuffer(data, dtype="<i2").astype(np.int16))


def decode_text(text: str) -> ControlMessage | BadMessage:
    if len(text) > MAX_TEXT_BYTES:
        return BadMessage(f"text message of {len(text)} characters: at most {MAX_TEXT_BYTES}")
    try:
        obj = jsonwire.loads(text)
    except ValueError as exc:
        return BadMessage(f"text message is not valid JSON ({str(exc)[:60]})")
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return BadMessage('text message must be a JSON object with a string "type"')
    kind = obj["type"]
    if kind not in CLIENT_EVENTS:
        return BadMessage(f"unknown event type {kind[:40]!r} (known: {', '.join(sorted(CLIENT_EVENTS))})")
    return ControlMessage(kind, obj)


def decode(message: bytes | str) -> ClientMessage:
    """One client message, as it came off the socket."""
    if isinstance(message, str):
        return decode_text(message)
    return decode_audio(message)


def encode_audio(pcm: np.ndarray) -> bytes:
    """Agent audio (int16 mono 16 kHz) as one binary message."""
    return pcm.astype("<i2", copy=False).tobytes()


def encode_event(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def error_event(reason: str, fatal: bool = False) -> dict[str, Any]:
    return {"type": "error", "message": reason, "stage": "transport", "fatal": fatal}


def hangup_event(reason: str) -> dict[str, Any]:
    """The agent ends the call (the client's own ``hangup``, the other way): the last event
    before the server closes the socket (code 1000, ``reason`` as the close reason)."""
    return {"type": "hangup", "reason": reason}
