"""Offline transcription's parts: where the batched VAD hears speech (every file, and every
minute of a long one, a row of one Silero batch), and the speech regions it gives, found as the
probabilities come in (:class:`SpeechTracker`). :mod:`stages.asr.progressive` cuts the regions
into chunks and transcribes them in large batches. Throughput rules here, not latency."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from stages.asr.cutting import Segment, joined

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
    tracker = SpeechTracker(threshold, neg_threshold, min_silence_windows)
    found = tracker.feed(probs) + tracker.finish()
    return padded(found, pad_windows, len(probs))


def padded(regions: list[tuple[int, int]], pad_windows: int, windows: int) -> list[tuple[int, int]]:
    """Regions in windows → sample ranges, ``pad_windows`` wider on each side, within
    ``windows`` windows."""
    return [(max(0, a - pad_windows) * WINDOW, min(windows, b + pad_windows) * WINDOW)
            for a, b in regions]


class SpeechTracker:
    """The hysteresis of :func:`speech_regions` fed piece by piece, as a long file is read:
    each region (in windows, unpadded) comes out the moment it closes, and the regions of a
    file fed in pieces are those of the file fed at once."""

    def __init__(self, threshold: float = 0.5, neg_threshold: float = 0.35,
                 min_silence_windows: int = 8) -> None:
        self.threshold, self.neg_threshold = threshold, neg_threshold
        self.min_silence = min_silence_windows
        self.windows = 0  # fed so far
        self._in_speech, self._start, self._silent = False, 0, 0

    @property
    def open_from(self) -> int | None:
        """The window the region still open starts at (None: none is)."""
        return self._start if self._in_speech else None

    def feed(self, probs: np.ndarray) -> list[tuple[int, int]]:
        """The regions that close in ``probs``, the windows after those fed before."""
        out: list[tuple[int, int]] = []
        in_speech, start, silent = self._in_speech, self._start, self._silent
        hi, lo, need = self.threshold, self.neg_threshold, self.min_silence
        for i, p in enumerate(probs.tolist(), self.windows):
            if not in_speech:
                if p >= hi:
                    in_speech, start, silent = True, i, 0
            elif p < lo:
                silent += 1
                if silent >= need:
                    out.append((start, i - silent + 1))
                    in_speech = False
            else:
                silent = 0
        self.windows += len(probs)
        self._in_speech, self._start, self._silent = in_speech, start, silent
        return out

    def finish(self) -> list[tuple[int, int]]:
        """The region still open at the end of the audio, if any."""
        if not self._in_speech:
            return []
        self._in_speech = False
        return [(self._start, self.windows - self._silent)]


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
    probs = pieces_probs(pieces, vad, threads)
    out = [np.empty(-(-len(a) // WINDOW), np.float32) for a in audios]
    for (fi, w, skip), p in zip(where, probs, strict=True):
        kept = p[skip:]
        out[fi][w : w + len(kept)] = kept
    return out


def pieces_probs(pieces: Sequence[np.ndarray], vad: object, threads: int = 1) -> list[np.ndarray]:
    """Each piece's window probabilities from one batched Silero run per thread (onnxruntime
    releases the GIL), the pieces dealt out longest first; each starts from a fresh state."""
    if not pieces:
        return []
    threads = max(1, min(threads, len(pieces)))
    if threads == 1:
        return vad.probs_batch(list(pieces))  # type: ignore[attr-defined]
    by_length = sorted(range(len(pieces)), key=lambda i: len(pieces[i]), reverse=True)
    shares = [by_length[k::threads] for k in range(threads)]
    probs = [np.empty(0, np.float32)] * len(pieces)
    with ThreadPoolExecutor(threads, thread_name_prefix="vad") as pool:
        done = pool.map(lambda share: vad.probs_batch([pieces[i] for i in share]), shares)  # type: ignore[attr-defined]
        for share, got in zip(shares, done, strict=True):
            for i, p in zip(share, got, strict=True):
                probs[i] = p
    return probs
