"""Offline transcription that reads files piece by piece and hands out each segment as soon as
it is final: ``voxline transcribe`` on a 90-minute recording shows its first lines within
seconds, holds minutes of audio rather than the file, and keeps what it decoded before a damage.

Each round reads the next piece of every open file (120 s first, then 240 s, then 480 s at a
time — whole minutes, so the batched VAD sees exactly the 60-s pieces it would see over the whole
file) and opens more files while the round holds under ``round_s`` of audio, so many short files
still share every batch. Then:

1. the VAD runs over the new audio of every stream (:func:`stages.asr.offline.pieces_probs`);
2. the speech regions that closed (:class:`~stages.asr.offline.SpeechTracker`) become chunks
   (:class:`~stages.asr.cutting.Chunker`) — the regions and chunks the whole file would give;
3. every final chunk of every file is transcribed, longest first, ``batch_size`` at a time;
4. with diarization, the new speech goes to the file's
   :class:`~stages.speaker.online.OnlineDiarizer`, and each chunk is split at its speakers;
5. a file's segments go out in time order once nothing earlier can still come (for channels
   split into speakers: once every channel has passed that point).

A stream's audio is kept only as long as something still needs it: the chunk still growing, a
speech region still open, the VAD's 2-s warm-up. Segments are :class:`SpokenSegment` (speaker -1
when nobody asked who spoke).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from agent.audio import RATE, int16_to_float, to_mono
from agent.errors import AudioInputError
from stages.asr.backend import ASRBackend, Hypothesis, Word
from stages.asr.cutting import MAX_CHUNK_S, Chunker, Segment
from stages.asr.long_audio import Submits
from stages.asr.offline import (
    TURN_PAD_WINDOWS,
    VAD_PIECE_WINDOWS,
    VAD_WARMUP_WINDOWS,
    WINDOW,
    FileResult,
    SpeechTracker,
    pieces_probs,
)
from stages.asr.slots import Slot
from stages.asr.sources import ArraySource, AudioSource
from stages.asr.speakers import SegmentMerger, SpokenSegment, split_at_speakers

ASR_PAD_WINDOWS = 10  # the ASR's regions: ~320 ms either side of the VAD's speech
PIECES_S = (120, 240, 480)  # a file's first pieces, then the last one over and over
# Files are opened while a round holds less audio than this: short files share batches (the 24
# recordings of benchmarks/diarization.py, 23 min: RTFx 66-69 in rounds of 600 s, 74-76 in
# 1,200 s, 76-77 all at once), and memory holds at most this much of them (1,800 s: 58 MB).
ROUND_S = 1800.0


@dataclass(slots=True, frozen=True)
class DiarizeWith:
    """Diarization of mono files: the embedding model and the speaker count's bounds."""

    embedder: object  # stages.speaker.Embedder
    speakers: int | None = None
    min_speakers: int = 1
    max_speakers: int = 8
    first_s: float = 60.0  # seconds of speech the first clustering waits for (or the end)
    # known voices: name → L2-normalised mean embedding of a sample of the voice; a speaker
    # found whose centroid is near one (within the clustering threshold) takes its name
    known: dict[str, np.ndarray] | None = None


@dataclass(slots=True)
class FileSegments:
    """Segments of file ``index`` that just became final, in time order."""

    index: int
    name: str
    segments: list[SpokenSegment]
    names: dict[int, str] | None = None  # speakers that are known voices, by number


@dataclass(slots=True)
class FileDone:
    """File ``index`` is finished: every segment of it (in order), its duration, one result per
    stream (channel), and the damage that ended it early, if any."""

    index: int
    name: str
    duration_s: float
    segments: list[SpokenSegment]
    results: list[FileResult]
    error: AudioInputError | None = None
    # diarized: every speaker turn (start s, end s, speaker numbered as the segments are)
    turns: list[tuple[float, float, int]] | None = None
    names: dict[int, str] | None = None  # speakers that are known voices, by number


