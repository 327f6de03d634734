"""Twilio Media Streams mounted on an aiohttp application (the browser server's), so one port
serves the browser demo and phone calls:
``add_twilio_routes(server.app, session_factory, server.admission)``.

aiohttp also takes Twilio's default POST webhook for the TwiML, which the standalone
``websockets`` server cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.errors import CapacityError
from transports.admission import Admission, CallRequest, Refusal, Route
from transports.twilio.call import TwilioCall
from transports.twilio.server import SessionFactory, TwilioCallReport, handle_media_stream
from transports.twilio.twiml import connect_stream_twiml, reject_twiml

log = logging.getLogger("voxline.twilio")


class _AiohttpSocket:
    """aiohttp's WebSocketResponse seen through the calls ``handle_media_stream`` makes."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def recv(self) -> str | bytes:
        from aiohttp import WSMsgType

        msg = await self.ws.receive()
        if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            return msg.data  # type: ignore[no-any-return]
        raise ConnectionError(f"Twilio WebSocket closed ({msg.type.name})")

    async def send(self, message: str) -> None:
        await self.ws.send_str(message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code=code, message=reason.encode()[:120])


def add_twilio_routes(
    app: Any,
    session_factory: SessionFactory,
    admission: Admission,
    media_path: str = "/twilio/media",
    twiml_path: str = "/twilio/twiml",
    on_call: Callable[[TwilioCall], None] | None = None,
    on_end: Callable[[TwilioCallReport], None] | None = None,
) -> None:
    """Add ``GET|POST twiml_path`` (the TwiML) and ``GET media_path`` (the media WebSocket), both
    through ``admission`` — the application's own (``VoiceServer.admission``), so Twilio's calls
    share its call limit. Raises ConfigError when the server is exposed without the Twilio auth
    token that lets it check Twilio's signatures."""
    from aiohttp import web

    from transports.server import LIVE_SOCKETS, refusal_error

    admission.require_twilio()

    def stream_url(request: web.Request) -> str:
        return admission.public_base(request.scheme, request.host, websocket=True) + media_path

    async def twiml(request: web.Request) -> web.Response:
        form: tuple[tuple[str, str], ...] = ()
        if request.method == "POST":  # Twilio's default: the call's parameters, form-encoded
            posted = await request.post()
            form = tuple((k, v) for k, v in posted.items() if isinstance(v, str))
        decision = admission.admit(CallRequest(
            Route.TWILIO_WEBHOOK, request.raw_path, request.headers, request.query, form,
            request.scheme,
        ))
        if isinstance(decision, Refusal):
            if decision.busy:
                return web.Response(text=reject_twiml("busy"), content_type="text/xml")
            raise refusal_error(decision)
        return web.Response(text=connect_stream_twiml(stream_url(request)),
                            content_type="text/xml")

    async def media(request: web.Request) -> web.StreamResponse:
        decision = admission.admit(CallRequest(
            Route.TWILIO_MEDIA, request.raw_path, request.headers, request.query,
            scheme=request.scheme,
        ))
        if isinstance(decision, Refusal):
            raise refusal_error(decision)  # before the upgrade: Twilio sees the HTTP status
        live: set[Any] = app.get(LIVE_SOCKETS, set())  # the server closes these when it stops
        try:
            ws = web.WebSocketResponse(max_msg_size=2**16)
            await ws.prepare(request)
            live.add(ws)
            try:
                report = await handle_media_stream(_AiohttpSocket(ws), session_factory, on_call)
            except CapacityError as exc:  # refused for want of room: a line, not a traceback
                log.warning("Twilio media stream refused: %s", exc)
                report = None
            except Exception:
                log.exception("Twilio media stream failed")
                report = None
            if report is not None and on_end is not None:
                on_end(report)
            await ws.close()
            return ws
        finally:
            live.discard(ws)
            decision.release()

    app.router.add_route("GET", twiml_path, twiml)
    app.router.add_route("POST", twiml_path, twiml)
    app.router.add_route("GET", media_path, media)
