"""``voxline transcribe FILES...``: offline transcription in large batches, with RTFx."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from agent.config import add_config_flags, config_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "transcribe", help="transcribe audio files offline (batched, with RTFx)",
        description="Cuts each file at VAD pauses into chunks of at most --max-chunk seconds, "
        "transcribes all chunks of all files in batches, and writes one JSON file per input "
        "(text; segments with start/end times).",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print one JSON object per file on stdout")
    p.add_argument("--batch-size", type=int, default=16, metavar="N")
    p.add_argument("--max-chunk", type=float, default=28.0, metavar="S",
                   help="longest chunk in seconds (default 28; Whisper's window is 30)")
    p.add_argument("--output-dir", metavar="DIR", help="where the JSON files go (default: beside each input)")
    p.add_argument("--no-write", action="store_true", help="do not write JSON files")
    add_config_flags(p, sections=["asr", "vad", "runtime"])
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agent.audio import int16_to_float, read_audio
    from agent.errors import AudioInputError, VoxlineError
    from agent.presets import backend_class
    from agent.runtime import freeze_after_warmup
    from stages.asr.offline import transcribe_files
    from stages.vad import SileroModel

    cfg = config_from_args(args)
    if args.batch_size < 1:
        raise VoxlineError("--batch-size must be at least 1")
    if not 1.0 <= args.max_chunk <= 30.0:
        raise VoxlineError("--max-chunk must be between 1 and 30 seconds")
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir and not out_dir.is_dir():
        raise VoxlineError(f"output folder does not exist: {out_dir}")
    audios, failed = [], 0
    for f in args.files:
        try:
            pcm = read_audio(f)
        except AudioInputError as exc:
            print(f"voxline: skipping {f}: {exc}", file=sys.stderr)
            failed += 1
            continue
        audios.append((f, int16_to_float(pcm)))
    if not audios:
        raise VoxlineError("no readable audio among the inputs")
    cfg.asr.max_batch = args.batch_size
    backend = backend_class("asr", cfg.asr.backend)(cfg.asr)
    backend.warmup()
    vad = SileroModel(cfg.vad)
    freeze_after_warmup(cfg.runtime)
    total = sum(len(a) for _, a in audios) / 16000
    t0 = time.perf_counter()
    results = _run_with_progress(audios, backend, vad, args, cfg, total, transcribe_files)
    wall = time.perf_counter() - t0
    for r in results:
        d = r.as_dict()
        if args.json:
            print(json.dumps(d), flush=True)
        if not args.no_write:
            src = Path(r.name)
            dest = (out_dir or src.parent) / (src.stem + ".json")
            dest.write_text(json.dumps(d, indent=2) + "\n", encoding="utf-8")
    rtfx = total / wall if wall > 0 else float("inf")
    msg = (f"{len(results)} files, {total:.1f} s of audio in {wall:.2f} s: RTFx {rtfx:.1f} "
           f"(audio seconds per wall second, after model load; asr {cfg.asr.backend}, "
           f"batch {args.batch_size})")
    print(msg, file=sys.stderr if args.json else sys.stdout)
    return 1 if failed else 0


def _run_with_progress(audios, backend, vad, args, cfg, total, transcribe_files):  # noqa: ANN001, ANN202
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:
        return transcribe_files(audios, backend, vad, args.batch_size, args.max_chunk,
                                vad_threads=cfg.asr.threads)
    columns = [TextColumn("transcribing"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
               TimeRemainingColumn()]
    with Progress(*columns, transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("audio", total=total)
        return transcribe_files(audios, backend, vad, args.batch_size, args.max_chunk,
                                on_progress=lambda s: bar.advance(task, s),
                                vad_threads=cfg.asr.threads)
