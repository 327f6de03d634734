"""asr-serve's long-audio chunking (stages/asr/long_audio.py) with Whisper tiny.en: WER and
throughput for a chunk limit of 20 s against 12 s, side by side, on the same files.

The files are the four test clips of tests/speech.py joined in four orders (40-60 s each, 0.5-s
pauses, 185 s in all); each is cut by ``cut_points`` at the given limit and its chunks go to the
backend as one batch, as ``transcribe_long`` sends them. WER is per file (the words of the
joined references) and pooled; ``--dither`` adds a seeded ±1-step dither to every sample as a
second view of how stable each limit is. Time is the best of ``--repeats`` passes over all
files (the model loaded and warmed up). Prints a table and one JSON line.

    python benchmarks/long_audio_chunks.py [--limits 20,12] [--repeats 3] [--dither]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from emit import emit  # noqa: E402
from speech import CLIPS, perturb, samples, text  # noqa: E402

from agent.audio import int16_to_float  # noqa: E402
from agent.config import ASRConfig  # noqa: E402
from stages.asr.long_audio import cut_points  # noqa: E402
from stages.asr.wer import wer  # noqa: E402
from stages.asr.whisper import WhisperBackend  # noqa: E402

ORDERS = [
    ("kittens", "quilter", "honest") * 3,
    ("honest", "kittens", "quilter") * 3,
    ("wizard", "honest", "kittens", "quilter") * 2,
    ("quilter", "wizard", "kittens", "honest") * 3,
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", default="20,12", help="chunk limits in seconds, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dither", action="store_true", help="±1-step dither on every sample")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    backend = WhisperBackend(ASRConfig())
    backend.warmup()
    gap = np.zeros(8000, np.int16)
    pcm = {n: samples(n) for n in CLIPS}
    files = []
    for order in ORDERS:
        audio = np.concatenate([p for n in order for p in (pcm[n], gap)])
        files.append((perturb(audio, "dither" if args.dither else ""), " ".join(text(n) for n in order)))
    seconds = sum(len(a) for a, _ in files) / 16000
    rows = []
    for limit in (float(x) for x in args.limits.split(",")):
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            hyps = [" ".join(h.text for h in backend.transcribe_batch(
                [int16_to_float(a[x:y]) for x, y in cut_points(a, limit)])) for a, _ in files]
            best = min(best, time.perf_counter() - t0)
        per_file = [round(wer(ref, hyp), 3) for (_, ref), hyp in zip(files, hyps, strict=True)]
        pooled = wer(" ".join(ref for _, ref in files), " ".join(hyps))
        rows.append({"limit_s": limit, "wer_per_file": per_file, "wer_pooled": round(pooled, 4),
                     "seconds": round(best, 3), "rtfx": round(seconds / best, 1)})
        print(f"{limit:>5.0f} s chunks: WER pooled {pooled:6.1%}, per file {per_file}, "
              f"{best:.2f} s for {seconds:.0f} s of audio (RTFx {seconds / best:.1f})", flush=True)
    emit({"benchmark": "long_audio_chunks", "audio_s": round(seconds, 1), "dither": args.dither,
          "rows": rows}, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
