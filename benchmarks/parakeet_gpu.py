"""Parakeet-TDT on one GPU, as one run that fits a lent machine: under 4 minutes on one H200,
warm-up (model build, graph capture) included. A random-weight v3-size model (24 × 1024
FastConformer, 8192 pieces) in bf16:

1. checks — every decoder mode gives the eager loop's tokens (and, at every timed batch size,
   the no-graph mode's tokens);
2. decoder throughput — no graph vs plain graphs vs the conditional-node graph, batch 1/16/128;
3. encoder RTFx in torch at each TensorRT profile's typical shape;
4. end-to-end offline RTFx at batch 64 (audio on the host → features → encoder → decoder), two
   timed passes;
5. TensorRT, only with ``--trt`` (the lent machine's image has no tensorrt): build one
   multi-profile engine, compare it with torch, time each profile, then end to end.

Goals on one H200: end-to-end RTFx >= 7,200; the conditional-graph decoder >= 2x no-graph.
Random weights decode differently from trained ones, so the joint is first tuned to emit about
one token per three encoder frames.

Time. The clock starts when the script starts (the torch import counts). Every measurement is
bounded: one warm-up call (which captures any new graph), then repeats until about
``--target-s`` (at least 3, the median is reported). Before each part the script checks
``--budget-s`` (default 210 s): a part whose conservative cost estimate no longer fits is skipped
and listed under ``skipped`` (status ``partial``). A watchdog thread ends the process at
``--hard-s`` (default: the budget + 20 s) whatever it is doing, writing what was measured so far
(status ``timed_out``, exit code 3). Without a CUDA device (and without ``--smoke``) nothing is
measured: it says so and exits 0 with ``{"status": "skipped", "skipped": "no CUDA device"}``.

    python benchmarks/parakeet_gpu.py           # on the GPU machine; see scripts/device_check.sh
    python benchmarks/parakeet_gpu.py --smoke   # tiny model and sizes: runs anywhere (CPU too)

Progress lines carry the elapsed time; at the end a table and one JSON line. The JSON also goes
to ``--json-out`` (default ``$OUT/parakeet_gpu.json`` when ``$OUT`` is set), rewritten at every
part, so a run killed from outside still leaves its last state (status ``running``) there.
Exit codes: 0 complete, partial or skipped; 1 a part raised (its error is in ``failures``);
3 the watchdog stopped it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

T0 = time.perf_counter()  # the budget counts from here: the torch import (in measure) is in it

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from emit import emit  # noqa: E402
from parakeet_cpu import tune_emission  # noqa: E402

EXIT_FAILED = 1
EXIT_TIMED_OUT = 3
DECODER_MODES = ("no_graphs", "no_while_loops", "full_graph")  # the reference first

# Conservative guesses of one part's cost on an H200, in seconds, used only to decide whether a
# part still fits the budget (not measurements; the end-to-end passes re-estimate from pass 1).
NEED_S = {"check": 8.0, "decoder": 8.0, "encoder": 6.0, "end_to_end": 25.0, "tensorrt": 150.0}


@dataclass(frozen=True, slots=True)
class Sizes:
    model: dict[str, int] = field(default_factory=dict)  # nemo_config overrides (none: v3 size)
    batches: tuple[int, ...] = (1, 16, 128)  # decoder batch sizes
    check_batch: int = 16
    utt_s: tuple[float, float] = (4.0, 20.0)  # end-to-end utterance lengths
    e2e_batch: int = 64
    e2e_pool: int = 128  # distinct synthetic utterances, cycled to make up the hours
    profiles_max_batch: int = 64
    target_s: float = 1.0  # timing per measurement after its warm-up call


FULL = Sizes()
SMOKE = Sizes(
    model=dict(
        n_layers=2, d_model=64, n_heads=4, vocab_size=64, pred_hidden=48, subsampling_channels=16
    ),
    batches=(1, 4),
    check_batch=4,
    utt_s=(2.0, 4.0),
    e2e_batch=4,
    e2e_pool=8,
    profiles_max_batch=4,
    target_s=0.2,
)


def elapsed() -> float:
    return time.perf_counter() - T0


def log(message: str) -> None:
    print(f"[{elapsed():6.1f} s] {message}", flush=True)


class Run:
    """The report, the time budget, the JSON file and the watchdog of one run."""

    def __init__(self, budget_s: float, hard_s: float, json_out: Path | None) -> None:
        self.budget_s, self.hard_s, self.json_out = budget_s, hard_s, json_out
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
        self.report: dict[str, Any] = {
            "benchmark": "parakeet_gpu", "status": "running", "budget_s": budget_s,
            "hard_s": hard_s, "current_part": "start", "skipped": [], "failures": [],
        }  # fmt: skip
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._closed = False
        self._snapshot = json.dumps(self.report)
        self.save()  # a run killed from outside, even during the torch import, leaves a file

    # --- time ---------------------------------------------------------------------------
    def left(self) -> float:
        return self.budget_s - elapsed()

    def fits(self, part: str, need_s: float) -> bool:
        """True when ``need_s`` more seconds fit the budget; else records ``part`` as skipped."""
        left = self.left()
        if left >= need_s:
            return True
        self.skip(
            part, f"budget: {max(left, 0):.0f} s of {self.budget_s:.0f} left, needs ~{need_s:.0f} s"
        )
        return False

    def skip(self, part: str, reason: str) -> None:
        self.report["skipped"].append({"part": part, "reason": reason})
        log(f"skip {part}: {reason}")
        self.save()

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """One part: logged with its time; an exception is recorded and the run goes on."""
        self.report["current_part"] = name
        self.save()
        start = time.perf_counter()
        log(f"{name} ...")
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - record it; the other parts still count
            error = f"{type(exc).__name__}: {exc}"[:400]
            self.report["failures"].append({"part": name, "error": error, "at": where(exc)})
            log(f"{name} FAILED after {time.perf_counter() - start:.1f} s: {error}")
            traceback.print_exc(file=sys.stdout)
        else:
            log(f"{name} done in {time.perf_counter() - start:.1f} s")
        self.save()

    # --- output ---------------------------------------------------------------------------
    def save(self) -> None:
        """Snapshot the report (what the watchdog writes) and rewrite the JSON file."""
        self.report["elapsed_s"] = round(elapsed(), 1)
        snapshot = json.dumps(self.report)
        with self._lock:
            if self._closed:
                return
            self._snapshot = snapshot
            self._write(self.report)

    def _write(self, result: dict[str, Any]) -> None:
        if self.json_out is None:
            return
        tmp = self.json_out.with_name(self.json_out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, self.json_out)

    def finish(self, status: str | None = None) -> int:
        """Final status, the JSON line and file (via ``emit``); returns the exit code."""
        failures, skipped = self.report["failures"], self.report["skipped"]
        self.report["status"] = status or (
            "failed" if failures else "partial" if skipped else "complete"
        )
        self.report.pop("current_part", None)
        self.report["total_s"] = round(elapsed(), 1)
        self.report.pop("elapsed_s", None)
        with self._lock:
            late = self._closed  # the watchdog got there first and is ending the process
            if not late:
                self._closed = True
                self._done.set()
                emit(self.report, str(self.json_out) if self.json_out else None)
        if late:
            time.sleep(60)
        return EXIT_FAILED if self.report["status"] == "failed" else 0

    # --- the hard limit ------------------------------------------------------------------
    def start_watchdog(self) -> None:
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def _watch(self) -> None:
        if self._done.wait(max(0.0, self.hard_s - elapsed())):
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            result = json.loads(self._snapshot)
            part = result.pop("current_part", "?")
            result.pop("elapsed_s", None)
            result["status"] = "timed_out"
            result["timed_out"] = f"hard limit of {self.hard_s:g} s reached in: {part}"
            result["total_s"] = round(elapsed(), 1)
            log(f"hard limit of {self.hard_s:g} s reached in {part}: stopping here")
            self._write(result)
            print(json.dumps(result), flush=True)
            sys.stderr.flush()
        os._exit(EXIT_TIMED_OUT)


def where(exc: BaseException) -> list[str]:
    """The innermost frames of an exception, as ``file:line function`` (for the JSON)."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]


