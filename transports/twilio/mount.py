"""Twilio Media Streams mounted on an aiohttp application (the browser server's), so one port
serves the browser demo and phone calls:
``add_twilio_routes(server.app, session_factory, server.admission)``.

aiohttp also takes Twilio's default POST webhook for the TwiML (and POST for the action
endpoint after a stream), which the standalone ``websockets`` server cannot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.errors import CapacityError
from transports.admission import Admission, CallRequest, Refusal, Route
from transports.twilio.call import TwilioCall
from transports.twilio.handover import TransferBook, check_action_request
from transports.twilio.rest import DEFAULT_API_BASE, TwilioRest
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
    twilio_account_sid: str = "",
    twilio_api_base: str = DEFAULT_API_BASE,
    action_path: str = "/twilio/action",
) -> TransferBook:
    """Add ``GET|POST twiml_path`` (the TwiML), ``GET media_path`` (the media WebSocket) and
    ``GET|POST action_path`` (what a call does after its stream: a transfer's ``<Dial>``), all
    through ``admission`` — the application's own (``VoiceServer.admission``), so Twilio's calls
    share its call limit. Raises ConfigError when the server is exposed without the Twilio auth
    token that lets it check Twilio's signatures.

    Transfers go through Twilio's REST API with ``twilio_account_sid`` (the auth token is the
    admission's), else through the action endpoint, whose book this returns."""
    from aiohttp import web

    from transports.server import LIVE_SOCKETS, refusal_error

    admission.require_twilio()
    rest = (TwilioRest(twilio_account_sid, admission.twilio_auth_token, twilio_api_base)
            if twilio_account_sid else None)
    book = TransferBook()

    def stream_url(request: web.Request) -> str:
        return admission.public_base(request.scheme, request.host, websocket=True) + media_path

    async def posted_form(request: web.Request) -> tuple[tuple[str, str], ...]:
        if request.method != "POST":
            return ()
        posted = await request.post()  # Twilio's default: the call's parameters, form-encoded
        return tuple((k, v) for k, v in posted.items() if isinstance(v, str))

    async def twiml(request: web.Request) -> web.Response:
        form = await posted_form(request)
        decision = admission.admit(CallRequest(
            Route.TWILIO_WEBHOOK, request.raw_path, request.headers, request.query, form,
            request.scheme,
        ))
        if isinstance(decision, Refusal):
            if decision.busy:
                return web.Response(text=reject_twiml("busy"), content_type="text/xml")
            raise refusal_error(decision)
        then = ""
        if rest is None:  # transfers go through the action endpoint after the stream
            book.arm(dict(form).get("CallSid") or request.query.get("CallSid", ""),
                     time.monotonic())
            then = admission.public_base(request.scheme, request.host, websocket=False)
            then += action_path
        return web.Response(text=connect_stream_twiml(stream_url(request), then_url=then),
                            content_type="text/xml")

    async def action(request: web.Request) -> web.Response:
        form = await posted_form(request)
        refusal = check_action_request(admission, CallRequest(
            Route.TWILIO_WEBHOOK, request.raw_path, request.headers, request.query, form,
            request.scheme,
        ))
        if refusal is not None:
            raise refusal_error(refusal)
        call_sid = dict(form).get("CallSid") or request.query.get("CallSid", "")
        return web.Response(text=book.answer(call_sid, time.monotonic()),
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
                report = await handle_media_stream(_AiohttpSocket(ws), session_factory, on_call,
                                                   rest=rest, book=book)
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
    app.router.add_route("GET", action_path, action)
    app.router.add_route("POST", action_path, action)
    return book
