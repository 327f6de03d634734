"""Calls on Ray Serve voice replicas against a plain server, side by side in one run.

A local Ray cluster on loopback runs ``voxline serve --ray``'s application (``--replicas``
voice replicas behind the ingress); a plain ``VoiceServer`` runs in a child process beside it.
Measured:

- **placement**: ``POST /place`` through Serve's proxy and the ingress (a reservation on a
  replica): the set-up time the ingress adds to a call, p50/p95.
- **per message**: a ping/pong event over a call's WebSocket while ``--calls`` calls stream
  20 ms frames in real time: wall p50/p95, and the media server's CPU per message (its
  process's CPU time over the messages it took), the replica's direct media path against the
  plain server. Serve's proxy is not on the path at all (measured before: ~3.2 ms CPU, 6–9 ms
  p50 per message through it).
- **calls per replica at the latency goal** (``--agent embedded``): voice-to-voice p95 of calls
  on one replica at 1, 2, 4, … concurrent calls, up to ``--max-calls``; the most calls whose p95
  stays within the budget. With the tone agent (default) this part is skipped: a tone answers
  no turn.

    python benchmarks/ray_calls.py --seconds 20                  # transport and placement
    python benchmarks/ray_calls.py --agent embedded --max-calls 8 --seconds 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from emit import emit  # noqa: E402

CLIP = ROOT / "tests" / "data" / "ls-dev-clean-1988-24833-0000.wav"
BUDGET_MS = 800.0  # voice_to_voice (agent.config.TraceConfig)


def tone_agent(cfg):  # noqa: ANN001, ANN201 — ScaleOptions.agent: a session factory per replica
    """A session that answers nothing: the transport's own cost (framing, events, playout)."""
    from agent.pipeline import Pipeline
    from agent.session import Session
    from agent.stage import Stage
    from agent.trace import Trace

    class Sink(Stage):
        def __init__(self) -> None:
            super().__init__("sink")

        def process(self, frame, direction):  # noqa: ANN001, ANN202
            self.push(frame, direction)

    return lambda: Session(Pipeline([Sink()]), Trace({}))


def _config(threads: int = 1):  # noqa: ANN202
    from agent.config import Config

    cfg = Config()
    cfg.asr.threads = threads
    cfg.tts.backend = "espeak"
    cfg.llm.batch_threads = 1
    cfg.runtime.gc_freeze = False
    return cfg


def _plain_server(port: mp.Value, agent: str) -> None:  # type: ignore[valid-type]
    from agent.presets import load_models, new_session
    from transports.server import VoiceServer

    cfg = _config()
    if agent == "tone":
        factory = tone_agent(cfg)
    else:
        models = load_models(cfg)

        def factory():  # noqa: ANN202
            return new_session(cfg, models)

    async def main() -> None:
        server = VoiceServer(factory, port=0, max_calls=256)
        port.value = await server.start()
        await asyncio.Event().wait()

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def stream_call(http, url: str, pcm: np.ndarray, seconds: float, out: dict,  # noqa: ANN001
                      ping_every: int = 5) -> None:
    """Stream ``pcm`` in a loop in real time; every ``ping_every`` frames a ping, whose pong's
    round trip is recorded; voice-to-voice of finished turns too."""
    import aiohttp

    ws = await http.ws_connect(url)
    sent_at: dict[int, float] = {}

    async def reader() -> None:
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            ev = json.loads(msg.data)
            if ev["type"] == "pong" and ev.get("t") in sent_at:
                out["rtt_ms"].append((time.perf_counter() - sent_at.pop(ev["t"])) * 1000)
            elif ev["type"] == "trace" and ev.get("kind") == "turn":
                v2v = ev.get("spans", {}).get("voice_to_voice")
                if v2v:
                    out["v2v_ms"].append(v2v["ms"])

    task = asyncio.create_task(reader())
    frames = [pcm[i:i + 320].tobytes() for i in range(0, len(pcm) - 319, 320)]
    loop = asyncio.get_running_loop()
    t0, k = loop.time(), 0
    while loop.time() - t0 < seconds and not ws.closed:
        await ws.send_bytes(frames[k % len(frames)])
        out["messages"] += 1
        if k % ping_every == 0:
            sent_at[k] = time.perf_counter()
            await ws.send_str(json.dumps({"type": "ping", "t": k}))
            out["messages"] += 1
        k += 1
        await asyncio.sleep(max(0.0, t0 + k * 0.02 - loop.time()))
    await ws.close()
    task.cancel()


async def media_cost(urls: list[str], pid: int, pcm: np.ndarray, seconds: float) -> dict:
    import aiohttp

    out = {"rtt_ms": [], "v2v_ms": [], "messages": 0}
    c0 = cpu_s(pid)
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(stream_call(http, u, pcm, seconds, out) for u in urls))
    cpu = cpu_s(pid) - c0
    return {"calls": len(urls), "messages": out["messages"],
            "cpu_ms_per_message": round(1000 * cpu / max(1, out["messages"]), 4),
            "wall_p50_ms": round(pct(out["rtt_ms"], 0.5), 3),
            "wall_p95_ms": round(pct(out["rtt_ms"], 0.95), 3),
            "v2v_ms": out["v2v_ms"]}


