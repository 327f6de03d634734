"""Where long audio is cut, and what a transcribed piece of it is: the quietest point in a span,
the two ways long audio becomes chunks (at energy minima, or at VAD pauses), and ``Segment``.

Every position here is a sample index at the pipeline's rate; seconds appear only at the edges
(JSON output), through :attr:`Segment.start_s` / :attr:`Segment.end_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from agent.audio import RATE
from stages.asr.backend import Word

FRAME = 320  # 20 ms: the step (and the default window) of the quietness search
# Whisper sees 30 s, but tiny.en without timestamps skips or repeats whole sentences in long
# windows, and whether it does flips with the smallest change of input. Measured on 40-60 s
# files of four LibriSpeech clips in four orders, each also with ±1 LSB dither (WER per file):
# 20-s chunks 0-36% (mean 14%), 14-s 0-20% (8 runs), 12-s 0-10% (mean 0.6%, 15 of 16 exact).
# Shorter windows are cheaper too (benchmarks/long_audio_chunks.py: 11-37% faster per run).
MAX_CHUNK_S = 12.0
SEARCH_S = 4.0  # a cut is the quietest 20 ms in the last SEARCH_S seconds before the limit


@dataclass(slots=True, frozen=True)
class Segment:
    """The text of one chunk and the samples ``[start, end)`` it covers, from the audio's start;
    its timed words (seconds from the audio's start) when the backend gives word times."""

    text: str
    start: int
    end: int
    words: tuple[Word, ...] = ()

    @property
    def start_s(self) -> float:
        return self.start / RATE

    @property
    def end_s(self) -> float:
        return self.end / RATE


def joined(segments: list[Segment]) -> str:
    """The segments' texts in order, one space between, empty ones left out."""
    return " ".join(s.text for s in segments if s.text)


def quietest_point(audio: np.ndarray, lo: int, hi: int, window: int = FRAME, step: int = FRAME) -> int:
    """The centre of the quietest ``window`` samples in ``audio[lo:hi]``, windows starting every
    ``step`` samples from ``lo``; the first of equally quiet windows wins.

    ``audio`` is 1-D int16 or float. ``window`` must be a whole number of steps; a span shorter
    than one window is judged as one window of its whole steps, and a span shorter than one step
    gives ``hi``. Energies are sums of squares in float64: exact for int16 audio (a window may
    hold 8 million samples before a sum could round), so there the answer never depends on the
    CPU's summation order.
    Cost: one pass over the span (no copy when it is contiguous) and a few arrays of
    ``(hi - lo) / step`` numbers."""
    if audio.ndim != 1:
        raise ValueError(f"quietest_point needs 1-D audio (got shape {audio.shape})")
    if not 0 <= lo <= hi <= len(audio):
        raise ValueError(f"span [{lo}, {hi}) is not inside audio of {len(audio)} samples")
    if step < 1 or window < step or window % step:
        raise ValueError(f"window ({window}) must be a whole number of steps ({step})")
    n = (hi - lo) // step
    if n == 0:
        return hi
    frames = audio[lo : lo + n * step].reshape(n, step)
    energy = np.einsum("ij,ij->i", frames, frames, dtype=np.float64)
    width = min(window // step, n)
    if width > 1:
        energy = sliding_window_view(energy, width).sum(axis=1)
    return lo + int(np.argmin(energy)) * step + width * step // 2


def cut_points(pcm: np.ndarray, max_chunk_s: float = MAX_CHUNK_S, search_s: float = SEARCH_S) -> list[tuple[int, int]]:
    """(start, end) sample ranges covering ``pcm``, each at most ``max_chunk_s`` long.

    Each cut falls in the middle of the lowest-energy 20 ms frame of the ``search_s`` seconds
    before the limit, so a word is rarely split; there is no overlap to reconcile afterwards.
    Cost: one sum of squares over ``search_s`` of audio per cut."""
    limit = int(max_chunk_s * RATE)
    if limit < FRAME:
        raise ValueError(f"max_chunk_s must be at least {FRAME / RATE} s (got {max_chunk_s})")
    search = min(int(search_s * RATE), limit - FRAME) // FRAME * FRAME
    n = len(pcm)
    cuts: list[tuple[int, int]] = []
    at = 0
    while n - at > limit:
        end = quietest_point(pcm, at + limit - search, at + limit)
        cuts.append((at, end))
        at = end
    if n > at or not cuts:
        cuts.append((at, n))
    return cuts


def chunk_regions(regions: list[tuple[int, int]], max_chunk_s: float, total: int) -> list[tuple[int, int]]:
    """Merge speech regions (sample ranges, in order) into chunks no longer than ``max_chunk_s``,
    cutting only at pauses; a region longer than that alone is cut into equal pieces."""
    chunker = Chunker(max_chunk_s)
    chunks = [c for a, b in regions for c in chunker.add(a, min(b, total))]
    return chunks + chunker.finish()


class Chunker:
    """:func:`chunk_regions` fed one region at a time, as a long file's VAD finds them: a chunk
    comes out once the region after it does not fit in it (or at :meth:`finish`), so the
    chunks are those of the whole file's regions cut at once."""

    def __init__(self, max_chunk_s: float) -> None:
        self.limit = int(max_chunk_s * RATE)
        self._cur: tuple[int, int] | None = None

    @property
    def pending_from(self) -> int | None:
        """Where the chunk still growing starts (None: none is)."""
        return self._cur[0] if self._cur else None

    def add(self, a: int, b: int) -> list[tuple[int, int]]:
        """The chunks that region [a, b) completes (it must start after the last one ends)."""
        limit, out = self.limit, []
        if b - a > limit:
            if self._cur:
                out.append(self._cur)
                self._cur = None
            pieces = -(-(b - a) // limit)
            step = -(-(b - a) // pieces)
            out.extend((x, min(x + step, b)) for x in range(a, b, step))
        elif self._cur is None:
            self._cur = (a, b)
        elif b - self._cur[0] <= limit:
            self._cur = (self._cur[0], b)
        else:
            out.append(self._cur)
            self._cur = (a, b)
        return out

    def finish(self) -> list[tuple[int, int]]:
        """The last chunk, if one is still growing."""
        cur, self._cur = self._cur, None
        return [cur] if cur else []
