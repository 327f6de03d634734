"""Concurrent SIP calls against the real pipeline: sipp places CALLS simultaneous calls, each
streaming a real 8 kHz recording as μ-law RTP, again and again for DURATION seconds, all on
127.0.0.1. Prints calls completed, RTP lost/late at our receiver, outbound pacing, and
voice-to-voice p50/p95 per call, then one JSON line.

    python benchmarks/telephony_calls.py --calls 20 --duration 120
    python benchmarks/telephony_calls.py --calls 20 --agent echo   # the transports' own cost

``--agent echo`` replaces the model pipeline by one stage that speaks the caller's audio straight
back: what is left is SIP, RTP, G.711, resampling, jitter buffer and pacing, so the numbers show
what telephony itself costs and whether it keeps 20 ms pacing under load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.commands.telephony import session_factory  # noqa: E402
from agent.config import Config  # noqa: E402
from agent.presets import load_models  # noqa: E402
from transports.sip.server import CallReport, SipServer  # noqa: E402

CLIP = ROOT / "tests" / "data" / "asterisk-queue-youarenext.wav"
SCENARIO = ROOT / "tests" / "data" / "sipp" / "uac_speech.xml"
DTMF = "/usr/share/sip-tester/dtmf_2833_5.pcap"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def echo_session_factory():  # noqa: ANN201 - only for --agent echo
    from agent.frames import AudioIn, Direction, TTSAudio
    from agent.pipeline import Pipeline
    from agent.session import Session
    from agent.stage import Stage

    class SpeakBack(Stage):
        name = "speak_back"

        def process(self, frame, direction) -> None:  # noqa: ANN001
            if isinstance(frame, AudioIn):
                self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
            else:
                self.push(frame, direction)

    return lambda: Session(Pipeline([SpeakBack()]))


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


async def run(args: argparse.Namespace) -> dict:
    import soundfile as sf

    sipp = shutil.which("sipp")
    if sipp is None:
        sys.exit("sipp is not installed: apt-get install -y sip-tester")
    tmp = Path(tempfile.mkdtemp(prefix="voxline-bench-"))
    pcm, _ = sf.read(CLIP, dtype="int16")
    sf.write(tmp / "caller.wav", pcm, 8000, subtype="ULAW")
    xml = (SCENARIO.read_text().replace("@WAV@", str(tmp / "caller.wav"))
           .replace("@DTMF@", DTMF).replace("@TALK_MS@", str(args.talk_ms)))
    (tmp / "caller.xml").write_text(xml)
    call_s = args.talk_ms / 1000 + 1.0
    total = max(args.calls, int(args.calls * args.duration / call_s))

    cfg = Config()
    t0 = time.monotonic()
    if args.agent == "echo":
        factory = echo_session_factory()
    else:
        factory = session_factory(cfg, load_models(cfg))
    load_s = time.monotonic() - t0
    reports: list[CallReport] = []
    server = SipServer(factory, port=free_udp_port(),
                       rtp_ports=(46000, 47998), max_calls=args.calls + 5,
                       on_end=reports.append)
    host, port = await server.start()
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sipp, f"{host}:{port}", "-i", "127.0.0.1", "-p", str(free_udp_port()),
        # sipp 3.6 offers the one -mp port for every call's media; -rtp_echo bounces each call's
        # agent RTP back to the call's own socket, which measures the return path too
        "-mi", "127.0.0.1", "-mp", str(free_udp_port()), "-rtp_echo",
        "-sf", str(tmp / "caller.xml"), "-s", "agent", "-m", str(total), "-l", str(args.calls),
        "-r", str(args.calls), "-rp", "1000", "-nostdin", "-timeout", f"{args.duration + 60}s",
        "-trace_err", cwd=tmp, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    cpu0 = time.process_time()
    out, _ = await proc.communicate()
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    if proc.returncode not in (0, 1):  # 1: some calls failed; anything else: sipp itself did
        sys.exit(f"sipp exited with {proc.returncode}:\n{out.decode(errors='replace')[-2000:]}")
    for _ in range(100):
        if not server.calls:
            break
        await asyncio.sleep(0.05)
    await server.stop()
    text = out.decode(errors="replace")
    ok = re.findall(r"Successful call\s*\|\s*\d+\s*\|\s*(\d+)", text)
    failed = re.findall(r"Failed call\s*\|\s*\d+\s*\|\s*(\d+)", text)

    per_call = []
    v2v_all: list[float] = []
    for r in reports:
        v2v = [t["spans"]["voice_to_voice"]["ms"] for t in r.turns
               if t["type"] == "turn" and t["complete"] and "voice_to_voice" in t["spans"]]
        v2v_all += v2v
        per_call.append({
            "reason": r.reason, "seconds": round(r.seconds, 1), "rtp_in": r.media.packets_in,
            "lost": r.jitter["lost"], "late": r.jitter["late"],
            "reordered": r.jitter["reordered"], "malformed": r.media.malformed,
            "agent_packets": r.media.agent_packets_out, "pacing_late_ticks": r.media.late_ticks,
            "rtp_out": r.media.packets_out, "echoed": r.media.echoed_in,
            "voice_to_voice_ms": v2v,
        })
    rtp_in = sum(c["rtp_in"] for c in per_call)
    return {
        "benchmark": "telephony_calls", "agent": args.agent, "concurrent": args.calls, "duration_s": args.duration,
        "talk_ms": args.talk_ms, "models_load_s": round(load_s, 1), "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "sipp_rc": proc.returncode, "calls_placed": total,
        "sipp_successful": int(ok[-1]) if ok else None,
        "sipp_failed": int(failed[-1]) if failed else None,
        "calls_ended_by_bye": sum(c["reason"] == "bye" for c in per_call),
        "rtp_packets_in": rtp_in, "rtp_lost": sum(c["lost"] for c in per_call),
        "rtp_late": sum(c["late"] for c in per_call),
        "rtp_malformed": sum(c["malformed"] for c in per_call),
        "pacing_late_ticks": sum(c["pacing_late_ticks"] for c in per_call),
        "rtp_packets_out": sum(c["rtp_out"] for c in per_call),
        "rtp_echoed_back": sum(c["echoed"] for c in per_call),
        "calls_with_reply": sum(bool(c["voice_to_voice_ms"]) for c in per_call),
        "voice_to_voice_p50_ms": pct(v2v_all, 50), "voice_to_voice_p95_ms": pct(v2v_all, 95),
        "per_call": per_call,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20, help="concurrent calls (default 20)")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of calling")
    ap.add_argument("--talk-ms", type=int, default=12000,
                    help="how long each call stays up after the recording starts")
    ap.add_argument("--agent", choices=["pipeline", "echo"], default="pipeline",
                    help="the embedded model pipeline, or an echo that isolates telephony's cost")
    args = ap.parse_args()
    res = asyncio.run(run(args))
    rows = [
        ("concurrent calls", res["concurrent"]), ("calls placed", res["calls_placed"]),
        ("sipp successful / failed", f"{res['sipp_successful']} / {res['sipp_failed']}"),
        ("calls ended by BYE", res["calls_ended_by_bye"]),
        ("calls with an agent reply", res["calls_with_reply"]),
        ("RTP packets in", res["rtp_packets_in"]),
        ("RTP lost / late / malformed",
         f"{res['rtp_lost']} / {res['rtp_late']} / {res['rtp_malformed']}"),
        ("outbound pacing ticks > 20 ms late", res["pacing_late_ticks"]),
        ("RTP out / echoed back by sipp", f"{res['rtp_packets_out']} / {res['rtp_echoed_back']}"),
        ("voice-to-voice p50 / p95 ms",
         f"{res['voice_to_voice_p50_ms']} / {res['voice_to_voice_p95_ms']}"),
        ("wall s", res["wall_s"]),
        ("process CPU s (user+sys)", res["cpu_s"]),
    ]
    for name, value in rows:
        print(f"{name:<38} {value}")
    print(json.dumps({k: v for k, v in res.items() if k != "per_call"}))


if __name__ == "__main__":
    main()