def synthetic_audio(n: int, low_s: float, high_s: float, seed: int = 0) -> list[np.ndarray]:
    """Speech-like envelopes: noise and a wandering tone under syllable-rate amplitude bursts."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        samples = int(rng.uniform(low_s, high_s) * 16000)
        t = np.arange(samples) / 16000
        f0 = 120 + 40 * np.sin(2 * np.pi * 0.3 * t + rng.uniform(0, 6))
        voice = np.sin(2 * np.pi * np.cumsum(f0) / 16000) + 0.3 * rng.standard_normal(samples)
        envelope = np.clip(np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 6)), 0, None)
        out.append((0.2 * voice * envelope).astype(np.float32))
    return out


def timed(
    fn: Callable[[], object], sync: Callable[[], None], target_s: float, min_reps: int = 3
) -> dict[str, float]:
    """One warm-up call, then calls until ``target_s`` has passed (at least ``min_reps``, at
    most 200); each call is synchronised, so the times are the device's too."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 200 and (len(times) < min_reps or time.perf_counter() - start < target_s):
        a = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - a)
    return {
        "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
        "reps": len(times),
    }  # fmt: skip


def timing_row(stats: dict[str, float], audio_s: float) -> dict[str, float]:
    med = stats["median_s"]
    return {
        "ms": round(med * 1e3, 3), "ms_min": round(stats["min_s"] * 1e3, 3),
        "ms_max": round(stats["max_s"] * 1e3, 3), "reps": int(stats["reps"]),
        "rtfx": round(audio_s / med, 1),
    }  # fmt: skip


