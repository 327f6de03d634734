"""The OpenAI-compatible ``POST /v1/audio/transcriptions`` endpoint of asr-serve (aiohttp, on the
server's event loop), so existing OpenAI clients can use the shared engine unchanged.

Multipart fields: ``file`` (required), ``model`` (accepted, any name), ``response_format``
(json | text | verbose_json), ``stream`` (true: server-sent events ``transcript.text.delta`` /
``transcript.text.done``); ``language``, ``prompt`` and ``temperature`` are accepted and ignored.
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
from stages.asr.long_audio import Segment, joined, transcribe_long
from stages.asr.uploads import AudioTooLong, decode_upload


class TranscriptionServer(Protocol):
    """What the endpoint needs of the server it serves for (asr-serve's ``ASRServer``)."""

    engine: ASREngine  # shared with the server's socket streams; one slot per request
    decode_pool: Executor | None  # where uploads are decoded; None: :func:`start` makes one
    language: str  # reported by ``verbose_json``
    max_file_samples: int  # the longest upload, decoded, in samples at 16 kHz
    draining: bool  # shutting down: uploads get 503, the ones in progress finish
    uploads: int  # uploads in progress (what a drain waits for)
    ops: OpsEndpoints  # /healthz, /readyz, /metrics

    def share(self) -> EngineShare:
        """A request's own share of the engine (so one upload never queues ahead of others)."""
        ...


class TokenCheck(Protocol):
    """Whether a request carries the token (``transports.auth.TokenAuth``: constant-time)."""

    def allows(self, query: Mapping[str, str], headers: Mapping[str, str]) -> bool: ...


PATH = "/v1/audio/transcriptions"
FORMATS = ("json", "text", "verbose_json")
FIELD_LIMIT = 4096  # bytes of a non-file form field


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
    data, filename = form.pop("file")
    loop = asyncio.get_running_loop()
    pcm = await loop.run_in_executor(server.decode_pool, _decode, data, filename,
                                     server.max_file_samples)
    del data
    try:
        slot = server.engine.open()
    except CapacityError as exc:
        raise RequestError(503, str(exc), kind="server_error") from None
    share = server.share()
    try:
        if stream:
            return await _stream(web, request, share, slot, pcm)
        segments = await transcribe_long(share, slot, pcm)
    finally:
        share.close()
        server.engine.close_slot(slot)
    text = joined(segments)
    if fmt == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    if fmt == "json":
        return web.json_response({"text": text})
    return web.json_response({
        "task": "transcribe",
        "language": server.language,
        "duration": round(len(pcm) / RATE, 3),
        "text": text,
        "segments": [
            {"id": i, "seek": 0, "start": round(s.start_s, 3), "end": round(s.end_s, 3), "text": s.text}
            for i, s in enumerate(segments)
        ],
    })


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
                    if len(raw) > FIELD_LIMIT:
                        raise RequestError(400, f"form field {_printable(name)!r} is too long", name)
                form[name] = raw.decode("utf-8", "replace").strip()
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


def _decode(data: bytes, filename: str, max_samples: int) -> np.ndarray:
    """The upload as 16 kHz int16, decoded in memory (on the decode thread)."""
    try:
        return decode_upload(data, max_samples, filename)
    except AudioTooLong as exc:
        raise RequestError(413, str(exc), "file") from None
    except AudioInputError as exc:
        raise RequestError(400, f"could not decode the uploaded audio: {exc}", "file") from None


def _printable(text: str, limit: int = 100) -> str:
    """Client-given text fit to quote in a message: no control characters, not too long."""
    out = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return out + "…" if len(text) > limit else out


async def _stream(web: Any, request: Any, share: EngineShare, slot: Any, pcm: np.ndarray) -> Any:
    """Server-sent events: one ``transcript.text.delta`` per chunk, then ``transcript.text.done``."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    ready: asyncio.Queue[Segment | None] = asyncio.Queue()
    task = asyncio.ensure_future(transcribe_long(share, slot, pcm, on_segment=ready.put_nowait))
    task.add_done_callback(lambda _: ready.put_nowait(None))
    first = True
    try:
        while (seg := await ready.get()) is not None:
            if seg.text:
                await resp.write(_event({"type": "transcript.text.delta",
                                         "delta": seg.text if first else " " + seg.text}))
                first = False
        try:
            text = joined(task.result())
        except Exception as exc:  # the headers are gone already: report in the stream
            await resp.write(_event({"type": "error", "error": {"message": f"transcription failed: {exc}"}}))
        else:
            await resp.write(_event({"type": "transcript.text.done", "text": text}))
        await resp.write_eof()
    finally:
        task.cancel()
    return resp


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _error(web: Any, exc: RequestError) -> Any:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    if exc.status == 503:
        headers = {"Retry-After": "1"}
    return web.json_response(
        {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}},
        status=exc.status, headers=headers,
    )
