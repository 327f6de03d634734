"""Timed words from Whisper tokens: which tokens make up each word of the text, when each word
starts and ends by the cross-attention alignment (``ctranslate2`` ``Whisper.align``), and the
word edges moved off the silence the alignment smears them over.

Times here count 20-ms steps, the encoder's frame (two log-mel frames of 10 ms); the alignment
reports positions in those steps, and the voiced-frame mask is cut in the same steps.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stages.asr.backend import Word

SAMPLE_RATE = 16_000
STEP_SAMPLES = 320  # one encoder frame: 20 ms
STEP_S = STEP_SAMPLES / SAMPLE_RATE
# A frame under -70 dBFS RMS is digital silence (the padding between recordings, or a
# dithered one), not the room: it never sets the noise floor.
SILENT_DB = -70.0
# Voiced: 12 dB over the noise floor near it (the quietest tenth of the frames that are not
# digital silence, within a second either side of its own second: a mix of recordings, or a
# call whose two lines hiss differently, has no one floor), and never more than 15 dB under the
# loudest frame, so a noisy recording (the test set's worst has a floor of -43 dBFS and speech
# peaks at -20) still has voiced frames. On the clips of tests/speech.py, alone or joined with
# pauses, this puts every first word's start on the step where the clip's energy rises.
OVER_FLOOR_DB = 12.0
UNDER_PEAK_DB = 15.0
FLOOR_PERCENTILE = 10
FLOOR_BLOCK = 50  # steps (1 s) that share one floor
FLOOR_REACH = 1  # blocks on either side that the floor of a block is taken over
# Loud stretches shorter than MIN_SOUND_STEPS are clicks or a noise burst, not speech; quiet
# stretches shorter than MIN_PAUSE_STEPS between voiced ones are a stop's closure or a soft
# syllable, part of speech: only a pause should pull a word's edge in (the alignment already
# places words well inside continuous speech).
MIN_SOUND_STEPS = 2  # 40 ms
MIN_PAUSE_STEPS = 10  # 200 ms


def _byte_level_table() -> dict[str, int]:
    """GPT-2 byte-level BPE spells each byte as one printable character: the printable Latin-1
    bytes as themselves, the other 68 as U+0100 onward in byte order. This is its inverse."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = (b for b in range(256) if b not in table.values())
    table.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return table


BYTE_OF_CHAR = _byte_level_table()


class TokenBytes:
    """Token id → the bytes it stands for, from a ``tokenizers`` byte-level BPE tokenizer;
    cached, since a transcript reuses few of the 50k tokens."""

    def __init__(self, tokenizer: object) -> None:
        self._token = tokenizer.id_to_token  # type: ignore[attr-defined]
        self._cache: dict[int, bytes] = {}

    def __call__(self, token: int) -> bytes:
        piece = self._cache.get(token)
        if piece is None:
            piece = bytes(BYTE_OF_CHAR[c] for c in self._token(token))
            self._cache[token] = piece
        return piece


@dataclass(frozen=True, slots=True)
class TokenWord:
    """One whitespace-separated word of a decoded text and the tokens it came from:
    ``tokens[first:last]``; ``spoken`` ends after the last token with a letter or digit, so a
    trailing full stop (which the alignment places in the pause after the word) is not timed."""

    text: str
    first: int
    last: int
    spoken: int


