"""Who said what, when, written out: a transcript's segments (speaker, times, text, words) as
JSON, JSON lines, SRT and WebVTT subtitles, and NIST RTTM speaker turns for diarization scoring.

Times are seconds from the start of the recording. The writers are pure functions of the
segments, so a command or a server streams them as it likes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LINE_CHARS = 42  # the usual subtitle line: two of these fit the width of a screen
CUE_LINES = 2
CUE_MAX_S = 7.0  # a longer cue is read before it goes; split at a word when words are known
CUE_PAUSE_S = 1.0  # with word times, a pause this long ends a cue: no text over silence
_SENTENCE_END = (".", "?", "!", "…", '."', '?"', '!"')
_CLAUSE_END = (",", ";", ":", "—")
UNKNOWN_SPEAKER = "unknown"  # RTTM needs a name where the transcript has none
TURN_GAP_S = 0.5  # RTTM: one speaker's segments this close together are one turn
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class CaptionWord:
    text: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class CaptionSegment:
    """A stretch of one speaker's speech; ``speaker`` is None when nobody labelled it."""

    start: float
    end: float
    text: str
    speaker: str | None = None
    words: tuple[CaptionWord, ...] = ()


# --- JSON ---------------------------------------------------------------------------------------
def segment_dict(segment: CaptionSegment) -> dict:
    """One segment as the JSON outputs write it (times in seconds, to the millisecond)."""
    return {
        "start": _seconds(segment.start),
        "end": _seconds(segment.end),
        "speaker": segment.speaker,
        "text": segment.text,
        "words": [
            {"word": w.text, "start": _seconds(w.start), "end": _seconds(w.end)}
            for w in segment.words
        ],
    }


def to_json(segments: Iterable[CaptionSegment], *, file: str, duration_s: float) -> dict:
    """The whole transcript: its text, its speakers in the order they first speak, and its
    segments in time order."""
    ordered = _in_order(segments)
    speakers = list(dict.fromkeys(s.speaker for s in ordered if s.speaker is not None))
    return {
        "file": file,
        "duration_s": _seconds(duration_s),
        "text": " ".join(t for s in ordered if (t := s.text.strip())),
        "speakers": speakers,
        "segments": [segment_dict(s) for s in ordered],
    }


def json_line(segment: CaptionSegment, **fields: object) -> str:
    """One segment as one line of JSON (no newline at the end), for streaming results as they
    finish, after ``fields`` (``voxline transcribe --json``: its type and file); characters
    outside ASCII are written as themselves."""
    return json.dumps({**fields, **segment_dict(segment)}, ensure_ascii=False,
                      separators=(",", ":"))


# --- subtitles ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Cue:
    """One subtitle on screen: its lines, already wrapped, and who speaks them."""

    start: float
    end: float
    lines: tuple[str, ...]
    speaker: str | None


def cues(
    segments: Iterable[CaptionSegment], line_chars: int = LINE_CHARS, max_lines: int = CUE_LINES,
    max_s: float = CUE_MAX_S,
) -> list[Cue]:
    """Segments cut into cues of at most ``max_lines`` lines of about ``line_chars`` characters
    (a word longer than a line gets a line of its own), the speaker's name counted on the
    first line. A segment with words is cut between words, each cue timed from its first
    word's start to its last word's end, and no cue longer than ``max_s``; one without words is
    cut between the words of its text, its time shared out by their length in characters.
    Segments with no text make no cue."""
    out: list[Cue] = []
    for seg in _in_order(segments):
        speaker = _one_line(seg.speaker or "") or None
        prefix = _speaker_prefix(speaker)
        if seg.words:
            timed = [(t, w.start, w.end) for w in seg.words if (t := _one_line(w.text))]
            for group in _groups([t for t, _, _ in timed], prefix, line_chars, max_lines,
                                 [(a, b) for _, a, b in timed], max_s):
                first, last = timed[group[0]], timed[group[-1]]
                text = [timed[i][0] for i in group]
                out.append(Cue(first[1], max(first[1], last[2]),
                               _wrap(text, prefix, line_chars, max_lines), speaker))
            continue
        texts = seg.text.split()
        total = sum(len(t) + 1 for t in texts)
        length = max(0.0, seg.end - seg.start)
        done = 0
        for group in _groups(texts, prefix, line_chars, max_lines):
            size = sum(len(texts[i]) + 1 for i in group)
            start = seg.start + length * done / total
            done += size
            out.append(Cue(start, seg.start + length * done / total,
                           _wrap([texts[i] for i in group], prefix, line_chars, max_lines),
                           speaker))
    # overlapping speakers' cues interleave; both formats want them by start time
    return sorted(out, key=lambda c: c.start)


