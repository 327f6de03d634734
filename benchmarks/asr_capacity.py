"""How many simultaneous callers one process's ASR serves within the latency bars.

N simulated callers stream real speech (../shared/data/speech LibriSpeech clips) at real-time
pace, each call alternating caller speech with the silence of the agent's turn (``--talk-ratio``
of the time speaking; between turns the line carries the recording's own background noise, or
with ``--gaps zeros`` digital silence), with staggered starts. Every caller has its own Silero
VAD. Three setups:

  (a) engine:   the shared ASREngine, cross-session batching on, silence bypass (voxline)
  (b) no-batch: the same engine with batching off (one backend call per request)
  (c) naive:    one model call per session per chunk, from each session's own thread, silence
                included — how per-session STT services work

For each setup N grows until a bar breaks; the capacity is the largest N with p95 final latency
<= 1 s (from the VAD's end-of-speech decision to the final transcript) and p95 partial lag
<= 1 s (newest audio in a partial to its delivery) and at most 10% of partials shed. Times are
time.monotonic_ns in the benchmark process. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402

from agent.audio import read_audio  # noqa: E402
from agent.config import ASRConfig, VADConfig  # noqa: E402
from agent.frames import AudioIn, Direction, Frame, SpeechStopped, Transcript  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.stage import Stage, StageContext  # noqa: E402
from agent.trace import Trace  # noqa: E402
from stages.asr.stage import StreamingASR, make_engine  # noqa: E402
from stages.asr.whisper import WhisperBackend  # noqa: E402
from stages.vad import SileroModel, VADStage  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
FRAME = 320
DOWN = Direction.DOWNSTREAM


class NaiveASR(Stage):
    """Per-session STT: every ``interval`` of audio — speech or not — one model call on this
    session's own thread over the audio since the last final; a final call at end of speech."""

    def __init__(self, backend, cfg: ASRConfig, pool: ThreadPoolExecutor) -> None:
        super().__init__("naive-asr")
        self.backend, self.pool = backend, pool
        self.interval = cfg.partial_interval_ms * 16
        self.buf: list[np.ndarray] = []
        self.since = 0
        self.last_t = 0
        self.busy_call = False

    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)
        if isinstance(frame, AudioIn):
            self.buf.append(frame.pcm)
            self.since += len(frame.pcm)
            self.last_t = frame.t_ns
            if len(self.buf) > 30 * 50:
                self.buf = self.buf[-30 * 50:]
            if self.since >= self.interval and not self.busy_call:
                self.since = 0
                self._call(final=False, t_ns=frame.t_ns)
        elif isinstance(frame, SpeechStopped):
            self._call(final=True, t_ns=frame.t_ns)

    def _call(self, final: bool, t_ns: int) -> None:
        audio = np.concatenate(self.buf).astype(np.float32) / 32768.0
        if final:
            self.buf = []
        self.busy_call = not final
        fut = asyncio.get_running_loop().run_in_executor(self.pool, self.backend.transcribe_batch, [audio])

        def done(f, final=final, t_ns=t_ns):
            if not final:
                self.busy_call = False
            if f.cancelled() or f.exception():
                return
            text = f.result()[0].text
            if not final and self.ctx.trace is not None:
                self.ctx.trace.partial_lag((time.monotonic_ns() - t_ns) / 1e6)
            self.push(Transcript(text, final=final))

        fut.add_done_callback(done)


class Meter(Stage):
    """Final latency: from the SpeechStopped decision to the final transcript after it."""

    def __init__(self) -> None:
        super().__init__("meter")
        self.stop_ns: list[int] = []
        self.final_ms: list[float] = []

    def process(self, frame: Frame, direction: Direction) -> None:
        if isinstance(frame, SpeechStopped):
            self.stop_ns.append(frame.t_ns)
        elif isinstance(frame, Transcript) and frame.final and self.stop_ns:
            self.final_ms.append((time.monotonic_ns() - self.stop_ns.pop(0)) / 1e6)


