"""The OpenAI-compatible ``POST /v1/audio/transcriptions`` endpoint of asr-serve (aiohttp, on the
server's event loop), so existing OpenAI clients can use the shared engine unchanged.

Multipart fields: ``file`` (required), ``model`` (any name), ``response_format`` (json | text |
verbose_json | srt | vtt | diarized_json), ``stream`` (true: server-sent events
``transcript.text.delta`` / ``transcript.text.done``, or with ``diarized_json``
``transcript.text.segment`` per segment as it is final), ``timestamp_granularities[]`` (``word``:
verbose_json gains each word's start and end, on a server with word times); ``language``,
``prompt``, ``temperature`` and ``chunking_strategy`` are accepted and ignored (the audio is
always cut at pauses).

Who spoke when (a server started with speaker tools, ``voxline asr-serve --diarize``):
``diarized_json`` — OpenAI's diarized shape: segments with ``speaker`` ``A``, ``B``, ... in order
of first speech — or any format with a model name containing ``diarize`` (as OpenAI's
``gpt-4o-transcribe-diarize``): verbose_json segments gain ``speaker`` and subtitles name their
speakers. The upload is cut at the VAD's pauses, its chunks go through the shared engine and
its speech windows through the speaker model (:func:`stages.asr.progressive.transcribe_with_engine`);
streamed, the first segments go out after the first two minutes of audio are done.
A damaged upload (cut short of what its header promises, or undecodable from some point on)
is transcribed up to the damage: 200, with ``warning`` in the JSON (and in the stream's
``transcript.text.done``) and an ``X-Voxline-Warning`` header saying where and why.
Server-sent events are written whole (an event is never split, so neither is a character), the
first at once and the rest at most every 50 ms (:class:`EventWriter`).
Uploads are decoded in memory on one decode thread, never on the loop, by
:func:`stages.asr.uploads.decode_upload`: self-contained audio containers only (a playlist naming
a local file is refused, never followed), and decoding stops as soon as the audio passes the
server's longest.

Who may ask: off loopback a token is required (``Authorization: Bearer …`` — the OpenAI SDK's
``api_key`` — or ``X-Voxline-Token``): the composition root hands in the check
(``transports.auth.TokenAuth``; ``voxline asr-serve`` makes and prints a random token when none is
given), and without one the endpoint does not start off loopback. On a loopback bind only
loopback Host names are answered (``localhost``, ``127.0.0.1``, ``[::1]``,
plus ``allowed_hosts``), which stops a web page from reaching the server through DNS rebinding.
How much: ``max_uploads`` requests at once (503 past it), the upload size, its duration, a
header timeout (``header_timeout_s``: a connection that has not sent a request by then is
closed) and a body timeout (the whole upload must arrive within ``body_timeout_s``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent.audio import RATE
from agent.errors import AudioInputError, CapacityError, ConfigError, require
from agent.netaddr import host_name, is_loopback, is_loopback_name
from agent.ops import OPS_PATHS, OpsEndpoints
from stages.asr.engine import ASREngine
from stages.asr.engine_share import EngineShare
from stages.asr.long_audio import Segment, transcribe_long
from stages.asr.speakers import SpokenSegment
from stages.asr.uploads import AudioTooLong, decode_upload, decode_upload_partial


class TranscriptionServer(Protocol):
    """What the endpoint needs of the server it serves for (asr-serve's ``ASRServer``)."""

    engine: ASREngine  # shared with the server's socket streams; one slot per request
    decode_pool: Executor | None  # where uploads are decoded; None: :func:`start` makes one
    language: str  # reported by ``verbose_json``
    max_file_samples: int  # the longest upload, decoded, in samples at 16 kHz
    speakers: SpeakerTools | None  # what diarized responses need; None: none are given
    draining: bool  # shutting down: uploads get 503, the ones in progress finish
    uploads: int  # uploads in progress (what a drain waits for)
    ops: OpsEndpoints  # /healthz, /readyz, /metrics

    def share(self) -> EngineShare:
        """A request's own share of the engine (so one upload never queues ahead of others)."""
        ...


class TokenCheck(Protocol):
    """Whether a request carries the token (``transports.auth.TokenAuth``: constant-time)."""

    def allows(self, query: Mapping[str, str], headers: Mapping[str, str]) -> bool: ...


@dataclass(slots=True, frozen=True)
class SpeakerTools:
    """What a diarized response needs: the VAD (``stages.vad.SileroModel``) and a speaker
    embedding model (``stages.speaker.Embedder``); the server's ASR backend must give word
    times (a chunk is split between speakers at its words)."""

    vad: Any
    embedder: Any
    speakers: int | None = None  # a fixed count, if every upload has it
    max_speakers: int = 8


PATH = "/v1/audio/transcriptions"
FORMATS = ("json", "text", "verbose_json", "srt", "vtt", "diarized_json")
FLUSH_S = 0.05  # server-sent events: at most one write this often (the first at once)
FIELD_LIMIT = 4096  # bytes of a non-file form field
REFERENCE_LIMIT = 2 << 20  # bytes of one known_speaker_references[] data URL
MAX_KNOWN = 4  # known speakers an upload may name (OpenAI's limit)
REFERENCE_S = 30.0  # the longest sample of a known voice


@dataclass(slots=True, frozen=True)
class HTTPOptions:
    """The endpoint's admission and limits."""

    max_upload_mb: float = 25.0
    token_check: TokenCheck | None = None  # None: no token (loopback only)
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides loopback's ("*": any)
    max_uploads: int = 4  # requests received, decoded or transcribed at once; more get 503
    header_timeout_s: float = 10.0  # a connection sends its request (headers) within this
    body_timeout_s: float = 60.0  # the whole upload arrives within this, or 408


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.kind, self.code = status, param, kind, code


async def start(server: TranscriptionServer, host: str, port: int,
                options: HTTPOptions | None = None) -> tuple[Any, int]:
    """Start the endpoint; returns the aiohttp runner (to clean up) and the bound port. A
    ``server.decode_pool`` of None is replaced by a one-thread pool the server then owns."""
    web = require("aiohttp.web", what="the asr-serve HTTP endpoint", extra="serve", package="aiohttp")
    opts = options or HTTPOptions()
    if opts.max_uploads < 1:
        raise ConfigError(f"--max-uploads must be at least 1, got {opts.max_uploads}")
    if opts.token_check is None and not is_loopback(host):
        raise ConfigError(f"the HTTP endpoint on {host} (off loopback) needs a token: pass "
                          "--token, or bind it to 127.0.0.1")
    if server.decode_pool is None:
        server.decode_pool = ThreadPoolExecutor(1, thread_name_prefix="asr-decode")
        # start the thread now, so the server's thread count is fixed from start-up on
        await asyncio.get_running_loop().run_in_executor(server.decode_pool, int)
    limit = int(opts.max_upload_mb * 1024 * 1024)
    check_host = is_loopback(host) or bool(opts.allowed_hosts)
    allowed = {h.lower().rstrip(".") for h in opts.allowed_hosts}
    active = 0

    @web.middleware
    async def json_errors(request: Any, handler: Any) -> Any:
        try:
            # (the operations paths need no token: load balancers and Prometheus read them)
            token = None if request.path in OPS_PATHS else opts.token_check
            _admit(request, token, allowed if check_host else None)
            return await handler(request)
        except RequestError as exc:
            return _error(web, exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(web, RequestError(exc.status, f"{exc.reason}: {request.method} "
                                            f"{_printable(request.path)} (this server answers "
                                            f"POST {PATH})"))

    async def transcriptions(request: Any) -> Any:
        nonlocal active
        if server.draining:
            raise RequestError(503, "the server is shutting down: it finishes the transcriptions "
                               "under way and takes no new ones; try again shortly",
                               kind="server_error")
        if active >= opts.max_uploads:
            raise RequestError(503, f"the server is taking {active} uploads, its limit: try "
                               "again shortly", kind="server_error")
        active += 1
        server.uploads += 1
        try:
            return await _transcribe(web, request, server, limit, opts)
        finally:
            active -= 1
            server.uploads -= 1

    app = web.Application(middlewares=[json_errors], client_max_size=limit + (1 << 20))
    app.router.add_post(PATH, transcriptions)
    server.ops.add_routes(app)
    # aiohttp closes a connection idle for keepalive_timeout, timed from its start too: one
    # that has not sent its request's headers by then (slowloris) goes.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=opts.header_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, int(bound)




def _admit(request: Any, auth: TokenCheck | None, allowed: set[str] | None) -> None:
    """The Host check (against DNS rebinding) and the token; raises RequestError."""
    if allowed is not None and "*" not in allowed:
        value = request.headers.get("Host")
        name = host_name(value) if value is not None else None
        if name is not None and not (is_loopback_name(name) or name in allowed):
            raise RequestError(403, "this server answers only requests addressed to it by a "
                               "loopback name (localhost, 127.0.0.1, [::1]): the Host header "
                               "names another (start asr-serve with --allow-host NAME to answer "
                               "to that name)", kind="permission_error")
    if auth is None:
        return
    for value in (request.headers.get("Authorization"), request.headers.get("X-Voxline-Token"),
                  request.query.get("token")):
        if value is not None and not _utf8(value):  # undecodable bytes, as aiohttp escapes them
            raise RequestError(400, "the token is not valid UTF-8 text", code="invalid_api_key")
    if not auth.allows(request.query, request.headers):
        raise RequestError(401, "this server needs its token: send it as `Authorization: Bearer "
                           "TOKEN` (the OpenAI SDK's api_key) or the X-Voxline-Token header",
                           code="invalid_api_key")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True




async def _transcribe(web: Any, request: Any, server: TranscriptionServer, limit: int,
                      opts: HTTPOptions) -> Any:
    try:
        async with asyncio.timeout(opts.body_timeout_s):
            form = await _read_form(request, limit)
    except TimeoutError:
        raise RequestError(408, f"the upload did not arrive within {opts.body_timeout_s:.0f} s",
                           "file") from None
    fmt = form.get("response_format", "json")
    if fmt not in FORMATS:
        raise RequestError(400, f"response_format {_printable(fmt)!r} is not supported (use "
                           f"one of: {', '.join(FORMATS)})", "response_format")
    stream = form.get("stream", "false").lower() in ("true", "1")
    if stream and fmt not in ("json", "text", "diarized_json"):
        raise RequestError(400, f"stream=true gives transcript events: it goes with json, text "
                           f"or diarized_json, not {fmt}", "stream")
    diarized = fmt == "diarized_json" or "diarize" in form.get("model", "").lower()
    words = "word" in form.get("timestamp_granularities[]", [])
    if diarized and server.speakers is None:
        raise RequestError(400, "this server gives no speakers: start it with `voxline asr-serve "
                           "--diarize` for diarized_json (or a model name with 'diarize')",
                           "response_format")
    if words and not server.engine.backend.capabilities.word_times:
        raise RequestError(400, "this server gives no word times: start it with `voxline "
                           "asr-serve --word-times` (or --diarize)", "timestamp_granularities[]")
    data, filename = form.pop("file")
    loop = asyncio.get_running_loop()
    known = await _known_voices(form, server, diarized)
    pcm, damage = await loop.run_in_executor(server.decode_pool, _decode, data, filename,
                                             server.max_file_samples)
    del data
    try:
        slot = server.engine.open()
    except CapacityError as exc:
        raise RequestError(503, str(exc), kind="server_error") from None
    share = server.share()
    try:
        labels = Labels()
        if stream:
            return await _stream(web, request, server, share, slot, pcm, diarized, damage,
                                 known, labels)
        segments = await _segments(server, share, slot, pcm, diarized, known, labels)
    finally:
        share.close()
        server.engine.close_slot(slot)
    text = " ".join(s.text for s in segments if s.text)
    duration = round(len(pcm) / RATE, 3)
    # a damaged upload: the transcript of what came before the damage, and a warning saying so
    warned = {"warning": damage} if damage else {}
    headers = {"X-Voxline-Warning": _printable(damage, 300)} if damage else None
    if fmt == "text":
        return web.Response(text=text + "\n", content_type="text/plain", headers=headers)
    if fmt == "json":
        return _json(web, {"text": text, **warned}, headers)
    if fmt in ("srt", "vtt"):
        from agent import captions

        cues = _captions(segments, labels if diarized else None)
        body = captions.to_srt(cues) if fmt == "srt" else captions.to_vtt(cues)
        return web.Response(text=body, content_type="text/plain" if fmt == "srt" else "text/vtt",
                            headers=headers)
    if fmt == "diarized_json":
        return _json(web, {
            "task": "transcribe", "duration": duration, "text": text,
            "segments": [_diarized(i, s, labels) for i, s in enumerate(segments)],
            "usage": {"type": "duration", "seconds": duration}, **warned,
        }, headers)
    doc: dict[str, Any] = {
        "task": "transcribe",
        "language": server.language,
        "duration": duration,
        "text": text,
        "segments": [
            {"id": i, "seek": 0, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
             **({"speaker": labels.label(s.speaker)} if diarized else {})}
            for i, s in enumerate(segments)
        ],
    }
    if words:
        doc["words"] = [{"word": w.text.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                        for s in segments for w in s.words]
    return _json(web, {**doc, **warned}, headers)


async def _known_voices(form: dict[str, Any], server: TranscriptionServer,
                        diarized: bool) -> dict[str, np.ndarray] | None:
    """``known_speaker_names[]`` with ``known_speaker_references[]`` (data URLs of a few
    seconds of each voice: ``data:audio/wav;base64,...``) → name → the voice's mean embedding."""
    names = form.get("known_speaker_names[]", [])
    refs = form.get("known_speaker_references[]", [])
    if not names and not refs:
        return None
    param = "known_speaker_names[]"
    if not diarized:
        raise RequestError(400, "known speakers go with diarized_json (or a model name with "
                           "'diarize')", param)
    if len(names) != len(refs):
        raise RequestError(400, f"{len(names)} known_speaker_names[] but {len(refs)} "
                           "known_speaker_references[]: give one reference per name", param)
    if len(names) > MAX_KNOWN or len(set(names)) != len(names) or not all(names):
        raise RequestError(400, f"known speakers: at most {MAX_KNOWN}, each with its own "
                           "non-empty name", param)
    blobs = [_data_url(r, i) for i, r in enumerate(refs)]
    loop = asyncio.get_running_loop()
    tools = server.speakers
    return await loop.run_in_executor(server.decode_pool, _embed_voices, names, blobs,
                                      tools.embedder if tools else None)


def _data_url(ref: str, i: int) -> bytes:
    import base64
    import binascii

    head, sep, body = ref.partition(",")
    if not (sep and head.startswith("data:") and head.endswith(";base64")):
        raise RequestError(400, f"known_speaker_references[{i}] must be a data URL "
                           "(data:audio/wav;base64,...)", "known_speaker_references[]")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, f"known_speaker_references[{i}] is not valid base64",
                           "known_speaker_references[]") from None


def _embed_voices(names: list[str], blobs: list[bytes], embedder: Any) -> dict[str, np.ndarray]:
    """Each known voice's mean window embedding (on the decode thread)."""
    from stages.speaker.diarization import DiarizationOptions, speech_windows

    out = {}
    for i, (name, blob) in enumerate(zip(names, blobs, strict=True)):
        try:
            pcm = decode_upload(blob, int(REFERENCE_S * RATE), f"known_speaker_references[{i}]")
        except AudioInputError as exc:
            raise RequestError(400, str(exc), "known_speaker_references[]") from None
        if len(pcm) < RATE:
            raise RequestError(400, f"known_speaker_references[{i}] is under a second: give "
                               "2-10 s of the voice", "known_speaker_references[]")
        wins = speech_windows([(0, len(pcm))], DiarizationOptions())
        mean = embedder.embed([pcm[a:b] for _, a, b in wins]).mean(axis=0)
        out[name] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return out


def speaker_label(i: int) -> str:
    """Speaker 0, 1, ... as OpenAI labels them: A, B, ..., Z, AA, AB, ..."""
    label = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        label = chr(65 + r) + label
    return label


class Labels:
    """Speaker numbers as the response names them: a known voice by its name, the others A, B,
    ... in order among themselves. Numbers come in order of first speech and each is named
    when it first speaks, so a label once given never changes."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def label(self, speaker: int) -> str:
        if speaker in self.names:
            return self.names[speaker]
        return speaker_label(speaker - sum(1 for n in self.names if n < speaker))


def _diarized(i: int, s: SpokenSegment, labels: Labels) -> dict[str, Any]:
    return {"type": "transcript.text.segment", "id": f"seg_{i}", "start": round(s.start, 3),
            "end": round(s.end, 3), "text": s.text, "speaker": labels.label(s.speaker)}


def _captions(segments: list[SpokenSegment], labels: Labels | None) -> list:
    from agent.captions import CaptionSegment, CaptionWord

    return [CaptionSegment(s.start, s.end, s.text, labels.label(s.speaker) if labels else None,
                           tuple(CaptionWord(w.text, w.start, w.end) for w in s.words))
            for s in segments if s.text]


def _json(web: Any, doc: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return web.json_response(doc, dumps=lambda d: json.dumps(d, ensure_ascii=False),
                             headers=headers)


async def _segments(server: TranscriptionServer, share: EngineShare, slot: Any, pcm: np.ndarray,
                    diarized: bool, known: dict[str, np.ndarray] | None, labels: Labels,
                    on_segments: Any = None) -> list[SpokenSegment]:
    """The upload's segments: speaker-labelled through the VAD and the speaker model when
    ``diarized`` (``labels`` learns the known voices' names as they speak); otherwise chunks
    at quiet points, speaker -1."""
    if diarized:
        from stages.asr.progressive import DiarizeWith, transcribe_with_engine

        tools = server.speakers
        assert tools is not None

        def each(segments: list[SpokenSegment], names: dict[int, str]) -> None:
            labels.names.update(names)
            if on_segments is not None:
                on_segments(segments)

        done = await transcribe_with_engine(
            share, slot, pcm, tools.vad, server.decode_pool,
            DiarizeWith(tools.embedder, tools.speakers, 1, tools.max_speakers, known=known),
            on_segments=each)
        labels.names.update(done.names or {})
        return done.segments
    out = []

    def each(seg: Segment) -> None:
        spoken = SpokenSegment(seg.start_s, seg.end_s, -1, seg.text, seg.words)
        out.append(spoken)
        if on_segments is not None:
            on_segments([spoken])

    await transcribe_long(share, slot, pcm, on_segment=each)
    return out


async def _read_form(request: Any, limit: int) -> dict[str, Any]:
    from aiohttp.http_exceptions import BadHttpMessage

    if request.content_type != "multipart/form-data":
        raise RequestError(400, "expected a multipart/form-data upload with a `file` field "
                           f"(got {_printable(request.content_type) or 'no content type'})")
    form: dict[str, Any] = {}
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            name = part.name or ""
            if name == "file":
                chunks: list[bytes] = []  # joined once: the decoder reads it in place
                size = 0
                while chunk := await part.read_chunk(1 << 16):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        raise RequestError(413, f"the uploaded file is larger than "
                                           f"{limit / 1048576:.0f} MB", "file")
                form["file"] = (b"".join(chunks), _printable(part.filename or "") or "audio")
            else:
                raw = bytearray()
                while chunk := await part.read_chunk(1024):
                    raw += chunk
                    if len(raw) > (REFERENCE_LIMIT if name == "known_speaker_references[]"
                                   else FIELD_LIMIT):
                        raise RequestError(400, f"form field {_printable(name)!r} is too long", name)
                value = raw.decode("utf-8", "replace").strip()
                if name.endswith("[]"):  # an array field: each part one item
                    items = form.setdefault(name, [])
                    if len(items) >= 64:
                        raise RequestError(400, f"too many {_printable(name)} items", name)
                    items.append(value)
                else:
                    form[name] = value
    except (BadHttpMessage, ValueError, RuntimeError, TypeError):
        # aiohttp's words for a broken body quote its bytes: say what is wrong instead
        raise RequestError(400, "the multipart/form-data body is malformed (a part's headers, "
                           "its boundary or its encoding): send the file as the OpenAI SDK or "
                           "`curl -F file=@audio.wav` does") from None
    if "file" not in form:
        raise RequestError(400, "missing the `file` field: upload the audio as multipart field "
                           "`file`", "file")
    if not form["file"][0]:
        raise RequestError(400, "the uploaded file is empty", "file")
    return form


def _decode(data: bytes, filename: str, max_samples: int) -> tuple[np.ndarray, str | None]:
    """The upload as 16 kHz int16, decoded in memory (on the decode thread), and what damage
    stopped it early, if any (the audio before the damage is kept)."""
    try:
        pcm, damage = decode_upload_partial(data, max_samples, filename)
        return pcm, None if damage is None else str(damage)
    except AudioTooLong as exc:
        raise RequestError(413, str(exc), "file") from None
    except AudioInputError as exc:
        raise RequestError(400, f"could not decode the uploaded audio: {exc}", "file") from None


def _printable(text: str, limit: int = 100) -> str:
    """Client-given text fit to quote in a message: no control characters, not too long."""
    out = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return out + "…" if len(text) > limit else out


async def _stream(web: Any, request: Any, server: TranscriptionServer, share: EngineShare,
                  slot: Any, pcm: np.ndarray, diarized: bool, damage: str | None,
                  known: dict[str, np.ndarray] | None, labels: Labels) -> Any:
    """Server-sent events as segments become final: ``transcript.text.delta`` each (or, for
    a diarized upload, ``transcript.text.segment`` with its speaker), then
    ``transcript.text.done``; a failure after the headers is an ``error`` event."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    writer = EventWriter(resp)
    said: list[str] = []
    count = 0

    def send(segments: list[SpokenSegment]) -> None:
        nonlocal count
        for s in segments:
            if not s.text:
                continue
            if diarized:
                writer.send(_diarized(count, s, labels))
            else:
                writer.send({"type": "transcript.text.delta",
                             "delta": s.text if not said else " " + s.text})
            said.append(s.text)
            count += 1

    try:
        try:
            await _segments(server, share, slot, pcm, diarized, known, labels, on_segments=send)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the headers are gone already: report in the stream
            writer.send({"type": "error", "error": {"message": f"transcription failed: {exc}"}})
        else:
            writer.send({"type": "transcript.text.done", "text": " ".join(said),
                         **({"usage": {"type": "duration", "seconds": round(len(pcm) / RATE, 3)}}
                            if diarized else {}), **({"warning": damage} if damage else {})})
        await writer.close()
        await resp.write_eof()
    finally:
        writer.cancel()
    return resp


class EventWriter:
    """Server-sent events onto a response: each event encoded whole (UTF-8) and written whole;
    the first at once, later ones gathered and written together at most every ``FLUSH_S``, so
    a fast producer costs one write per 50 ms, not one per event."""

    def __init__(self, resp: Any, flush_s: float = FLUSH_S) -> None:
        self.resp, self.flush_s = resp, flush_s
        self._buf: list[bytes] = []
        self._last = -float("inf")  # when the last write went out
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()  # one write at a time, in order
        self.writes = 0

    def send(self, obj: dict[str, Any]) -> None:
        self._buf.append(_event(obj))
        if self._task is None:
            self._task = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self._last + self.flush_s - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        self._task = None
        await self._write()

    async def _write(self) -> None:
        async with self._lock:
            if not self._buf:
                return
            data, self._buf = b"".join(self._buf), []
            self._last = asyncio.get_running_loop().time()
            self.writes += 1
            await self.resp.write(data)

    async def close(self) -> None:
        """Write what is left (after the pending flush, if one is due)."""
        if self._task is not None:
            await self._task
        await self._write()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def _error(web: Any, exc: RequestError) -> Any:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    if exc.status == 503:
        headers = {"Retry-After": "1"}
    return web.json_response(
        {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}},
        status=exc.status, headers=headers,
    )