async def place_many(origin: str, n: int) -> tuple[list[float], list[dict]]:
    import aiohttp

    times, places = [], []
    async with aiohttp.ClientSession() as http:
        for _ in range(n):
            t = time.perf_counter()
            async with http.post(f"{origin}/place") as r:
                body = await r.json()
            times.append((time.perf_counter() - t) * 1000)
            if r.status == 200:
                places.append(body)
    return times, places


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--calls", type=int, default=4, help="calls streaming while per-message cost is measured")
    ap.add_argument("--seconds", type=float, default=20.0, help="each measurement's length")
    ap.add_argument("--placements", type=int, default=40)
    ap.add_argument("--agent", choices=["tone", "embedded"], default="tone")
    ap.add_argument("--max-calls", type=int, default=8, help="embedded: the largest step of calls per replica")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    import ray
    from ray import serve

    from agent.audio import read_audio
    from agent.commands.ray_serve import APP_NAME, ScaleOptions, voice_app

    pcm = np.concatenate([read_audio(CLIP), np.zeros(16000, np.int16)])
    spawn = mp.get_context("spawn")  # (no fork after Ray's threads)
    port = spawn.Value("i", 0)
    plain = spawn.Process(target=_plain_server, args=(port, args.agent), daemon=True)
    plain.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http_port = s.getsockname()[1]
    ray.init(num_cpus=args.replicas + 2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False,
             # the replicas import this file's tone agent
             runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT}"}})
    result: dict = {"benchmark": "ray_calls", "replicas": args.replicas, "agent": args.agent,
                    "calls": args.calls, "seconds": args.seconds}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        origin = f"http://127.0.0.1:{http_port}"
        options = ScaleOptions(
            cfg=_config(), max_calls=256, replicas=args.replicas, media_host="127.0.0.1",
            allowed_origins=[origin], hold_s=1.0,
            agent="" if args.agent == "embedded" else "ray_calls:tone_agent")
        t0 = time.monotonic()
        serve.run(voice_app(options), name=APP_NAME, route_prefix="/")
        result["deploy_s"] = round(time.monotonic() - t0, 1)
        while port.value == 0:
            time.sleep(0.1)
        # --- the set-up time the ingress adds ------------------------------------------------
        asyncio.run(place_many(origin, 3))  # warm the proxy and the handles
        times, places = asyncio.run(place_many(origin, args.placements))
        by = {}
        for p in places:
            by[p["replica"]] = by.get(p["replica"], 0) + 1
        result["placement_ms"] = {"p50": round(statistics.median(times), 2),
                                  "p95": round(pct(times, 0.95), 2), "n": len(times),
                                  "spread": sorted(by.values())}
        # --- per message: the replica's direct media path against a plain server -------------
        handle = serve.get_deployment_handle("VoiceReplica", app_name=APP_NAME)
        infos = {}
        # the replicas' pids: the handle's router picks the replica with most free places, so
        # ask until one of the placed replicas answered
        for _ in range(32 * args.replicas):
            i = handle.info.remote().result(timeout_s=30)
            infos[i["replica"]] = i
            if len(infos) == args.replicas:
                break
        replica = next((p for p in places if p["replica"] in infos), None)
        if replica is None:
            raise SystemExit(f"no placed replica answered info() (heard {sorted(infos)})")
        pid = infos[replica["replica"]]["pid"]
        time.sleep(1.5)  # the placements' reservations lapse (hold_s=1)
        ray_path = asyncio.run(media_cost([replica["ws"]] * args.calls, pid, pcm, args.seconds))
        plain_path = asyncio.run(media_cost([f"ws://127.0.0.1:{port.value}/ws"] * args.calls,
                                            plain.pid, pcm, args.seconds))
        result["per_message"] = {"ray_direct": {k: v for k, v in ray_path.items() if k != "v2v_ms"},
                                 "plain_server": {k: v for k, v in plain_path.items() if k != "v2v_ms"}}
        # --- calls per replica at the latency goal ------------------------------------------------
        steps = []
        if args.agent == "embedded":
            n = 1
            while n <= args.max_calls:
                m = asyncio.run(media_cost([replica["ws"]] * n, pid, pcm, args.seconds))
                p95 = pct(m["v2v_ms"], 0.95)
                steps.append({"calls": n, "turns": len(m["v2v_ms"]), "v2v_p95_ms": round(p95, 1)})
                if not m["v2v_ms"] or p95 > BUDGET_MS:
                    break
                n *= 2
        ok = [s["calls"] for s in steps if s["turns"] and s["v2v_p95_ms"] <= BUDGET_MS]
        result["capacity"] = {"steps": steps, "budget_ms": BUDGET_MS,
                              "calls_per_replica_at_goal": max(ok) if ok else None}
    finally:
        serve.shutdown()
        ray.shutdown()
        plain.terminate()
        plain.join(5)

    pm, pl = result["per_message"], result["placement_ms"]
    print(f"Ray Serve voice replicas: {args.replicas} ({args.agent} agent), {args.calls} calls "
          f"x {args.seconds:.0f} s, loopback; deployed in {result['deploy_s']} s")
    print(f"  placement through the ingress   p50 {pl['p50']:.1f} ms  p95 {pl['p95']:.1f} ms "
          f"({pl['n']} placements, spread over replicas {pl['spread']})")
    print(f"  {'per message':<32}{'replica (direct)':>18}{'plain server':>16}")
    for key, label in (("cpu_ms_per_message", "server CPU ms / message"),
                       ("wall_p50_ms", "ping round trip p50 ms"), ("wall_p95_ms", "ping round trip p95 ms"),
                       ("messages", "messages")):
        print(f"  {label:<32}{pm['ray_direct'][key]:>18}{pm['plain_server'][key]:>16}")
    cap = result["capacity"]
    if cap["steps"]:
        for s in cap["steps"]:
            print(f"  {s['calls']:>3} calls on one replica: {s['turns']} turns, voice-to-voice p95 "
                  f"{s['v2v_p95_ms']} ms")
        print(f"  calls per replica within {BUDGET_MS:.0f} ms p95: {cap['calls_per_replica_at_goal']}")
    else:
        print("  calls per replica at the latency goal: run with --agent embedded")
    emit(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
