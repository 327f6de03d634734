"""``voxline sip`` and ``voxline twilio``: the voice pipeline answering phone calls, over a SIP
trunk or PBX (UDP SIP + G.711 RTP) or over Twilio Media Streams (WebSocket)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

from agent.config import Config, add_config_flags, config_from_args

log = logging.getLogger("voxline.telephony")


def add_parser(sub: argparse._SubParsersAction) -> None:
    sip = sub.add_parser(
        "sip",
        help="answer SIP calls (UDP SIP, G.711 RTP) with the voice pipeline",
        description="A SIP user agent server for a SIP trunk or a PBX (Asterisk, FreeSWITCH): "
        "each INVITE with a PCMU/PCMA offer becomes a call with its own session. No "
        "registration, TLS or SRTP yet: point the trunk or PBX at HOST:PORT directly.",
    )
    sip.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sip.add_argument("--port", type=int, default=5060, help="SIP UDP port (default 5060)")
    sip.add_argument("--rtp-ports", default="40000-40999", metavar="LO-HI",
                     help="UDP port range for RTP, one even port per call (default 40000-40999)")
    sip.add_argument("--media-address", default="", metavar="IP",
                     help="address put in the SDP answer (default: --host)")
    sip.add_argument("--max-calls", type=int, default=100, help="concurrent calls (default 100)")
    _add_call_output_flags(sip, main_sip)

    tw = sub.add_parser(
        "twilio",
        help="answer Twilio calls over Media Streams (WebSocket) with the voice pipeline",
        description="Serves Twilio Media Streams on ws://HOST:PORT/twilio/media and the TwiML "
        "that connects a call to it on GET /twilio/twiml (set the number's voice webhook to "
        "that URL with method GET, behind a public HTTPS address). Both check Twilio's "
        "X-Twilio-Signature with the account's auth token, which is required off loopback or "
        "with --public-url.",
    )
    tw.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    tw.add_argument("--port", type=int, default=8080, help="HTTP/WebSocket port (default 8080)")
    tw.add_argument("--public-url", default="", metavar="URL",
                    help="the public https:// address Twilio reaches this server at (the "
                         "TwiML's stream address and the URL Twilio signs)")
    tw.add_argument("--twilio-auth-token", default=os.environ.get("TWILIO_AUTH_TOKEN", ""),
                    metavar="TOKEN",
                    help="the Twilio account's auth token (better: $TWILIO_AUTH_TOKEN), to check "
                         "Twilio's request signatures; required off loopback or with --public-url")
    tw.add_argument("--max-calls", type=int, default=100,
                    help="media streams at once; the TwiML answers busy beyond (default 100)")
    _add_call_output_flags(tw, main_twilio)


def _add_call_output_flags(p: argparse.ArgumentParser, func: object) -> None:
    """What both telephony commands share: --json, --trace, the config flags, the entry point."""
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.add_argument("--trace", metavar="TRACE.jsonl", help="latency trace to write (JSON lines)")
    add_config_flags(p)
    p.set_defaults(func=func)


def _port_range(text: str) -> tuple[int, int]:
    from agent.errors import ConfigError

    lo, sep, hi = text.partition("-")
    if not sep or not lo.isdigit() or not hi.isdigit() or not 0 < int(lo) < int(hi) < 65536:
        raise ConfigError(f"--rtp-ports: expected LO-HI such as 40000-40999, got {text!r}")
    return int(lo), int(hi)


class CallPrinter:
    """Prints every call's events, tagged with the call: human lines or JSON lines."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, call: str, ev: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps({"call": call, **ev}), flush=True)
            return
        kind = ev["type"]
        if kind == "transcript" and ev["final"] and ev["text"].strip():
            print(f"[{call}] caller: {ev['text'].strip()}", flush=True)
        elif kind == "agent_text" and ev["text"]:
            tag = " (interrupted)" if ev["cancelled"] else ""
            print(f"[{call}] agent{tag}: {ev['text'].strip()}", flush=True)
        elif kind == "dtmf":
            print(f"[{call}] key {ev['digit']}", flush=True)
        elif kind == "trace" and "voice_to_voice" in ev["spans"]:
            print(f"[{call}]   voice-to-voice {ev['spans']['voice_to_voice']['ms']:.0f} ms",
                  flush=True)
        elif kind == "call":
            print(f"[{call}] {ev['state']}" + (f" ({ev['reason']})" if ev.get("reason") else ""),
                  flush=True)


