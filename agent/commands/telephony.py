"""``voxline sip`` and ``voxline twilio``: the voice pipeline answering phone calls, over a SIP
trunk or PBX (UDP SIP + G.711 RTP) or over Twilio Media Streams (WebSocket)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from agent.commands.operate import add_ops_flags, check_ops_flags
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
    sip.add_argument("--rtp-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="end a call (BYE) when the caller has sent no RTP for this long; "
                          "0 never (default 30)")
    sip.add_argument("--media-peers", default="", metavar="CIDR,...",
                     help="networks an offer's SDP may name for its media besides the address "
                          "the INVITE came from (a PBX or trunk with separate media servers); "
                          "default: none, RTP goes only to the SIP peer's address")
    sip.add_argument("--invite-rate", default="10/s", metavar="RATE",
                     help="new INVITEs a second per source address (an IPv6 source by its "
                          "/64); beyond it 503 with Retry-After; 0 no limit (default 10/s)")
    sip.add_argument("--invite-burst", type=int, default=20, metavar="N",
                     help="INVITEs a source may send at once, and calls it may have set up but "
                          "not yet ACKed (default 20)")
    sip.add_argument("--max-calls-per-source", type=int, default=0, metavar="N",
                     help="calls one source address may hold at once; 0 no limit besides "
                          "--max-calls (default: a trunk or PBX brings every call from one "
                          "address)")
    sip.add_argument("--echo-test", action="store_true",
                     help="answer sip:echo@… with the echo test: the caller's audio played back "
                          "(no model), to check a line's audio and round trip")
    sip.add_argument("--transfer-to", default="", metavar="URI",
                     help="where the agent transfers a caller (SIP REFER) when it names no "
                          "target: a SIP URI, or a number or name, which becomes a SIP URI at "
                          "the caller's host (default: none)")
    sip.add_argument("--transfer-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="how long a transferred caller's new call may take to be answered "
                          "before the transfer counts as failed and the call goes on "
                          "(default 30)")
    add_ops_flags(sip, http_port=False)
    _add_call_output_flags(sip, main_sip)

    tw = sub.add_parser(
        "twilio",
        help="answer Twilio calls over Media Streams (WebSocket) with the voice pipeline",
        description="Serves Twilio Media Streams on ws://HOST:PORT/twilio/media and the TwiML "
        "that connects a call to it on GET /twilio/twiml (set the number's voice webhook to "
        "that URL with method GET, behind a public HTTPS address). Both check Twilio's "
        "X-Twilio-Signature with the account's auth token, which is required off loopback or "
        "with --public-url. The agent transfers a call through Twilio's REST API when "
        "--twilio-account-sid is given, else through GET /twilio/action, which the TwiML "
        "redirects to once the stream ends.",
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
    add_twilio_transfer_flags(tw)
    add_ops_flags(tw)
    _add_call_output_flags(tw, main_twilio)


def add_twilio_transfer_flags(p: argparse.ArgumentParser) -> None:
    """How the agent hands a Twilio call over (``voxline twilio``, ``voxline serve --twilio``)."""
    p.add_argument("--twilio-account-sid", default=os.environ.get("TWILIO_ACCOUNT_SID", ""),
                   metavar="SID",
                   help="the Twilio account's SID (AC…; or $TWILIO_ACCOUNT_SID): with the auth "
                        "token, a transfer is one REST \"update call\" request; without, the "
                        "call is handed to its <Dial> after its stream, through the TwiML's "
                        "<Redirect> to /twilio/action")
    p.add_argument("--twilio-api-base", default=os.environ.get("TWILIO_API_BASE", "")
                   or "https://api.twilio.com", metavar="URL",
                   help="Twilio's REST API (default https://api.twilio.com; or "
                        "$TWILIO_API_BASE); https only, except on loopback")


def _add_call_output_flags(p: argparse.ArgumentParser, func: object) -> None:
    """What both telephony commands share: --json, --trace, the config flags, the entry point."""
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.add_argument("--trace", metavar="TRACE.jsonl", help="latency trace to write (JSON lines)")
    p.add_argument("--record", metavar="DIR", default="",
                   help="record every call in DIR as it goes: <session>.wav (stereo: caller "
                        "left, agent right, as heard) and <session>.jsonl (its trace)")
    add_config_flags(p)
    p.set_defaults(func=func)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # isdigit() alone takes "²", which int() refuses


def _port_range(text: str) -> tuple[int, int]:
    from agent.errors import ConfigError

    lo, sep, hi = text.partition("-")
    if not sep or not _digits(lo) or not _digits(hi) or not 0 < int(lo) < int(hi) < 65536:
        raise ConfigError(f"--rtp-ports: expected LO-HI such as 40000-40999, got {text!r}")
    return int(lo), int(hi)


def _invite_rate(text: str) -> float:
    from agent.errors import ConfigError

    number = text.strip().removesuffix("/s")
    try:
        rate = float(number) if number.isascii() else -1.0
    except ValueError:
        rate = -1.0
    if not 0 <= rate < 1e6:  # also refuses nan and inf
        raise ConfigError(f"--invite-rate: expected INVITEs a second such as 10/s (0: no "
                          f"limit), got {text!r}")
    return rate


def _networks(text: str) -> list[Any]:
    import ipaddress

    from agent.errors import ConfigError

    nets = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            nets.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ConfigError(f"--media-peers: {part!r} is not an address or a network such as "
                              "10.0.0.0/8") from None
    return nets


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
        elif kind == "stats":
            print(f"[{call}] " + ", ".join(f"{k} {v}" for k, v in ev.items() if k != "type"),
                  flush=True)


def _echo_test(summary: dict[str, Any]) -> dict[str, Any]:
    """An echo-test call's end record also says what it played back (``echo_test``)."""
    for e in summary.get("events", ()):
        if e.get("event") == "echo_test":
            return {"echo_test": {k: e[k] for k in ("echoed_samples", "dropped_samples") if k in e}}
    return {}


