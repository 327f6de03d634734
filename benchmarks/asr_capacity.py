"""How many simultaneous callers one process's ASR serves within the latency bars.

N simulated callers stream real speech (../shared/data/speech LibriSpeech clips) at real-time
pace, each call alternating caller speech with the silence of the agent's turn (``--talk-ratio``
of the time speaking; between turns the line carries the recording's own background noise, or
with ``--gaps zeros`` digital silence), with staggered starts. Every caller has its own Silero
VAD. Four setups:

  (a) engine:      the shared ASREngine, cross-session batching on, silence bypass, partials
                   that re-read only the uncommitted tail (voxline)
  (a0) engine-full: the same, but every partial re-reads the whole utterance
                   (``asr.commit_after_s = 0``: what voxline did before tail commits)
  (b) no-batch:    the engine with batching off (one backend call per request)
  (c) naive:       one model call per session per chunk, from each session's own thread,
                   silence included — how per-session STT services work

For each setup N grows until a bar breaks; the capacity is the largest N with p95 final latency
<= 1 s (from the VAD's end-of-speech decision to the final transcript) and p95 partial lag
<= 1 s (newest audio in a partial to its delivery), at most 10% of partials shed, and at least
one partial per second of caller speech (an engine under load sends partials less often rather
than late; this bar keeps that honest). Times are
time.monotonic_ns in the benchmark process. NumPy's BLAS runs on ``runtime.blas_threads``
threads, as asr-serve holds it (``--blas-threads 1 0`` measures both settings, level by level).

Before the capacity runs, a lockstep pass (``--wer``, on by default) streams every clip of the
speech set alone through VAD + streaming ASR, waiting for each model call before the next 20 ms
frame (so it is deterministic), once with tail commits and once without: it prints the WER of
the finals (pooled over the set) and the cost of one partial's model call against the length of
the utterance so far. Prints tables and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
from agent.config import ASRConfig, RuntimeConfig, VADConfig  # noqa: E402
from agent.frames import AudioIn, Direction, Frame, SpeechStopped, Transcript  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.runtime import limit_blas_threads  # noqa: E402
from agent.stage import Stage, StageContext  # noqa: E402
from agent.trace import Trace  # noqa: E402
from stages.asr.stage import StreamingASR, make_engine  # noqa: E402
from stages.asr.wer import wer  # noqa: E402
from stages.asr.whisper import WhisperBackend  # noqa: E402
from stages.vad import SileroModel, VADStage  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
# A setup that keeps its latencies by sending fewer partials must still send at least one per
# second of caller speech (at the configured 400 ms it would send 2.5).
MIN_PARTIAL_RATE = 1.0
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
                 gaps: str = "room") -> tuple[np.ndarray, int]:
    """A caller's line and how many of its samples are speech."""
    parts, n, speech = [], 0, 0
    end = int(seconds * 16000)
    while n < end:
        c = clips[rng.integers(len(clips))]
        gap = int(len(c) * (1 - talk_ratio) / talk_ratio)
        parts += [c, room_noise(c, gap, rng) if gaps == "room" else np.zeros(gap, np.int16)]
        speech += min(len(c), end - n)
        n += len(c) + gap
    return np.concatenate(parts)[:end], speech


class Timed:
    """The backend, timing every call (the lockstep pass makes every call a batch of one)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name, self.capabilities = inner.name, inner.capabilities
        self.sample_rate, self.max_batch = inner.sample_rate, inner.max_batch
        self.ms: list[float] = []

    def transcribe_batch(self, audio, prompts=None, **kw):
        t0 = time.perf_counter()
        try:
            return self.inner.transcribe_batch(audio, prompts, **kw)
        finally:
            self.ms.append((time.perf_counter() - t0) * 1000)

    def warmup(self) -> None:
        self.inner.warmup()


class Recording(StreamingASR):
    """StreamingASR noting each request's kind and the utterance length it was made at."""

    def __init__(self, engine, cfg, log: list) -> None:
        super().__init__(engine, cfg)
        self.log = log

    def _submit(self, core, req) -> None:
        self.log.append((req.kind.name, (req.end - req.utterance) / 16000, len(req.audio) / 16000))
        super()._submit(core, req)


class Finals(Stage):
    def __init__(self) -> None:
        super().__init__("finals")
        self.texts: list[str] = []

    def process(self, frame: Frame, direction: Direction) -> None:
        if isinstance(frame, Transcript) and frame.final and frame.text:
            self.texts.append(frame.text)


BUCKETS = (0, 2, 4, 6, 8, 12, 16, 30, 1e9)