def split_words(pieces: Sequence[bytes]) -> tuple[str, list[TokenWord]]:
    """The text of the byte pieces (UTF-8, invalid bytes replaced, as the tokenizer decodes)
    and its words, ``text.split()`` exactly. A character whose bytes span several tokens
    starts in the first of them and ends in the last."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chars: list[str] = []
    began: list[int] = []  # the token each character's first byte came from
    ended: list[int] = []  # the token that completed it
    origin = 0  # the token the decoder's buffered bytes began in
    for i, piece in enumerate(pieces):
        if not decoder.getstate()[0]:
            origin = i
        got = decoder.decode(piece, final=i == len(pieces) - 1)
        if got:
            chars.append(got)
            began.extend([origin] + [i] * (len(got) - 1))
            ended.extend([i] * len(got))
            origin = i  # what is still buffered is the tail of this piece
    text = "".join(chars)
    words: list[TokenWord] = []
    at = 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        end = at
        alnum = -1  # the last token that gave this word a letter or digit
        while end < len(text) and not text[end].isspace():
            if text[end].isalnum():
                alnum = ended[end]
            end += 1
        last = ended[end - 1] + 1
        words.append(TokenWord(text[at:end], began[at], last, alnum + 1 if alnum >= 0 else last))
        at = end
    return text, words


def jump_steps(alignments: Sequence[tuple[int, int]], tokens: int) -> np.ndarray:
    """The step at which the alignment path first reaches each text position ``0..tokens``
    (the last one is the end of text): the start of every token, and the end of the last."""
    path = np.asarray(alignments, dtype=np.int64).reshape(-1, 2)
    if not len(path):
        return np.zeros(tokens + 1, np.int64)
    # The path's text positions never decrease (dynamic time warping), so the first visit of
    # each is a sorted search; a position it skipped would take the next one's start.
    first = np.searchsorted(path[:, 0], np.arange(tokens + 1), side="left")
    return path[np.minimum(first, len(path) - 1), 1]


def voiced_steps(audio: np.ndarray) -> np.ndarray:
    """Per 20-ms step of ``audio`` (float32, 16 kHz): whether it is louder than the noise
    around it (see :data:`OVER_FLOOR_DB`)."""
    n = len(audio) // STEP_SAMPLES
    if n == 0:
        return np.zeros(0, bool)
    frames = np.asarray(audio[: n * STEP_SAMPLES], np.float32).reshape(n, STEP_SAMPLES)
    db = 10.0 * np.log10(np.maximum(np.mean(frames * frames, axis=1), 1e-12))
    room = db > SILENT_DB
    ceiling = float(db.max()) - UNDER_PEAK_DB
    threshold = np.full(n, SILENT_DB)
    for at in range(0, n, FLOOR_BLOCK):
        lo = max(0, at - FLOOR_REACH * FLOOR_BLOCK)
        hi = min(n, at + (1 + FLOOR_REACH) * FLOOR_BLOCK)
        near = db[lo:hi][room[lo:hi]]
        if len(near):
            floor = float(np.percentile(near, FLOOR_PERCENTILE))
            threshold[at : at + FLOOR_BLOCK] = max(SILENT_DB, min(floor + OVER_FLOOR_DB, ceiling))
    voiced = db >= threshold
    _drop_runs(voiced, True, MIN_SOUND_STEPS)
    _drop_runs(voiced, False, MIN_PAUSE_STEPS, inner=True)
    return voiced


def _drop_runs(mask: np.ndarray, value: bool, shorter: int, inner: bool = False) -> None:
    """Flip, in place, every run of ``value`` in ``mask`` that is shorter than ``shorter``
    steps; ``inner``: only runs with the other value on both sides."""
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [len(mask)]))
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if mask[a] == value and b - a < shorter and not (inner and (a == 0 or b == len(mask))):
            mask[a:b] = not value


def timed_words(
    words: Sequence[TokenWord], jumps: np.ndarray, voiced: np.ndarray
) -> tuple[Word, ...]:
    """Each word from its first token's start to its last spoken token's end, in seconds, with
    the silent steps at either edge trimmed off; a word with no voiced step keeps the
    alignment's span. Times never decrease from word to word."""
    out = []
    done = 0  # where the previous word ended
    for w in words:
        a = max(int(jumps[w.first]), done)
        b = max(int(jumps[w.spoken]), a)
        if b > a:
            inside = np.flatnonzero(voiced[a:b])
            if len(inside):
                a, b = a + int(inside[0]), a + int(inside[-1]) + 1
        done = b
        out.append(Word(w.text, round(a * STEP_S, 3), round(b * STEP_S, 3)))
    return tuple(out)
