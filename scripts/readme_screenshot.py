"""Makes the README's picture of the browser demo (web/screenshot.png) from a real call: headless
Chromium calls `voxline serve`'s server over WebSocket, the agent greets, the fake microphone
says one LibriSpeech sentence, the embedded models answer, and the page is captured once the
turn is traced. Run it on a quiet machine (nothing else running), so the waterfall shows what a
caller meets, not a loaded test run; it prints the turn's numbers for the README's caption.

    python scripts/readme_screenshot.py [--out web/screenshot.png] [--transport ws|webrtc]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]

GREETING = "Hi! I'm a voxline demo agent. What would you like to talk about?"
UNTIL = ("v.finals.length > 0 && v.replies.some(r => !r.greeting && !r.cancelled)"
         " && v.traces.some(t => t.kind === 'turn' && t.complete)"
         " && document.querySelectorAll('#waterfall .turn').length > 1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "web" / "screenshot.png"))
    ap.add_argument("--transport", default="ws", choices=["ws", "webrtc"])
    args = ap.parse_args()
    shots = Path(tempfile.mkdtemp(prefix="voxline-shot-"))
    os.environ["VOXLINE_SCREENSHOTS"] = str(shots)  # read when test_browser_call is imported

    from test_browser_call import browser_call, read_clip, write_mic

    from agent.config import Config
    from agent.presets import load_models, new_session

    cfg = Config()
    cfg.agent.greeting = GREETING
    print("loading models…", flush=True)
    models = load_models(cfg)
    # the greeting plays out before the caller speaks (no barge-in), then one sentence
    mic = write_mic(shots / "mic.wav", 6.0, read_clip("kittens"), 14.0)
    state, _, _ = asyncio.run(browser_call(lambda: new_session(cfg, models), mic, args.transport,
                                           UNTIL, "readme.png", timeout_s=120.0))
    shutil.copyfile(shots / "readme.png", args.out)
    turn = next(t for t in state["traces"] if t["kind"] == "turn" and t["complete"])
    greeting = next((t for t in state["traces"] if t["kind"] == "greeting"), None)
    spans = ", ".join(f"{k} {v['ms']:.0f}" for k, v in turn["spans"].items())
    print(f"wrote {args.out} ({args.transport})")
    print(f"turn: {spans}")
    if greeting is not None:
        print(f"greeting: {greeting['spans'].get('greeting', {}).get('ms', float('nan')):.0f} ms")
    print(f"page-measured voice-to-voice: {state['voiceToVoiceMs']} ms")
    shutil.rmtree(shots, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
