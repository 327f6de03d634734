"""Voice-to-voice latency as the browser sees it, over WebSocket and over WebRTC.

Headless Chromium calls the server with the embedded models; its fake microphone plays a real
recording ``--turns`` times with silences between. Per turn, two numbers:

- page: from where the voice stopped in the page's microphone track (the last 5-ms block within
  35 dB of the loudest, read from an AnalyserNode holding more than a polling interval, so the
  time is exact to a block) to the first audible block of agent audio in the page's playback;
- trace: the server's own ``voice_to_voice`` span, from the arrival of the frame where the voice
  stopped (the same 35-dB rule, in the VAD) to the first agent audio frame handed to the
  transport — the in-process pipeline's voice-to-voice for this very turn.

Per turn, page - trace is what the transport adds: the page's capture framing, the uplink, the
downlink, the playback margin and the render quantum. Pairing turn by turn cancels the model's
own variation (the reply differs from turn to turn). Prints a table and one JSON line.

    python benchmarks/browser_latency.py [--turns 4] [--transports ws,webrtc]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from emit import emit  # noqa: E402
from test_browser_call import CLIP, browser_call, read_clip, session_factory, write_mic  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--gap", type=float, default=7.0, help="silence after each utterance (s)")
    ap.add_argument("--transports", default="ws,webrtc")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    from agent.config import Config
    from agent.presets import load_models

    cfg = Config()
    models = (cfg, load_models(cfg))
    clip = read_clip(CLIP[0])
    parts: list[np.ndarray | float] = [0.8]
    for _ in range(args.turns):
        parts += [clip, args.gap]
    results = {}
    wall_offset_ns = time.time_ns() - time.monotonic_ns()
    with tempfile.TemporaryDirectory() as tmp:
        mic = write_mic(Path(tmp) / "mic.wav", *parts, 10.0)
        for transport in args.transports.split(","):
            until = (f"v.traces.filter(t => t.kind === 'turn' && t.complete).length >= {args.turns}"
                     f" && v.voiceToVoiceMs.length >= {args.turns}")
            timeout = 20 + args.turns * (len(clip) / 16000 + args.gap) * 1.5
            state, _, _ = asyncio.run(browser_call(
                session_factory(models), mic, transport, until,
                f"voxline-latency-{transport}.png", timeout_s=timeout))
            turns = [t for t in state["traces"]
                     if t["kind"] == "turn" and t["complete"] and "voice_to_voice" in t["spans"]]
            trace = [t["spans"]["voice_to_voice"]["ms"] for t in turns]
            page = [float(x) for x in state["voiceToVoiceMs"]]
            n = min(len(trace), len(page))
            added = [page[i] - trace[i] for i in range(n)]
            # The server runs in this process: its monotonic stamps become wall-clock times, to
            # split what was added into the way up (voice end in the page -> that frame's
            # arrival) and the way down (first agent frame sent -> heard in the page).
            up, down = [], []
            for t, (voice_end, heard) in zip(turns, state["voiceToVoiceAt"], strict=False):
                arrived = (t["t0_ns"] + wall_offset_ns) / 1e6
                sent = arrived + t["spans"]["voice_to_voice"]["ms"]
                up.append(arrived - voice_end)
                down.append(heard - sent)
            results[transport] = {"page_ms": page, "trace_ms": trace, "added_ms": added,
                                  "uplink_ms": up, "downlink_ms": down,
                                  "browser_jitter_buffer_ms": state.get("jitterBufferMs")}
    print(f"{'transport':10} {'turns':>5} {'page p50':>9} {'page p95':>9} {'trace p50':>10} "
          f"{'added p50':>10} {'added p95':>10}")
    for name, r in results.items():
        print(f"{name:10} {len(r['page_ms']):5d} {pct(r['page_ms'], 50):9.0f} "
              f"{pct(r['page_ms'], 95):9.0f} {pct(r['trace_ms'], 50):10.0f} "
              f"{pct(r['added_ms'], 50):10.0f} {pct(r['added_ms'], 95):10.0f}")
    print("of which, on this machine's wall clock (page performance.timeOrigin vs the server's "
          "time.time_ns): ")
    for name, r in results.items():
        print(f"  {name:8} way up p50 {pct(r['uplink_ms'], 50):6.0f} ms, "
              f"way down p50 {pct(r['downlink_ms'], 50):6.0f} ms")
    for name, r in results.items():
        if r["browser_jitter_buffer_ms"] is not None:
            print(f"{name}: the browser's receive jitter buffer held agent audio "
                  f"{r['browser_jitter_buffer_ms']} ms on average (getStats inbound-rtp)")
    emit({"benchmark": "browser_latency", "turns": args.turns, "results": results}, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
