"""Operating a server: what ``/healthz`` and ``/readyz`` answer, and the drain on SIGTERM.

Every server (``serve``, ``twilio``, ``sip``, ``asr-serve``) is a :class:`Drainable`: it can stop
taking calls while its live calls go on (:meth:`Drainable.begin_drain`; a new call is refused
with a reason), say how many calls are live, and stop — ending the calls still live cleanly
(WebSocket close 1001 with a reason, SIP BYE, the Twilio stream closed). :func:`serve_until_stopped`
runs that sequence on the first SIGTERM or SIGINT; a second signal ends the drain at once.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

DRAIN_TIMEOUT_S = 60.0
DRAIN_POLL_S = 0.05


class Drainable(Protocol):
    def begin_drain(self) -> None: ...
    @property
    def live_calls(self) -> int: ...
    async def stop(self) -> None: ...


Check = Callable[[], str]  # "" when fine, else why the server is not ready


@dataclass(slots=True)
class Health:
    """One server's health. ``/healthz`` answers 200 while the process serves at all (with
    ``stats``); ``/readyz`` answers 200 only when the models are loaded, the server is not
    draining and every check passes (a free ASR slot, room under ``--max-calls``), else 503
    with the reasons — what a load balancer or Kubernetes reads to send calls elsewhere."""

    stats: Callable[[], dict[str, Any]] = dict
    checks: list[Check] = field(default_factory=list)
    loaded: bool = False
    draining: bool = False
    started: float = field(default_factory=time.monotonic)

    def not_ready(self) -> list[str]:
        if not self.loaded:
            return ["models loading"]  # (the checks may read what loading makes)
        why = []
        if self.draining:
            why.append("draining: the server is shutting down")
        for check in self.checks:
            reason = check()
            if reason:
                why.append(reason)
        return why

    def health(self) -> dict[str, Any]:
        return {"status": "draining" if self.draining else "ok",
                "uptime_s": round(time.monotonic() - self.started, 1), **self.stats()}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        why = self.not_ready()
        return (503 if why else 200), {"ready": not why, "reasons": why}

    def answer(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """The status and JSON body for ``/healthz`` or ``/readyz``; None for other paths."""
        if path == "/healthz":
            return 200, self.health()
        if path == "/readyz":
            return self.readiness()
        return None


def slot_check(engine: Any) -> Check:
    """Ready only while the shared ASR engine has a free slot."""

    def check() -> str:
        pool = engine.pool
        return "" if pool.in_use < pool.capacity else f"all {pool.capacity} ASR slots in use"

    return check


class StopSignals:
    """SIGTERM and SIGINT, caught from :meth:`install` until :meth:`close`: the first sets
    :attr:`first` (drain), a second :attr:`second` (stop now). The handlers stay in place
    between the two, so a second signal never meets the default action (death mid-drain)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        self.name = ""

    def install(self) -> StopSignals:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self._on, sig)
        return self

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.remove_signal_handler(sig)

    def _on(self, sig: signal.Signals) -> None:
        if self.first.is_set():
            self.second.set()
        else:
            self.name = sig.name
            self.first.set()


async def drain(server: Drainable, timeout_s: float, stop_now: asyncio.Event | None = None) -> int:
    """Refuse new calls and wait up to ``timeout_s`` for the live ones to end (or until
    ``stop_now`` is set). Returns the calls still live."""
    server.begin_drain()
    give_up = time.monotonic() + timeout_s
    while (server.live_calls and time.monotonic() < give_up
           and not (stop_now is not None and stop_now.is_set())):
        await asyncio.sleep(DRAIN_POLL_S)
    return server.live_calls


async def serve_until_stopped(server: Drainable, name: str, drain_timeout_s: float = DRAIN_TIMEOUT_S,
                              health: Health | None = None) -> str:
    """Serve until SIGTERM/SIGINT, then drain (at most ``drain_timeout_s``; a second signal
    cuts it short) and stop; progress goes to stderr. Returns the signal's name."""
    signals = StopSignals().install()
    try:
        await signals.first.wait()
        if health is not None:
            health.draining = True
        print(f"{name}: {signals.name}: draining — refusing new calls, letting "
              f"{server.live_calls} live call(s) finish (at most {drain_timeout_s:g} s; signal "
              "again to stop now)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        left = await drain(server, drain_timeout_s, signals.second)
        took = time.monotonic() - t0
        if left:
            print(f"{name}: ending {left} call(s) still live after {took:.1f} s",
                  file=sys.stderr, flush=True)
        else:
            print(f"{name}: drained in {took:.1f} s", file=sys.stderr, flush=True)
        await server.stop()
    finally:
        signals.close()
    return signals.name


# --- the HTTP side: /healthz, /readyz, /metrics ------------------------------------------------
MetricsRender = Callable[[], tuple[bytes, str]]  # the exposition's body and its content type
OPS_PATHS = ("/healthz", "/readyz", "/metrics")


@dataclass(slots=True)
class OpsEndpoints:
    """What a server answers on its operations paths, whatever its HTTP library: ``health``
    for ``/healthz`` and ``/readyz``, ``metrics`` (the Prometheus exposition) for ``/metrics``
    — a 404 there when the process runs no metrics."""

    health: Health
    metrics: MetricsRender | None = None

    def respond(self, path: str) -> tuple[int, str, bytes] | None:
        """(status, content type, body) for an operations path; None for any other path."""
        if path == "/metrics":
            if self.metrics is None:
                return 404, "text/plain", b"this server runs without metrics\n"
            body, kind = self.metrics()
            return 200, kind, body
        answer = self.health.answer(path)
        if answer is None:
            return None
        status, doc = answer
        import json

        return status, "application/json", json.dumps(doc).encode()

    def add_routes(self, app: Any) -> None:
        """Mount the three paths on an aiohttp application (before it starts)."""
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            answer = self.respond(request.path)
            assert answer is not None  # (only the three paths are routed here)
            status, kind, body = answer
            ctype, _, params = kind.partition(";")
            charset = params.partition("charset=")[2].strip() or None
            return web.Response(status=status, body=body, content_type=ctype.strip(),
                                charset=charset)

        for path in OPS_PATHS:
            app.router.add_get(path, handle)


class OpsServer:
    """The operations paths on an HTTP port of their own (``--metrics-port``): for the servers
    without HTTP (SIP, asr-serve on its Unix socket), or to keep ``/metrics`` off a public port."""

    def __init__(self, endpoints: OpsEndpoints, host: str = "127.0.0.1", port: int = 0) -> None:
        self.endpoints = endpoints
        self.host, self.port = host, port
        self._runner: Any = None

    async def start(self) -> int:
        from aiohttp import web

        app = web.Application()
        self.endpoints.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@dataclass(slots=True, frozen=True)
class Sample:
    """One metric sample a server or an engine reports when ``/metrics`` is scraped (so its
    counters cost nothing until then). ``kind``: ``gauge``, ``counter`` (``name`` without its
    ``_total``), or ``histogram`` — then ``value`` is ``(buckets, sum)``, the buckets as
    ``(upper bound, count at or below it)`` pairs ending with ``inf``."""

    name: str
    kind: str
    help: str
    value: Any
    labels: tuple[tuple[str, str], ...] = ()


def histogram_value(bounds: tuple[float, ...], counts: list[int], total: float) -> tuple[list[tuple[float, int]], float]:
    """A :class:`Sample` histogram value from per-bucket counts (``len(bounds) + 1`` of them,
    the last over every bound)."""
    buckets, running = [], 0
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        running += n
        buckets.append((bound, running))
    return buckets, total
