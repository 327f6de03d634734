"""The OpenAI-compatible ``POST /v1/audio/transcriptions`` endpoint of asr-serve (aiohttp, on the
server's event loop), so existing OpenAI clients can use the shared engine unchanged.

Multipart fields: ``file`` (required), ``model`` (accepted, any name), ``response_format``
(json | text | verbose_json), ``stream`` (true: server-sent events ``transcript.text.delta`` /
``transcript.text.done``); ``language``, ``prompt`` and ``temperature`` are accepted and ignored.
Uploads are decoded in memory like ``voxline run`` inputs (any common format and rate) on one
decode thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import io
import json
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from agent.audio import RATE, read_audio
from agent.errors import AudioInputError, CapacityError, require
from stages.asr.engine import ASREngine
from stages.asr.long_audio import Segment, joined, transcribe_long


class TranscriptionServer(Protocol):
    """What the endpoint needs of the server it serves for (asr-serve's ``ASRServer``)."""

    engine: ASREngine  # shared with the server's socket streams; one slot per request
    decode_pool: Executor | None  # where uploads are decoded; None: :func:`start` makes one
    language: str  # reported by ``verbose_json``
    max_file_samples: int  # the longest upload, decoded, in samples at 16 kHz


PATH = "/v1/audio/transcriptions"
FORMATS = ("json", "text", "verbose_json")
FIELD_LIMIT = 4096  # bytes of a non-file form field


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


async def start(server: TranscriptionServer, host: str, port: int, max_upload_mb: float) -> tuple[Any, int]:
    """Start the endpoint; returns the aiohttp runner (to clean up) and the bound port. A
    ``server.decode_pool`` of None is replaced by a one-thread pool the server then owns."""
    web = require("aiohttp.web", what="the asr-serve HTTP endpoint", extra="serve", package="aiohttp")
    if server.decode_pool is None:
        server.decode_pool = ThreadPoolExecutor(1, thread_name_prefix="asr-decode")
        # start the thread now, so the server's thread count is fixed from start-up on
        await asyncio.get_running_loop().run_in_executor(server.decode_pool, int)
    limit = int(max_upload_mb * 1024 * 1024)

    @web.middleware
    async def json_errors(request: Any, handler: Any) -> Any:
        try:
            return await handler(request)
        except RequestError as exc:
            return _error(web, exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(web, RequestError(exc.status, f"{exc.reason}: {request.method} {request.path}"
                                            f" (this server answers POST {PATH})"))

    async def transcriptions(request: Any) -> Any:
        form = await _read_form(request, limit)
        fmt = form.get("response_format", "json")
        if fmt not in FORMATS:
            raise RequestError(400, f"response_format {fmt!r} is not supported (use one of: "
                               f"{', '.join(FORMATS)})", "response_format")
        stream = form.get("stream", "false").lower() in ("true", "1")
        data, filename = form["file"]
        loop = asyncio.get_running_loop()
        pcm = await loop.run_in_executor(server.decode_pool, _decode, data, filename)
        if len(pcm) > server.max_file_samples:
            raise RequestError(413, f"the uploaded audio is {len(pcm) / RATE:.0f} s long; this "
                               f"server takes at most {server.max_file_samples / RATE:.0f} s", "file")
        try:
            slot = server.engine.open()
        except CapacityError as exc:
            raise RequestError(503, str(exc), kind="server_error") from None
        try:
            if stream:
                return await _stream(web, request, server, slot, pcm)
            segments = await transcribe_long(server.engine, slot, pcm)
        finally:
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

    app = web.Application(middlewares=[json_errors], client_max_size=limit + (1 << 20))
    app.router.add_post(PATH, transcriptions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, int(bound)


async def _read_form(request: Any, limit: int) -> dict[str, Any]:
    if request.content_type != "multipart/form-data":
        raise RequestError(400, "expected a multipart/form-data upload with a `file` field "
                           f"(got {request.content_type or 'no content type'})")
    form: dict[str, Any] = {}
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        name = part.name or ""
        if name == "file":
            buf = io.BytesIO()  # decoded from here: no temporary file, no second copy
            while chunk := await part.read_chunk(1 << 16):
                buf.write(chunk)
                if buf.tell() > limit:
                    raise RequestError(413, f"the uploaded file is larger than "
                                       f"{limit / 1048576:.0f} MB", "file")
            form["file"] = (buf, part.filename or "audio")
        else:
            raw = bytearray()
            while chunk := await part.read_chunk(1024):
                raw += chunk
                if len(raw) > FIELD_LIMIT:
                    raise RequestError(400, f"form field {name!r} is too long", name)
            form[name] = raw.decode("utf-8", "replace").strip()
    if "file" not in form:
        raise RequestError(400, "missing the `file` field: upload the audio as multipart field "
                           "`file`", "file")
    if form["file"][0].tell() == 0:  # written, not rewound: its position is its size
        raise RequestError(400, "the uploaded file is empty", "file")
    return form


def _decode(data: io.BytesIO, filename: str) -> np.ndarray:
    """The upload as 16 kHz int16, decoded in memory (on the decode thread)."""
    try:
        return read_audio(data, name=filename)
    except AudioInputError as exc:
        raise RequestError(400, f"could not decode the uploaded audio: {exc}", "file") from None


async def _stream(web: Any, request: Any, server: TranscriptionServer, slot: Any, pcm: np.ndarray) -> Any:
    """Server-sent events: one ``transcript.text.delta`` per chunk, then ``transcript.text.done``."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    ready: asyncio.Queue[Segment | None] = asyncio.Queue()
    task = asyncio.ensure_future(transcribe_long(server.engine, slot, pcm, on_segment=ready.put_nowait))
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
    return web.json_response(
        {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": None}},
        status=exc.status,
    )
