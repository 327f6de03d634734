"""``voxline serve --ray``: calls spread over voice replicas of a Ray Serve application.

Each voice replica loads the models once and runs its own :class:`~transports.server.VoiceServer`
on its node's address. The ingress, behind Serve's HTTP proxy, serves the page and places each
call: it reserves a place on a replica with a free slot and answers that replica's own media
addresses, so a call's media never passes through Serve's proxy and the call stays on the one
replica that holds its state, for its whole life.

The placement book, the replica ranking and the autoscaling policy are plain Python (no Ray
import) so they are tested without a cluster; Ray is imported only when an application is built.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

APP_NAME = "voxline"
TWIML_BODY_MAX = 64 * 1024  # a Twilio webhook's form: its call parameters
SESSIONS_KEPT = 64  # the latest calls a replica's info() lists
PLACE_HOLD_S = 10.0  # a reserved place waits this long for its call, then lapses
ACTIVE_CALLS = "active_calls"  # the custom autoscaling metric each replica reports
ROUTING_STATS_PERIOD_S = 1.0  # how often replicas tell the ingress's router their free places
# Serve force-kills a stopping replica this long after the drain timeout (the models' and the
# server's own shutdown must fit in it)
SHUTDOWN_MARGIN_S = 15.0


# --- the placement book: what one replica promised, sans-I/O ----------------------------------
class Places:
    """One replica's places: ``capacity`` (its ``--max-calls``) less its live calls, less the
    places it reserved for calls still on their way. A reservation ends when a call arrives (the
    server's ``served`` count grows: the oldest reservation is taken as that call's) or lapses
    after ``hold_s``. A call that arrives without a reservation also takes one off the book, so
    the book errs towards refusing, never towards promising a place the server would refuse;
    the server's own limit stays the hard bound either way."""

    __slots__ = ("capacity", "hold_s", "draining", "_held", "_served_seen")

    def __init__(self, capacity: int, hold_s: float = PLACE_HOLD_S, served: int = 0) -> None:
        if capacity < 1:
            raise ValueError("a replica needs room for at least one call")
        self.capacity = capacity
        self.hold_s = hold_s
        self.draining = False
        self._held: deque[float] = deque()  # lapse times, oldest first
        self._served_seen = served

    def _settle(self, now: float, served: int) -> None:
        arrived = served - self._served_seen
        self._served_seen = served
        for _ in range(min(arrived, len(self._held))):
            self._held.popleft()
        while self._held and self._held[0] <= now:
            self._held.popleft()

    def held(self, now: float, served: int) -> int:
        """Places reserved for calls not yet arrived."""
        self._settle(now, served)
        return len(self._held)

    def free(self, now: float, live: int, served: int) -> int:
        if self.draining:
            return 0
        return max(0, self.capacity - live - self.held(now, served))

    def reserve(self, now: float, live: int, served: int) -> str:
        """Reserve a place: "" when done, else why not."""
        if self.draining:
            return "draining"
        if self.free(now, live, served) < 1:
            return f"full: {live} live calls and {len(self._held)} on their way, of {self.capacity}"
        self._held.append(now + self.hold_s)
        return ""


# --- which replica the ingress asks first ------------------------------------------------------
def rank_replicas(stats: Mapping[str, Mapping[str, Any] | None], tried: Iterable[str]) -> list[str]:
    """The replicas a placement asks, best first: not yet asked, most free places first (as the
    replicas last reported them; one not heard from yet after those with room), draining or
    full ones last. When every replica was asked, all of them: the one that gets the request
    then sees itself in ``tried`` and answers that none had room."""
    tried = set(tried)
    fresh = [r for r in stats if r not in tried]
    if not fresh:
        return list(stats)

    def order(r: str) -> tuple[int, int]:
        s = stats[r]
        if not s:
            return (1, 0)
        free = int(s.get("free", 0))
        return (0 if free > 0 else 2, -free)

    return sorted(fresh, key=order)