def session_factory(cfg: Config, models: Any, printer: CallPrinter | None = None,
                    record_dir: str = "", echo_test: bool = False) -> Any:
    """One fresh pipeline and session per call, sharing the loaded models (recorded into
    ``record_dir`` when one is given); ``echo_test``: the echo test's sessions instead."""
    from agent.events import EVENT_FRAMES, frame_event, trace_event
    from agent.frames import Dtmf
    from agent.presets import new_echo_test_session, new_session
    from agent.session import Session

    def make(*_: Any) -> Session:
        session = (new_echo_test_session(cfg, record_dir=record_dir) if echo_test
                   else new_session(cfg, models, telephony=True,  # [echo] auto: guarded
                                    record_dir=record_dir))
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
    from agent.presets import check_record_dir

    cfg = config_from_args(args)
    check_ops_flags(args)
    check_record_dir(args.record)
    if args.trace:
        cfg.trace.path = args.trace
    return runtime.run(serve(args, cfg), cfg.runtime)


def main_sip(args: argparse.Namespace) -> int:
    return _launch(_serve_sip, args)


async def _serve_sip(args: argparse.Namespace, cfg: Config) -> int:
    from agent.commands.operate import Telemetry
    from agent.errors import ConfigError
    from agent.ops import serve_until_stopped, slot_check
    from agent.runtime import keep_heap_trimmed
    from transports.sip.server import SipServer

    rtp_ports = _port_range(args.rtp_ports)
    media_peers = _networks(args.media_peers)
    invite_rate = _invite_rate(args.invite_rate)
    if args.invite_burst < 1 or args.max_calls_per_source < 0 or args.rtp_timeout < 0:
        raise ConfigError("--invite-burst must be at least 1; --max-calls-per-source and "
                          "--rtp-timeout at least 0")
    if args.transfer_timeout <= 0:
        raise ConfigError("--transfer-timeout must be more than 0 seconds")
    if args.transfer_to:
        from transports.sip.transfer import TransferError, refer_target

        try:  # (a bare number or name is checked here against a stand-in caller host)
            refer_target(args.transfer_to, "<sip:caller@localhost>")
        except TransferError as err:
            raise ConfigError(f"--transfer-to: {err}") from None
    printer = CallPrinter(args.json)
    telemetry = Telemetry("sip", args)
    models = _load(cfg)
    keep_heap_trimmed(cfg.runtime)
    server = SipServer(
        session_factory(cfg, models, printer, args.record), host=args.host, port=args.port,
        rtp_ports=rtp_ports, media_address=args.media_address, max_calls=args.max_calls,
        on_call=lambda c: printer.emit(c.session.id, {"type": "call", "state": "ringing",
                                                      "sip_call_id": c.call_id}),
        on_end=lambda r: printer.emit(r.summary.get("session", r.call_id), {
            "type": "call", "state": "ended", "reason": r.reason,
            "seconds": round(r.seconds, 1), "jitter": r.jitter,
            "malformed_rtp": r.media.malformed, "dtmf": r.media.dtmf,
            "rtp_dropped": {"foreign": r.media.foreign, "stray_ssrc": r.media.stray_ssrc},
            "rtp_send_errors": r.media.send_errors, **_echo_test(r.summary)}),
        media_peers=media_peers, invite_rate=invite_rate, invite_burst=args.invite_burst,
        max_calls_per_source=args.max_calls_per_source, rtp_timeout_s=args.rtp_timeout,
        ready_checks=(slot_check(models.asr),), transfer_to=args.transfer_to,
        transfer_timeout_s=args.transfer_timeout,
        echo_session_factory=(session_factory(cfg, models, printer, args.record, echo_test=True)
                              if args.echo_test else None),
    )
    server.ops.metrics = telemetry.metrics.render
    telemetry.metrics.add_source(server.metric_samples)
    telemetry.metrics.add_source(models.asr.metric_samples)
    host, port = await server.start()
    print(f"voxline sip: listening on udp {host}:{port} (RTP {args.rtp_ports}); Ctrl-C stops",
          file=sys.stderr, flush=True)
    from agent.presets import asr_stats

    def report_stats() -> None:  # SIGUSR1: one stats line (SIP has no HTTP port for /healthz)
        printer.emit("server", {"type": "stats", "calls": len(server.calls),
                                "ended": server.ended, "tasks": len(asyncio.all_tasks()),
                                **asr_stats(models.asr)})

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, report_stats)
    try:
        await telemetry.start(server.health)
        # new INVITEs get 503 while the live calls run out the drain; then each left gets a
        # BYE and its end record
        await serve_until_stopped(server, "voxline sip", args.drain_timeout, server.health)
    finally:
        await server.stop()  # (again: a no-op after a drain; the BYEs if it was cut short)
        await telemetry.close()
    print(f"voxline sip: stopped after {server.ended} call(s)", file=sys.stderr,
          flush=True)
    return 0


