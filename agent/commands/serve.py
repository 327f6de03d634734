"""``voxline serve``: the browser voice-call demo — open the page, press Call, talk."""

from __future__ import annotations

import argparse
import os
import time

from agent.commands.operate import add_ops_flags, check_ops_flags
from agent.commands.telephony import add_twilio_transfer_flags
from agent.config import Config, add_config_flags, config_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the browser voice-call demo (WebSocket and WebRTC)",
        description="Serves web/ and takes calls over WebSocket (GET /ws) and WebRTC "
        "(POST /offer); every call gets its own pipeline, the models are loaded once. Bound to "
        "anything but loopback, or given --public-url, calls need a token (--token or "
        "$VOXLINE_TOKEN; a random one is made and printed otherwise) and Twilio's calls a valid "
        "signature (--twilio-auth-token or $TWILIO_AUTH_TOKEN).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--token", default=os.environ.get("VOXLINE_TOKEN", ""),
                   help="token calls must present (?token=… or the X-Voxline-Token header)")
    p.add_argument("--max-calls", type=int, default=16, metavar="N",
                   help="calls served at once; more are refused (default 16)")
    p.add_argument("--max-calls-per-client", type=int, default=8, metavar="N",
                   help="browser calls one client address may hold at once; loopback clients "
                        "(a local reverse proxy) are not counted; 0: no limit (default 8)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="another site whose pages may start calls here, as https://app.example "
                        "(repeatable; '*' allows any). The server's own page always may")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a name this server answers to besides loopback's, when bound to "
                        "loopback (repeatable; '*' any): other Host headers are refused, which "
                        "stops DNS rebinding")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="a STUN/TURN server for WebRTC (repeatable; default: none)")
    p.add_argument("--webrtc-ptime", type=int, choices=(10, 20), default=None, metavar="MS",
                   help="WebRTC packet time of the agent's audio in ms: 20 (default) or 10 "
                        "(twice the packets; measured slower on a busy 2-core machine)")
    p.add_argument("--twilio", action="store_true",
                   help="also take Twilio Media Streams calls on this port "
                        "(TwiML at /twilio/twiml, media at /twilio/media)")
    p.add_argument("--public-url", default="", metavar="URL",
                   help="the public https:// URL this server is reached at behind a proxy or a "
                        "tunnel (the TwiML's stream address and the URL Twilio signs); with it, "
                        "browser calls need the token even on loopback")
    p.add_argument("--twilio-auth-token", default=os.environ.get("TWILIO_AUTH_TOKEN", ""),
                   metavar="TOKEN",
                   help="the Twilio account's auth token (better: $TWILIO_AUTH_TOKEN), to check "
                        "Twilio's X-Twilio-Signature on the TwiML and the media stream; required "
                        "with --twilio off loopback or with --public-url")
    add_twilio_transfer_flags(p)
    p.add_argument("--record", metavar="DIR", default="",
                   help="record every call in DIR as it goes: <session>.wav (stereo: caller "
                        "left, agent right, as heard) and <session>.jsonl (its trace)")
    p.add_argument("--echo-test", action="store_true",
                   help="also serve the echo test at /ws/echo: the caller's audio played back "
                        "to it (no model), to check a line's audio and round trip")
    add_ops_flags(p)
    ray = p.add_argument_group("scale-out on Ray Serve (voxline[ray])")
    ray.add_argument("--ray", action="store_true",
                     help="run as a Ray Serve application: voice replicas (each with the models "
                          "and its own media server) behind an ingress that serves the page and "
                          "places each call; --max-calls is per replica")
    ray.add_argument("--ray-address", default="", metavar="ADDR",
                     help="the cluster to join (default: $RAY_ADDRESS, else a local one)")
    ray.add_argument("--ray-replicas", type=int, default=0, metavar="N",
                     help="a fixed number of voice replicas (default: autoscale on active calls)")
    ray.add_argument("--ray-max-replicas", type=int, default=4, metavar="N",
                     help="the most voice replicas the autoscaler starts (default 4)")
    ray.add_argument("--ray-media-host", default="", metavar="ADDR",
                     help="the address the replicas' media servers bind and hand to callers "
                          "(default: each node's IP)")
    ray.add_argument("--ray-replica-cpus", type=float, default=1.0, metavar="N",
                     help="CPUs Ray reserves for each voice replica (default 1)")
    add_config_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agent import runtime
    from agent.presets import check_record_dir

    cfg = config_from_args(args)
    check_ops_flags(args)
    check_record_dir(args.record)
    if args.ray:
        from agent.commands.ray_serve import serve_main

        if args.echo_test:
            from agent.errors import ConfigError

            raise ConfigError("--echo-test is served by a plain voxline serve, not with --ray")

        return serve_main(args, cfg)
    return runtime.run(_serve(args, cfg), cfg.runtime)


