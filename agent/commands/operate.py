"""What every server command shares to be operated: the flags (``--metrics-port``,
``--drain-timeout``, ``--otel``, ``--stall-ms``) and the process's telemetry — Prometheus
metrics, the budget-violation log, the event-loop watchdog and, when asked for, OpenTelemetry
spans."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agent.errors import ConfigError
from agent.ops import DRAIN_TIMEOUT_S, Health, OpsEndpoints, OpsServer


def add_ops_flags(p: argparse.ArgumentParser, http_port: bool = True) -> None:
    """``http_port``: the server has an HTTP port of its own, which also serves /metrics,
    /healthz and /readyz (``--metrics-port`` adds a separate one); without one (SIP, asr-serve on
    its socket), ``--metrics-port`` is where they are served."""
    where = ("also on a port of their own (e.g. to keep /metrics off the public port)"
             if http_port else "on this HTTP port")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help=f"serve /metrics (Prometheus), /healthz and /readyz {where}; 0 picks a "
                        "free port (printed)")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDR",
                   help="address of --metrics-port (default 127.0.0.1)")
    p.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT_S, metavar="S",
                   help="on SIGTERM (or Ctrl-C) refuse new calls and let live ones run this long "
                        f"before ending them; a second signal ends them at once (default "
                        f"{DRAIN_TIMEOUT_S:g})")
    p.add_argument("--stall-ms", type=float, default=250.0, metavar="MS",
                   help="log an event-loop stall longer than this, with what the loop was "
                        "running (default 250)")
    p.add_argument("--otel", action="store_true",
                   help="export each call's trace as OpenTelemetry spans over OTLP/HTTP to the "
                        "endpoint $OTEL_EXPORTER_OTLP_ENDPOINT names (on by itself when that is "
                        "set; needs voxline[otel])")


def check_ops_flags(args: argparse.Namespace) -> None:
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port must be a port number, got {args.metrics_port}")
    if not args.drain_timeout >= 0:
        raise ConfigError(f"--drain-timeout must be at least 0, got {args.drain_timeout}")
    if not args.stall_ms > 0:
        raise ConfigError(f"--stall-ms must be positive, got {args.stall_ms}")


class Telemetry:
    """The telemetry of one server process, from :meth:`start` to :meth:`close`."""

    def __init__(self, server: str, args: argparse.Namespace) -> None:
        from agent import observe
        from agent.metrics import Metrics

        check_ops_flags(args)
        self.name = server if server == "asr-serve" else f"voxline {server}"  # (as it prints)
        self.args = args
        self.metrics = Metrics(server)
        self._unwatch = [observe.watch(self.metrics), observe.watch(observe.BudgetLog())]
        self.otel: Any = None
        from agent.otel import enabled_by_env

        if args.otel or enabled_by_env():
            from agent.otel import OtelExporter

            self.otel = OtelExporter.from_env()
            self._unwatch.append(observe.watch(self.otel))
        self.watchdog: Any = None
        self.ops_server: OpsServer | None = None

    async def start(self, health: Health) -> None:
        """Start the loop's watchdog and, with ``--metrics-port``, the operations port."""
        from agent.observe import LoopWatchdog

        self.watchdog = LoopWatchdog(on_lag=self.metrics.observe_lag,
                                     on_stall=self.metrics.observe_stall,
                                     stall_s=self.args.stall_ms / 1000).start()
        if self.args.metrics_port is not None:
            self.ops_server = OpsServer(self.endpoints(health), self.args.metrics_host,
                                        self.args.metrics_port)
            port = await self.ops_server.start()
            host = self.args.metrics_host
            host = f"[{host}]" if ":" in host else host
            print(f"{self.name}: metrics on http://{host}:{port}/metrics (and /healthz, "
                  "/readyz)", file=sys.stderr, flush=True)
        if self.otel is not None:
            print(f"{self.name}: OpenTelemetry spans to {self.otel.endpoint}", file=sys.stderr,
                  flush=True)

    def endpoints(self, health: Health) -> OpsEndpoints:
        return OpsEndpoints(health, self.metrics.render)

    async def close(self) -> None:
        for unwatch in self._unwatch:
            unwatch()
        if self.watchdog is not None:
            await self.watchdog.stop()
        if self.ops_server is not None:
            await self.ops_server.stop()
        if self.otel is not None:  # (a flush to a collector that is down can take seconds)
            await asyncio.to_thread(self.otel.shutdown)

