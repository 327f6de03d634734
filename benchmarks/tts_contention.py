"""The Piper voice's first-chunk time alone and beside a busy core, per onnxruntime pool.

A reply's first chunk (1-3 words) is synthesized while the LLM goes on writing the reply on
one thread, so on 2 cores the TTS shares the machine with a busy thread. This times Piper on
short chunks for each ``[tts] threads`` setting (0: onnxruntime's default pool, a thread per
core that spins while it waits; N: N threads that sleep), alone and beside one thread that
keeps a core busy (float32 matrix products on one BLAS thread, so the competitor is one core
and no more). Medians over ``--repeat`` rounds of the chunks; every setting alternates
alone / busy in the same process. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The competitor must be one thread: numpy's BLAS would otherwise take every core itself.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402
from emit import emit  # noqa: E402

from agent.config import TTSConfig  # noqa: E402
from stages.tts.piper import PiperTTS  # noqa: E402

CHUNKS = ["I'm sorry,", "The wizard", "That's a great", "Hello there.", "Sure,", "Well, I"]


class Busy:
    """One thread that keeps one core busy until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        a = np.random.default_rng(0).random((200, 200), dtype=np.float32)
        while not self._stop.is_set():
            a @ a

    def __enter__(self) -> Busy:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def time_chunks(tts: PiperTTS, repeat: int) -> list[float]:
    ms = []
    for _ in range(repeat):
        for text in CHUNKS:
            t = time.perf_counter()
            for _audio in tts.synthesize(text):
                pass
            ms.append((time.perf_counter() - t) * 1000)
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--repeat", type=int, default=4, help="rounds of the chunks per measurement")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    res: dict = {"benchmark": "tts_contention", "cores": len(os.sched_getaffinity(0)),
                 "chunks": CHUNKS, "repeat": args.repeat, "settings": {}}
    for n in args.threads:
        print(f"threads {n}: loading the voice", flush=True)
        tts = PiperTTS(TTSConfig(threads=n))
        tts.warmup()
        row = {}
        for label in ("alone", "busy", "alone2", "busy2"):
            if label.startswith("busy"):
                with Busy():
                    ms = time_chunks(tts, args.repeat)
            else:
                ms = time_chunks(tts, args.repeat)
            row[label] = ms
            print(f"  {label:<7} p50 {np.median(ms):6.1f} ms  p90 {np.percentile(ms, 90):6.1f} ms", flush=True)
        alone = row["alone"] + row["alone2"]
        busy = row["busy"] + row["busy2"]
        res["settings"][str(n)] = {
            "alone_p50_ms": float(np.median(alone)), "alone_p90_ms": float(np.percentile(alone, 90)),
            "busy_p50_ms": float(np.median(busy)), "busy_p90_ms": float(np.percentile(busy, 90)),
        }
    print(f"\n{'threads':<22}{'alone p50':>10}{'p90':>8}{'busy p50':>10}{'p90':>8}")
    for n, r in res["settings"].items():
        name = "0 (onnxruntime pool)" if n == "0" else f"{n} (no spinning)"
        print(f"{name:<22}{r['alone_p50_ms']:>10.1f}{r['alone_p90_ms']:>8.1f}"
              f"{r['busy_p50_ms']:>10.1f}{r['busy_p90_ms']:>8.1f}")
    emit(res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