async def _serve(args: argparse.Namespace, cfg: Config) -> int:
    from agent import presets
    from agent.commands.operate import Telemetry
    from agent.ops import serve_until_stopped, slot_check
    from agent.presets import asr_stats, load_models
    from agent.runtime import freeze_after_warmup, keep_heap_trimmed
    from agent.session import Session
    from transports.server import VoiceServer

    def new_session(telephony: bool = False) -> Session:
        # (models are loaded before the server listens); [echo] auto guards Twilio calls only
        return presets.new_session(cfg, models, telephony, record_dir=args.record)

    def new_echo_session() -> Session:
        return presets.new_echo_test_session(cfg, record_dir=args.record)

    # the server and its routes first: a refused configuration fails before the models load
    server = VoiceServer(new_session, host=args.host, port=args.port, token=args.token,
                         max_calls=args.max_calls, ice_servers=args.ice_server,
                         webrtc_ptime_ms=args.webrtc_ptime, public_url=args.public_url,
                         twilio_auth_token=args.twilio_auth_token,
                         max_calls_per_client=args.max_calls_per_client,
                         allowed_origins=args.allow_origin, allowed_hosts=args.allow_host,
                         extra_stats=lambda: asr_stats(models.asr),
                         ready_checks=[lambda: slot_check(models.asr)()], loaded=False,
                         new_echo_session=new_echo_session if args.echo_test else None)
    telemetry = Telemetry("serve", args)
    server.ops.metrics = telemetry.metrics.render
    telemetry.metrics.add_source(server.metric_samples)
    if args.twilio:
        from transports.twilio.mount import add_twilio_routes

        add_twilio_routes(server.app, lambda start: new_session(True), server.admission,
                          twilio_account_sid=args.twilio_account_sid,
                          twilio_api_base=args.twilio_api_base)
    t_load = time.monotonic()
    models = load_models(cfg)
    telemetry.metrics.add_source(models.asr.metric_samples)
    freeze_after_warmup(cfg.runtime)
    keep_heap_trimmed(cfg.runtime)
    server.health.loaded = True
    await server.start()
    await telemetry.start(server.health)
    print(f"models ready in {time.monotonic() - t_load:.1f} s (asr {cfg.asr.backend}, "
          f"llm {cfg.llm.backend}, tts {cfg.tts.backend})", flush=True)
    print(f"open {server.url} and press Call (Ctrl-C stops)", flush=True)
    if args.twilio:
        checked = ("signatures checked" if args.twilio_auth_token
                   else "signatures not checked: loopback only")
        print(f"Twilio: point your number's voice webhook at "
              f"{(args.public_url or server.url.split('?')[0]).rstrip('/')}/twilio/twiml "
              f"({checked})", flush=True)
    try:
        await serve_until_stopped(server, "voxline serve", args.drain_timeout, server.health)
    finally:
        await telemetry.close()
    print(f"served {server.served} calls", flush=True)
    return 0
