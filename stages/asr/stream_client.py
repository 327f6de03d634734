"""An asyncio client of ``voxline asr-serve``'s streaming protocol (``stages/asr/wire.py``): one
caller's audio and VAD events in, partials and finals out, over the server's Unix socket — the
same :class:`ASRStream` core as an in-process call, run in the server's shared engine.

One :class:`ServedStream` is one stream on a connection of its own (``OPEN {"events": true}``).
It counts the samples it sends, so VAD events and results are in the caller's own sample
offsets (16 kHz) whatever happened to the connection.

Nothing is lost when asr-serve goes away (killed, restarted) or has no free slot: the stream
keeps the audio of every utterance whose final has not come (and half a second before it), and
once a connection is back — tried again with backoff, without end — it opens a new stream,
sends that audio again with the utterances' events, and the finals owed arrive late rather than
never. Each outage is reported once through ``on_error``; the recovery through ``on_recovered``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from stages.asr import local_socket, wire
from stages.asr.stream import PRE_ROLL_MS, RING_MARGIN_S, Kind, Result

log = logging.getLogger("voxline.asr.stream_client")

RATE = wire.SAMPLE_RATE
IDLE_KEEP_S = 0.5  # audio kept outside any utterance: the pre-roll of one starting meanwhile
MAX_KEEP_S = 25.0 + RING_MARGIN_S  # never more than a server ring holds (asr.max_utterance_s)
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0
STREAM_ID = 1  # one stream per connection


@dataclass(slots=True)
class _Utterance:
    """A VAD utterance whose final has not come: what a new stream must be told again."""

    start: int  # SpeechStarted.at, in the caller's samples
    stop: int | None = None  # SpeechStopped.at, once seen
    resume: int = -1  # where a segment final left off (a long utterance goes on from there)
    pause: tuple[int, int] | None = None  # the VAD's latest pause (at, voice_end), not resumed


class ServedStream:
    """One caller's stream on asr-serve. Feed :meth:`audio` (PCM16 little-endian, 16 kHz mono)
    and the VAD's :meth:`started`/:meth:`paused`/:meth:`stopped`; results come to ``on_result`` as
    :class:`Result` values (PARTIAL, SPECULATIVE, FINAL or SEGMENT) in the caller's offsets.
    All calls are made on one event loop; none blocks."""

    def __init__(self, on_result: Callable[[Result], None], on_error: Callable[[str], None],
                 socket_path: str | None = None, partials: bool = True,
                 on_recovered: Callable[[], None] | None = None) -> None:
        self.path = socket_path or os.environ.get("VOXLINE_ASR_SOCKET") or local_socket.default_path()
        self.on_result = on_result
        self.on_error = on_error
        self.on_recovered = on_recovered
        self.partials = partials
        self.heard = 0  # samples of the caller's audio given to :meth:`audio`
        self.reconnects = 0
        self._base = 0  # the caller's sample where the current server stream begins
        self._tape = bytearray()  # PCM16 from _tape_from to heard, for a new stream
        self._tape_from = 0
        self._pending: deque[_Utterance] = deque()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._down: str | None = None  # why the stream is not being served (reported once)
        self._ended = asyncio.Event()  # the server said END: every result is in
        self._closed = False
        self._finishing = False

    # --- life ----------------------------------------------------------------------------------
    async def open(self) -> None:
        """Connect and open the stream. A server that is not there (or not this user's) is
        reported through ``on_error`` and tried again in the background; audio given meanwhile
        is kept for it."""
        await self._connect_once()

    async def finish(self, timeout_s: float = 5.0) -> None:
        """The caller is done: end an open utterance here, send END and wait (up to
        ``timeout_s``) for the finals owed. Whatever did not come in time is given up."""
        if self._closed:
            return
        if self._pending and self._pending[-1].stop is None:
            self.stopped(self.heard, self._pending[-1].start)
        self._finishing = True  # a stream opened from now on is ended at once
        if self._writer is not None:
            self._send(wire.encode_end(STREAM_ID))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ended.wait(), timeout_s)
        self.close()

    def close(self) -> None:
        """Drop the connection at once (the server frees the slot when the socket closes)."""
        self._closed = True
        for task in (self._reader_task, self._connecting):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._tape = bytearray()
        self._pending.clear()

    @property
    def served(self) -> bool:
        return self._writer is not None and self._down is None

    # --- inputs --------------------------------------------------------------------------------
    def audio(self, pcm: bytes) -> None:
        if self._closed or not pcm:
            return
        pcm = pcm[: len(pcm) & ~1]
        self._tape += pcm
        self.heard += len(pcm) // 2
        self._trim()
        if self.served:
            for frame in wire.encode_audio_chunks(STREAM_ID, pcm):
                self._send(frame)

    def started(self, at: int) -> None:
        if self._closed or (self._pending and self._pending[-1].stop is None):
            return
        at = min(max(at, 0), self.heard)
        self._pending.append(_Utterance(at))
        if self.served:
            self._send(wire.encode_event(STREAM_ID, wire.SpeechEvent.STARTED, self._rel(at)))

    def paused(self, at: int, voice_end: int = -1) -> None:
        """The VAD's pause at ``at`` (``voice_end``: where the voice stopped, -1 if not known):
        the server transcribes the utterance up to there before its end is confirmed. Kept
        until :meth:`resumed` or the stop: a stream opened after an outage is told it again, so
        the caller's transcript still comes at the pause, not only at the stop."""
        if self._closed or not self._pending or self._pending[-1].stop is not None:
            return
        u = self._pending[-1]
        at = min(max(at, 0), self.heard)
        if at < u.start:
            return
        u.pause = (at, voice_end if u.start <= voice_end <= at else -1)
        if self.served:
            self._send_pause(u.pause)

    def resumed(self) -> None:
        """The VAD heard the voice again after a pause: that pause is no longer the
        utterance's end, and a new stream is not told it."""
        if self._pending and self._pending[-1].stop is None:
            self._pending[-1].pause = None

    def stopped(self, at: int, started_at: int | None = None) -> None:
        if self._closed:
            return
        at = min(max(at, 0), self.heard)
        if not self._pending or self._pending[-1].stop is not None:
            self._pending.append(_Utterance(min(started_at if started_at is not None else at, at)))
        u = self._pending[-1]
        u.stop = max(at, u.start)
        if self.served:
            self._send(wire.encode_event(STREAM_ID, wire.SpeechEvent.STOPPED, self._rel(u.stop),
                                         self._rel(u.start)))

    # --- the connection --------------------------------------------------------------------------
    def _rel(self, at: int) -> int:
        return max(at - self._base, 0)

    def _send_pause(self, pause: tuple[int, int]) -> None:
        at, voice_end = pause
        if at < self._base:
            return  # before this stream's audio (a segment final already covered it)
        self._send(wire.encode_pause(STREAM_ID, self._rel(at),
                                     self._rel(voice_end) if voice_end >= self._base else -1))

    def _send(self, frame: bytes) -> None:
        assert self._writer is not None
        self._writer.write(frame)

    async def _connect_once(self) -> bool:
        try:
            trusted = local_socket.trusted_uids()
            local_socket.check_socket_file(self.path, trusted)
            reader, writer = await asyncio.open_unix_connection(self.path)
        except local_socket.SocketTrustError as exc:
            self._outage(str(exc))
            return False
        except OSError as exc:
            self._outage(f"cannot reach asr-serve at {self.path} ({exc.strerror or exc}) — start "
                         f"it with `voxline asr-serve --socket {self.path}`")
            return False
        raw = writer.get_extra_info("socket")
        try:
            if raw is not None:
                local_socket.check_server(raw, self.path, trusted)
        except local_socket.SocketTrustError as exc:
            writer.close()
            self._outage(str(exc))
            return False
        if self._closed:
            writer.close()
            return False
        self._writer = writer
        self._start_stream()
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
        return True

    def _start_stream(self) -> None:
        """OPEN a stream and tell it again what it owes: the audio of every utterance without its
        final (from its pre-roll, or where a segment left off) and their events."""
        frm = self.heard - int(IDLE_KEEP_S * RATE)
        if self._pending:
            u = self._pending[0]
            frm = u.resume if u.resume >= 0 else u.start - PRE_ROLL_MS * RATE // 1000
        frm = min(max(frm, self._tape_from), self.heard)
        self._base = frm
        self._ended.clear()
        self._send(wire.encode_open(STREAM_ID, {"events": True, "partials": self.partials}))
        replay = memoryview(self._tape)[(frm - self._tape_from) * 2:]
        for frame in wire.encode_audio_chunks(STREAM_ID, replay):
            self._send(frame)
        for u in self._pending:
            start = max(u.start, frm)
            self._send(wire.encode_event(STREAM_ID, wire.SpeechEvent.STARTED, self._rel(start)))
            if u.stop is not None:
                self._send(wire.encode_event(STREAM_ID, wire.SpeechEvent.STOPPED,
                                             self._rel(max(u.stop, start)), self._rel(start)))
            elif u.pause is not None and u.pause[0] >= start:
                self._send_pause(u.pause)
        if self._finishing:
            self._send(wire.encode_end(STREAM_ID))
        if self._down is not None:
            self._down = None
            if self.reconnects and self.on_recovered is not None:
                self.on_recovered()

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = wire.Decoder()
        why = "asr-serve closed the connection"
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for msg in decoder.feed(data):
                    refusal = self._deliver(msg)
                    if refusal:
                        why = refusal
                        return
                if decoder.error is not None:
                    why = f"asr-serve's answer broke the protocol: {decoder.error}"
                    return
        except OSError as exc:
            why = f"the connection to asr-serve failed: {exc}"
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
                if not self._closed and not self._ended.is_set():
                    self._outage(why)

    def _deliver(self, msg: wire.Message) -> str | None:
        """Hand on one server message; a refusal (the reason) drops this connection."""
        if isinstance(msg, wire.Partial | wire.Final):
            if msg.stream != STREAM_ID:
                return None
            if isinstance(msg, wire.Final):
                kind = Kind.FINAL if self._settled(msg.samples + self._base) else Kind.SEGMENT
            else:
                kind = Kind.SPECULATIVE if msg.speculative else Kind.PARTIAL
            self.on_result(Result(kind, msg.text, msg.start + self._base,
                                  msg.samples + self._base, msg.stable))
        elif isinstance(msg, wire.End):
            self._ended.set()
        elif isinstance(msg, wire.Error):
            if msg.code in (wire.ErrorCode.CAPACITY, wire.ErrorCode.LIMIT):
                return f"asr-serve has no room for this stream now: {msg.message}"
            if msg.code is wire.ErrorCode.INTERNAL:
                self.on_error(f"asr-serve: {msg.message}")  # the stream goes on
                return None
            return f"asr-serve refused the stream: {msg.message}"
        return None

    def _settled(self, end: int) -> bool:
        """A FINAL ending at ``end``: the final of the oldest utterance (True), or a segment of
        it (it goes on from ``end``)."""
        if not self._pending:
            return True
        u = self._pending[0]
        if u.stop is not None and end >= min(u.stop, self.heard):
            self._pending.popleft()
            self._trim()
            return True
        u.resume = end
        self._trim()
        return False

    def _trim(self) -> None:
        """Forget audio no new stream would need."""
        keep = self.heard - int(IDLE_KEEP_S * RATE)
        if self._pending:
            u = self._pending[0]
            keep = u.resume if u.resume >= 0 else u.start - PRE_ROLL_MS * RATE // 1000
        keep = max(keep, self.heard - int(MAX_KEEP_S * RATE))
        drop = keep - self._tape_from
        if drop >= RATE:  # trimmed a second at a time: not a copy per frame
            del self._tape[: drop * 2]
            self._tape_from = keep

    def _outage(self, why: str) -> None:
        if self._closed:
            return
        if self._down is None:
            self._down = why
            log.warning("asr-serve stream: %s (keeping the audio; trying again)", why)
            self.on_error(why)
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = BACKOFF_FIRST_S
        while not self._closed:
            await asyncio.sleep(delay)
            if self._writer is not None or self._closed:
                return
            self.reconnects += 1
            if await self._connect_once():
                return
            delay = min(delay * 2, BACKOFF_MAX_S)