async def lockstep(backend, vad_base, manifest, commit_after_s: float) -> dict:
    """Every clip alone, frame by frame, each model call awaited: WER of the finals and the
    cost of each partial against the utterance's length so far."""
    cfg = ASRConfig(workers=backend.capabilities.lanes, commit_after_s=commit_after_s)
    timed = Timed(backend)
    engine = make_engine(timed, cfg, capacity=1)
    log: list = []
    refs, hyps = [], []
    for m in manifest:
        pcm = read_audio(DATA / m["path"])
        pcm = np.concatenate([np.zeros(8000, np.int16), pcm, np.zeros(16000, np.int16)])
        asr, sink = Recording(engine, cfg, log), Finals()
        p = Pipeline([VADStage(VADConfig(), model=vad_base.fork()), asr, sink])
        ctx = StageContext(Trace())
        await p.start(ctx)
        for k in range(len(pcm) // FRAME):
            p.push(AudioIn(pcm[k * FRAME : (k + 1) * FRAME], offset=k * FRAME,
                           t_ns=time.monotonic_ns()), DOWN)
            await asyncio.sleep(0)
            while asr.busy:
                await asyncio.sleep(0.0005)
        await p.stop()
        await ctx.cancel_all()
        refs.append(m["text"])
        hyps.append(" ".join(sink.texts))
    engine.close()
    assert len(log) == len(timed.ms), "lockstep: one model call per request"
    rows = []
    for lo, hi in zip(BUCKETS, BUCKETS[1:], strict=False):
        ms = [t for (kind, u, _), t in zip(log, timed.ms, strict=True) if kind == "PARTIAL" and lo <= u < hi]
        audio = [a for kind, u, a in log if kind == "PARTIAL" and lo <= u < hi]
        if ms:
            rows.append({"utterance_s": f"{lo}-{hi if hi < 1e9 else ''}", "partials": len(ms),
                         "mean_ms": float(np.mean(ms)), "mean_audio_s": float(np.mean(audio))})
    kinds = {}
    for (kind, _, _), t in zip(log, timed.ms, strict=True):
        k = kinds.setdefault(kind, {"calls": 0, "ms": 0.0})
        k["calls"] += 1
        k["ms"] += t
    return {"commit_after_s": commit_after_s, "clips": len(manifest),
            "wer": wer(" ".join(refs), " ".join(hyps)), "model_s": sum(timed.ms) / 1000,
            "calls": kinds, "partial_cost": rows,
            "clip_wer": {m["id"]: round(wer(r, h), 4) for m, r, h in zip(manifest, refs, hyps,
                                                                         strict=True)}}


async def run_level(setup: str, n: int, backend, vad_base, cfg: ASRConfig, clips, args) -> dict:
    rng = np.random.default_rng(n)
    engine = None
    pool = None
    if setup == "engine-full":
        cfg = dataclasses.replace(cfg, commit_after_s=0.0)
    if setup in ("engine", "engine-full", "no-batch"):
        engine = make_engine(backend, cfg, capacity=n)
        if setup == "no-batch":
            engine.max_batch = 1
    else:
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="naive")
    callers = []
    speech_s = 0.0
    for _ in range(n):
        trace = Trace()
        meter = Meter()
        asr = StreamingASR(engine, cfg) if engine is not None else NaiveASR(backend, cfg, pool)
        p = Pipeline([VADStage(VADConfig(), model=vad_base.fork()), asr, meter])
        ctx = StageContext(trace)
        await p.start(ctx)
        audio, voiced = caller_audio(clips, args.seconds, args.talk_ratio, rng, args.gaps)
        speech_s += voiced / 16000
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
           "partials_per_speech_s": partials / max(speech_s, 1e-9),
           "shed_ratio": shed / max(calls, 1), "late_ticks": late}
    res["ok"] = (res["p95_final_ms"] <= 1000 and res["p95_partial_lag_ms"] <= 1000
                 and res["shed_ratio"] <= 0.10 and len(finals) > 0
                 and res["partials_per_speech_s"] >= MIN_PARTIAL_RATE)
    return res