class RecentPlacements:
    """What a router sent each replica since that replica last reported its free places (a
    report is a second old at most; a burst of calls in between would otherwise all go to the
    replica that looked emptiest): :meth:`adjusted` takes them off the reported free places."""

    __slots__ = ("_sent", "_report")

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._report: dict[str, Any] = {}

    def adjusted(self, stats: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for rid, s in stats.items():
            if s and self._report.get(rid) != s.get("at"):  # a new report counts them itself
                self._report[rid] = s.get("at")
                self._sent[rid] = 0
            out[rid] = {**s, "free": int(s.get("free", 0)) - self._sent.get(rid, 0)} if s else s
        return out

    def sent(self, replica: str) -> None:
        self._sent[replica] = self._sent.get(replica, 0) + 1


# --- autoscaling on active calls -----------------------------------------------------------------
class ActiveCallsPolicy:
    """Serve's custom autoscaling policy: as many replicas as the calls live and on their way
    need at ``calls_per_replica`` each (the replicas report ``active_calls``, averaged over the
    look-back window). Serve applies min/max replicas, the up/down delays and the scaling
    factors around it. A replica it stops drains first (see :class:`VoiceReplica` below). It
    never asks for zero replicas by itself: a caller would wait for a cold replica's models."""

    def __init__(self, calls_per_replica: float) -> None:
        if calls_per_replica <= 0:
            raise ValueError("calls_per_replica must be positive")
        self.calls_per_replica = calls_per_replica

    def desired(self, active_calls: Iterable[float], current: int) -> int:
        calls = sum(active_calls)
        return max(1 if current else 0, math.ceil(calls / self.calls_per_replica - 1e-9))

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        per_replica = metrics.get(ACTIVE_CALLS, {})
        if not per_replica:  # nothing reported yet: stay
            return ctx.current_num_replicas, {}
        want = self.desired(per_replica.values(), ctx.current_num_replicas)
        low, high = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        return min(max(want, low), high), {}


# --- the application's options ---------------------------------------------------------------------
@dataclass(slots=True)
class ScaleOptions:
    """What ``voxline serve --ray`` (or ``serve run examples.ray_serve_app:app``) deploys.

    ``max_calls`` is per replica. ``media_host`` is the address each replica's media server
    binds and hands to callers ("" = the replica node's IP; loopback for a one-machine test).
    ``allowed_origins`` must include the origin the page is served from (the Serve proxy's
    address), since the page then calls another port. ``replicas`` fixes the count (no
    autoscaling); else it autoscales from ``min_replicas`` to ``max_replicas`` at
    ``calls_per_replica`` (default three quarters of ``max_calls``)."""

    cfg: Any = None  # an agent.config.Config (None: the defaults)
    token: str = ""
    max_calls: int = 16
    replicas: int = 0
    min_replicas: int = 1
    max_replicas: int = 4
    calls_per_replica: float = 0.0
    media_host: str = ""
    allowed_origins: Sequence[str] = ()
    drain_timeout_s: float = 60.0
    hold_s: float = PLACE_HOLD_S
    replica_cpus: float = 1.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0
    extra: dict[str, Any] = field(default_factory=dict)  # more VoiceServer arguments
    # "module:function": function(cfg) returns the replica's session factory (its own agent);
    # "" = the configured models (agent.presets), loaded once per replica
    agent: str = ""
    # Twilio Media Streams: the ingress answers the number's webhook (GET|POST /twilio/twiml)
    # with TwiML that connects the call straight to a replica's /twilio/media; with the
    # account's auth token both check Twilio's signatures (required off loopback)
    twilio: bool = False
    twilio_auth_token: str = ""
    public_url: str = ""  # the ingress's public https:// address (the URL Twilio signs)

    def graceful_shutdown_timeout_s(self) -> float:
        # Serve force-kills a stopping replica after this: it must outlast the drain
        return self.drain_timeout_s + SHUTDOWN_MARGIN_S

    def deployment_options(self) -> dict[str, Any]:
        """The voice replicas' ``.options(...)``."""
        opts: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.replica_cpus},
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s(),
            "graceful_shutdown_wait_loop_s": 1.0,
            # reservations are short; a call's media never is a Serve request
            "max_ongoing_requests": 64,
            "health_check_period_s": 5.0,
        }
        if self.replicas:
            opts["num_replicas"] = self.replicas
        else:
            per = self.calls_per_replica or max(1.0, 0.75 * self.max_calls)
            opts["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": max(self.max_replicas, self.min_replicas),
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
                # (averaged over two of the replicas' 10-s metric reports: Serve wants more than one)
                "look_back_period_s": 20.0,
                "policy": {"policy_function": f"{__name__}:ActiveCallsPolicy",
                           "policy_kwargs": {"calls_per_replica": per}},
            }
        return opts