def to_srt(segments: Iterable[CaptionSegment], line_chars: int = LINE_CHARS,
           max_lines: int = CUE_LINES) -> str:
    """SubRip subtitles. SRT has no way to name a speaker, so each cue's first line starts
    with it: ``SPEAKER_1: text``. SRT has no escapes either: a ``-->`` in the text (which a
    reader could take for a timing line) is written ``->``."""
    blocks = []
    for n, cue in enumerate(cues(segments, line_chars, max_lines), 1):
        lines = list(cue.lines)
        lines[0] = _speaker_prefix(cue.speaker) + lines[0]
        text = "\n".join(line.replace("-->", "->") for line in lines)
        blocks.append(f"{n}\n{_clock(cue.start, ',')} --> {_clock(cue.end, ',')}\n{text}\n")
    return "\n".join(blocks)


def to_vtt(segments: Iterable[CaptionSegment], line_chars: int = LINE_CHARS,
           max_lines: int = CUE_LINES) -> str:
    """WebVTT subtitles, each cue's speaker as a voice span (``<v SPEAKER_1>text``) and the
    text escaped (``&``, ``<``, ``>``), which also keeps ``-->`` out of cue text."""
    blocks = ["WEBVTT\n"]
    for n, cue in enumerate(cues(segments, line_chars, max_lines), 1):
        lines = [_vtt_escape(line) for line in cue.lines]
        if cue.speaker:
            lines[0] = f"<v {_vtt_escape(cue.speaker)}>{lines[0]}"
        body = "\n".join(lines)
        blocks.append(f"{n}\n{_clock(cue.start, '.')} --> {_clock(cue.end, '.')}\n{body}\n")
    return "\n".join(blocks)


# --- RTTM ---------------------------------------------------------------------------------------
def turns(
    segments: Iterable[CaptionSegment], max_gap_s: float = TURN_GAP_S
) -> list[tuple[str, float, float]]:
    """Speaker turns ``(speaker, start, end)`` in time order: a speaker's consecutive segments
    merged where they overlap or lie less than ``max_gap_s`` apart with nobody else starting to
    speak in between. Turns of different speakers may overlap (a call recorded one channel per
    side). Segments of no length make no turn; a segment with no speaker is ``unknown``'s."""
    current: dict[str, list[float]] = {}  # each speaker's turn that may still grow
    done: list[tuple[str, float, float]] = []
    for seg in _in_order(segments):
        if seg.end <= seg.start:
            continue
        who = _name(seg.speaker)
        # whoever had stopped before this segment began cannot carry their turn over it
        for other, (a, b) in list(current.items()):
            if other != who and b <= seg.start:
                done.append((other, a, b))
                del current[other]
        turn = current.get(who)
        if turn is not None and seg.start - turn[1] <= max_gap_s:
            turn[1] = max(turn[1], seg.end)
            continue
        if turn is not None:
            done.append((who, turn[0], turn[1]))
        current[who] = [seg.start, seg.end]
    done.extend((who, a, b) for who, (a, b) in current.items())
    return sorted(done, key=lambda t: (t[1], t[2], t[0]))