def main_twilio(args: argparse.Namespace) -> int:
    return _launch(_serve_twilio, args)


async def _serve_twilio(args: argparse.Namespace, cfg: Config) -> int:
    from agent.commands.operate import Telemetry
    from agent.ops import serve_until_stopped, slot_check
    from agent.runtime import keep_heap_trimmed
    from transports.admission import Admission
    from transports.twilio.server import TwilioServer

    # the server checks this too; here it fails before the models take their time to load
    Admission(args.host, public_url=args.public_url,
              twilio_auth_token=args.twilio_auth_token).require_twilio()
    printer = CallPrinter(args.json)
    telemetry = Telemetry("twilio", args)
    models = _load(cfg)
    keep_heap_trimmed(cfg.runtime)
    server = TwilioServer(
        session_factory(cfg, models, printer, args.record), host=args.host, port=args.port,
        public_url=args.public_url, twilio_auth_token=args.twilio_auth_token,
        twilio_account_sid=args.twilio_account_sid, twilio_api_base=args.twilio_api_base,
        max_calls=args.max_calls,
        on_end=lambda r: printer.emit(r.summary.get("session", r.stream_sid), {
            "type": "call", "state": "ended", "reason": r.reason,
            "heard_lag_ms": r.heard_lags_ms, "dtmf": r.stats.dtmf}),
        ready_checks=(slot_check(models.asr),),
    )
    server.ops.metrics = telemetry.metrics.render
    telemetry.metrics.add_source(server.metric_samples)
    telemetry.metrics.add_source(models.asr.metric_samples)
    host, port = await server.start()
    print(f"voxline twilio: media streams on ws://{host}:{port}{server.media_path}, TwiML on "
          f"GET http://{host}:{port}{server.twiml_path}; Ctrl-C stops", file=sys.stderr,
          flush=True)
    try:
        await telemetry.start(server.health)
        await serve_until_stopped(server, "voxline twilio", args.drain_timeout, server.health)
    finally:
        # stops listening, then closes every live stream (1001, going away): each call's
        # session closes and its end record is printed before this returns
        await server.stop()
        await telemetry.close()
    print(f"voxline twilio: stopped after {server.ended} call(s)", file=sys.stderr,
          flush=True)
    return 0
