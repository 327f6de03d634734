"""asr-serve: the shared ASR engine behind a Unix socket, on ONE event-loop thread.

Connections are asyncio protocols fed into the sans-I/O :mod:`stages.asr.wire` decoder — no
thread and no task per connection, so thousands of idle connections cost only their buffers.
Each open stream holds one engine slot; model work runs on the engine's worker thread. The
OpenAI-compatible HTTP endpoint (:mod:`stages.asr.openai_api`) can share the same loop.

What one client may take is bounded: streams (slots) per connection, audio held in server memory
per connection and in all, model calls in the engine per connection (an
:class:`~stages.asr.engine_share.EngineShare`, so one client's backlog never queues ahead of
another's requests). Who may connect is checked on every connection (:mod:`stages.asr.local_socket`),
and a shared-memory segment is copied out through its file descriptor, never mapped: a client
that shrinks its segment meanwhile gets an error, and cannot crash the server (a mapping would
die with SIGBUS).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agent.errors import CapacityError
from agent.ops import Health, OpsEndpoints, Sample
from stages.asr import local_socket, wire
from stages.asr.backend import Hypothesis, ask_sentence_ends
from stages.asr.engine import ASREngine
from stages.asr.engine_share import EngineShare
from stages.asr.local_socket import Peer, PeerPolicy
from stages.asr.long_audio import joined, transcribe_long
from stages.asr.slots import Slot
from stages.asr.stream import ASRStream, Cancel, Failure, Kind, Request, Result, StreamConfig
from stages.asr.wire import (
    Audio,
    End,
    ErrorCode,
    Flag,
    Open,
    SharedMemoryFile,
    SpeechEvent,
    VADEvent,
)

log = logging.getLogger("voxline.asr.server")

RATE = wire.SAMPLE_RATE
OPTIONS = {"partials": bool, "file": bool, "events": bool, "end_p": bool}
MIB = 1 << 20
SHM_READ = 1 << 20  # bytes of a segment copied per step: well under a millisecond of the loop
MAX_REFUSED = 1024  # refused streams a connection may leave without their END
WRITE_BUFFER = 1 << 20  # bytes of results owed to a client before its requests are paused
FORBIDDEN_LINGER_S = 1.0  # a refused peer's connection is ended this long after its answer


@dataclass(slots=True, eq=False)
class Stream:
    """One stream of one connection: its slot and, when it streams, its ASR core."""

    id: int
    slot: Slot
    core: ASRStream | None = None  # None: a whole file, transcribed at END
    events: bool = False  # the client sends VAD events; else the stream is one utterance
    file: bytearray | None = None  # whole-file mode: PCM16 gathered until END
    buffered: int = 0  # bytes of this stream's audio held in server memory (file or segment copy)
    heard: int = 0  # samples received
    segments: list[str] = field(default_factory=list)  # without events: finals of its parts
    requests: dict[int, asyncio.Future] = field(default_factory=dict)  # model calls out, by id
    ended: bool = False
    released: bool = False  # the slot went back to the pool (it may already serve another call)
    tell_end: bool = False  # OPEN {"end_p": true}: results carry the model's P(a sentence ends)
    end_p: float | None = None  # without events: that of the last final with words


class ASRServer:
    """Streams over a Unix socket (and HTTP, see :meth:`start_http`) into one shared engine.

    A streaming stream is driven by the same :class:`ASRStream` core as an in-process call,
    so it gets the same partials (with stable prefixes), speculative results and finals. With
    OPEN ``{"events": true}`` the client sends its VAD's events and gets a FINAL per utterance
    (and END once everything is delivered); without, the whole stream is one utterance, and its
    one FINAL comes at END. With ``{"end_p": true}`` a stream's finals and speculative partials
    carry the model's P(a sentence ends after their last word) where the backend can tell it
    (Whisper): the first stream that asks switches it on for the whole engine (2-11% more per
    call). Past the longest utterance (``stream.max_utterance``) it is cut at a quiet point, so
    a stream may be any length. Whole files (OPEN ``{"file": true}`` or a
    shared-memory segment) are cut into chunks and transcribed as batches.

    Limits, per connection unless said: ``max_streams`` open at once (default half the slots, so
    one client never holds them all); ``max_in_engine`` model calls in the engine at once
    (default two batches per lane: enough to keep the engine busy alone, and what a newcomer
    waits behind per other client); ``max_buffered_mb`` of whole-file audio and segment copies
    held in memory (default 128 MiB ≈ 70 min of PCM16, past the longest file) and
    ``max_buffered_total_mb`` over all connections (default 512 MiB); ``max_file_s`` for one
    whole file, socket or HTTP (default an hour: 115 MB of PCM16). Beyond a limit the stream is
    refused with ``LIMIT`` and the connection goes on.
    """

    def __init__(
        self,
        engine: ASREngine,
        *,
        stream: StreamConfig | None = None,
        max_message: int = wire.MAX_MESSAGE,
        max_file_s: float = 3600.0,
        language: str = "en",
        max_streams: int = 0,
        max_in_engine: int = 0,
        max_buffered_mb: float = 128.0,
        max_buffered_total_mb: float = 512.0,
    ) -> None:
        self.engine = engine
        # each connection's stream limits (asr-serve: stages.asr.stage.stream_config of its
        # [asr] settings), the longest utterance shortened to fit the engine's slots
        self.stream_cfg = (stream or StreamConfig()).fitting(engine.pool.slot_samples)
        self.max_message = max_message
        self.max_file_samples = int(max_file_s * RATE)
        self.language = language
        self.max_streams = max_streams or max(1, engine.pool.capacity // 2)
        self.max_in_engine = max_in_engine or 2 * engine.lanes * engine.max_batch
        self.max_buffered = int(max_buffered_mb * MIB)
        self.max_buffered_total = int(max_buffered_total_mb * MIB)
        self.buffered = 0  # bytes of audio all connections hold in memory
        self.policy = PeerPolicy(os.geteuid())
        self.connections: set[Connection] = set()
        self.protocol_errors = 0
        self.refused_peers = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._http: Any = None
        self.decode_pool: Any = None
        self.draining = False  # shutting down: new streams and uploads are refused
        self.sentence_ends: bool | None = None  # None: no client asked; then whether told
        self.uploads = 0  # HTTP uploads in progress
        # diarized responses (stages.asr.openai_api.SpeakerTools); None: the server gives none
        self.speakers: Any = None
        self.health = Health(self.stats, [self._slot_free], loaded=True)
        self.ops = OpsEndpoints(self.health)  # (the command sets ops.metrics)

    # --- operating it -----------------------------------------------------------------------
    @property
    def streams(self) -> int:
        return sum(len(c.streams) for c in self.connections)

    def stats(self) -> dict[str, Any]:
        pool = self.engine.pool
        return {"connections": len(self.connections), "streams": self.streams,
                "uploads": self.uploads, "asr_slots": pool.capacity,
                "asr_slots_in_use": pool.in_use, "protocol_errors": self.protocol_errors,
                "refused_peers": self.refused_peers}

    def _slot_free(self) -> str:
        pool = self.engine.pool
        return "" if pool.in_use < pool.capacity else f"all {pool.capacity} ASR slots in use"

    def begin_drain(self) -> None:
        """Take no new stream (refused with CAPACITY and why) and no upload (503); the streams
        and uploads under way finish."""
        self.draining = self.health.draining = True

    def tell_sentence_ends(self) -> bool:
        """A client wants the model's P(a sentence ends): the backend tells it from now on, for
        every call (asked once; False where the backend cannot)."""
        if self.sentence_ends is None:
            self.sentence_ends = ask_sentence_ends(self.engine.backend)
            if self.sentence_ends:
                log.info("asr-serve: a client reads the sentence end; the ASR tells it from now on")
            else:
                log.warning("asr-serve: a client asked for the sentence end; backend %r cannot "
                            "tell it", self.engine.backend.name)
        return self.sentence_ends

    @property
    def live_calls(self) -> int:
        return self.streams + self.uploads

    def metric_samples(self) -> list[Sample]:
        return [
            Sample("voxline_asr_serve_connections", "gauge", "Socket connections open.",
                   len(self.connections)),
            Sample("voxline_asr_serve_streams", "gauge", "Streams open over the socket.",
                   self.streams),
            Sample("voxline_asr_serve_uploads", "gauge", "HTTP uploads in progress.",
                   self.uploads),
            Sample("voxline_asr_serve_buffered_bytes", "gauge", "Audio the connections hold in "
                   "memory.", self.buffered),
            Sample("voxline_draining", "gauge", "1 while the server drains (SIGTERM).",
                   int(self.draining)),
            Sample("voxline_asr_serve_protocol_errors", "counter", "Connections closed on a "
                   "malformed frame.", self.protocol_errors),
            Sample("voxline_asr_serve_refused_peers", "counter", "Connections refused: the "
                   "peer's user may not use the server.", self.refused_peers),
        ]

    def share(self) -> EngineShare:
        """A new client's share of the engine (a connection, an HTTP upload)."""
        return EngineShare(self.engine, self.max_in_engine)

    # --- listening ---------------------------------------------------------------------------
    async def start_unix(self, path: str, group: int | None = None) -> None:
        """Listen on the Unix socket ``path``, mode 0600 (0660 and owned by ``group``); only
        processes of this user (or root, or ``group``'s members) may talk to it. The default
        path's directory is made private first; a stale socket of this user's is replaced."""
        if path == local_socket.default_path():
            local_socket.private_dir(path, group)
        sock = local_socket.listen(path, group)
        self.policy = PeerPolicy(os.geteuid(), group)
        loop = asyncio.get_running_loop()
        srv = await loop.create_unix_server(lambda: Connection(self), sock=sock)
        self._servers.append(srv)

    async def start_http(self, host: str, port: int, max_upload_mb: float = 25.0,
                         **options: Any) -> int:
        """Serve ``POST /v1/audio/transcriptions`` on ``host:port``; returns the bound port.
        ``options``: the other fields of :class:`stages.asr.openai_api.HTTPOptions` (the token
        check — required off loopback —, the allowed Host names, concurrent uploads, timeouts)."""
        from stages.asr.openai_api import HTTPOptions, start

        opts = HTTPOptions(max_upload_mb=max_upload_mb, **options)
        self._http, bound = await start(self, host, port, opts)
        return bound

    async def close(self) -> None:
        """Stop listening and drop every connection left (a second call does nothing)."""
        servers, self._servers = self._servers, []
        for srv in servers:
            srv.close()
        for conn in list(self.connections):
            conn.abort()
        for srv in servers:
            await srv.wait_closed()
        if self._http is not None:
            http, self._http = self._http, None
            await http.cleanup()
        if self.decode_pool is not None:
            self.decode_pool.shutdown(wait=False)
            self.decode_pool = None

    stop = close  # (what agent.ops.serve_until_stopped calls after the drain)

    async def __aenter__(self) -> ASRServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Connection(asyncio.Protocol):
    """One client connection: bytes in through the decoder, results out; many streams."""

    def __init__(self, server: ASRServer) -> None:
        self.server = server
        self.engine = server.engine
        self.decoder = wire.Decoder(server.max_message)
        self.streams: dict[int, Stream] = {}
        self.refused: set[int] = set()  # streams refused at OPEN: their audio is ignored quietly
        self.tasks: set[asyncio.Task] = set()
        self.transport: asyncio.Transport | None = None
        self.peer: Peer | None = None
        self.share = server.share()
        self.buffered = 0  # bytes of this connection's audio held in memory
        self.closed = False
        self.sent = 0  # messages written to the client
        self.handled = 0  # messages received from the client

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        # Past this much owed to a client that is not reading, its requests wait (below): high
        # enough that a client sending a long stream before it reads (10,000 partials) goes on.
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER)
        sock = transport.get_extra_info("socket")
        self.peer = local_socket.peer_of(sock) if sock is not None else None
        if not self.server.policy.allows(self.peer):
            self._forbid()

    def _forbid(self) -> None:
        """Refuse this peer: say why, then hang up. Closing at once, with the client's first
        frames unread, would reset the connection and could lose the answer; so the server
        stops writing, ignores what comes, and ends it when the client does (1 s at most)."""
        self.server.refused_peers += 1
        self._send(wire.encode_error(0, ErrorCode.FORBIDDEN,
                                     "this asr-serve takes connections from its own user only "
                                     "(and its --socket-group)"))
        self.closed = True  # nothing it sends is handled
        assert self.transport is not None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(FORBIDDEN_LINGER_S, self.abort)

    def pause_writing(self) -> None:
        # The client is not reading its results: stop reading its requests until it does, so
        # what the server owes it stays bounded by one read's worth.
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        for msg in self.decoder.feed(data):
            if self.closed:
                return
            self.handled += 1
            try:
                self._handle(msg)
            except Exception as exc:  # a bug on one connection must not take the server down
                log.exception("asr-serve: failed on %r", type(msg).__name__)
                self._send(wire.encode_error(0, ErrorCode.INTERNAL, f"server error: {exc}"))
                self._close()
                return
        if self.decoder.error is not None:
            self.server.protocol_errors += 1
            self._send(wire.encode_error(0, ErrorCode.PROTOCOL, f"protocol error: {self.decoder.error}"
                                         " — closing the connection"))
            self._close()

    def eof_received(self) -> bool:
        return False  # half-closed by the client: close; its streams are abandoned

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for task in self.tasks:
            task.cancel()
        for stream in list(self.streams.values()):
            self._release(stream)
        self.share.close()

    # --- messages ----------------------------------------------------------------------------
    def _handle(self, msg: wire.Message) -> None:
        if isinstance(msg, Audio):
            self._audio(msg)
        elif isinstance(msg, Open):
            self._open(msg)
        elif isinstance(msg, End):
            self._end(msg)
        elif isinstance(msg, VADEvent):
            self._event(msg)
        elif isinstance(msg, SharedMemoryFile):
            self._shared_memory(msg)
        else:
            self._send(wire.encode_error(msg.stream, ErrorCode.BAD_REQUEST,
                                         f"a client cannot send {type(msg).__name__} messages"))

    def _open(self, msg: Open) -> None:
        opts = self._options(msg)
        if opts is None:
            return
        if opts.get("file", False) and opts.get("events", False):
            self._refuse(msg.stream, ErrorCode.BAD_REQUEST,
                         "a whole file ({\"file\": true}) takes no VAD events")
            return
        stream = self._new_stream(msg.stream)
        if stream is None:
            return
        stream.tell_end = bool(opts.get("end_p", False)) and self.server.tell_sentence_ends()
        if opts.get("file", False):
            stream.file = bytearray()
            return
        cfg = self.server.stream_cfg
        if not opts.get("partials", True):
            cfg = replace(cfg, partials=False)
        stream.core = ASRStream(stream.slot.audio, cfg, self.engine.partial_room)
        stream.events = bool(opts.get("events", False))
        if not stream.events:
            stream.core.started(0)  # the whole stream is one utterance

    def _options(self, msg: Open) -> dict[str, Any] | None:
        for key, value in msg.options.items():
            if key not in OPTIONS or not isinstance(value, OPTIONS[key]):
                known = ", ".join(f"{k} ({t.__name__})" for k, t in OPTIONS.items())
                self._refuse(msg.stream, ErrorCode.BAD_REQUEST,
                             f"bad OPEN option {key!r}={value!r} (known: {known})")
                return None
        return msg.options

    def _new_stream(self, sid: int) -> Stream | None:
        if sid == 0:
            self._send(wire.encode_error(0, ErrorCode.BAD_REQUEST, "stream id 0 is reserved"))
            return None
        if sid in self.streams:
            self._send(wire.encode_error(sid, ErrorCode.BAD_REQUEST, f"stream {sid} is already open"))
            return None
        if self.server.draining:
            self._refuse(sid, ErrorCode.CAPACITY, "the server is shutting down: it finishes "
                         "the streams under way and takes no new ones")
            return None
        if len(self.streams) >= self.server.max_streams:
            self._refuse(sid, ErrorCode.LIMIT,
                         f"this connection holds {len(self.streams)} streams, the most one "
                         "connection may: end one before opening another")
            return None
        try:
            slot = self.engine.open()
        except CapacityError as exc:
            self._refuse(sid, ErrorCode.CAPACITY, str(exc))
            return None
        self.refused.discard(sid)
        stream = Stream(sid, slot)
        self.streams[sid] = stream
        return stream

    def _refuse(self, sid: int, code: ErrorCode, message: str) -> None:
        if len(self.refused) >= MAX_REFUSED:  # refused streams never ended: forget the oldest
            self.refused.clear()
        self.refused.add(sid)
        self._send(wire.encode_error(sid, code, message))

    def _stream_for(self, sid: int) -> Stream | None:
        stream = self.streams.get(sid)
        if stream is not None and not stream.ended:
            return stream
        if sid not in self.refused:
            why = "has ended" if stream is not None else "is not open"
            self._send(wire.encode_error(sid, ErrorCode.UNKNOWN_STREAM, f"stream {sid} {why}"))
        return None

    def _audio(self, msg: Audio) -> None:
        stream = self._stream_for(msg.stream)
        if stream is None:
            return
        n = len(msg.pcm) // 2
        at = stream.heard
        stream.heard += n
        if stream.file is not None:
            if stream.heard > self.server.max_file_samples:
                self._drop(stream, ErrorCode.BAD_REQUEST, "the file is longer than "
                           f"{self.server.max_file_samples / RATE:.0f} s — send it in parts")
                return
            refusal = self._hold(stream, len(msg.pcm))
            if refusal:
                self._drop(stream, ErrorCode.LIMIT, refusal)
                return
            stream.file += msg.pcm
            return
        assert stream.core is not None
        stream.core.audio(np.frombuffer(msg.pcm, dtype="<i2"), at)
        self._pump(stream)

    def _event(self, msg: VADEvent) -> None:
        stream = self._stream_for(msg.stream)
        if stream is None:
            return
        if not stream.events or stream.core is None:
            self._send(wire.encode_error(msg.stream, ErrorCode.BAD_REQUEST,
                                         f"stream {msg.stream} was not opened with events"))
            return
        core = stream.core
        if msg.event is SpeechEvent.STARTED:
            core.started(msg.at)
        elif msg.event is SpeechEvent.PAUSED:
            core.paused(msg.at, msg.voice_end)
        else:
            core.stopped(msg.at, msg.started_at)
        self._pump(stream)

    def _end(self, msg: End) -> None:
        if msg.stream in self.refused:
            self.refused.discard(msg.stream)
            return
        stream = self._stream_for(msg.stream)
        if stream is None:
            return
        stream.ended = True
        if stream.file is not None:
            pcm = np.frombuffer(stream.file, dtype="<i2")
            self._spawn(self._finish_file(stream, pcm))
            return
        core = stream.core
        assert core is not None
        if core.in_speech:  # the stream ends mid-utterance: that utterance ends with it
            core.stopped(stream.heard)
        self._pump(stream)

    # --- the core's requests and results -----------------------------------------------------
    def _pump(self, stream: Stream) -> None:
        core = stream.core
        assert core is not None
        for out in core.take():
            if isinstance(out, Request):
                self._submit(stream, out)
            elif isinstance(out, Cancel):
                fut = stream.requests.get(out.id)
                if fut is not None:
                    self.share.cancel(fut)
            elif isinstance(out, Failure):
                if out.kind is Kind.PARTIAL or out.kind is Kind.COMMIT:
                    log.warning("asr-serve: stream %d: a partial failed: %s", stream.id,
                                out.message)
                else:
                    self._send(wire.encode_error(stream.id, ErrorCode.INTERNAL,
                                                 f"transcription failed: {out.message}"))
            else:
                self._result(stream, out)
        if stream.ended and not core.busy and not stream.released:
            if not stream.events:
                self._send(wire.encode_final(stream.id, " ".join(stream.segments),
                                             stream.heard, end_p=stream.end_p))
            else:
                self._send(wire.encode_end(stream.id))
            self._release(stream)

    def _result(self, stream: Stream, r: Result) -> None:
        end_p = r.end_p if stream.tell_end else None
        if stream.events:
            flags = Flag.SPECULATIVE if r.kind is Kind.SPECULATIVE else Flag.NONE
            enc = wire.encode_final if r.final else wire.encode_partial
            self._send(enc(stream.id, r.text, r.end, r.start, r.stable, flags, end_p))
        elif r.final:
            if r.text:
                stream.segments.append(r.text)  # sent, joined, when the stream is done
                stream.end_p = end_p
        else:  # one utterance: a partial covers the segments cut off before it too
            before = " ".join(stream.segments)
            text = f"{before} {r.text}".strip() if before else r.text
            stable = len(before) + 1 + r.stable if before and r.text else len(before) + r.stable
            flags = Flag.SPECULATIVE if r.kind is Kind.SPECULATIVE else Flag.NONE
            self._send(wire.encode_partial(stream.id, text, r.end, 0, min(stable, len(text)),
                                           flags, end_p))

    def _submit(self, stream: Stream, req: Request) -> None:
        fut = self.share.submit(stream.slot, req.audio, final=req.final, prompt=req.prompt)
        stream.requests[req.id] = fut

        def done(f: asyncio.Future[Hypothesis | None]) -> None:
            stream.requests.pop(req.id, None)
            if stream.core is not None and not (self.closed or stream.released):
                stream.core.settle(req.id, f)
                self._pump(stream)

        fut.add_done_callback(done)

    async def _finish_file(self, stream: Stream, pcm: np.ndarray) -> None:
        try:
            segments = await transcribe_long(self.share, stream.slot, pcm)
            self._send(wire.encode_final(stream.id, joined(segments), len(pcm)))
        except Exception as exc:
            self._send(wire.encode_error(stream.id, ErrorCode.INTERNAL, f"transcription failed: {exc}"))
        finally:
            self._release(stream)

    def _shared_memory(self, msg: SharedMemoryFile) -> None:
        if not 0 < msg.samples <= self.server.max_file_samples or msg.size != 2 * msg.samples:
            self._send(wire.encode_error(
                msg.stream, ErrorCode.BAD_REQUEST,
                f"bad SHM request: size must be 2 × samples, at least one and at most "
                f"{self.server.max_file_samples / RATE:.0f} s (got size {msg.size}, samples {msg.samples})"))
            return
        if not wire.shm_name_ok(msg.name, self.peer.pid if self.peer is not None else None):
            self._send(wire.encode_error(msg.stream, ErrorCode.BAD_REQUEST, _unusable(msg)))
            return
        stream = self._new_stream(msg.stream)
        if stream is None:
            self.refused.discard(msg.stream)  # no END follows a SHM request
            return
        stream.ended = True
        refusal = self._hold(stream, msg.size)
        if refusal:
            self._drop(stream, ErrorCode.LIMIT, refusal)
            self.refused.discard(msg.stream)
            return
        self._spawn(self._finish_shared(stream, msg))

    async def _finish_shared(self, stream: Stream, msg: SharedMemoryFile) -> None:
        try:
            pcm = await _copy_segment(msg.name, msg.size, self.peer)
            if pcm is None:
                self._send(wire.encode_error(stream.id, ErrorCode.BAD_REQUEST, _unusable(msg)))
                return
            segments = await transcribe_long(self.share, stream.slot, pcm)
            self._send(wire.encode_final(stream.id, joined(segments), msg.samples))
        except Exception as exc:
            self._send(wire.encode_error(stream.id, ErrorCode.INTERNAL, f"transcription failed: {exc}"))
        finally:
            self._release(stream)

    # --- plumbing ----------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _hold(self, stream: Stream, n: int) -> str:
        """Count ``n`` more bytes of ``stream``'s audio held in memory; a refusal's text when
        that passes this connection's or the server's limit (nothing is counted then)."""
        srv = self.server
        if self.buffered + n > srv.max_buffered:
            return (f"this connection would hold more than {srv.max_buffered / MIB:.0f} MiB of "
                    "whole-file audio in the server: wait for its files' results first")
        if srv.buffered + n > srv.max_buffered_total:
            return ("the server holds all the whole-file audio it may "
                    f"({srv.max_buffered_total / MIB:.0f} MiB): try again shortly")
        stream.buffered += n
        self.buffered += n
        srv.buffered += n
        return ""

    def _release(self, stream: Stream) -> None:
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        if stream.buffered:
            self.buffered -= stream.buffered
            self.server.buffered -= stream.buffered
            stream.buffered = 0
            stream.file = None
        if not stream.released:
            stream.released = True
            if stream.core is not None:
                stream.core.close()
            self.share.forget(stream.slot)
            self.engine.close_slot(stream.slot)

    def _drop(self, stream: Stream, code: ErrorCode, message: str) -> None:
        self._refuse(stream.id, code, message)
        stream.ended = True
        self._release(stream)

    def _send(self, frame: bytes) -> None:
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)
            self.sent += 1

    def _close(self) -> None:
        """Close after the queued frames (the error message) are flushed."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _unusable(msg: SharedMemoryFile) -> str:
    """One answer whatever was wrong with a segment — a name not of this client's process, no
    such segment, another user's, smaller than announced, shrunk while read — so an error tells
    nothing about segments the client did not make."""
    return (f"shared memory {msg.name!r} cannot be used: it must be a segment this client "
            f"process made, named {wire.SHM_PREFIX}<pid>-<hex>, holding the {msg.size} bytes "
            "announced until the answer comes")


async def _copy_segment(name: str, size: int, peer: Peer | None) -> np.ndarray | None:
    """The first ``size`` bytes of the client's segment ``name`` as int16 samples, copied out
    through its file descriptor a step at a time; None if it is not a segment of ``peer``'s
    process and user of at least ``size`` bytes, or shrinks while it is read.

    Not mapped: a mapping of a segment its owner then truncates kills the reader with SIGBUS
    (the whole server), while ``pread`` past the new end returns short. Not through
    ``SharedMemory(name=...)`` either: before Python 3.13 that registers the segment with this
    process's resource tracker, which would unlink the client's segment when the server exits."""
    import _posixshmem  # what SharedMemory itself uses on POSIX

    if not wire.shm_name_ok(name, peer.pid if peer is not None else None):
        return None
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDONLY | os.O_NOFOLLOW, mode=0o600)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_size < size
                or (peer is not None and st.st_uid != peer.uid)):
            return None
        pcm = np.empty(size // 2, "<i2")
        view = memoryview(pcm).cast("B")
        at = 0
        while at < size:
            n = os.preadv(fd, [view[at : at + SHM_READ]], at)
            if n <= 0:
                return None  # the segment shrank under us
            at += n
            await asyncio.sleep(0)
        return pcm
    except OSError:
        return None
    finally:
        os.close(fd)