async def main_async(args) -> dict:
    limit_blas_threads(RuntimeConfig(blas_threads=args.blas_threads[0]))  # as asr-serve does
    cfg = ASRConfig(workers=args.workers).for_throughput()  # as asr-serve runs
    if args.max_batch:
        cfg.max_batch = args.max_batch
    backend = WhisperBackend(cfg)
    backend.warmup()
    vad = SileroModel(VADConfig())
    manifest = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    clips = [read_audio(DATA / m["path"]) for m in manifest if m["id"].startswith("ls-")]
    out = {"benchmark": "asr_capacity", "seconds_per_level": args.seconds,
           "talk_ratio": args.talk_ratio, "gaps": args.gaps, "levels": [], "capacity": {}}
    if args.wer:
        out["lockstep"] = []
        for commit in (cfg.commit_after_s, 0.0):
            t0 = time.monotonic()
            r = await lockstep(backend, vad, manifest, commit)
            out["lockstep"].append(r)
            calls = ", ".join(f"{k.lower()} {v['calls']}" for k, v in r["calls"].items())
            print(f"lockstep, commit_after_s {commit:g}: WER {r['wer']:.2%} over {r['clips']} "
                  f"clips; model {r['model_s']:.1f} s ({calls}); "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
        print(f"\nper-partial model call (ms) against utterance length so far; "
              f"with tail commits (commit_after_s {cfg.commit_after_s:g}) | without")
        print(f"{'utterance s':<12}{'partials':>9}{'with':>8}{'tail s':>8}{'partials':>10}"
              f"{'without':>9}{'audio s':>9}")
        a, b = ({r["utterance_s"]: r for r in x["partial_cost"]} for x in out["lockstep"])
        for key in sorted(a.keys() | b.keys(), key=lambda k: float(k.split("-")[0])):
            x, y = a.get(key), b.get(key)
            print(f"{key:<12}{x['partials'] if x else 0:>9}{x['mean_ms'] if x else 0:>8.0f}"
                  f"{x['mean_audio_s'] if x else 0:>8.1f}{y['partials'] if y else 0:>10}"
                  f"{y['mean_ms'] if y else 0:>9.0f}{y['mean_audio_s'] if y else 0:>9.1f}")
        print(flush=True)
    out["blas_threads"] = args.blas_threads
    for setup in args.setups:
        # each BLAS setting at a level before the next level, so that both see the same machine
        names = {b: setup if len(args.blas_threads) == 1 else f"{setup}@blas{b}"
                 for b in args.blas_threads}
        best = dict.fromkeys(names.values(), 0)
        going = list(args.blas_threads)
        for n in args.levels:
            for b in list(going):
                limit_blas_threads(RuntimeConfig(blas_threads=b))
                r = await run_level(setup, n, backend, vad, cfg, clips, args)
                r["blas_threads"] = b
                out["levels"].append(r)
                print(f"{names[b]:<9} N={n:<3} finals {r['finals']:>4}  p95 final "
                      f"{r['p95_final_ms']:>8.0f} ms  p95 partial lag {r['p95_partial_lag_ms']:>8.0f} ms  "
                      f"shed {r['shed_ratio']:>5.0%}  partials/speech s "
                      f"{r['partials_per_speech_s']:>4.1f}  {'ok' if r['ok'] else 'FAIL'}", flush=True)
                if r["ok"]:
                    best[names[b]] = n
                else:
                    going.remove(b)
            if not going:
                break
        out["capacity"].update(best)
    limit_blas_threads(RuntimeConfig(blas_threads=args.blas_threads[0]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per caller per level")
    ap.add_argument("--talk-ratio", type=float, default=0.4, help="share of the call the caller speaks")
    ap.add_argument("--gaps", choices=["room", "zeros"], default="room",
                    help="what the line carries between turns: the recording's own background "
                    "noise (default), or digital silence (which the backend skips unaided)")
    ap.add_argument("--workers", type=int, default=0,
                    help="backend calls in flight (asr.workers; default 0: one per thread, as "
                         "asr-serve runs Whisper)")
    ap.add_argument("--max-batch", type=int, default=0,
                    help="asr.max_batch for the engine setups (default: the configuration's)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32])
    ap.add_argument("--setups", nargs="+", default=["engine", "engine-full", "no-batch", "naive"],
                    choices=["engine", "engine-full", "no-batch", "naive"])
    ap.add_argument("--no-wer", dest="wer", action="store_false",
                    help="skip the lockstep WER / per-partial cost pass")
    ap.add_argument("--blas-threads", type=int, nargs="+", default=[RuntimeConfig().blas_threads],
                    help="NumPy's BLAS threads (runtime.blas_threads; 0: NumPy's default, a thread "
                         "a core); several: each setup at each setting, level by level")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    res = asyncio.run(main_async(args))
    cap = res["capacity"]
    print(f"\n{'setup':<10}{'capacity (callers)':>20}")
    for k, v in cap.items():
        print(f"{k:<10}{v:>20}")
    naive = next((k for k in cap if k.startswith("naive")), None)
    if naive and cap[naive]:
        for k in cap:
            if not k.startswith("naive"):
                key = k.replace("-", "_").replace("@", "_")
                res[f"ratio_{key}_vs_naive"] = cap[k] / cap[naive]
                print(f"{k} / {naive}: {cap[k] / cap[naive]:.1f}x")
    emit(res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