def session_factory(cfg: Config, models: Any, printer: CallPrinter | None = None) -> Any:
    """One fresh pipeline and session per call, sharing the loaded models."""
    from agent.events import EVENT_FRAMES, frame_event, trace_event
    from agent.frames import Dtmf
    from agent.presets import new_session
    from agent.session import Session

    def make(*_: Any) -> Session:
        session = new_session(cfg, models, telephony=True)  # [echo] auto: guarded
        trace = session.trace
        if printer is not None:
            def on_frame(frame: Any) -> None:
                if isinstance(frame, Dtmf):
                    printer.emit(session.id, {"type": "dtmf", "digit": frame.digit})
                    return
                ev = frame_event(frame, session.started_ns)
                if ev is not None:
                    printer.emit(session.id, ev)

            session.listen(on_frame, EVENT_FRAMES | {Dtmf})
            trace.listeners.append(lambda rec: printer.emit(session.id, trace_event(rec)))
        return session

    return make


def _load(cfg: Config) -> Any:
    from agent.presets import load_models
    from agent.runtime import freeze_after_warmup

    models = load_models(cfg)
    freeze_after_warmup(cfg.runtime)
    return models


def _launch(serve: Any, args: argparse.Namespace) -> int:
    from agent import runtime

    cfg = config_from_args(args)
    if args.trace:
        cfg.trace.path = args.trace
    return runtime.run(serve(args, cfg), cfg.runtime)


def main_sip(args: argparse.Namespace) -> int:
    return _launch(_serve_sip, args)


async def _serve_sip(args: argparse.Namespace, cfg: Config) -> int:
    from transports.sip.server import SipServer

    rtp_ports = _port_range(args.rtp_ports)
    printer = CallPrinter(args.json)
    models = _load(cfg)
    server = SipServer(
        session_factory(cfg, models, printer), host=args.host, port=args.port,
        rtp_ports=rtp_ports, media_address=args.media_address, max_calls=args.max_calls,
        on_call=lambda c: printer.emit(c.session.id, {"type": "call", "state": "ringing",
                                                      "sip_call_id": c.call_id}),
        on_end=lambda r: printer.emit(r.summary.get("session", r.call_id), {
            "type": "call", "state": "ended", "reason": r.reason,
            "seconds": round(r.seconds, 1), "jitter": r.jitter,
            "malformed_rtp": r.media.malformed, "dtmf": r.media.dtmf}),
    )
    host, port = await server.start()
    print(f"voxline sip: listening on udp {host}:{port} (RTP {args.rtp_ports}); Ctrl-C stops",
          file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
    return 0


def main_twilio(args: argparse.Namespace) -> int:
    return _launch(_serve_twilio, args)


async def _serve_twilio(args: argparse.Namespace, cfg: Config) -> int:
    from transports.admission import Admission
    from transports.twilio.server import TwilioServer

    # the server checks this too; here it fails before the models take their time to load
    Admission(args.host, public_url=args.public_url,
              twilio_auth_token=args.twilio_auth_token).require_twilio()
    printer = CallPrinter(args.json)
    models = _load(cfg)
    server = TwilioServer(
        session_factory(cfg, models, printer), host=args.host, port=args.port,
        public_url=args.public_url, twilio_auth_token=args.twilio_auth_token,
        max_calls=args.max_calls,
        on_end=lambda r: printer.emit(r.summary.get("session", r.stream_sid), {
            "type": "call", "state": "ended", "reason": r.reason,
            "heard_lag_ms": r.heard_lags_ms, "dtmf": r.stats.dtmf}),
    )
    host, port = await server.start()
    print(f"voxline twilio: media streams on ws://{host}:{port}{server.media_path}, TwiML on "
          f"GET http://{host}:{port}{server.twiml_path}; Ctrl-C stops", file=sys.stderr,
          flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
    return 0
