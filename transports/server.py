"""The browser demo's server: one aiohttp application on one event loop serving the page
(``web/``), calls over WebSocket (``GET /ws``) and WebRTC signalling (``POST /offer``).

Every call gets its own :class:`~agent.session.Session` from ``new_session``; models are shared
by whoever builds the sessions. A call that ends for any reason closes its session, and the
server goes on serving the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.session import Session
from transports.auth import TokenAuth, is_loopback
from transports.websocket import codec
from transports.websocket.call import WebSocketCall

log = logging.getLogger("voxline.server")

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"
MAX_OFFER_BYTES = 64 * 1024  # an SDP offer is a few KB

SessionFactory = Callable[[], Session]


class VoiceServer:
    """``max_calls`` bounds the calls served at once (each holds an ASR slot and a pipeline);
    a call beyond it is refused with a clear error, never queued. ``webrtc_ptime_ms`` is the
    packet time of the agent's WebRTC audio (None: the track's default, 20 ms)."""

    def __init__(
        self,
        new_session: SessionFactory,
        host: str = "127.0.0.1",
        port: int = 8080,
        token: str = "",
        web_root: Path = WEB_ROOT,
        max_calls: int = 64,
        ice_servers: Sequence[str] = (),
        webrtc_ptime_ms: int | None = None,
    ) -> None:
        self.new_session = new_session
        self.host = host
        self.port = port
        self.auth = TokenAuth.for_host(host, token)
        self.web_root = web_root
        self.max_calls = max_calls
        self.ice_servers = tuple(ice_servers)
        self.webrtc_ptime_ms = webrtc_ptime_ms
        self.loopback = is_loopback(host)
        self.calls: dict[str, Any] = {}  # session id -> WebSocketCall | WebRTCCall
        self.served = 0
        self.refused = 0
        self.dropped_audio = 0
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None

    # --- set-up --------------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_OFFER_BYTES)
        app.add_routes([
            web.get("/", self._index),
            web.get("/ws", self._websocket),
            web.post("/offer", self._offer),
            web.get("/healthz", self._health),
        ])
        app.router.add_static("/static/", self.web_root)
        return app

    async def start(self) -> int:
        """Listen; returns the port (useful with ``port=0``)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if server is not None and server.sockets:  # type: ignore[attr-defined]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self.port

    @property
    def url(self) -> str:
        q = f"?token={self.auth.token}" if self.auth.required else ""
        return f"http://{self.host}:{self.port}/{q}"

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            if call is None:  # a call still being set up
                continue
            if hasattr(call, "ws"):
                await call.ws.close()
            else:
                await call.close("server stopping")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stats(self) -> dict[str, Any]:
        return {
            "calls": len(self.calls),
            "served": self.served,
            "refused": self.refused,
            "dropped_audio_frames": self.dropped_audio,
        }

    # --- handlers ----------------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(self.web_root / "index.html")

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    def _check(self, request: web.Request) -> None:
        if not self.auth.allows(request.query, request.headers):
            self.refused += 1
            raise web.HTTPUnauthorized(text="a token is required: add ?token=… to the page URL\n")
        if len(self.calls) >= self.max_calls:
            self.refused += 1
            raise web.HTTPServiceUnavailable(
                text=f"the server is at its limit of {self.max_calls} calls; try again later\n"
            )

    def _open_session(self) -> Session:
        session = self.new_session()
        self.calls[session.id] = None  # reserve the place before any await
        self.served += 1
        return session

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        self._check(request)
        ws = web.WebSocketResponse(max_msg_size=codec.MAX_MESSAGE_BYTES, heartbeat=20.0)
        await ws.prepare(request)
        try:
            session = self._open_session()
        except Exception as exc:  # e.g. no free ASR slot
            log.exception("could not start a call")
            await ws.send_str(codec.encode_event(codec.error_event(f"cannot start a call: {exc}", True)))
            await ws.close()
            return ws
        call = WebSocketCall(ws, session)
        self.calls[session.id] = call
        try:
            stats = await call.run()
            self.dropped_audio += stats.dropped_audio
        finally:
            self.calls.pop(session.id, None)
        return ws

    async def _offer(self, request: web.Request) -> web.Response:
        self._check(request)
        from transports.webrtc.ice import (
            keep_loopback_candidates,
            rtc_configuration,
            use_loopback_ice,
        )
        from transports.webrtc.peer import WebRTCCall

        try:
            body = await request.json()
        except ValueError:  # (a body over MAX_OFFER_BYTES is refused by aiohttp with 413)
            raise web.HTTPBadRequest(text="the offer must be JSON: {\"sdp\": …, \"type\": \"offer\"}\n") from None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("sdp"), str)
            or body.get("type") != "offer"
        ):
            raise web.HTTPBadRequest(text="the offer must be JSON: {\"sdp\": …, \"type\": \"offer\"}\n")
        sdp = body["sdp"]
        if self.loopback:
            use_loopback_ice()
            sdp = keep_loopback_candidates(sdp)
        session = self._open_session()
        options = {} if self.webrtc_ptime_ms is None else {"ptime_ms": self.webrtc_ptime_ms}
        call = WebRTCCall(session, rtc_configuration(self.ice_servers), on_closed=self._rtc_closed,
                          **options)
        self.calls[session.id] = call
        try:
            answer = await call.answer(sdp)
        except Exception as exc:
            await call.close("bad offer")
            raise web.HTTPBadRequest(text=f"cannot answer the offer: {exc}\n") from None
        return web.json_response({"sdp": answer.sdp, "type": answer.type, "session": session.id})

    def _rtc_closed(self, call: Any) -> None:
        self.calls.pop(call.session.id, None)