def to_rttm(segments: Iterable[CaptionSegment], file_id: str,
            max_gap_s: float = TURN_GAP_S) -> str:
    """NIST RTTM: one ``SPEAKER`` line per speaker turn (:func:`turns`), channel 1, onset and
    duration in seconds. Fields are separated by spaces, so whitespace inside the file id or a
    speaker's name becomes ``_``; a segment with no speaker counts as ``unknown``."""
    file_id = _name(file_id)
    return "".join(
        f"SPEAKER {file_id} 1 {start:.3f} {end - start:.3f} <NA> <NA> {who} <NA> <NA>\n"
        for who, start, end in turns(segments, max_gap_s)
    )


# --- internals ----------------------------------------------------------------------------------
def _in_order(segments: Iterable[CaptionSegment]) -> list[CaptionSegment]:
    return sorted(segments, key=lambda s: (s.start, s.end))


def _seconds(t: float) -> float:
    return round(float(t), 3)


def _clock(t: float, comma: str) -> str:
    """``HH:MM:SS,mmm`` (SRT) or ``HH:MM:SS.mmm`` (WebVTT); hours grow past two digits."""
    ms = max(0, round(t * 1000))
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h:02d}:{m:02d}:{s:02d}{comma}{ms:03d}"


def _one_line(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _name(text: str | None) -> str:
    """A name fit for a space-separated field."""
    name = _WHITESPACE.sub("_", text.strip()) if text else ""
    return name or UNKNOWN_SPEAKER


def _speaker_prefix(speaker: str | None) -> str:
    return f"{speaker}: " if speaker else ""


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _fill(texts: Sequence[str], prefix: str, width: int) -> list[str]:
    """Greedy line filling at ``width``; the first line starts after ``prefix``."""
    lines: list[str] = []
    line, used = "", len(prefix)
    for t in texts:
        if line and used + 1 + len(t) > width:
            lines.append(line)
            line, used = t, len(t)
        elif line:
            line, used = f"{line} {t}", used + 1 + len(t)
        else:
            line, used = t, used + len(t)
    if line:
        lines.append(line)
    return lines


def _fits(texts: Sequence[str], prefix: str, width: int, max_lines: int) -> bool:
    return len(_fill(texts, prefix, width)) <= max_lines


def _wrap(texts: Sequence[str], prefix: str, width: int, max_lines: int) -> tuple[str, ...]:
    """The cue's lines, balanced: the narrowest width (up to ``width``) that still needs no
    more lines than the full width does, so two lines come out about equally long."""
    need = len(_fill(texts, prefix, width))
    lo, hi = 1, width
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_fill(texts, prefix, mid)) <= min(need, max_lines):
            hi = mid
        else:
            lo = mid + 1
    return tuple(_fill(texts, prefix, hi))


def _groups(
    texts: Sequence[str], prefix: str, width: int, max_lines: int,
    times: Sequence[tuple[float, float]] | None = None, max_s: float = CUE_MAX_S,
) -> list[list[int]]:
    """Consecutive words grouped into cues: as many as fit ``max_lines`` lines (always at
    least one); a full cue ends after its last sentence or clause if that leaves it at least
    half full. With ``times`` a cue also ends before a pause of ``CUE_PAUSE_S`` and before it
    would last more than ``max_s``."""
    groups: list[list[int]] = []
    group: list[int] = []
    for i in range(len(texts)):
        if group and times is not None and (
            times[i][0] - times[group[-1]][1] >= CUE_PAUSE_S
            or times[i][1] - times[group[0]][0] > max_s
        ):
            groups.append(group)
            group = []
        while group and not _fits([texts[j] for j in [*group, i]], prefix, width, max_lines):
            cut = _clause_end(texts, group)
            groups.append(group[:cut])
            group = group[cut:]
        group.append(i)
    if group:
        groups.append(group)
    return groups


def _clause_end(texts: Sequence[str], group: list[int]) -> int:
    """How many of ``group``'s words a full cue keeps: through its last sentence end, else its
    last clause end, in the second half; else all of them."""
    for marks in (_SENTENCE_END, _CLAUSE_END):
        for k in range(len(group) - 1, len(group) // 2 - 1, -1):
            if texts[group[k]].endswith(marks):
                return k + 1
    return len(group)
