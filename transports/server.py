"""The browser demo's server: one aiohttp application on one event loop serving the page
(``web/``), calls over WebSocket (``GET /ws``) and WebRTC signalling (``POST /offer``).

Every call gets its own :class:`~agent.session.Session` from ``new_session``; models are shared
by whoever builds the sessions. A call that ends for any reason closes its session, and the
server goes on serving the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.netaddr import is_loopback
from agent.ops import Check, Health, MetricsRender, OpsEndpoints, Sample
from agent.session import Session
from transports import jsonwire
from transports.admission import Admission, CallRequest, Refusal, Route, Ticket
from transports.auth import TokenAuth
from transports.websocket import codec
from transports.websocket.call import IDLE_TIMEOUT_S, CallStats, WebSocketCall

log = logging.getLogger("voxline.server")

# the page is the `web` package's data, so an installed wheel serves it as a checkout does
WEB_ROOT = Path(str(files("web")))
MAX_OFFER_BYTES = 64 * 1024  # an SDP offer is a few KB
# A connection must finish its request's headers within this (slow-loris clients hold a socket
# each, forever otherwise); an idle keep-alive connection is closed after it too.
HEADER_TIMEOUT_S = 15.0
WS_GOING_AWAY = 1001  # the close code a call gets when the server stops
# every call's WebSocket (the browser's and Twilio's media streams), closed when the app stops
LIVE_SOCKETS = web.AppKey("voxline.live_sockets", set)

SessionFactory = Callable[[], Session]

_REFUSALS: dict[int, type[web.HTTPException]] = {
    401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 429: web.HTTPTooManyRequests,
    503: web.HTTPServiceUnavailable,
}


def refusal_error(refusal: Refusal) -> web.HTTPException:
    """The aiohttp answer to an admission refusal (raise it before a WebSocket is prepared)."""
    return _REFUSALS[refusal.status](text=refusal.text)


class VoiceServer:
    """``max_calls`` bounds the calls served at once (each holds an ASR slot and a pipeline);
    a call beyond it is refused with a clear error, never queued. ``webrtc_ptime_ms`` is the
    packet time of the agent's WebRTC audio (None: the track's default, 20 ms).

    Every call on this port, Twilio's included when its routes are mounted
    (``add_twilio_routes(server.app, session_factory, server.admission)``), passes one
    :class:`~transports.admission.Admission` built from ``host``, ``token``, ``max_calls``,
    ``public_url`` (the address Twilio or a browser reaches this server at, behind a proxy or a
    tunnel), ``twilio_auth_token``, ``max_calls_per_client``, ``allowed_origins`` and
    ``allowed_hosts``.

    ``stop`` ends every live call — the browser's and Twilio's streams alike — with close code
    1001 and a reason, so no call keeps the process alive after SIGTERM. Before it,
    ``begin_drain`` refuses every new call (503, reason ``draining``) while the live ones go on.

    ``/healthz``, ``/readyz`` (``ready_checks`` besides room under ``max_calls``; ``loaded``
    False until the models are) and ``/metrics`` (``metrics``, the Prometheus exposition) are
    served on the same port."""

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
        public_url: str = "",
        twilio_auth_token: str = "",
        max_calls_per_client: int = 8,
        allowed_origins: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        header_timeout_s: float = HEADER_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        extra_stats: Callable[[], dict[str, Any]] | None = None,
        metrics: MetricsRender | None = None,
        ready_checks: Sequence[Check] = (),
        loaded: bool = True,
        new_echo_session: SessionFactory | None = None,
    ) -> None:
        self.new_session = new_session
        self.new_echo_session = new_echo_session  # /ws/echo: the echo test (None: no route)
        self.host = host
        self.port = port
        self.admission = Admission(host, token, max_calls, public_url, twilio_auth_token,
                                   max_calls_per_client, allowed_origins, allowed_hosts)
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.web_root = web_root
        self.ice_servers = tuple(ice_servers)
        self.webrtc_ptime_ms = webrtc_ptime_ms
        self.loopback = is_loopback(host)
        self.calls: dict[str, Any] = {}  # session id -> WebSocketCall | WebRTCCall
        self.served = 0
        self.dropped_audio = 0
        self.frames_in = 0  # caller frames the finished WebSocket calls took
        self.dropped_inbound = 0  # and dropped, over the real-time rate
        self.webrtc_dropped_inbound = 0  # WebRTC caller frames over the rate (ended calls)
        self.extra_stats = extra_stats  # what the process adds to /healthz (its ASR slots)
        self.health = Health(self.stats, [self._room, *ready_checks], loaded=loaded)
        self.ops = OpsEndpoints(self.health, metrics)
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None

    # --- set-up --------------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_OFFER_BYTES)
        app.add_routes([
            web.get("/", self._index),
            web.get("/ws", self._websocket),
            web.post("/offer", self._offer),
        ])
        if self.new_echo_session is not None:
            app.add_routes([web.get("/ws/echo", self._echo_websocket)])
        self.ops.add_routes(app)
        app.router.add_static("/static/", self.web_root)
        app[LIVE_SOCKETS] = set()
        app.on_shutdown.append(_close_live_sockets)
        return app

    async def start(self) -> int:
        """Listen; returns the port (useful with ``port=0``)."""
        self._runner = web.AppRunner(self.app, access_log=None,
                                     keepalive_timeout=self.header_timeout_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if server is not None and server.sockets:  # type: ignore[attr-defined]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self.port

    @property
    def auth(self) -> TokenAuth:
        return self.admission.auth

    @property
    def max_calls(self) -> int:
        return self.admission.max_calls

    @property
    def refused(self) -> int:
        return self.admission.refused_total

    @property
    def url(self) -> str:
        q = f"?token={self.auth.token}" if self.auth.required else ""
        return f"http://{self.host}:{self.port}/{q}"

    def begin_drain(self) -> None:
        """Take no new call (each is refused with 503 and why); the live ones go on."""
        self.admission.draining = self.health.draining = True

    @property
    def live_calls(self) -> int:
        """Calls holding a place: the browser's (WebSocket, WebRTC) and Twilio's streams."""
        return self.admission.active

    def _room(self) -> str:
        active, most = self.admission.active, self.admission.max_calls
        return "" if active < most else f"at its limit of {most} calls"

    async def stop(self) -> None:
        self.begin_drain()
        for call in list(self.calls.values()):
            if call is not None and not isinstance(call, WebSocketCall):  # (None: setting up)
                await call.close("server stopping")
        await _close_live_sockets(self.app)  # the WebSocket calls, Twilio's streams too
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stats(self) -> dict[str, Any]:
        return {
            "calls": len(self.calls),
            "served": self.served,
            "refused": self.refused,
            "refused_by": dict(self.admission.refused),
            "dropped_audio_frames": self.dropped_audio,
            "audio_frames_in": self.frames_in,
            "dropped_inbound_frames": self.dropped_inbound,
            "tasks": len(asyncio.all_tasks()),
            **(self.extra_stats() if self.extra_stats is not None else {}),
        }

    def metric_samples(self) -> list[Sample]:
        """What ``/metrics`` shows of this port: places held, refusals, dropped frames."""
        live = [c for c in self.calls.values() if isinstance(c, WebSocketCall)]
        out = self.dropped_audio + sum(c.outbox.dropped_audio for c in live)
        into = self.dropped_inbound + sum(c.stats.dropped_inbound for c in live)
        rtc = self.webrtc_dropped_inbound + sum(
            c.dropped_inbound for c in self.calls.values()
            if c is not None and not isinstance(c, WebSocketCall))
        refused = "Calls refused at admission, by reason."
        dropped = "Audio frames dropped, by transport and direction (out: the agent's audio a " \
                  "slow client could not take; in: caller audio over the real-time rate)."
        return [
            Sample("voxline_calls_admitted", "gauge", "Calls holding a place on this port "
                   "(browser and Twilio).", self.admission.active),
            Sample("voxline_calls_max", "gauge", "Calls this port serves at once (--max-calls).",
                   self.admission.max_calls),
            Sample("voxline_draining", "gauge", "1 while the server drains (SIGTERM).",
                   int(self.admission.draining)),
            *(Sample("voxline_calls_refused", "counter", refused, n, (("reason", reason),))
              for reason, n in self.admission.refused.items()),
            Sample("voxline_frames_dropped", "counter", dropped, out,
                   (("transport", "websocket"), ("direction", "out"))),
            Sample("voxline_frames_dropped", "counter", dropped, into,
                   (("transport", "websocket"), ("direction", "in"))),
            Sample("voxline_frames_dropped", "counter", dropped, rtc,
                   (("transport", "webrtc"), ("direction", "in"))),
        ]

    # --- handlers ----------------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(self.web_root / "index.html")

    def _admit(self, request: web.Request) -> Ticket:
        decision = self.admission.admit(CallRequest(
            Route.BROWSER, request.raw_path, request.headers, request.query, scheme=request.scheme,
            peer=request.remote or "",
        ))
        if isinstance(decision, Refusal):
            raise refusal_error(decision)
        return decision

    def _start_error(self, exc: Exception) -> str:
        """What a caller is told when its call cannot start. An exposed server says no more
        than that (the exception may name paths, hosts, models); on loopback the caller is the
        operator, who is told why."""
        if self.admission.exposed:
            return "cannot start a call: the server could not (its log says why)"
        return f"cannot start a call: {exc}"

    def _open_session(self, factory: SessionFactory | None = None) -> Session:
        session = (factory or self.new_session)()
        self.calls[session.id] = None  # listed before any await (admission holds its place)
        self.served += 1
        return session

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        return await self._ws_call(request, self.new_session)

    async def _echo_websocket(self, request: web.Request) -> web.StreamResponse:
        """The echo test over the browser protocol: the caller's audio comes back to it."""
        if self.new_echo_session is None:  # (the route exists only with one)
            raise web.HTTPNotFound()
        return await self._ws_call(request, self.new_echo_session)

    async def _ws_call(self, request: web.Request, factory: SessionFactory) -> web.StreamResponse:
        ticket = self._admit(request)
        try:
            ws = web.WebSocketResponse(max_msg_size=codec.MAX_WIRE_BYTES, heartbeat=20.0)
            await ws.prepare(request)
            try:
                session = self._open_session(factory)
            except Exception as exc:  # e.g. no free ASR slot
                log.exception("could not start a call")
                await ws.send_str(codec.encode_event(
                    codec.error_event(self._start_error(exc), True)))
                await ws.close()
                return ws
            call = WebSocketCall(ws, session, idle_timeout_s=self.idle_timeout_s)
            self.calls[session.id] = call
            live: set[web.WebSocketResponse] = self.app[LIVE_SOCKETS]
            live.add(ws)

            def ended(stats: CallStats) -> None:
                # The call is over: its place goes back now, not after the closing handshake.
                self.calls.pop(session.id, None)
                ticket.release()
                self.dropped_audio += stats.dropped_audio
                self.frames_in += stats.frames_in
                self.dropped_inbound += stats.dropped_inbound

            try:
                await call.run(ended)  # (which calls ``ended`` on every way out)
            finally:
                live.discard(ws)
            return ws
        finally:
            ticket.release()

    async def _offer(self, request: web.Request) -> web.Response:
        ticket = self._admit(request)
        try:
            return await self._answer(request, ticket)
        except BaseException:
            ticket.release()  # no call came of it (a live call releases when it closes)
            raise

    async def _answer(self, request: web.Request, ticket: Ticket) -> web.Response:
        from transports.webrtc.ice import (
            keep_loopback_candidates,
            rtc_configuration,
            use_loopback_ice,
        )
        from transports.webrtc.peer import WebRTCCall

        if request.content_type != "application/json":  # text/plain would skip CORS preflight
            raise web.HTTPUnsupportedMediaType(
                text="the offer must be sent as Content-Type: application/json\n")
        try:  # (a body over MAX_OFFER_BYTES is refused by aiohttp with 413)
            body = jsonwire.loads(await request.read())
        except ValueError:
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
        def closed(call: Any) -> None:
            ticket.release()
            self.calls.pop(call.session.id, None)
            self.webrtc_dropped_inbound += call.dropped_inbound

        call = WebRTCCall(session, rtc_configuration(self.ice_servers), on_closed=closed, **options)
        self.calls[session.id] = call
        try:
            answer = await call.answer(sdp)
        except Exception as exc:
            if not call.life.started:
                log.exception("session %s: the call could not start", session.id)
                await call.close("error")
                raise web.HTTPInternalServerError(text=self._start_error(exc) + "\n") from None
            await call.close("bad offer")
            raise web.HTTPBadRequest(text=f"cannot answer the offer: {str(exc)[:200]}\n") from None
        return web.json_response({"sdp": answer.sdp, "type": answer.type, "session": session.id})



async def _close_live_sockets(app: web.Application) -> None:
    live: set[web.WebSocketResponse] = app[LIVE_SOCKETS]
    for ws in list(live):
        await ws.close(code=WS_GOING_AWAY, message=b"server stopping")
