"""Voice-to-voice latency as the browser sees it, over WebSocket and over WebRTC.

Headless Chromium calls the server with the embedded models; its fake microphone plays a real
recording ``--turns`` times with silences between. Per turn, two numbers:

- page: from where the voice stopped in the page's microphone track (the last 5-ms block within
  35 dB of the loudest, read off the track's own frames with their capture times:
  MediaStreamTrackProcessor) to the first audible agent audio where the page plays it — over
  WebSocket the first audible 5-ms block in WebAudio (an AnalyserNode holding more than a
  polling interval, so no block is missed), over WebRTC the first audible packet the receiver
  hands to the playing <audio> element (getSynchronizationSources: its time and RTP audio
  level, to the 10-ms chunk). Over WebRTC the same turns are also timed where WebAudio hears
  the track ("(WebAudio)"), which is ~30 ms later in Chromium;
- trace: the server's own ``voice_to_voice`` span, from the arrival of the frame where the voice
  stopped (the same 35-dB rule, in the VAD) to the first agent audio frame handed to the
  transport — the in-process pipeline's voice-to-voice for this very turn.

Per turn, page - trace is what the transport adds: the page's capture framing, the uplink, the
downlink, the browser's jitter buffer and playback start. Pairing turn by turn cancels the
model's own variation (the reply differs from turn to turn). The server runs in this process,
so the added time also splits into the way up and the way down on one wall clock. Prints a
table and one JSON line.

    python benchmarks/browser_latency.py [--turns 4] [--transports ws,webrtc,webrtc@aiortc]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # speech.py: the test clips
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from emit import emit  # noqa: E402
from test_browser_call import CLIP, browser_call, read_clip, session_factory, write_mic  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def split(turns: list[dict], page_ms: list, page_at: list, wall_offset_ns: int) -> dict:
    """Pair the page's turns with the server's, turn by turn: what the transport added, and
    (the server runs in this process: its monotonic stamps become wall-clock times) how much of
    it on the way up (voice end in the page -> that frame's arrival) and on the way down (first
    agent frame sent -> heard in the page)."""
    trace = [t["spans"]["voice_to_voice"]["ms"] for t in turns]
    page = [float(x) for x in page_ms]
    n = min(len(trace), len(page))
    up, down = [], []
    for t, (voice_end, heard) in zip(turns, page_at, strict=False):
        arrived = (t["t0_ns"] + wall_offset_ns) / 1e6
        sent = arrived + t["spans"]["voice_to_voice"]["ms"]
        up.append(arrived - voice_end)
        down.append(heard - sent)
    return {"page_ms": page[:n], "trace_ms": trace[:n],
            "added_ms": [page[i] - trace[i] for i in range(n)],
            "uplink_ms": up[:n], "downlink_ms": down[:n]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--gap", type=float, default=7.0, help="silence after each utterance (s)")
    ap.add_argument("--transports", default="ws,webrtc",
                    help="calls to make, in order: ws, webrtc (low-delay Opus, 20-ms packets), "
                         "webrtc@10 (10-ms packets), webrtc@aiortc (aiortc's own encoder: voip "
                         "mode, 20 ms); "
                         "a name given twice pools its turns (alternate them to compare)")
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
        for name in args.transports.split(","):
            transport, _, variant = name.partition("@")
            until = (f"v.traces.filter(t => t.kind === 'turn' && t.complete).length >= {args.turns}"
                     f" && v.voiceToVoiceMs.length >= {args.turns}")
            timeout = 20 + args.turns * (len(clip) / 16000 + args.gap) * 1.5
            options, encoder = {}, contextlib.nullcontext()
            if variant == "aiortc":  # aiortc's own Opus encoder (voip mode, 20-ms packets)
                import transports.webrtc.peer as peer
                options["webrtc_ptime_ms"] = 20
                encoder = mock.patch.object(peer, "use_low_delay_opus", lambda *a: False)
            elif variant:
                options["webrtc_ptime_ms"] = int(variant)
            with encoder:
                state, _, _ = asyncio.run(browser_call(
                    session_factory(models), mic, transport, until,
                    f"voxline-latency-{transport}.png", timeout_s=timeout,
                    server_options=options))
            turns = [t for t in state["traces"]
                     if t["kind"] == "turn" and t["complete"] and "voice_to_voice" in t["spans"]]
            runs = [(name, "voiceToVoiceMs")]
            if transport == "webrtc":
                runs.append((f"{name} (WebAudio)", "voiceToVoiceWebAudioMs"))
            for label, key in runs:
                r = split(turns, state[key], state[f"{key}At"], wall_offset_ns)
                r["mic_clock"] = state.get("micClock")
                r["browser_rtp"] = state.get("rtp")
                merged = results.setdefault(label, {})
                for k, v in r.items():  # a name given twice: its runs are pooled
                    merged[k] = merged.get(k, []) + v if isinstance(v, list) else v
    print(f"{'transport':18} {'turns':>5} {'page p50':>9} {'page p95':>9} {'trace p50':>10} "
          f"{'added p50':>10} {'added p95':>10}")
    for name, r in results.items():
        print(f"{name:18} {len(r['page_ms']):5d} {pct(r['page_ms'], 50):9.0f} "
              f"{pct(r['page_ms'], 95):9.0f} {pct(r['trace_ms'], 50):10.0f} "
              f"{pct(r['added_ms'], 50):10.0f} {pct(r['added_ms'], 95):10.0f}")
    print("of which, on this machine's wall clock (page performance.timeOrigin vs the server's "
          "time.time_ns): ")
    for name, r in results.items():
        print(f"  {name:18} way up p50 {pct(r['uplink_ms'], 50):6.0f} ms, "
              f"way down p50 {pct(r['downlink_ms'], 50):6.0f} ms")
    for name, r in results.items():
        if r.get("browser_rtp") and "(WebAudio)" not in name:
            rtp = r["browser_rtp"]
            print(f"{name}: the browser's receive jitter buffer held agent audio "
                  f"{rtp['jitterBufferMs']} ms on average, aiming at {rtp['targetMs']} ms; "
                  f"interarrival jitter {rtp['jitterMs']} ms; {rtp['concealedMs']} ms concealed "
                  f"(getStats inbound-rtp)")
    emit({"benchmark": "browser_latency", "turns": args.turns, "results": results}, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