def environment(torch: Any, device: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "numpy": np.__version__, "device": "cpu",
    }  # fmt: skip
    for dist in ("cuda-bindings", "cuda-python", "tensorrt"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            env[dist.replace("-", "_")] = importlib.metadata.version(dist)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
        )
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="tiny model and sizes: checks the script runs"
    )
    ap.add_argument(
        "--budget-s", type=float, default=210.0,
        help="skip parts that would end past this many seconds from the start (default 210)",
    )  # fmt: skip
    ap.add_argument(
        "--hard-s", type=float, default=None,
        help="the watchdog ends the run here, whatever it is doing (default: budget + 20)",
    )  # fmt: skip
    ap.add_argument("--target-s", type=float, default=None, help="timing per measurement")
    ap.add_argument(
        "--e2e-hours", type=float, default=None,
        help="audio per end-to-end pass (default 2.0; 0.01 with --smoke)",
    )  # fmt: skip
    ap.add_argument("--e2e-passes", type=int, default=2)
    ap.add_argument("--trt", action="store_true", help="also build and time a TensorRT encoder")
    default_out = Path(os.environ["OUT"]) / "parakeet_gpu.json" if os.environ.get("OUT") else None
    ap.add_argument(
        "--json-out", "--out", type=Path, default=default_out,
        help="write the JSON here too (default: $OUT/parakeet_gpu.json when $OUT is set)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.hard_s is None:
        args.hard_s = args.budget_s + 20.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(args.budget_s, args.hard_s, args.json_out)
    run.start_watchdog()
    try:
        return measure(args, run)
    except Exception as exc:  # a bug outside the parts: still leave the JSON, marked failed
        traceback.print_exc()
        run.report["failures"].append(
            {"part": "script", "error": f"{type(exc).__name__}: {exc}"[:400]}
        )
        return run.finish("failed")


def measure(args: argparse.Namespace, run: Run) -> int:  # noqa: C901, PLR0915 - parts in order
    report = run.report
    report["smoke"] = args.smoke
    log(f"parakeet_gpu: budget {args.budget_s:g} s, hard limit {args.hard_s:g} s")

    report["current_part"] = "import torch"
    run.save()
    try:
        import torch
    except ImportError:
        print("parakeet_gpu: torch is not installed: nothing measured", flush=True)
        report["skipped"] = "torch is not installed"
        return run.finish("skipped")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report["environment"] = environment(torch, device)
    if device.type != "cuda" and not args.smoke:
        print(
            "parakeet_gpu: no CUDA device: nothing measured (--smoke runs the tiny model on the CPU)",
            flush=True,
        )
        report["skipped"] = "no CUDA device"
        return run.finish("skipped")

    sizes = SMOKE if args.smoke else FULL
    target_s = args.target_s if args.target_s is not None else sizes.target_s
    e2e_hours = args.e2e_hours if args.e2e_hours is not None else (0.01 if args.smoke else 2.0)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dtype = torch.bfloat16
    report.update(dtype="bf16", target_s=target_s)
    log(f"torch {torch.__version__} on {report['environment']['device']}")

    # 0. warm-up: model, emission tuning, the encoder frames the decoder parts decode, and the
    # eager loop's tokens for the checks.
    setup: dict[str, float] = {"start_s": round(elapsed(), 1)}  # imports and CUDA init
    report["setup"] = setup
    with run.part("setup"):
        from stages.asr.parakeet.architectures import nemo_config
        from stages.asr.parakeet.conditional_nodes import while_node_openers
        from stages.asr.parakeet.cuda_graphs import GraphTDTDecoder
        from stages.asr.parakeet.dims import dims_from_config
        from stages.asr.parakeet.model import ParakeetTDT
        from stages.asr.parakeet.tensorrt import default_profiles
        from stages.asr.parakeet.transcriber import ParakeetTranscriber

        try:
            impls: Any = [name for name, _ in while_node_openers()] if cuda else []
        except Exception as exc:  # noqa: BLE001 - the full_graph check will fail and say why
            impls = f"failed: {type(exc).__name__}: {exc}"[:300]
        report["conditional_node_impls"] = impls
        dims = dims_from_config(nemo_config("v3", **sizes.model))
        profiles = default_profiles(max_batch=sizes.profiles_max_batch)
        t = time.perf_counter()
        with torch.device(device):
            model = ParakeetTDT(dims).eval()
        report["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
        probe = ParakeetTranscriber(model, device, dtype, max_batch=max(sizes.batches))
        sync()
        setup["model_s"] = round(time.perf_counter() - t, 1)
        log(f"model ready: {report['params_m']} M params")
        t = time.perf_counter()
        rate = tune_emission(probe, synthetic_audio(4, *sizes.utt_s, seed=1))
        report["tokens_per_frame"] = round(rate, 3)
        setup["tune_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        dec_audio = synthetic_audio(max(sizes.batches), 9.5, 10.5, seed=2)  # ~10 s utterances
        enc, lens = probe.encode(dec_audio)
        sync()
        audio_s = [len(a) / 16000 for a in dec_audio]
        setup["encode_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        tdt = probe.tdt
        b = min(sizes.check_batch, enc.shape[0])
        eager = tdt.decode(enc[:b], lens[:b])
        setup["eager_decode_s"] = round(time.perf_counter() - t, 1)
    if report["failures"]:
        return run.finish()

    # 1. checks: every mode gives the eager loop's tokens.
    modes = DECODER_MODES if cuda else ("no_graphs",)
    checks: dict[str, Any] = {}
    report["checks"] = checks
    decoders: dict[str, Any] = {}
    for mode in modes:
        if not run.fits(f"check {mode}", NEED_S["check"]):
            continue
        with run.part(f"check {mode}"):
            try:
                decoder = GraphTDTDecoder(tdt, mode=mode)
                same = decoder.decode(enc[:b], lens[:b]) == eager
                checks[f"decoder_{mode}_equals_eager"] = same
                if same:
                    decoders[mode] = decoder
                    if mode == "full_graph":
                        checks["full_graph_while_impl"] = decoder.while_impl
            except Exception as exc:  # noqa: BLE001 - a mode that cannot build is a finding
                error = f"failed: {type(exc).__name__}: {exc}"
                checks[f"decoder_{mode}_equals_eager"] = error[:300]
                checks[f"decoder_{mode}_failed_at"] = where(exc)
                log(f"check {mode} raised:")
                traceback.print_exc(file=sys.stdout)
    if cuda and run.fits("check auto", NEED_S["check"]):
        with run.part("check auto"):
            auto = GraphTDTDecoder(tdt)
            checks["decoder_auto_equals_eager"] = auto.decode(enc[:b], lens[:b]) == eager
            checks["auto_mode"] = auto.mode
            checks["auto_while_impl"] = auto.while_impl
    log(f"checks: {checks}")

    # 2. decoder throughput, batch by batch (the no-graph reference first at each).
    dec_rows: list[dict[str, Any]] = []
    report["decoder"] = dec_rows
    for batch in sizes.batches:
        reference = None
        for mode in modes:
            name = f"decoder {mode} batch {batch}"
            if mode not in decoders:
                tried = f"decoder_{mode}_equals_eager" in checks
                run.skip(name, "its check failed" if tried else "its check was skipped")
                continue
            if not run.fits(name, NEED_S["decoder"]):
                continue
            with run.part(name):
                decoder = decoders[mode]
                stats = timed(
                    lambda d=decoder, n=batch: d.decode(enc[:n], lens[:n]), sync, target_s
                )
                out = decoder.decode(enc[:batch], lens[:batch])
                same = None if reference is None else out == reference
                if mode == "no_graphs":
                    reference = out
                tokens = sum(len(o.tokens) for o in out)
                row = {"mode": mode, "batch": batch, **timing_row(stats, sum(audio_s[:batch])),
                       "tokens_per_s": round(tokens / stats["median_s"]),
                       "equals_no_graphs": same}  # fmt: skip
                dec_rows.append(row)
                log(f"{name}: {row['ms']} ms, RTFx {row['rtfx']}")
    by = {(r["mode"], r["batch"]): r["rtfx"] for r in dec_rows}
    report["decoder_speedup_full_vs_no_graphs"] = {
        str(bt): round(by[("full_graph", bt)] / by[("no_graphs", bt)], 2)
        for bt in sizes.batches
        if ("full_graph", bt) in by and ("no_graphs", bt) in by
    }

    # 3. encoder RTFx in torch at each profile's typical shape (TensorRT in part 5).
    enc_rows: list[dict[str, Any]] = []
    report["encoder"] = enc_rows

    def time_encoder(engine: str, fn: Callable[[Any, Any], object], feat_dtype: Any) -> None:
        for p in profiles:
            name = f"encoder {engine} {p.name}"
            if not run.fits(name, NEED_S["encoder"]):
                continue
            with run.part(name):
                batch, frames = p.opt
                feats = torch.randn(
                    batch, dims.encoder.n_mels, frames, device=device, dtype=feat_dtype
                )
                flens = torch.full((batch,), frames, device=device)
                with torch.inference_mode():
                    stats = timed(lambda f=feats, n=flens: fn(f, n), sync, target_s)
                row = {"engine": engine, "profile": p.name, "batch": batch, "frames": frames,
                       **timing_row(stats, batch * frames * 0.01)}  # fmt: skip
                enc_rows.append(row)
                log(f"{name}: {row['ms']} ms, RTFx {row['rtfx']}")

    time_encoder("torch", model.encoder, dtype)

    # 4. end to end at batch 64: a pool of distinct utterances, cycled to make up the hours.
    e2e_rows: list[dict[str, Any]] = []
    report["end_to_end"] = e2e_rows
    batch = sizes.e2e_batch
    n_utts = max(1, round(e2e_hours * 3600 / sum(sizes.utt_s) * 2 / batch)) * batch  # full batches
    e2e_audio: list[np.ndarray] = []

    def end_to_end(transcriber: ParakeetTranscriber, label: str) -> None:
        need = NEED_S["end_to_end"]
        for k in range(1, args.e2e_passes + 1):
            name = f"end to end {label} pass {k}"
            if not run.fits(name, need):
                return
            with run.part(name):
                if not e2e_audio:
                    pool = synthetic_audio(min(sizes.e2e_pool, n_utts), *sizes.utt_s, seed=3)
                    e2e_audio.extend(pool[i % len(pool)] for i in range(n_utts))
                hours = sum(len(a) for a in e2e_audio) / 16000 / 3600
                if k == 1:  # warm-up on one full batch: kernels, graphs for this bucket
                    transcriber.transcribe(e2e_audio[:batch])
                gc.collect()
                gc.freeze()  # a long-running server does this after warm-up: no GC pauses
                try:
                    sync()
                    start = time.perf_counter()
                    out = transcriber.transcribe(e2e_audio)
                    sync()
                    seconds = time.perf_counter() - start
                finally:
                    gc.unfreeze()
                row = {"encoder": label, "pass": k, "batch": transcriber.max_batch,
                       "decoder_mode": transcriber.decoder_mode, "utterances": len(e2e_audio),
                       "audio_h": round(hours, 3), "seconds": round(seconds, 3),
                       "rtfx": round(hours * 3600 / seconds, 1),
                       "tokens": sum(len(o.tokens) for o in out)}  # fmt: skip
                e2e_rows.append(row)
                log(f"{name}: {row['audio_h']} h in {row['seconds']} s = RTFx {row['rtfx']}")
                need = 1.5 * seconds + 2.0  # the next pass is a replay of this one

    end_to_end(ParakeetTranscriber(model, device, dtype, max_batch=batch), "torch")

    # 5. TensorRT: one multi-profile engine; compare, time each profile, then end to end.
    trt_state = "not requested (--trt)"
    if args.trt:
        trt_state = ""
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            trt_state = "tensorrt is not installed"
        if not trt_state and not cuda:
            trt_state = "needs a CUDA device"
        if not trt_state and not run.fits("tensorrt", NEED_S["tensorrt"]):
            trt_state = "skipped: not enough of the budget left to build the engine"
        if not trt_state:
            trt_state = "failed"
            with run.part("tensorrt build and check"):
                from stages.asr.parakeet.tensorrt import TensorRTEncoder

                t = time.perf_counter()
                trt_encoder = TensorRTEncoder.from_encoder(
                    model.encoder, profiles, precision="bf16"
                )
                report["trt_build_s"] = round(time.perf_counter() - t, 1)
                feats = torch.randn(4, dims.encoder.n_mels, 700, device=device)
                flens = torch.tensor([700, 650, 300, 120], device=device)
                feats = feats * (
                    torch.arange(700, device=device)[None, None] < flens[:, None, None]
                )
                with torch.inference_mode():
                    ref, ref_len = model.encoder(feats.to(dtype), flens)
                    got, got_len = trt_encoder(feats, flens)
                rel = max(
                    (
                        (got[i, :n].float() - ref[i, :n].float()).abs().max()
                        / ref[i, :n].float().abs().max()
                    ).item()
                    for i, n in enumerate(ref_len.tolist())
                )
                checks["trt_vs_torch_max_rel_err"] = round(rel, 4)
                checks["trt_lengths_equal"] = got_len.tolist() == ref_len.tolist()
                trt_state = "ran"
            if trt_state == "ran":
                time_encoder("tensorrt", trt_encoder, torch.float32)
                end_to_end(
                    ParakeetTranscriber(model, device, dtype, max_batch=batch, encoder=trt_encoder),
                    "tensorrt",
                )
    report["tensorrt"] = trt_state

    bools = [
        v for k, v in checks.items() if k.endswith("_equals_eager") or k == "trt_lengths_equal"
    ]
    bools += [r["equals_no_graphs"] for r in dec_rows if r["equals_no_graphs"] is not None]
    report["checks_pass"] = bool(bools) and all(v is True for v in bools)
    if cuda and not args.smoke:
        best = max((r["rtfx"] for r in e2e_rows if r["encoder"] == "torch"), default=None)
        report["goals"] = {
            "end_to_end_rtfx_ge_7200": None if best is None else best >= 7200,
            "full_graph_ge_2x_no_graphs": {
                k: v >= 2.0 for k, v in report["decoder_speedup_full_vs_no_graphs"].items()
            },
        }

    print()
    size = "tiny (smoke)" if args.smoke else "v3-size"
    print(f"Parakeet-TDT {size} random weights, bf16, {report['environment']['device']}")
    print(f"{'decoder mode':<16}{'batch':>6}{'ms':>11}{'RTFx':>10}{'tokens/s':>11}{'same':>6}")
    for r in dec_rows:
        same = {None: "ref", True: "yes", False: "NO"}[r["equals_no_graphs"]]
        print(
            f"{r['mode']:<16}{r['batch']:>6}{r['ms']:>11}{r['rtfx']:>10}{r['tokens_per_s']:>11}{same:>6}"
        )
    print(f"{'encoder':<10}{'profile':<11}{'batch':>6}{'frames':>7}{'ms':>11}{'RTFx':>10}")
    for r in enc_rows:
        print(
            f"{r['engine']:<10}{r['profile']:<11}{r['batch']:>6}{r['frames']:>7}{r['ms']:>11}{r['rtfx']:>10}"
        )
    for r in e2e_rows:
        print(f"end to end ({r['encoder']}, pass {r['pass']}, batch {r['batch']}, {r['decoder_mode']}): "
              f"{r['audio_h']} h in {r['seconds']} s = RTFx {r['rtfx']}")  # fmt: skip
    skipped = ", ".join(s["part"] for s in report["skipped"]) or "nothing"
    print(f"checks pass: {report['checks_pass']}; tensorrt: {trt_state}; skipped: {skipped}; "
          f"failures: {len(report['failures'])}; total {elapsed():.1f} s")  # fmt: skip
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
