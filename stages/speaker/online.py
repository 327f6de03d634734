"""Diarization of a recording read piece by piece, so that its first turns come out long
before its end: the speakers found so far keep their numbers, and later speech joins them or
adds new ones.

The first piece with enough speech (``first_s`` seconds of it, or the whole recording when it
ends first) is diarized as :func:`~stages.speaker.diarization.diarize` would diarize it on its
own — a recording that fits in it gets exactly that answer. Each speaker keeps the sum of its
windows' embeddings. A later window joins the speaker whose centroid is nearest when that is
within the clustering threshold; the windows near no speaker are clustered among themselves,
and a group of at least ``min_new_s`` seconds of windows becomes a new speaker (while the count
allows one); the rest join their nearest speaker. Every window that joins a speaker moves its
centroid. Turns are then cut exactly as in the whole-file case.

What this gives up against diarizing the whole file at once: a voice first heard after the
first piece must say ``min_new_s`` in one piece to be told apart, and two speakers merged in the
first piece stay merged. ``benchmarks/diarization.py --piece-s`` measures the difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stages.speaker.cluster import cluster
from stages.speaker.diarization import (
    THRESHOLDS,
    DiarizationOptions,
    long_windows,
    merged_regions,
    speaker_turns,
    speech_windows,
)
from stages.speaker.embedder import RATE, Embedder
from stages.speaker.timeline import SpeakerTurn

FIRST_S = 60.0  # seconds of speech the first clustering waits for (unless the audio ends first)
MIN_NEW_S = 3.0  # a voice heard later becomes a speaker with this much speech in one piece


class OnlineDiarizer:
    """Speaker turns of one recording, piece by piece (see the module). Speakers are numbered
    in the order they were found, not renumbered: a number once given is kept."""

    def __init__(self, embedder: Embedder, speakers: int | None = None, min_speakers: int = 1,
                 max_speakers: int = 8, options: DiarizationOptions | None = None,
                 first_s: float = FIRST_S, min_new_s: float = MIN_NEW_S) -> None:
        self.embedder = embedder
        self.opt = options or DiarizationOptions()
        self.speakers, self.min_speakers, self.max_speakers = speakers, min_speakers, max_speakers
        self.threshold = (self.opt.threshold if self.opt.threshold is not None
                          else THRESHOLDS[embedder.frontend])
        self.first_s, self.min_new_s = first_s, min_new_s
        self._sums: np.ndarray | None = None  # [k, dim] float64: each speaker's windows summed
        # speech held back until the first clustering: spans, windows and their embeddings
        self._spans: list[tuple[int, int]] = []
        self._wins: list[tuple[int, int, int]] = []
        self._vecs: list[np.ndarray] = []

    @property
    def count(self) -> int:
        """Speakers found so far."""
        return 0 if self._sums is None else len(self._sums)

    def add(self, audio: np.ndarray, offset: int, regions: Sequence[tuple[int, int]],
            final: bool = False) -> list[SpeakerTurn]:
        """The turns of ``regions`` (samples from the recording's start, in order, after every
        region given before); ``audio`` holds the recording from sample ``offset`` on, at least
        to the last region's end. ``final``: the recording ends here. The turns come in order;
        until the first clustering has enough speech, none come (they come with a later call)."""
        spans = merged_regions([(a - offset, b - offset) for a, b in regions], len(audio))
        wins = speech_windows(spans, self.opt)
        vecs = (self.embedder.embed([audio[a:b] for _, a, b in wins]) if wins
                else np.zeros((0, self.embedder.dim), np.float32))
        spans = [(a + offset, b + offset) for a, b in spans]
        base = len(self._spans)
        wins = [(r + base, a + offset, b + offset) for r, a, b in wins]
        if self._sums is None:
            self._spans += spans
            self._wins += wins
            self._vecs.append(vecs)
            speech = sum(b - a for a, b in self._spans) / RATE
            if not self._wins or (speech < self.first_s and not final):
                return []
            return self._first(final)
        return self._later(spans, [(r - base, a, b) for r, a, b in wins], vecs)

    def _first(self, final: bool) -> list[SpeakerTurn]:
        spans, wins = self._spans, self._wins
        vecs = np.concatenate(self._vecs)
        self._spans, self._wins, self._vecs = [], [], []
        long = long_windows(wins, self.opt)
        if final:  # the whole recording: what diarize() gives
            speakers, lo, hi = self.speakers, self.min_speakers, self.max_speakers
        else:  # more is to come: the count of the speakers heard so far, up to the most allowed
            speakers, lo, hi = None, 1, self.speakers or self.max_speakers
        labels = np.zeros(len(wins), np.int64)
        labels[long] = cluster(vecs[long], speakers, lo, hi, self.threshold)
        k = int(labels[long].max()) + 1
        self._sums = np.zeros((k, vecs.shape[1]), np.float64)
        np.add.at(self._sums, labels[long], vecs[long])
        if not long.all():
            labels[~long] = np.argmax(vecs[~long] @ self._centroids().T, axis=1)
        return self._turns(spans, wins, labels)

    def _later(self, spans: list[tuple[int, int]], wins: list[tuple[int, int, int]],
               vecs: np.ndarray) -> list[SpeakerTurn]:
        if not wins:
            return []
        long = long_windows(wins, self.opt)
        near = vecs @ self._centroids().T  # cosine similarity to each speaker
        labels = np.argmax(near, axis=1)
        far = long & (1.0 - near.max(axis=1) >= self.threshold)
        limit = self.speakers or self.max_speakers
        if far.sum() >= 2 and self.count < limit:
            idx = np.flatnonzero(far)
            groups = cluster(vecs[idx], None, 1, len(idx), self.threshold)
            window_s = self.opt.step_s  # what one window adds to a voice's speech, about
            for g in np.unique(groups):
                members = idx[groups == g]
                if len(members) * window_s < self.min_new_s or self.count >= limit:
                    continue
                labels[members] = self.count
                self._sums = np.vstack([self._sums, vecs[members].sum(axis=0, dtype=np.float64)])
                long[members] = False  # already counted in the new speaker's sum
        joined = long & (labels < len(self._sums))
        np.add.at(self._sums, labels[joined], vecs[joined])
        return self._turns(spans, wins, labels)

    def centroid(self, speaker: int) -> np.ndarray:
        """Speaker ``speaker``'s mean embedding, L2-normalised."""
        return self._centroids()[speaker]

    def _centroids(self) -> np.ndarray:
        sums = self._sums if self._sums is not None else np.zeros((0, self.embedder.dim))
        return (sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)).astype(
            np.float32)

    def _turns(self, spans: list[tuple[int, int]], wins: list[tuple[int, int, int]],
               labels: np.ndarray) -> list[SpeakerTurn]:
        return speaker_turns(spans, wins, labels, self.count, self.opt)
