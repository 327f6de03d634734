"""Parakeet-TDT on one GPU: a random-weight v3-size model (24 × 1024 FastConformer, 8192 pieces)
in bf16. One prepared run, under 8 minutes on an H200:

1. checks — every decoder mode gives the eager loop's tokens; the TensorRT encoder is close to
   the torch one;
2. decoder throughput — no graph vs plain graphs vs the conditional-node graph, batch 1/16/128;
3. encoder RTFx — torch vs TensorRT, at each TensorRT profile's typical shape;
4. end-to-end offline RTFx at batch 64 (audio on the host → features → encoder → decoder).

Goals on one H200: end-to-end RTFx >= 7,200; the conditional-graph decoder >= 2x no-graph.
Random weights decode differently from trained ones, so the joint is first tuned to emit about
one token per three encoder frames. Sections that would overrun ``--budget-s`` are skipped.

    python benchmarks/parakeet_gpu.py                 # on the GPU machine
    python benchmarks/parakeet_gpu.py --smoke         # tiny model, runs anywhere (CPU too)

Prints a table and one JSON line; also writes the JSON to --out (default: $OUT/parakeet_gpu.json
when $OUT is set, else benchmarks/parakeet_gpu.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from parakeet_cpu import tune_emission  # noqa: E402

T0 = time.perf_counter()


def left(budget: float) -> float:
    return budget - (time.perf_counter() - T0)


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


def timed(fn, device, repeats: int) -> float:
    """Mean seconds per call after one warm-up call."""
    import torch

    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats


def main() -> None:  # noqa: C901, PLR0915 - one linear script, sections in order
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="tiny model and sizes: checks the script runs"
    )
    ap.add_argument(
        "--budget-s", type=float, default=450.0, help="skip sections that would overrun this"
    )
    ap.add_argument("--skip-trt", action="store_true")
    ap.add_argument("--e2e-hours", type=float, default=3.0, help="audio for the end-to-end run")
    default_out = Path(os.environ["OUT"]) / "parakeet_gpu.json" if os.environ.get("OUT") else None
    ap.add_argument(
        "--out", type=Path, default=default_out or Path(__file__).with_name("parakeet_gpu.json")
    )
    args = ap.parse_args()

    import torch

    from stages.asr.parakeet.architectures import nemo_config
    from stages.asr.parakeet.conditional_nodes import while_node_openers
    from stages.asr.parakeet.cuda_graphs import GraphTDTDecoder
    from stages.asr.parakeet.dims import dims_from_config
    from stages.asr.parakeet.model import ParakeetTDT
    from stages.asr.parakeet.tensorrt import Profile, default_profiles
    from stages.asr.parakeet.transcriber import ParakeetTranscriber

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("no CUDA device: run with --smoke to check the script on the CPU")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dtype = torch.bfloat16
    if args.smoke:
        cfg = nemo_config(
            "v3",
            n_layers=2,
            d_model=64,
            n_heads=4,
            vocab_size=64,
            pred_hidden=48,
            subsampling_channels=16,
        )
        batches, utt_s, e2e_n, repeats = (1, 4), (2.0, 4.0), 8, 1
        profiles: tuple[Profile, ...] = default_profiles(max_batch=4)
    else:
        cfg = nemo_config("v3")
        batches, utt_s, repeats = (1, 16, 128), (4.0, 20.0), 3
        e2e_n = int(args.e2e_hours * 3600 / 12.0)  # 12 s mean utterance
        profiles = default_profiles(max_batch=64)
    dims = dims_from_config(cfg)
    report: dict[str, Any] = {
        "benchmark": "parakeet_gpu", "smoke": args.smoke, "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "torch": torch.__version__, "dtype": "bf16",
        "conditional_node_impls": [name for name, _ in while_node_openers()] if device.type == "cuda" else [],
        "skipped": [],
    }  # fmt: skip

    with torch.device(device):
        model = ParakeetTDT(dims).eval()
    report["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    probe = ParakeetTranscriber(model, device, dtype, max_batch=max(batches))
    report["tokens_per_frame"] = round(tune_emission(probe, synthetic_audio(4, *utt_s, seed=1)), 3)
    tdt = probe.tdt
    print(
        f"model ready ({report['params_m']} M params) at {time.perf_counter() - T0:.0f} s",
        flush=True,
    )

    # Encoder frames for the decoder runs: real encoder output of ~10 s utterances.
    dec_audio = synthetic_audio(max(batches), 9.5, 10.5, seed=2)
    enc, lens = probe.encode(dec_audio)
    audio_s = [len(a) / 16000 for a in dec_audio]

    # 1. checks: every mode equals the eager loop.
    modes = (
        ["no_graphs", "no_while_loops", "full_graph"] if device.type == "cuda" else ["no_graphs"]
    )
    checks: dict[str, Any] = {}
    b = min(16, enc.shape[0])
    eager = tdt.decode(enc[:b], lens[:b])
    for mode in modes:
        try:
            got = GraphTDTDecoder(tdt, mode=mode).decode(enc[:b], lens[:b])
            checks[f"decoder_{mode}_equals_eager"] = got == eager
        except Exception as exc:  # noqa: BLE001 - report and go on: the other modes still count
            checks[f"decoder_{mode}_equals_eager"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    auto = GraphTDTDecoder(tdt)
    auto.decode(enc[:b], lens[:b])
    checks["auto_mode"] = auto.mode
    checks["auto_while_impl"] = auto.while_impl
    report["checks"] = checks
    print("checks:", checks, flush=True)

    # 2. decoder throughput per mode and batch size.
    dec_rows = []
    for mode in modes:
        if checks.get(f"decoder_{mode}_equals_eager") is not True:
            continue
        decoder = GraphTDTDecoder(tdt, mode=mode)
        for batch in batches:
            if left(args.budget_s) < 60:
                report["skipped"].append(f"decoder {mode} batch {batch}")
                continue
            with torch.inference_mode():
                seconds = timed(
                    lambda d=decoder, n=batch: d.decode(enc[:n], lens[:n]), device, repeats
                )
            tokens = sum(len(o.tokens) for o in decoder.decode(enc[:batch], lens[:batch]))
            dec_rows.append({"mode": mode, "batch": batch, "ms": round(seconds * 1e3, 2),
                             "rtfx": round(sum(audio_s[:batch]) / seconds, 1),
                             "tokens_per_s": round(tokens / seconds)})  # fmt: skip
    report["decoder"] = dec_rows
    by = {(r["mode"], r["batch"]): r["rtfx"] for r in dec_rows}
    report["decoder_speedup_full_vs_no_graphs"] = {
        str(bt): round(by[("full_graph", bt)] / by[("no_graphs", bt)], 2)
        for bt in batches
        if ("full_graph", bt) in by and ("no_graphs", bt) in by
    }
    print("decoder:", dec_rows, flush=True)

    # 3. encoder RTFx in torch at each profile's typical shape (TensorRT below).
    enc_rows = []
    for p in profiles:
        batch, frames = p.opt
        feats = torch.randn(batch, dims.encoder.n_mels, frames, device=device, dtype=dtype)
        flens = torch.full((batch,), frames, device=device)
        with torch.inference_mode():
            seconds = timed(lambda f=feats, n=flens: model.encoder(f, n), device, repeats)
        enc_rows.append({"engine": "torch", "profile": p.name, "batch": batch, "frames": frames,
                         "ms": round(seconds * 1e3, 2), "rtfx": round(batch * frames * 0.01 / seconds, 1)})  # fmt: skip
    report["encoder"] = enc_rows
    print("encoder:", enc_rows, flush=True)

    # 4. end to end at batch 64 with the torch encoder.
    def end_to_end(transcriber: ParakeetTranscriber, label: str) -> None:
        e2e_audio = synthetic_audio(e2e_n, *utt_s, seed=3)
        hours = sum(len(a) for a in e2e_audio) / 16000 / 3600
        transcriber.transcribe(e2e_audio[: transcriber.max_batch])  # warm-up: graphs, kernels
        gc.collect()
        gc.freeze()  # a long-running server does this after warm-up; keeps GC pauses out
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = transcriber.transcribe(e2e_audio)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        gc.unfreeze()
        report.setdefault("end_to_end", []).append({
            "encoder": label, "batch": transcriber.max_batch, "decoder_mode": transcriber.decoder_mode,
            "audio_h": round(hours, 2), "seconds": round(seconds, 2), "rtfx": round(hours * 3600 / seconds, 1),
            "tokens": sum(len(o.tokens) for o in out),
        })  # fmt: skip
        print("end to end:", report["end_to_end"][-1], flush=True)

    if left(args.budget_s) > 90:
        end_to_end(
            ParakeetTranscriber(model, device, dtype, max_batch=64 if not args.smoke else 4),
            "torch",
        )
    else:
        report["skipped"].append("end to end (torch)")

    # 5. TensorRT: build one multi-profile engine, compare, time each profile, then end to end.
    trt_state = "skipped by --skip-trt" if args.skip_trt else ""
    if not trt_state:
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            trt_state = "tensorrt is not installed"
    if not trt_state and device.type != "cuda":
        trt_state = "needs a CUDA device"
    if not trt_state and left(args.budget_s) < 200:
        trt_state = "not enough time left in the budget to build the engine"
    if not trt_state:
        from stages.asr.parakeet.tensorrt import TensorRTEncoder

        try:
            t_build = time.perf_counter()
            trt_encoder = TensorRTEncoder.from_encoder(model.encoder, profiles, precision="bf16")
            report["trt_build_s"] = round(time.perf_counter() - t_build, 1)
            feats = torch.randn(4, dims.encoder.n_mels, 700, device=device)
            flens = torch.tensor([700, 650, 300, 120], device=device)
            feats = feats * (torch.arange(700, device=device)[None, None] < flens[:, None, None])
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
            report["checks"]["trt_vs_torch_max_rel_err"] = round(rel, 4)
            report["checks"]["trt_lengths_equal"] = got_len.tolist() == ref_len.tolist()
            for p in profiles:
                batch, frames = p.opt
                feats = torch.randn(batch, dims.encoder.n_mels, frames, device=device)
                flens = torch.full((batch,), frames, device=device)
                seconds = timed(lambda f=feats, n=flens: trt_encoder(f, n), device, repeats)
                enc_rows.append({"engine": "tensorrt", "profile": p.name, "batch": batch, "frames": frames,
                                 "ms": round(seconds * 1e3, 2), "rtfx": round(batch * frames * 0.01 / seconds, 1)})  # fmt: skip
            if left(args.budget_s) > 60:
                end_to_end(
                    ParakeetTranscriber(model, device, dtype, max_batch=64, encoder=trt_encoder),
                    "tensorrt",
                )
            trt_state = "ran"
        except Exception as exc:  # noqa: BLE001 - report it; the torch numbers above still stand
            trt_state = f"failed: {type(exc).__name__}: {exc}"[:400]
    report["tensorrt"] = trt_state
    report["total_s"] = round(time.perf_counter() - T0, 1)

    print()
    print(
        f"Parakeet-TDT {'tiny (smoke)' if args.smoke else 'v3-size'} random weights, bf16, {report['device']}"
    )
    print(f"{'decoder mode':<16}{'batch':>6}{'ms':>10}{'RTFx':>10}{'tokens/s':>11}")
    for r in dec_rows:
        print(f"{r['mode']:<16}{r['batch']:>6}{r['ms']:>10}{r['rtfx']:>10}{r['tokens_per_s']:>11}")
    print(f"{'encoder':<10}{'profile':<11}{'batch':>6}{'frames':>7}{'ms':>10}{'RTFx':>10}")
    for r in enc_rows:
        print(
            f"{r['engine']:<10}{r['profile']:<11}{r['batch']:>6}{r['frames']:>7}{r['ms']:>10}{r['rtfx']:>10}"
        )
    for r in report.get("end_to_end", []):
        print(f"end to end ({r['encoder']}, batch {r['batch']}, {r['decoder_mode']}): "
              f"{r['audio_h']} h in {r['seconds']} s = RTFx {r['rtfx']}")  # fmt: skip
    print(
        f"tensorrt: {trt_state}; skipped: {report['skipped'] or 'nothing'}; total {report['total_s']} s"
    )
    line = json.dumps(report)
    print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
