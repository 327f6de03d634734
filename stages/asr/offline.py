"""Offline transcription: long audio cut at VAD pauses into chunks of at most ``max_chunk_s``
(:func:`stages.asr.cutting.chunk_regions`), all chunks of all files transcribed in large
batches. Throughput rules here, not latency."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from agent.audio import RATE, int16_to_float
from stages.asr.backend import ASRBackend, Hypothesis, Word
from stages.asr.cutting import Segment, chunk_regions, joined

WINDOW = 512  # samples per Silero VAD window (32 ms)
TURN_PAD_WINDOWS = 3  # FileResult.speech: ~100 ms either side of the VAD's speech


@dataclass(slots=True)
class FileResult:
    name: str
    duration_s: float
    segments: list[Segment] = field(default_factory=list)
    regions: list[tuple[int, int]] = field(default_factory=list)  # what the ASR read, in samples
    # the VAD's speech with a short pad only: where speaker turns go (the ASR's regions carry
    # 320 ms on either side, context for the model, that nobody spoke in)
    speech: list[tuple[int, int]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return joined(self.segments)

    def as_dict(self) -> dict:
        return {
            "file": self.name,
            "duration_s": round(self.duration_s, 3),
            "text": self.text,
            "segments": [
                {"start": round(s.start_s, 2), "end": round(s.end_s, 2), "text": s.text}
                for s in self.segments
            ],
        }


def speech_regions(
    probs: np.ndarray, threshold: float = 0.5, neg_threshold: float = 0.35,
    min_silence_windows: int = 8, pad_windows: int = 10,
) -> list[tuple[int, int]]:
    """Speech regions as (start, end) sample indices from per-window speech probabilities,
    with hysteresis; pauses shorter than ``min_silence_windows`` do not split a region."""
    regions: list[tuple[int, int]] = []
    in_speech, start, silent = False, 0, 0
    for i, p in enumerate(probs):
        if not in_speech:
            if p >= threshold:
                in_speech, start, silent = True, i, 0
        elif p < neg_threshold:
            silent += 1
            if silent >= min_silence_windows:
                regions.append((start, i - silent + 1))
                in_speech = False
        else:
            silent = 0
    if in_speech:
        regions.append((start, len(probs) - silent))
    n = len(probs)
    return [(max(0, a - pad_windows) * WINDOW, min(n, b + pad_windows) * WINDOW) for a, b in regions]


def vad_probs(audio: np.ndarray, vad: object) -> np.ndarray:
    """Speech probability of every 512-sample window (the last one zero-padded)."""
    vad.reset()  # type: ignore[attr-defined]
    n = -(-len(audio) // WINDOW)
    padded = np.zeros(n * WINDOW, np.float32)
    padded[: len(audio)] = audio
    prob = vad.prob  # type: ignore[attr-defined]
    return np.fromiter((prob(padded[i * WINDOW : (i + 1) * WINDOW]) for i in range(n)), np.float32, n)


# Long files are cut into pieces that run side by side in the VAD batch; each piece after the
# first starts a little early so the model's recurrent state has settled by its first window.
VAD_PIECE_WINDOWS = 1875  # 60 s
VAD_WARMUP_WINDOWS = 63  # 2 s


def vad_probs_many(audios: Sequence[np.ndarray], vad: object, threads: int = 1) -> list[np.ndarray]:
    """:func:`vad_probs` for many files at once: every file (and every minute of a long one)
    is one row of a batched Silero run, so the model is called once per window position rather
    than once per window of every file. ``threads`` batches run side by side (onnxruntime
    releases the GIL), the rows dealt out longest first."""
    pieces: list[np.ndarray] = []
    where: list[tuple[int, int, int]] = []  # (file, first window kept, windows skipped)
    for fi, audio in enumerate(audios):
        n = -(-len(audio) // WINDOW)
        for w in range(0, max(n, 1), VAD_PIECE_WINDOWS):
            skip = min(w, VAD_WARMUP_WINDOWS)
            a = (w - skip) * WINDOW
            pieces.append(audio[a : (w + VAD_PIECE_WINDOWS) * WINDOW])
            where.append((fi, w, skip))
    threads = max(1, min(threads, len(pieces)))
    if threads == 1:
        probs = vad.probs_batch(pieces)  # type: ignore[attr-defined]
    else:
        by_length = sorted(range(len(pieces)), key=lambda i: len(pieces[i]), reverse=True)
        shares = [by_length[k::threads] for k in range(threads)]
        with ThreadPoolExecutor(threads, thread_name_prefix="vad") as pool:
            done = pool.map(lambda share: vad.probs_batch([pieces[i] for i in share]), shares)  # type: ignore[attr-defined]
            probs = [np.empty(0, np.float32)] * len(pieces)
            for share, got in zip(shares, done, strict=True):
                for i, p in zip(share, got, strict=True):
                    probs[i] = p
    out = [np.empty(-(-len(a) // WINDOW), np.float32) for a in audios]
    for (fi, w, skip), p in zip(where, probs, strict=True):
        kept = p[skip:]
        out[fi][w : w + len(kept)] = kept
    return out


def transcribe_files(
    audios: Sequence[tuple[str, np.ndarray]],
    backend: ASRBackend,
    vad: object,
    batch_size: int = 16,
    max_chunk_s: float = 28.0,
    on_progress: Callable[[float], None] | None = None,
    vad_threads: int = 1,
) -> list[FileResult]:
    """Transcribe whole files (float32 in [-1, 1], or int16: a long file then costs half the
    memory, each chunk converted when it is read): VAD cut, then every chunk of every file in batches of
    ``batch_size``, longest first (similar lengths share a batch). ``on_progress`` receives the
    seconds of audio finished after each batch."""
    jobs: list[tuple[int, int, int]] = []  # (file index, start, end)
    results: list[FileResult] = []
    all_probs = vad_probs_many([audio for _, audio in audios], vad, vad_threads)
    for fi, (name, audio) in enumerate(audios):
        results.append(FileResult(name, len(audio) / RATE))
        regions = speech_regions(all_probs[fi])
        results[-1].regions = regions
        results[-1].speech = speech_regions(all_probs[fi], pad_windows=TURN_PAD_WINDOWS)
        for a, b in chunk_regions(regions, max_chunk_s, len(audio)):
            jobs.append((fi, a, b))
        if on_progress is not None and not regions:
            on_progress(len(audio) / RATE)
    # progress counts each file's silence with its first chunk
    share = {}
    for fi, (_, audio) in enumerate(audios):
        spans = [(a, b) for f, a, b in jobs if f == fi]
        speech = sum(b - a for a, b in spans)
        share[fi] = (len(audio) / RATE) / max(speech / RATE, 1e-9) if spans else 0.0
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][2] - jobs[j][1], reverse=True)
    hyps: dict[int, Hypothesis] = {}
    for at in range(0, len(order), max(1, batch_size)):
        part = order[at : at + batch_size]
        bufs = [_as_float(audios[jobs[j][0]][1][jobs[j][1] : jobs[j][2]]) for j in part]
        for j, hyp in zip(part, backend.transcribe_batch(bufs), strict=True):
            hyps[j] = hyp
        if on_progress is not None:
            on_progress(sum((jobs[j][2] - jobs[j][1]) / RATE * share[jobs[j][0]] for j in part))
    for j, (fi, a, b) in enumerate(jobs):
        text = hyps[j].text.strip() if j in hyps else ""
        if text:
            at_s = a / RATE  # word times count from the chunk: the file's from here
            words = tuple(Word(w.text, w.start + at_s, w.end + at_s) for w in hyps[j].words)
            results[fi].segments.append(Segment(text, a, b, words))
    for r in results:
        r.segments.sort(key=lambda s: s.start)
    return results


def _as_float(pcm: np.ndarray) -> np.ndarray:
    return int16_to_float(pcm) if pcm.dtype == np.int16 else pcm
