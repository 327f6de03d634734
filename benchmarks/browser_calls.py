"""Many concurrent WebSocket calls against one ``voxline serve`` server on loopback.

The server runs in a child process with a small tone agent per call (the transport's own load:
framing, the 20 ms playout ticker, the bounded outbox, events) or with the embedded models
(``--agent embedded``). Each client streams a real recording in real time, in a loop, and reads
everything the server sends. Every ``--every`` seconds the server's RSS is sampled. At the end:
calls dropped, frames both ways, audio the server dropped for slow readers, RSS over time.
Prints a table and one JSON line.

    python benchmarks/browser_calls.py --calls 50 --seconds 120
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from emit import emit  # noqa: E402

CLIP = ROOT / "tests" / "data" / "ls-dev-clean-1988-24833-0000.wav"


def _serve(port: mp.Value, agent: str) -> None:  # type: ignore[valid-type]
    from agent.frames import AudioIn, Transcript, TTSAudio
    from agent.pipeline import Pipeline
    from agent.session import Session
    from agent.stage import Stage
    from agent.trace import Trace
    from transports.server import VoiceServer

    class ToneAgent(Stage):
        """Answers every 3 s of caller audio with 1 s of 440 Hz and a transcript event."""

        tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.int16)

        def __init__(self) -> None:
            super().__init__("tone-agent")
            self.frames = 0

        def process(self, frame, direction):  # type: ignore[no-untyped-def]
            self.push(frame, direction)
            if isinstance(frame, AudioIn):
                self.frames += 1
                if self.frames % 150 == 0:
                    now = time.monotonic_ns()
                    self.ctx.trace.begin_turn(speech_end=now, vad_decision=now, asr_final=now)
                    self.push(Transcript(f"{self.frames} frames", final=True, end=frame.end))
                    self.push(TTSAudio(self.tone, last=True))

    if agent == "embedded":
        from agent.config import Config
        from agent.presets import build_pipeline, load_models

        cfg = Config()
        models = load_models(cfg)

        def new_session() -> Session:
            return Session(build_pipeline(cfg, models), Trace(cfg.trace.budgets))
    else:
        def new_session() -> Session:
            return Session(Pipeline([ToneAgent()]), Trace({}))

    async def main() -> None:
        server = VoiceServer(new_session, port=0, max_calls=1000)
        port.value = await server.start()
        await asyncio.Event().wait()

    asyncio.run(main())


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def one_call(url: str, pcm: np.ndarray, seconds: float, stats: dict) -> None:
    import aiohttp

    frames = [pcm[i : i + 320].tobytes() for i in range(0, len(pcm) - 319, 320)]
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url)

        async def reader() -> None:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.BINARY:
                    stats["frames_in"] += 1
                elif msg.type is aiohttp.WSMsgType.TEXT:
                    stats["events"] += 1

        task = asyncio.create_task(reader())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        k = 0
        while loop.time() - t0 < seconds:
            if ws.closed:
                stats["dropped_calls"] += 1
                break
            await ws.send_bytes(frames[k % len(frames)])
            stats["frames_out"] += 1
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * 0.02 - loop.time()))
        else:
            await ws.close()
        task.cancel()


async def drive(args: argparse.Namespace, port: int, pid: int) -> dict:
    with wave.open(str(CLIP)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    pcm = np.concatenate([pcm, np.zeros(16000, np.int16)])
    stats = {"frames_out": 0, "frames_in": 0, "events": 0, "dropped_calls": 0}
    url = f"http://127.0.0.1:{port}/ws"
    rss = [(0.0, rss_mb(pid))]
    calls = [asyncio.create_task(one_call(url, pcm, args.seconds, stats)) for _ in range(args.calls)]
    t0 = time.monotonic()
    while not all(c.done() for c in calls):
        await asyncio.sleep(min(args.every, 1.0))
        if time.monotonic() - t0 >= len(rss) * args.every:
            rss.append((round(time.monotonic() - t0, 1), rss_mb(pid)))
    errors = [c.exception() for c in calls if c.exception() is not None]
    import aiohttp

    async with aiohttp.ClientSession() as http:
        health = await (await http.get(f"http://127.0.0.1:{port}/healthz")).json()
    return {"stats": stats, "rss": rss, "errors": [repr(e) for e in errors], "server": health}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--json-out")
    ap.add_argument("--every", type=float, default=10.0, help="RSS sampling interval (s)")
    ap.add_argument("--agent", choices=["tone", "embedded"], default="tone")
    args = ap.parse_args()
    port = mp.Value("i", 0)
    proc = mp.get_context("fork").Process(target=_serve, args=(port, args.agent), daemon=True)
    proc.start()
    t0 = time.monotonic()
    while port.value == 0:
        if time.monotonic() - t0 > 300 or not proc.is_alive():
            print("server did not start", file=sys.stderr)
            return 1
        time.sleep(0.1)
    try:
        res = asyncio.run(drive(args, port.value, proc.pid))
    finally:
        proc.terminate()
        proc.join(5)
    s, rss = res["stats"], res["rss"]
    expected_out = int(args.calls * args.seconds / 0.02)
    print(f"{args.calls} WebSocket calls x {args.seconds:.0f} s ({args.agent} agent), loopback")
    print(f"  calls dropped            {s['dropped_calls'] + len(res['errors'])}")
    print(f"  caller frames sent       {s['frames_out']} (real time would be {expected_out})")
    print(f"  agent frames received    {s['frames_in']}; events {s['events']}")
    print(f"  server: {res['server']}")
    print("  server RSS (MB) over time: " + ", ".join(f"{t:.0f}s {m:.1f}" for t, m in rss))
    growth = rss[-1][1] - rss[min(1, len(rss) - 1)][1]
    print(f"  RSS growth after the first sample: {growth:+.1f} MB")
    # Each call keeps its last 32 turns (one every 3 s with the tone agent: full after 96 s), so
    # per-call state stops growing by design after that; the second half shows whether anything
    # else does.
    half = next((m for t, m in rss if t >= args.seconds / 2), rss[-1][1])
    late = rss[-1][1] - half
    print(f"  RSS growth over the second half: {late:+.1f} MB")
    emit({"benchmark": "browser_calls", "calls": args.calls, "seconds": args.seconds,
                      "agent": args.agent, **s, "errors": res["errors"], "server": res["server"],
                      "rss_mb": rss, "rss_growth_mb": round(growth, 1),
                      "rss_growth_second_half_mb": round(late, 1)}, args.json_out)
    return 0 if not res["errors"] and not s["dropped_calls"] else 1


if __name__ == "__main__":
    sys.exit(main())