def media_urls(host: str, port: int, token: str) -> dict[str, str]:
    """A replica's own call addresses, as the page and clients use them."""
    from urllib.parse import quote

    q = f"?token={quote(token)}" if token else ""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # (Twilio presents no token: its media stream is checked by its signature)
    return {"ws": f"ws://{netloc}/ws{q}", "offer": f"http://{netloc}/offer{q}",
            "twilio": f"ws://{netloc}/twilio/media", "base": f"http://{netloc}"}


def allow_cross_origin_offers(app: Any, origins: Iterable[str]) -> None:
    """Let pages at ``origins`` POST ``/offer`` here (the ingress's page calls this replica's
    port: the browser asks first, with an OPTIONS preflight, since the body is JSON). The
    WebSocket route needs none of this: the server's own Origin check admits them."""
    from aiohttp import web

    allowed = {o.rstrip("/").lower() for o in origins}

    def allows(origin: str | None) -> bool:
        return bool(origin) and ("*" in allowed or origin.rstrip("/").lower() in allowed)

    async def preflight(request: web.Request) -> web.Response:
        origin = request.headers.get("Origin")
        if not allows(origin):
            return web.Response(status=403, text="this origin may not call here\n")
        return web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin or "",
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": "Content-Type, X-Voxline-Token",
            "Access-Control-Max-Age": "600", "Vary": "Origin"})

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if request.path == "/offer" and allows(origin):
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Vary"] = "Origin"

    app.router.add_route("OPTIONS", "/offer", preflight)
    app.on_response_prepare.append(on_prepare)


def placement_page(index_html: str, place_path: str = "/place") -> str:
    """The page as the ingress serves it: it tells app.js to ask for a place before calling."""
    tag = f'<meta name="voxline-placement" content="{place_path}">'
    head = index_html.find("<head>")
    if head < 0:
        return tag + index_html
    return index_html[: head + 6] + "\n" + tag + index_html[head + 6:]