class _Stream:
    """One channel of audio on its way through VAD, chunking and ASR."""

    def __init__(self, name: str, max_chunk_s: float) -> None:
        self.result = FileResult(name, 0.0)
        self.tape = np.zeros(0, np.int16)
        self.base = 0  # the sample tape[0] is
        self.end = 0  # samples received
        self.eof = False
        self.tracker = SpeechTracker()
        self.chunker = Chunker(max_chunk_s)
        self.vad_done = 0  # windows with a probability
        self.closed: list[tuple[int, int]] = []  # regions (windows) closed, not yet padded out
        self.chunks: list[tuple[int, int]] = []  # final, not yet transcribed
        self.speech: list[tuple[int, int]] = []  # new speech (samples, turn pad), for speakers
        self.done: list[Segment] = []  # transcribed this round

    def feed(self, pcm: np.ndarray, eof: bool) -> None:
        if len(pcm):
            self.tape = np.concatenate([self.tape, pcm]) if len(self.tape) else pcm.copy()
            self.end += len(pcm)
        self.eof = self.eof or eof

    def audio(self, a: int, b: int) -> np.ndarray:
        return self.tape[a - self.base : b - self.base]

    def vad_pieces(self) -> list[tuple[np.ndarray, int]]:
        """(audio, windows of warm-up to drop) for every VAD piece of the new audio."""
        upto = -(-self.end // WINDOW) if self.eof else self.end // WINDOW
        last = self.end if self.eof else upto * WINDOW  # (a window not yet whole waits)
        out = []
        for w in range(self.vad_done, upto, VAD_PIECE_WINDOWS):
            skip = min(w, VAD_WARMUP_WINDOWS)
            out.append((self.audio((w - skip) * WINDOW,
                                   min((w + VAD_PIECE_WINDOWS) * WINDOW, last)), skip))
        return out

    def add_probs(self, probs: list[np.ndarray], skips: list[int]) -> None:
        for p, skip in zip(probs, skips, strict=True):
            kept = p[skip:]
            self.closed += self.tracker.feed(kept)
            self.vad_done += len(kept)
            self.result.duration_s = self.end / RATE
        if self.eof:
            self.closed += self.tracker.finish()
        self._release()

    def _release(self) -> None:
        """Pad out the closed regions that have room for it; chunk them."""
        n, total = self.vad_done, self.end
        keep = []
        for a, b in self.closed:
            if not self.eof and b + ASR_PAD_WINDOWS > n:
                keep.append((a, b))
                continue
            region = (max(0, a - ASR_PAD_WINDOWS) * WINDOW, min(n, b + ASR_PAD_WINDOWS) * WINDOW)
            turn = (max(0, a - TURN_PAD_WINDOWS) * WINDOW, min(n, b + TURN_PAD_WINDOWS) * WINDOW)
            self.result.regions.append(region)
            self.result.speech.append(turn)
            self.speech.append((turn[0], min(turn[1], total)))
            self.chunks += self.chunker.add(region[0], min(region[1], total))
        self.closed = keep
        if self.eof:
            self.chunks += self.chunker.finish()

    def transcribed(self, a: int, b: int, hyp: Hypothesis) -> None:
        """Chunk [a, b) came back from the ASR."""
        text = hyp.text.strip()
        if text:
            at_s = a / RATE  # word times count from the chunk: the file's from here
            words = tuple(Word(w.text, w.start + at_s, w.end + at_s) for w in hyp.words)
            seg = Segment(text, a, b, words)
            self.done.append(seg)
            self.result.segments.append(seg)

    def round_done(self) -> None:
        self.chunks = []
        self.done.sort(key=lambda seg: seg.start)

    def watermark(self) -> float:
        """No segment still to come from this stream starts before this sample."""
        if self.eof:
            return float("inf")
        starts = [(self.vad_done - ASR_PAD_WINDOWS) * WINDOW]
        if self.chunker.pending_from is not None:
            starts.append(self.chunker.pending_from)
        if self.closed:
            starts.append((self.closed[0][0] - ASR_PAD_WINDOWS) * WINDOW)
        if self.tracker.open_from is not None:
            starts.append((self.tracker.open_from - ASR_PAD_WINDOWS) * WINDOW)
        return max(0, min(starts))

    def trim(self) -> None:
        """Drop the audio nothing needs any more."""
        keep = min(self.watermark(), (self.vad_done - VAD_WARMUP_WINDOWS) * WINDOW)
        cut = int(max(0, keep)) - self.base
        if cut > 0:
            self.tape = self.tape[cut:].copy()
            self.base += cut


class _File:
    def __init__(self, index: int, source: AudioSource, max_chunk_s: float, split: bool,
                 diarize: DiarizeWith | None, pieces_s: Sequence[int]) -> None:
        self.index, self.source, self.split = index, source, split
        self.pieces_s = pieces_s
        self.name = source.name
        names = ([f"{source.name}#{c + 1}" for c in range(source.channels)]
                 if split and source.channels > 1 else [source.name])
        self.streams = [_Stream(n, max_chunk_s) for n in names]
        self.pieces = 0
        self.error: AudioInputError | None = None
        self.diarizer = None
        if diarize is not None:
            from stages.speaker.online import OnlineDiarizer

            self.diarizer = OnlineDiarizer(diarize.embedder, diarize.speakers,  # type: ignore[arg-type]
                                           diarize.min_speakers, diarize.max_speakers,
                                           first_s=diarize.first_s)
        self.turns: list[tuple[float, float, int]] = []  # (start s, end s, speaker), in order
        self.all_turns: list[tuple[float, float, int]] = []
        self.waiting: list[Segment] = []  # transcribed, waiting for their speakers
        self.last_end = 0.0
        self.merger = SegmentMerger(merge=diarize is not None)
        self.known = dict(diarize.known) if diarize is not None and diarize.known else {}
        self.names: dict[int, str] = {}
        self._named: set[int] = set()
        self.pending: list[SpokenSegment] = []  # final, waiting for the other channels
        self.all: list[SpokenSegment] = []

    @property
    def eof(self) -> bool:
        return self.streams[0].eof

    def read(self) -> int:
        """Read the next piece; returns the samples read."""
        seconds = self.pieces_s[min(self.pieces, len(self.pieces_s) - 1)]
        self.pieces += 1
        want = seconds * RATE
        try:
            pcm = self.source.read(want)
        except AudioInputError as exc:
            self.error, pcm = exc, np.zeros((0, len(self.streams)), np.int16)
        eof = self.error is not None or len(pcm) < want
        if eof and self.error is None:
            try:  # a source ends short at a damage, and raises it on the read after
                self.source.read(1)
            except AudioInputError as exc:
                self.error = exc
        if eof:
            self.source.close()
        if len(self.streams) == 1 and pcm.ndim == 2 and pcm.shape[1] > 1:
            pcm = to_mono(pcm)  # (a source of several channels, mixed)
        for c, stream in enumerate(self.streams):
            stream.feed(np.ascontiguousarray(pcm[:, c]) if pcm.ndim == 2 else pcm, eof)
        return len(pcm)

    def settle(self) -> list[SpokenSegment]:
        """After the round's ASR: speakers, then the segments now final, in order."""
        if self.split:
            for c, stream in enumerate(self.streams):
                self.pending += [SpokenSegment(s.start_s, s.end_s, c, s.text, s.words)
                                 for s in stream.done if s.text]
        else:
            (stream,) = self.streams
            new = [s for s in stream.done if s.text]
            if self.diarizer is None:
                self.pending += [SpokenSegment(s.start_s, s.end_s, -1, s.text, s.words) for s in new]
            else:
                self._speakers(stream, new)
        for stream in self.streams:
            stream.done = []
        mark = min(s.watermark() for s in self.streams) / RATE
        self.pending.sort(key=lambda s: (s.start, s.speaker))
        ready = [s for s in self.pending if s.start < mark]
        self.pending = self.pending[len(ready):]
        out = []
        for s in ready:
            out += self.merger.add(s)
        if self.eof:
            out += self.merger.finish()
        for s in out:
            if s.speaker not in self._named:
                self._named.add(s.speaker)
                self._name(s.speaker)
        self.all += out
        return out

    def _name(self, number: int) -> None:
        """Speaker ``number`` takes the name of the known voice nearest it, if one is near."""
        if not self.known or self.diarizer is None:
            return
        free = [n for n in self.known if n not in self.names.values()]
        if not free:
            return
        centre = self.diarizer.centroid(self.merger.raw(number))
        distance = {n: 1.0 - float(self.known[n] @ centre) for n in free}
        best = min(distance, key=distance.__getitem__)
        if distance[best] < self.diarizer.threshold:
            self.names[number] = best

    def _speakers(self, stream: _Stream, new: list[Segment]) -> None:
        assert self.diarizer is not None
        if stream.speech or stream.eof:
            turns = self.diarizer.add(stream.tape, stream.base, stream.speech, final=stream.eof)
            stream.speech = []
            timed = [(t.start / RATE, t.end / RATE, t.speaker) for t in turns]
            self.turns += timed
            self.all_turns += timed
        self.waiting += new
        if self.diarizer.count == 0 and not stream.eof:
            return  # the first clustering is still gathering speech
        for seg in self.waiting:
            parts = split_at_speakers(seg, self.turns, self.last_end)
            if parts:
                self.last_end = parts[-1].end
            self.pending += parts
        self.waiting = []
        if self.turns:  # turns well before what is still to come are needed no more
            horizon = stream.watermark() / RATE - 60.0
            self.turns = [t for t in self.turns if t[1] >= horizon] or self.turns[-1:]

    def done(self) -> FileDone:
        for s in self.streams:
            s.result.segments.sort(key=lambda seg: seg.start)
        return FileDone(self.index, self.name, self.streams[0].end / RATE, self.all,
                        [s.result for s in self.streams], self.error,
                        [(a, b, self.merger.number(who)) for a, b, who in self.all_turns]
                        if self.diarizer is not None else None,
                        dict(self.names))


def transcribe_progressively(
    sources: Sequence[AudioSource] | Iterator[AudioSource],
    backend: ASRBackend,
    vad: object,
    batch_size: int = 16,
    max_chunk_s: float = 28.0,
    split: bool = False,
    diarize: DiarizeWith | None = None,
    vad_threads: int = 1,
    on_progress: Callable[[float], None] | None = None,
    round_s: float = ROUND_S,
    pieces_s: Sequence[int] = PIECES_S,
) -> Iterator[FileSegments | FileDone]:
    """Transcribe ``sources`` (see the module): yields :class:`FileSegments` as segments become
    final and one :class:`FileDone` per file as it finishes — a short file may finish before a
    long one opened earlier (``index`` is the source's place). ``on_progress``
    gets seconds of audio finished. ``pieces_s``: whole minutes (the VAD's pieces), except to
    study the pieces' effect (any length works; the VAD's answers then differ a little)."""
    todo = iter(sources)
    active: list[_File] = []
    index = 0
    more = True
    while active or more:
        got = sum(f.read() for f in active)
        while more and got < round_s * RATE:
            src = next(todo, None)
            if src is None:
                more = False
                break
            f = _File(index, src, max_chunk_s, split, diarize, pieces_s)
            index += 1
            active.append(f)
            got += f.read()
        streams = [s for f in active for s in f.streams]
        _vad(streams, vad, vad_threads)
        _asr(streams, backend, batch_size, got / RATE, on_progress)
        finished = []
        for f in active:
            ready = f.settle()
            if ready:
                yield FileSegments(f.index, f.name, ready, dict(f.names))
            for s in f.streams:
                s.trim()
            if f.eof:
                finished.append(f)
        for f in finished:
            active.remove(f)
            yield f.done()


def transcribe_files(
    audios: Sequence[tuple[str, np.ndarray]],
    backend: ASRBackend,
    vad: object,
    batch_size: int = 16,
    max_chunk_s: float = 28.0,
    on_progress: Callable[[float], None] | None = None,
    vad_threads: int = 1,
) -> list[FileResult]:
    """Transcribe whole files held in memory (float32 in [-1, 1], or int16: a long file then
    costs half the memory, each chunk converted when it is read), each one result, in order:
    :func:`transcribe_progressively` over them, collected (``voxline transcribe --ray``'s
    engine actors, and benchmarks)."""
    sources = [ArraySource(name, [audio]) for name, audio in audios]
    done = [e for e in transcribe_progressively(sources, backend, vad, batch_size, max_chunk_s,
                                                vad_threads=vad_threads, on_progress=on_progress)
            if isinstance(e, FileDone)]
    return [r for d in sorted(done, key=lambda d: d.index) for r in d.results]


def _vad(streams: list[_Stream], vad: object, threads: int) -> None:
    jobs = [(s, piece, skip) for s in streams for piece, skip in s.vad_pieces()]
    probs = pieces_probs([piece for _, piece, _ in jobs], vad, threads)
    for s in streams:
        mine = [(p, skip) for (owner, _, skip), p in zip(jobs, probs, strict=True) if owner is s]
        s.add_probs([p for p, _ in mine], [k for _, k in mine])


def _asr(streams: list[_Stream], backend: ASRBackend, batch_size: int, seconds: float,
         on_progress: Callable[[float], None] | None) -> None:
    jobs = [(s, a, b) for s in streams for a, b in s.chunks]
    order = sorted(range(len(jobs)), key=lambda j: jobs[j][2] - jobs[j][1], reverse=True)
    speech = sum(b - a for _, a, b in jobs)
    done = 0.0
    for at in range(0, len(order), max(1, batch_size)):
        part = [jobs[j] for j in order[at : at + batch_size]]
        bufs = [_as_float(s.audio(a, b)) for s, a, b in part]
        for (s, a, b), hyp in zip(part, backend.transcribe_batch(bufs), strict=True):
            s.transcribed(a, b, hyp)
        if on_progress is not None:
            share = sum(b - a for _, a, b in part) / speech
            done += seconds * share
            on_progress(seconds * share)
    if on_progress is not None and seconds - done > 1e-9:
        on_progress(seconds - done)
    for s in streams:
        s.round_done()


async def transcribe_with_engine(
    engine: Submits,
    slot: Slot,
    pcm: np.ndarray,
    vad: object,
    pool: Executor,
    diarize: DiarizeWith | None = None,
    max_chunk_s: float = MAX_CHUNK_S,
    on_segments: Callable[[list[SpokenSegment], dict[int, str]], None] | None = None,
) -> FileDone:
    """One upload (int16 ``pcm``) the same way, its chunks through the shared engine on
    ``slot`` (``engine.max_batch`` at a time, so the float copies alive stay bounded); the VAD
    and the speaker embeddings run on ``pool``, never on the event loop. ``on_segments`` gets
    the segments of each piece as they become final, and the known voices' names so far."""
    loop = asyncio.get_running_loop()
    f = _File(0, ArraySource("upload", [pcm]), max_chunk_s, False, diarize, PIECES_S)
    (s,) = f.streams
    while True:
        f.read()
        await loop.run_in_executor(pool, _vad, f.streams, vad, 1)
        chunks = s.chunks
        for wave_at in range(0, len(chunks), engine.max_batch):
            wave = chunks[wave_at : wave_at + engine.max_batch]
            # submitted back to back, so the engine's window sees the whole wave as one batch
            futures = [engine.submit(slot, _as_float(s.audio(a, b)), final=True) for a, b in wave]
            for (a, b), fut in zip(wave, futures, strict=True):
                hyp = await fut
                if hyp is None:  # the slot was released: the client went away
                    raise asyncio.CancelledError
                s.transcribed(a, b, hyp)
        s.round_done()
        ready = await loop.run_in_executor(pool, f.settle)  # (speaker embeddings)
        s.trim()
        if ready and on_segments is not None:
            on_segments(ready, dict(f.names))
        if f.eof:
            return f.done()


def _as_float(pcm: np.ndarray) -> np.ndarray:
    return int16_to_float(pcm) if pcm.dtype == np.int16 else pcm
