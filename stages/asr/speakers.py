"""Who said each piece of a transcript: the two ways a file's transcript gets speakers.

* Channels as speakers (``voxline transcribe --channels split``): each channel of a call
  recording was transcribed on its own; its segments belong to that channel's speaker, and the
  channels' segments are interleaved in time.
* Diarization (``--diarize``): the transcript's chunks were cut at VAD pauses, not at speaker
  changes, so each chunk is split at its words: a word belongs to the speaker whose turn covers
  its middle (the nearest turn if none does), and a run of words of one speaker is a segment.
  A chunk without word times goes whole to the speaker who talks most of it.

Times are seconds from the start of the file; speakers are numbers: the channel's, or in order
of first speech.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.audio import RATE
from stages.asr.backend import Word
from stages.asr.cutting import Segment


class Turn(Protocol):
    """A stretch of one speaker, in samples (``stages.speaker.SpeakerTurn``)."""

    start: int
    end: int
    speaker: int


@dataclass(slots=True, frozen=True)
class SpokenSegment:
    start: float
    end: float
    speaker: int
    text: str
    words: tuple[Word, ...] = ()  # times in seconds from the start of the file


def interleave_channels(channels: Sequence[Sequence[Segment]]) -> list[SpokenSegment]:
    """Channel ``i``'s segments as speaker ``i``'s (the channel is the speaker, whoever talks
    first), all of them in order of start (a tie goes to the lower channel)."""
    out = [SpokenSegment(t.start_s, t.end_s, ch, t.text, t.words)
           for ch, segs in enumerate(channels) for t in segs if t.text]
    out.sort(key=lambda s: (s.start, s.speaker))
    return out


def assign_speakers(chunks: Sequence[Segment], turns: Sequence[Turn]) -> list[SpokenSegment]:
    """Split each chunk at the speaker changes its words fall on (see the module)."""
    return assign_speakers_and_turns(chunks, turns)[0]


def assign_speakers_and_turns(
    chunks: Sequence[Segment], turns: Sequence[Turn]
) -> tuple[list[SpokenSegment], list[tuple[float, float, int]]]:
    """:func:`assign_speakers`, and the turns (start s, end s, speaker) numbered as the
    segments are."""
    spans = sorted((t.start / RATE, t.end / RATE, t.speaker) for t in turns)
    out: list[SpokenSegment] = []
    for seg in sorted(chunks, key=lambda c: c.start):
        out += split_at_speakers(seg, spans, out[-1].end if out else 0.0)
    merger = SegmentMerger()
    segments = [m for s in out for m in merger.add(s)] + merger.finish()
    return segments, [(a, b, merger.number(who)) for a, b, who in spans]


def split_at_speakers(seg: Segment, spans: Sequence[tuple[float, float, int]],
                      after: float) -> list[SpokenSegment]:
    """One chunk's segments, split where its words change speaker; ``spans`` are (start s,
    end s, speaker) turns in order, ``after`` is where the segment before it ends."""
    if not seg.text:
        return []
    if not seg.words or not spans:
        who = _most_of(spans, seg.start_s, seg.end_s)
        return [SpokenSegment(seg.start_s, seg.end_s, who, seg.text, seg.words)]
    starts = [a for a, _, _ in spans]
    out: list[SpokenSegment] = []
    run: list[Word] = []
    run_speaker = -1
    for w in seg.words:
        who = _speaker_at(spans, starts, (w.start + w.end) / 2)
        if run and who != run_speaker:
            out.append(_from_words(run, run_speaker, seg, out[-1].end if out else after))
            run = []
        run.append(w)
        run_speaker = who
    if run:
        out.append(_from_words(run, run_speaker, seg, out[-1].end if out else after))
    return out


class SegmentMerger:
    """Segments in order in, segments out with neighbours of one speaker less than a second
    apart joined (``merge``) and the speakers numbered 0, 1, ... in order of their first
    segment; each comes out once the one after it shows it is complete (or at :meth:`finish`).
    Without ``merge`` segments pass straight through, their speakers as they are."""

    def __init__(self, merge: bool = True) -> None:
        self.merge = merge
        self._held: SpokenSegment | None = None
        self._order: dict[int, int] = {}

    def add(self, s: SpokenSegment) -> list[SpokenSegment]:
        if not self.merge:
            return [s]
        last = self._held
        if last is not None and last.speaker == s.speaker and s.start - last.end < 1.0 \
                and last.words and s.words:
            self._held = SpokenSegment(last.start, max(last.end, s.end), s.speaker,
                                       f"{last.text} {s.text}", last.words + s.words)
            return []
        self._held = s
        return [self._numbered(last)] if last is not None else []

    def finish(self) -> list[SpokenSegment]:
        last, self._held = self._held, None
        return [self._numbered(last)] if last is not None else []

    def _numbered(self, s: SpokenSegment) -> SpokenSegment:
        who = self._order.setdefault(s.speaker, len(self._order))
        return SpokenSegment(s.start, s.end, who, s.text, s.words)

    def number(self, raw: int) -> int:
        """The number speaker ``raw`` has (or gets, if it has had no segment yet)."""
        return self._order.setdefault(raw, len(self._order))

    def raw(self, number: int) -> int:
        """The speaker given out as ``number``, as it came in."""
        return next(raw for raw, n in self._order.items() if n == number)


def _from_words(words: list[Word], speaker: int, seg: Segment, after: float) -> SpokenSegment:
    """A segment of a run of words: it spans them, within its chunk, after the one before."""
    start = max(min(words[0].start, seg.end_s), seg.start_s, after)
    end = min(max(words[-1].end, start), seg.end_s)
    return SpokenSegment(start, end, speaker, _joined(words), tuple(words))


def _joined(words: list[Word]) -> str:
    return " ".join(w.text.strip() for w in words if w.text.strip())


def _speaker_at(spans: Sequence[tuple[float, float, int]], starts: list[float], t: float) -> int:
    """The speaker whose turn holds time ``t``, else the nearest turn's (the earlier of two
    equally near); ``spans`` sorted and apart, ``starts`` their starts."""
    i = bisect_right(starts, t) - 1
    if i >= 0 and t < spans[i][1]:
        return spans[i][2]
    best, gap = spans[0][2], float("inf")
    for j in (i, i + 1):
        if 0 <= j < len(spans):
            a, b, who = spans[j]
            d = a - t if t < a else t - b
            if d < gap:
                best, gap = who, d
    return best


def _most_of(spans: list[tuple[float, float, int]], a: float, b: float) -> int:
    if not spans:
        return 0
    talk: dict[int, float] = {}
    for s, e, who in spans:
        talk[who] = talk.get(who, 0.0) + max(0.0, min(b, e) - max(a, s))
    if max(talk.values()) > 0:
        return max(talk, key=talk.__getitem__)
    return _speaker_at(spans, [s for s, _, _ in spans], (a + b) / 2)