# --- the Serve application --------------------------------------------------------------------------
def voice_app(options: ScaleOptions, replicas: int = 0) -> Any:
    """The Serve application: the ingress bound to the voice replicas (``serve.run`` it).
    ``replicas`` overrides the options' count alone: run again with the same options, that is
    a scale-up or a scale-down (a replica that goes drains), not a redeploy."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    deployment = options.deployment_options()
    if replicas:
        deployment.pop("autoscaling_config", None)
        deployment["num_replicas"] = replicas

    voice = serve.deployment(VoiceReplica, name="VoiceReplica").options(
        request_router_config=RequestRouterConfig(
            request_router_class=f"{__name__}:FreePlaceRouter",
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
            request_routing_stats_timeout_s=5.0),
        **deployment)
    ingress = serve.deployment(VoiceIngress, name="VoiceIngress").options(
        ray_actor_options={"num_cpus": 0})
    return ingress.bind(voice.bind(options), options)


_ROUTER: list[type] = []


def __getattr__(name: str) -> Any:
    # ``FreePlaceRouter`` subclasses Ray's router class, so it is made on first use (Serve
    # imports it by name): importing this module never imports Ray
    if name == "FreePlaceRouter":
        if not _ROUTER:
            _ROUTER.append(_free_place_router())
        return _ROUTER[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _free_place_router() -> type:
    """Serve's request router for the voice replicas' handle: it asks the replicas in
    :func:`rank_replicas` order (free places first, and none twice for one placement: the
    placement's ``tried`` list travels in the request)."""
    from ray.serve.request_router import RequestRouter

    class FreePlaceRouter(RequestRouter):
        def initialize_state(self, **kwargs: Any) -> None:
            self.recent = RecentPlacements()

        async def choose_replicas(self, candidate_replicas: list, pending_request: Any = None) -> list:
            tried = ()
            if pending_request is not None:
                tried = pending_request.kwargs.get("tried", ()) or ()
            by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
            stats = self.recent.adjusted({k: r.routing_stats for k, r in by_id.items()})
            return [[by_id[k]] for k in rank_replicas(stats, tried)]

        def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
            if pending_request.metadata.call_method == "reserve":
                self.recent.sent(replica_id.unique_id)

    FreePlaceRouter.__module__ = __name__
    FreePlaceRouter.__qualname__ = "FreePlaceRouter"
    return FreePlaceRouter


class VoiceReplica:
    """One voice replica: the models, loaded once, and its own media server. Serve's methods:
    ``reserve`` (a place for a call that is on its way), ``record_routing_stats`` (free places,
    for the ingress's router), ``record_autoscaling_stats`` (``active_calls``, for the policy)
    and an async ``__del__``, which Serve awaits when it stops the replica (scale-down,
    redeploy, delete): no new calls, live calls finish within the drain timeout."""

    async def __init__(self, options: ScaleOptions) -> None:
        import asyncio
        import functools

        self.server: Any = None  # (until the models are loaded: nothing to drain)

        from ray import serve

        from agent import observe
        from agent.config import Config
        from agent.metrics import Metrics
        from agent.presets import asr_stats, load, load_models, new_session
        from transports.server import VoiceServer

        self.options = options
        cfg = options.cfg if options.cfg is not None else Config()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        host = options.media_host or _node_ip()
        # the latest calls this replica served: their session ids and traces (what the caller
        # said, turn by turn), for info()
        self.sessions: deque[tuple[str, Any]] = deque(maxlen=SESSIONS_KEPT)
        self.metrics = Metrics("serve-replica")  # its /metrics, beside its calls
        if options.agent:
            factory = await asyncio.to_thread(load(options.agent), cfg)
            phone = factory
            stats: Any = dict
        else:
            models = await asyncio.to_thread(load_models, cfg)
            factory = functools.partial(new_session, cfg, models)
            phone = functools.partial(new_session, cfg, models, telephony=True)
            stats = functools.partial(asr_stats, models.asr)  # (read when asked: slots in use)
            self.metrics.add_source(models.asr.metric_samples)
        self.twilio_calls = 0  # Twilio streams started (their places come off the book too)

        def session() -> Any:
            s = factory()
            self.sessions.append((s.id, s.trace))
            return s

        def twilio_session(start: Any) -> Any:
            self.twilio_calls += 1
            s = phone()
            self.sessions.append((s.id, s.trace))
            return s

        self.server = VoiceServer(session, host=host, port=0, token=options.token,
                                  max_calls=options.max_calls,
                                  allowed_origins=list(options.allowed_origins),
                                  twilio_auth_token=options.twilio_auth_token,
                                  extra_stats=lambda: {**stats(), "replica": self.replica_id},
                                  metrics=self.metrics.render, **options.extra)
        self.metrics.add_source(self.server.metric_samples)
        self._unwatch = observe.watch(self.metrics)
        allow_cross_origin_offers(self.server.app, options.allowed_origins)
        if options.twilio:
            from transports.twilio.mount import add_twilio_routes

            add_twilio_routes(self.server.app, twilio_session, self.server.admission)
        await self.server.start()
        self.places = Places(options.max_calls, options.hold_s)
        token = self.server.auth.token if self.server.auth.required else ""
        self.urls = media_urls(host, self.server.port, token)

    def _book(self) -> tuple[float, int, int]:
        return (time.monotonic(), self.server.live_calls,
                self.server.served + self.twilio_calls)

    async def reserve(self, tried: Sequence[str] = ()) -> dict[str, Any]:
        """A place for one call, or why not. Seeing itself in ``tried`` means the router had
        no replica left to ask: then it answers so (``exhausted``) instead of placing twice."""
        if self.replica_id in tried:
            return {"ok": False, "replica": self.replica_id, "exhausted": True,
                    "why": "asked twice: every replica was asked"}
        why = self.places.reserve(*self._book())
        if why:
            return {"ok": False, "replica": self.replica_id, "exhausted": False, "why": why}
        return {"ok": True, "replica": self.replica_id, **self.urls}

    async def record_routing_stats(self) -> dict[str, Any]:
        return {"free": self.places.free(*self._book()), "draining": self.places.draining,
                "at": time.time()}

    async def record_autoscaling_stats(self) -> dict[str, float]:
        now, live, served = self._book()
        return {ACTIVE_CALLS: float(live + self.places.held(now, served))}

    async def info(self) -> dict[str, Any]:
        """What tests and the benchmark read of the replica."""
        import os

        return {"replica": self.replica_id, "pid": os.getpid(), **self.urls,
                "sessions": [sid for sid, _ in self.sessions],
                "heard": {sid: [t["text"] for t in trace.turns if t["text"]]
                          for sid, trace in self.sessions},
                "draining": self.places.draining, **self.server.stats()}

    # Serve awaits this on shutdown. Should the GC call it later, the coroutine it gets is
    # dropped unrun (Python warns that it was never awaited): nothing is drained twice.
    async def __del__(self) -> None:
        from agent.ops import drain

        server = self.server
        if server is None:
            return
        self.places.draining = True
        left = await drain(server, self.options.drain_timeout_s)
        if left:
            print(f"voxline replica {self.replica_id}: ending {left} call(s) still live after "
                  f"the {self.options.drain_timeout_s:g} s drain", flush=True)
        await server.stop()
        self._unwatch()


class VoiceIngress:
    """Behind Serve's HTTP proxy: the page (``/``, ``/static/…``), ``POST /place`` (a place on
    a replica: its direct ``ws`` and ``offer`` addresses, or 503 and why), ``GET /healthz``."""

    def __init__(self, voice: Any, options: ScaleOptions) -> None:
        from transports.admission import Admission
        from transports.server import WEB_ROOT

        self.voice = voice
        self.options = options
        self.web_root = WEB_ROOT
        self.page = placement_page((WEB_ROOT / "index.html").read_text(encoding="utf-8"))
        self.placed = 0
        self.refused = 0
        # the Twilio webhook's signature check (the ingress's own address is what Twilio signs)
        self.twilio = Admission("0.0.0.0" if options.public_url else "127.0.0.1",
                                public_url=options.public_url,
                                twilio_auth_token=options.twilio_auth_token)
        if options.twilio:
            self.twilio.require_twilio()

    async def place(self, attempts: int = 0) -> tuple[int, dict[str, Any]]:
        """Ask replicas (each at most once) for a place; (200, addresses) or (503, why)."""
        tried: list[str] = []
        why: list[str] = []
        limit = attempts or 64
        for _ in range(limit):
            answer = await self.voice.reserve.remote(tried=list(tried))
            if answer["ok"]:
                self.placed += 1
                return 200, answer
            if answer.get("exhausted"):
                break
            tried.append(answer["replica"])
            why.append(f"{answer['replica']}: {answer['why']}")
        self.refused += 1
        return 503, {"ok": False, "why": "no replica has room for a call now", "replicas": why}

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse

        path = request.url.path
        if path == "/place" and request.method == "POST":
            if self.options.token and not _token_ok(request, self.options.token):
                return PlainTextResponse("a token is needed: ?token=… or X-Voxline-Token\n", 401)
            status, body = await self.place()
            return JSONResponse(body, status_code=status)
        if path == "/twilio/twiml" and request.method in ("GET", "POST") and self.options.twilio:
            return await self._twiml(request)
        if path == "/" and request.method == "GET":
            return HTMLResponse(self.page)
        if path.startswith("/static/") and request.method == "GET":
            target = (self.web_root / path[len("/static/"):]).resolve()
            if target.is_file() and target.is_relative_to(self.web_root.resolve()):
                return FileResponse(target)
        if path == "/healthz":
            return JSONResponse({"status": "ok", "placed": self.placed, "refused": self.refused})
        return PlainTextResponse("not found\n", 404)


    async def _twiml(self, request: Any) -> Any:
        """Twilio's webhook: its signature checked, then a place on a replica; the TwiML
        connects the call's media straight to that replica (busy when none has room)."""
        from urllib.parse import parse_qsl

        from starlette.responses import PlainTextResponse, Response

        from transports.admission import CallRequest, Refusal, Route
        from transports.twilio.twiml import connect_stream_twiml, reject_twiml

        form: tuple[tuple[str, str], ...] = ()
        if request.method == "POST":  # Twilio's parameters, form-encoded (a few hundred bytes)
            body = await request.body()
            if len(body) > TWIML_BODY_MAX:
                return PlainTextResponse("the webhook's body is too large\n", 413)
            form = tuple(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        decision = self.twilio.admit(CallRequest(
            Route.TWILIO_WEBHOOK, target, request.headers, dict(request.query_params), form,
            request.url.scheme))
        if isinstance(decision, Refusal):
            return PlainTextResponse(decision.text, decision.status)
        status, answer = await self.place()
        scheme = (self.options.public_url.partition("://")[0] if self.options.public_url
                  else request.url.scheme)
        twiml = (connect_stream_twiml(_secure(answer["twilio"], scheme))
                 if status == 200 else reject_twiml("busy"))
        return Response(twiml, media_type="text/xml")


def _secure(url: str, scheme: str) -> str:
    """A replica's media URL as Twilio is to use it: ``wss`` when the ingress is reached over
    TLS (Twilio connects only to wss:// in production: each replica's media port then sits
    behind TLS of its own)."""
    return "wss://" + url.removeprefix("ws://") if scheme == "https" else url


def _token_ok(request: Any, token: str) -> bool:
    given = request.query_params.get("token") or request.headers.get("X-Voxline-Token", "")
    return secrets.compare_digest(given.encode(), token.encode())


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


# --- ``voxline serve --ray`` ------------------------------------------------------------------------
def serve_main(args: Any, cfg: Any) -> int:
    """Start (or join, with ``--ray-address``) a Ray cluster, run the application, and serve
    until SIGINT/SIGTERM; then delete it, which drains every replica."""
    import signal
    import threading

    try:
        import ray
        from ray import serve
    except ImportError:
        from agent.errors import VoxlineError

        raise VoxlineError("voxline serve --ray needs Ray Serve: pip install 'voxline[ray]'") from None
    from agent.netaddr import is_loopback

    token = args.token or ("" if is_loopback(args.host) else secrets.token_urlsafe(16))
    origin = f"http://{args.host}:{args.port}"
    origins = [origin, *args.allow_origin]
    if is_loopback(args.host):
        origins += [f"http://localhost:{args.port}", f"http://127.0.0.1:{args.port}"]
    options = ScaleOptions(
        cfg=cfg, token=token, max_calls=args.max_calls, replicas=args.ray_replicas,
        max_replicas=args.ray_max_replicas, media_host=args.ray_media_host,
        allowed_origins=origins, replica_cpus=args.ray_replica_cpus,
        drain_timeout_s=args.drain_timeout, twilio=args.twilio,
        twilio_auth_token=args.twilio_auth_token, public_url=args.public_url)
    ray.init(address=args.ray_address or None, include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(voice_app(options), name=APP_NAME, route_prefix="/")
    q = f"?token={token}" if token else ""
    print(f"open {origin}/{q} and press Call (Ctrl-C stops; calls go straight to the replicas)",
          flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print(f"draining (at most {options.drain_timeout_s:g} s)", flush=True)
    serve.delete(APP_NAME)  # each replica drains in its __del__
    serve.shutdown()
    ray.shutdown()
    return 0
