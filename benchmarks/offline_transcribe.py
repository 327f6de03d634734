"""Offline transcription throughput and accuracy, side by side in one run: voxline's batched
offline path (``voxline transcribe``: Silero VAD cuts, all chunks of all files batched) against
faster-whisper's own ``BatchedInferencePipeline`` with the same Whisper tiny.en (int8, 2 CPU
threads, beam 1, its built-in VAD), over every clip of ../shared/data/speech.

RTFx = seconds of audio / seconds of wall time (time.perf_counter), models loaded and warmed
before the clock starts, decoding of the audio files excluded for both. WER over all clips,
normalised (stages/asr/wer.py). Each setup runs ``--repeat`` times; the best run is reported.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402

from agent.audio import read_audio  # noqa: E402
from agent.config import ASRConfig, RuntimeConfig, VADConfig  # noqa: E402
from agent.runtime import limit_blas_threads  # noqa: E402
from stages.asr.progressive import transcribe_files  # noqa: E402
from stages.asr.wer import corpus_wer  # noqa: E402
from stages.asr.whisper import WhisperBackend, embedded_model_dir  # noqa: E402
from stages.vad import SileroModel  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blas-threads", type=int, default=RuntimeConfig().blas_threads,
                    help="NumPy's BLAS threads for voxline's path (runtime.blas_threads, as "
                         "`voxline transcribe` holds it; 0: NumPy's default)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    manifest = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    audios = [(m["id"], read_audio(DATA / m["path"]).astype(np.float32) / 32768.0) for m in manifest]
    refs = [m["text"] for m in manifest]
    total = sum(len(a) for _, a in audios) / 16000
    res: dict = {"benchmark": "offline_transcribe", "clips": len(audios), "audio_s": round(total, 1),
                 "batch_size": args.batch_size, "threads": args.threads}

    res["blas_threads"] = args.blas_threads
    limit_blas_threads(RuntimeConfig(blas_threads=args.blas_threads))
    cfg = ASRConfig(threads=args.threads).for_throughput()  # as `voxline transcribe` runs
    backend = WhisperBackend(cfg, max_batch=args.batch_size)
    backend.warmup()
    vad = SileroModel(VADConfig())
    best = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = transcribe_files(audios, backend, vad, batch_size=args.batch_size,
                               vad_threads=args.threads)
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, out)
    wall, out = best
    res["voxline"] = {"rtfx": total / wall, "wall_s": wall,
                      "wer": corpus_wer(list(zip(refs, [r.text for r in out], strict=True)))}

    from faster_whisper import BatchedInferencePipeline, WhisperModel

    limit_blas_threads(RuntimeConfig(blas_threads=0))  # faster-whisper with NumPy's own default

    model = WhisperModel(str(embedded_model_dir()), device="cpu", compute_type="int8",
                         cpu_threads=args.threads)
    pipe = BatchedInferencePipeline(model)
    list(pipe.transcribe(audios[0][1], language="en", beam_size=1, batch_size=args.batch_size)[0])
    best = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        texts = []
        for _, a in audios:
            segs, _ = pipe.transcribe(a, language="en", beam_size=1, batch_size=args.batch_size)
            texts.append(" ".join(s.text.strip() for s in segs))
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, texts)
    wall, texts = best
    res["faster_whisper_batched"] = {"rtfx": total / wall, "wall_s": wall,
                                     "wer": corpus_wer(list(zip(refs, texts, strict=True)))}
    res["rtfx_ratio"] = res["voxline"]["rtfx"] / res["faster_whisper_batched"]["rtfx"]
    print(f"{len(audios)} clips, {total:.0f} s of audio; Whisper tiny.en int8, {args.threads} threads, "
          f"beam 1, batch {args.batch_size}; best of {args.repeat}")
    print(f"{'pipeline':<28}{'RTFx':>8}{'wall s':>9}{'WER':>8}")
    for k in ("voxline", "faster_whisper_batched"):
        r = res[k]
        print(f"{k:<28}{r['rtfx']:>8.1f}{r['wall_s']:>9.2f}{r['wer']:>8.2%}")
    print(f"voxline / faster-whisper RTFx: {res['rtfx_ratio']:.2f}x")
    emit(res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