def room_noise(clip: np.ndarray, samples: int, rng) -> np.ndarray:
    """``samples`` of the recording's own background: its quietest 20-ms frames (the lowest
    10% by RMS) in random order — the room and microphone noise a real line carries between
    turns, at the recording's level."""
    frames = clip[: len(clip) // FRAME * FRAME].reshape(-1, FRAME)
    rms = np.sqrt(np.mean(frames.astype(np.float32) ** 2, axis=1))
    quiet = frames[rms <= np.percentile(rms, 10)]
    pick = rng.integers(len(quiet), size=-(-samples // FRAME))
    return quiet[pick].ravel()[:samples]


def caller_audio(clips: list[np.ndarray], seconds: float, talk_ratio: float, rng,
                 gaps: str = "room") -> np.ndarray:
    parts, n = [], 0
    while n < seconds * 16000:
        c = clips[rng.integers(len(clips))]
        gap = int(len(c) * (1 - talk_ratio) / talk_ratio)
        parts += [c, room_noise(c, gap, rng) if gaps == "room" else np.zeros(gap, np.int16)]
        n += len(c) + gap
    return np.concatenate(parts)[: int(seconds * 16000)]


async def run_level(setup: str, n: int, backend, vad_base, cfg: ASRConfig, clips, args) -> dict:
    rng = np.random.default_rng(n)
    engine = None
    pool = None
    if setup in ("engine", "no-batch"):
        engine = make_engine(backend, cfg, capacity=n)
        if setup == "no-batch":
            engine.max_batch = 1
    else:
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="naive")
    callers = []
    for _ in range(n):
        trace = Trace()
        meter = Meter()
        asr = StreamingASR(engine, cfg) if engine is not None else NaiveASR(backend, cfg, pool)
        p = Pipeline([VADStage(VADConfig(), model=vad_base.fork()), asr, meter])
        ctx = StageContext(trace)
        await p.start(ctx)
        audio = caller_audio(clips, args.seconds, args.talk_ratio, rng, args.gaps)
        lead = int(rng.integers(0, 16000 * 2) // FRAME * FRAME)  # staggered starts
        audio = np.concatenate([np.zeros(lead, np.int16), audio])
        callers.append((p, ctx, trace, meter, asr, audio))
    frames = max(len(c[5]) for c in callers) // FRAME
    loop = asyncio.get_running_loop()
    t_next = loop.time()
    late = 0
    for k in range(frames):
        now_ns = time.monotonic_ns()
        for p, _, _, _, _, audio in callers:
            chunk = audio[k * FRAME : (k + 1) * FRAME]
            if len(chunk) == FRAME:
                p.push(AudioIn(chunk, offset=k * FRAME, t_ns=now_ns), DOWN)
        t_next += 0.02
        d = t_next - loop.time()
        if d > 0:
            await asyncio.sleep(d)
        else:
            late += 1
            await asyncio.sleep(0)
    await asyncio.sleep(2.0)  # let the last finals land
    finals, lags, shed = [], [], 0
    calls = 0
    for p, ctx, trace, meter, _asr, _ in callers:
        finals += meter.final_ms
        lags += trace.partial_lags_ms
        await p.stop()
        await ctx.cancel_all()
    if engine is not None:
        shed = engine.stats.dropped_stale
        calls = engine.stats.requests + shed
        engine.close()
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    p95 = lambda xs: float(np.percentile(xs, 95)) if xs else float("inf")  # noqa: E731
    partials = len(lags)
    res = {"setup": setup, "callers": n, "finals": len(finals), "p95_final_ms": p95(finals),
           "p95_partial_lag_ms": p95(lags), "partials": partials,
           "shed_ratio": shed / max(calls, 1), "late_ticks": late}
    res["ok"] = (res["p95_final_ms"] <= 1000 and res["p95_partial_lag_ms"] <= 1000
                 and res["shed_ratio"] <= 0.10 and len(finals) > 0)
    return res


async def main_async(args) -> dict:
    cfg = ASRConfig(workers=args.workers)
    backend = WhisperBackend(cfg)
    backend.warmup()
    vad = SileroModel(VADConfig())
    manifest = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    clips = [read_audio(DATA / m["path"]) for m in manifest if m["id"].startswith("ls-")]
    out = {"benchmark": "asr_capacity", "seconds_per_level": args.seconds,
           "talk_ratio": args.talk_ratio, "gaps": args.gaps, "levels": [], "capacity": {}}
    for setup in args.setups:
        best = 0
        for n in args.levels:
            r = await run_level(setup, n, backend, vad, cfg, clips, args)
            out["levels"].append(r)
            print(f"{setup:<9} N={n:<3} finals {r['finals']:>4}  p95 final {r['p95_final_ms']:>8.0f} ms  "
                  f"p95 partial lag {r['p95_partial_lag_ms']:>8.0f} ms  shed {r['shed_ratio']:>5.0%}  "
                  f"{'ok' if r['ok'] else 'FAIL'}", flush=True)
            if not r["ok"]:
                break
            best = n
        out["capacity"][setup] = best
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per caller per level")
    ap.add_argument("--talk-ratio", type=float, default=0.4, help="share of the call the caller speaks")
    ap.add_argument("--gaps", choices=["room", "zeros"], default="room",
                    help="what the line carries between turns: the recording's own background "
                    "noise (default), or digital silence (which the backend skips unaided)")
    ap.add_argument("--workers", type=int, default=0,
                    help="backend calls in flight (asr.workers; default 0: one per thread)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32])
    ap.add_argument("--setups", nargs="+", default=["engine", "no-batch", "naive"])
    ap.add_argument("--json-out")
    args = ap.parse_args()
    res = asyncio.run(main_async(args))
    cap = res["capacity"]
    print(f"\n{'setup':<10}{'capacity (callers)':>20}")
    for k, v in cap.items():
        print(f"{k:<10}{v:>20}")
    if cap.get("naive"):
        for k in ("engine", "no-batch"):
            if k in cap:
                res[f"ratio_{k.replace('-', '_')}_vs_naive"] = cap[k] / cap["naive"]
                print(f"{k} / naive: {cap[k] / cap['naive']:.1f}x")
    emit(res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
