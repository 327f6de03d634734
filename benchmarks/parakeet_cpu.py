"""Offline Parakeet-TDT speed on the CPU: a 110m-size random-weight model (17 × 512 FastConformer,
80 mels, 1-layer LSTM, 1024 pieces) transcribing real speech with N threads.

Random weights decode differently from trained ones, so the joint's blank bias is first tuned
until the model emits about one token per three encoder frames (a trained model's rate on read
speech); otherwise the decoder would do unrealistically much or little work.

    python benchmarks/parakeet_cpu.py [--threads 2] [--seconds 120] [--batch 1 8]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MANIFEST = Path("/work/shared/data/speech/manifest.jsonl")
TOKENS_PER_FRAME = 0.3


def speech(seconds: float) -> list[np.ndarray]:
    """Real recordings from the project's speech set (synthetic noise bursts when it is absent)."""
    clips: list[np.ndarray] = []
    total = 0.0
    if MANIFEST.is_file():
        import soundfile as sf

        for line in MANIFEST.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("sample_rate") != 16000:
                continue
            audio, sr = sf.read(MANIFEST.parent / entry["path"], dtype="float32")
            if sr == 16000 and audio.ndim == 1:
                clips.append(audio)
                total += len(audio) / 16000
            if total >= seconds:
                break
    rng = np.random.default_rng(0)
    while total < seconds:  # top up (or replace) with shaped noise
        n = int(rng.uniform(3, 12) * 16000)
        clips.append((0.1 * rng.standard_normal(n) * np.hanning(n)).astype(np.float32))
        total += n / 16000
    return clips


def tune_emission(transcriber, audio: list[np.ndarray], target: float = TOKENS_PER_FRAME) -> float:
    """Make a random joint emit about ``target`` tokens per encoder frame: spread its logits
    (so blank wins on some frames and not others), then bisect the blank bias. Returns the rate."""
    import torch

    joint = transcriber.model.joint.out
    blank = transcriber.model.dims.decoder.blank_id
    enc, lens = transcriber.encode(audio[:2])
    enc, lens = enc[:, :40], lens.clamp(max=40)  # a few seconds are enough to measure a rate
    with torch.no_grad():
        joint.weight.mul_(4.0)
        base = joint.bias[blank].item()
    lo, hi, best = -30.0, 30.0, (float("inf"), 0.0, 0.0)
    for _ in range(10):
        mid = (lo + hi) / 2
        with torch.no_grad():
            joint.bias[blank] = base + mid
        out = transcriber.tdt.decode(enc, lens)
        rate = sum(len(o.tokens) for o in out) / max(1, int(lens.sum()))
        best = min(best, (abs(rate - target), mid, rate))
        lo, hi = (mid, hi) if rate > target else (lo, mid)
    with torch.no_grad():
        joint.bias[blank] = base + best[1]
    return best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--seconds", type=float, default=120.0, help="audio to transcribe per batch size"
    )
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--kind", default="110m", choices=["110m", "v2", "v3"])
    args = ap.parse_args()

    import torch

    from stages.asr.parakeet.architectures import nemo_config
    from stages.asr.parakeet.dims import dims_from_config
    from stages.asr.parakeet.model import ParakeetTDT
    from stages.asr.parakeet.transcriber import ParakeetTranscriber

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dims = dims_from_config(nemo_config(args.kind))
    model = ParakeetTDT(dims).eval()
    params = sum(p.numel() for p in model.parameters()) / 1e6
    audio = speech(args.seconds)
    audio_s = sum(len(a) for a in audio) / 16000
    rows = []
    rate = tune_emission(ParakeetTranscriber(model, "cpu", torch.float32), audio)
    for batch in args.batch:
        tr = ParakeetTranscriber(model, "cpu", torch.float32, max_batch=batch)
        tr.transcribe(audio[:2])  # warm-up
        t0 = time.perf_counter()
        enc_time = dec_time = 0.0
        tokens = 0
        order = sorted(range(len(audio)), key=lambda i: -len(audio[i]))
        for start in range(0, len(order), batch):
            chunk = [audio[i] for i in order[start : start + batch]]
            a = time.perf_counter()
            enc, lens = tr.encode(chunk)
            b = time.perf_counter()
            out = tr.tdt.decode(enc, lens)
            c = time.perf_counter()
            enc_time += b - a
            dec_time += c - b
            tokens += sum(len(o.tokens) for o in out)
        wall = time.perf_counter() - t0
        rows.append({
            "batch": batch, "audio_s": round(audio_s, 1), "wall_s": round(wall, 2),
            "rtfx": round(audio_s / wall, 1), "encoder_rtfx": round(audio_s / enc_time, 1),
            "decoder_rtfx": round(audio_s / dec_time, 1), "tokens": tokens,
            "tokens_per_frame": round(rate, 3),
        })  # fmt: skip

    print(
        f"Parakeet-TDT {args.kind} (random weights, {params:.1f} M params), CPU, {args.threads} threads, fp32"
    )
    print(
        f"{'batch':>5} {'audio s':>8} {'wall s':>7} {'RTFx':>6} {'enc RTFx':>9} {'dec RTFx':>9} {'tokens':>7}"
    )
    for r in rows:
        print(
            f"{r['batch']:>5} {r['audio_s']:>8} {r['wall_s']:>7} {r['rtfx']:>6} {r['encoder_rtfx']:>9} "
            f"{r['decoder_rtfx']:>9} {r['tokens']:>7}"
        )
    print(json.dumps({"benchmark": "parakeet_cpu", "model": args.kind, "params_m": round(params, 1),
                      "threads": args.threads, "results": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
