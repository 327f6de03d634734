"""Twilio's side of a media stream, for trying a bot without a phone number: it connects to the
bot's WebSocket, streams 8 kHz audio as Twilio would (20 ms μ-law chunks in real time), plays
the bot's audio on a simulated handset clock, and echoes marks once the audio queued before
them has played — or at once when the bot sends ``clear``, as Twilio does.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transports.g711 import ulaw_decode, ulaw_encode
from transports.twilio.messages import (
    Clear,
    Connected,
    DtmfDigit,
    MarkEcho,
    Media,
    SendMark,
    SendMedia,
    Start,
    Stop,
    TwilioMessageError,
    parse_command,
)

CHUNK = 160  # 20 ms at 8 kHz
CHUNK_S = 0.020


@dataclass(slots=True)
class CallerLog:
    """What the caller side saw: agent audio (8 kHz int16, as heard), marks, clears."""

    agent_chunks: list[np.ndarray] = field(default_factory=list)
    first_agent_audio_s: float | None = None  # seconds since the stream started
    marks_sent: list[str] = field(default_factory=list)  # names, in the order the bot sent them
    marks_echoed: list[str] = field(default_factory=list)
    # marks still behind unplayed audio in the handset buffer when the caller hung up: never
    # echoed, as on a real call
    marks_unplayed: list[str] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)  # seconds since the stream started
    dropped_by_clear: int = 0  # chunks the bot's clear removed from the handset buffer
    barge_in_s: float | None = None  # when the caller started talking over the bot
    malformed: int = 0
    close_code: int | None = None  # the bot closed the stream (an agent hang-up): its code...
    close_reason: str = ""  # ... and reason

    @property
    def agent_audio(self) -> np.ndarray:
        return np.concatenate(self.agent_chunks) if self.agent_chunks else np.zeros(0, np.int16)


class TwilioCaller:
    """``await run(ws, audio8k)`` plays one call over an open WebSocket and returns its log.

    ``dtmf`` maps a time in seconds to a digit pressed then; ``tail_s`` keeps the call open
    after the audio so the bot can answer; ``until`` ends that tail early once it returns true.
    ``barge_in`` is more caller speech, started once the caller's own audio has been sent and
    the bot has then played audio without a break for ``barge_in_after_s``: the caller talking
    over the agent (not merely going on after a pause the agent took for the end of the turn).
    """

    def __init__(self, stream_sid: str = "", call_sid: str = "") -> None:
        self.stream_sid = stream_sid or "MZ" + secrets.token_hex(16)
        self.call_sid = call_sid or "CA" + secrets.token_hex(16)
        self.log = CallerLog()
        self._queue: list[tuple[str, Any]] = []  # the handset buffer: ("audio", pcm)|("mark", n)
        self._t0 = 0.0
        self._playing_ticks = 0  # consecutive handset ticks that played agent audio

    async def run(self, ws: Any, audio8k: np.ndarray, dtmf: dict[float, str] | None = None,
                  tail_s: float = 10.0, until: Any = None, barge_in: np.ndarray | None = None,
                  barge_in_after_s: float = 1.0) -> CallerLog:
        self._t0 = time.monotonic()
        await ws.send(Connected().to_json())
        await ws.send(Start(self.stream_sid, self.call_sid, "AC" + "0" * 32, sequence=1).to_json())
        from websockets.exceptions import ConnectionClosed

        reader = asyncio.get_running_loop().create_task(self._read(ws))
        try:
            await self._stream(ws, audio8k, dict(dtmf or {}), tail_s, until, barge_in,
                               barge_in_after_s)
        except ConnectionClosed as closed:  # the bot ended the call
            if closed.rcvd is not None:
                self.log.close_code, self.log.close_reason = closed.rcvd.code, closed.rcvd.reason
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.log.marks_unplayed = [item for kind, item in self._queue if kind == "mark"]
        return self.log

    async def _stream(self, ws: Any, audio8k: np.ndarray, dtmf: dict[float, str],
                      tail_s: float, until: Any, barge_in: np.ndarray | None,
                      barge_in_after_s: float) -> None:
        seq = 2
        n_audio = -(-len(audio8k) // CHUNK)
        n_total = n_audio + int(tail_s / CHUNK_S)
        silence = np.zeros(CHUNK, np.int16)
        extra = np.zeros(0, np.int16)  # barge-in speech still to send
        for k in range(n_total):
            if (barge_in is not None and k >= n_audio
                    and self._playing_ticks * CHUNK_S >= barge_in_after_s):
                extra, barge_in = barge_in, None
                self.log.barge_in_s = k * CHUNK_S
            if k >= n_audio and not len(extra) and until is not None and until():
                break
            if k < n_audio:
                chunk = audio8k[k * CHUNK:(k + 1) * CHUNK]
            elif len(extra):
                chunk, extra = extra[:CHUNK], extra[CHUNK:]
            else:
                chunk = silence
            if len(chunk) < CHUNK:
                chunk = np.concatenate([chunk, silence[: CHUNK - len(chunk)]])
            await ws.send(Media(self.stream_sid, ulaw_encode(chunk), chunk=k + 1,
                                timestamp_ms=k * 20, sequence=seq).to_json())
            seq += 1
            for at in [t for t in dtmf if t <= k * CHUNK_S]:
                await ws.send(DtmfDigit(self.stream_sid, dtmf.pop(at), sequence=seq).to_json())
                seq += 1
            await self._play(ws, seq)
            delay = self._t0 + (k + 1) * CHUNK_S - time.monotonic()
            await asyncio.sleep(max(delay, 0.0))
        await ws.send(Stop(self.stream_sid, self.call_sid, sequence=seq + 1).to_json())

    async def _play(self, ws: Any, seq: int) -> None:
        """One 20 ms tick of the handset: play one chunk, echo the marks it has reached."""
        played = False
        while self._queue:
            kind, item = self._queue[0]
            if kind == "mark":
                self._queue.pop(0)
                self.log.marks_echoed.append(item)
                await ws.send(MarkEcho(self.stream_sid, item, seq).to_json())
            elif played:
                break
            else:
                self._queue.pop(0)
                self.log.agent_chunks.append(item)
                played = True
        self._playing_ticks = self._playing_ticks + 1 if played else 0

    async def _read(self, ws: Any) -> None:
        async for raw in ws:
            try:
                cmd = parse_command(raw)
            except TwilioMessageError:
                self.log.malformed += 1
                continue
            now = time.monotonic() - self._t0
            if isinstance(cmd, SendMedia):
                if self.log.first_agent_audio_s is None:
                    self.log.first_agent_audio_s = now
                self._queue.append(("audio", ulaw_decode(cmd.payload)))
            elif isinstance(cmd, SendMark):
                self.log.marks_sent.append(cmd.name)
                self._queue.append(("mark", cmd.name))
            elif isinstance(cmd, Clear):
                self.log.clears.append(now)
                kept = []
                for kind, item in self._queue:
                    if kind == "mark":
                        kept.append((kind, item))  # echoed at the next tick, unplayed
                    else:
                        self.log.dropped_by_clear += 1
                self._queue = kept
