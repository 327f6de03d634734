"""``voxline asr-serve``: the shared ASR engine as its own server — a Unix socket (and optionally
the OpenAI-compatible HTTP endpoint) on one event-loop thread."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from agent.config import Config, add_config_flags, config_from_args
from agent.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "asr-serve",
        help="run the ASR engine as a server (Unix socket, OpenAI-compatible HTTP)",
        description="Loads the ASR model once and serves every client from one batched engine: "
        "streams of PCM16 over a Unix socket (partials and finals back; whole files through "
        "shared memory), and optionally POST /v1/audio/transcriptions over HTTP. Pipelines "
        "use it with --asr-backend remote --asr-model SOCKET.",
    )
    p.add_argument("--socket", metavar="PATH", default=None,
                   help="Unix socket to listen on (default: /tmp/voxline-asr.sock)")
    p.add_argument("--http", metavar="HOST:PORT", default=None,
                   help="also serve the OpenAI-compatible endpoint here, e.g. 127.0.0.1:8300")
    p.add_argument("--max-upload-mb", type=float, default=25.0, metavar="MB",
                   help="largest HTTP upload (default 25 MB)")
    add_config_flags(p, sections=["asr", "runtime"])
    p.set_defaults(func=main)


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--http expects HOST:PORT (e.g. 127.0.0.1:8300), got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def main(args: argparse.Namespace) -> int:
    from agent import runtime
    from stages.asr import wire

    cfg = config_from_args(args)
    if cfg.asr.slots < 1:
        raise ConfigError(f"--asr-slots must be at least 1, got {cfg.asr.slots}")
    http = parse_host_port(args.http) if args.http else None
    return runtime.run(_serve(cfg, args.socket or wire.DEFAULT_SOCKET, http, args), cfg.runtime)


async def _serve(cfg: Config, path: str, http: tuple[str, int] | None, args: argparse.Namespace) -> int:
    from agent.presets import backend_class
    from agent.runtime import event_loop_name, freeze_after_warmup
    from stages.asr.server import ASRServer
    from stages.asr.stage import make_engine

    t0 = time.monotonic()
    backend = backend_class("asr", cfg.asr.backend)(cfg.asr)
    backend.warmup()
    engine = make_engine(backend, cfg.asr)
    server = ASRServer(engine, partial_interval_ms=cfg.asr.partial_interval_ms,
                       max_utterance_s=cfg.asr.max_utterance_s,
                       commit_after_s=cfg.asr.commit_after_s, language=cfg.asr.language)
    try:
        await server.start_unix(path)
        where = [f"unix:{path}"]
        if http is not None:
            port = await server.start_http(http[0], http[1], args.max_upload_mb)
            where.append(f"http://{http[0]}:{port}/v1/audio/transcriptions")
        freeze_after_warmup(cfg.runtime)
        print(f"asr-serve: {cfg.asr.backend} ready in {time.monotonic() - t0:.1f} s, "
              f"{cfg.asr.slots} slots, {event_loop_name(cfg.runtime)} loop; listening on "
              f"{' and '.join(where)}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("asr-serve: stopping", file=sys.stderr, flush=True)
    finally:
        await server.close()
        engine.close()
    return 0
