"""Turns a stream of LLM tokens into speakable chunks for the TTS.

The first chunk of a reply may end at a clause boundary (comma, semicolon, colon, dash) once it
holds enough words, so the caller hears the agent sooner; later chunks end at sentences.
"""

from __future__ import annotations

import re

_TERMINATORS = ".!?…"
_CLOSERS = "\"')]}”’»"
_OPENERS = "\"'([{“‘«"
_CLAUSE_MARKS = ",;:"
_DASHES = "—–"
# Words a long first chunk is best cut before ("I think | that we should ...").
_CONJUNCTIONS = frozenset(
    {"and", "but", "or", "so", "because", "that", "which", "when", "while", "if", "then", "to"}
)
# Words whose trailing period does not end a sentence ("Mr. Smith", "e.g. this").
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "approx", "dept"}
    | {"fig", "inc", "ltd", "corp", "mt", "ave", "blvd"}
)


class SentenceAggregator:
    """Feed it LLM text deltas; it returns the chunks that are complete.

    A boundary is decided only once the character after it is known (``3.`` may become
    ``3.5``), so a chunk leaves one delta after its final punctuation. ``flush`` returns what
    is left at the end of the reply and readies the aggregator for the next one.
    """

    def __init__(self, min_first_chunk_words: int = 3, max_first_chunk_words: int = 0) -> None:
        self.min_first_chunk_words = min_first_chunk_words
        self.max_first_chunk_words = max_first_chunk_words
        self._buf = ""
        self._first = True

    def feed(self, text: str) -> list[str]:
        self._buf += text
        chunks: list[str] = []
        while (cut := self._find_cut()) is not None:
            chunk = self._buf[:cut].strip()
            self._buf = self._buf[cut:]
            if chunk:
                chunks.append(chunk)
                self._first = False
        return chunks

    def flush(self) -> str | None:
        rest = self._buf.strip()
        self._buf = ""
        self._first = True
        return rest or None

    def _find_cut(self) -> int | None:
        buf = self._buf
        n = len(buf)
        word_cut = self._word_cut(buf) if self._first and self.max_first_chunk_words else None
        for i, ch in enumerate(buf):
            if word_cut is not None and i >= word_cut:
                return word_cut  # the first chunk's word limit comes before any boundary
            if ch == "\n":
                return i + 1
            if ch in _TERMINATORS:
                j = i + 1
                while j < n and (buf[j] in _TERMINATORS or buf[j] in _CLOSERS):
                    j += 1
                if j == n:
                    return None  # the next delta decides
                if not buf[j].isspace():
                    continue  # "3.5", "example.com", "e.g.x"
                if ch == "." and _is_abbreviation(buf, i):
                    continue
                return j
            if self._first and self._is_clause_mark(buf, i):
                if i + 1 == n and ch not in _DASHES:
                    return None
                if (ch in _DASHES or buf[i + 1].isspace()) and self._enough_words(buf[:i]):
                    return i + 1
        return word_cut

    def _word_cut(self, buf: str) -> int | None:
        """The first chunk has no boundary yet but ``max_first_chunk_words`` complete words:
        cut before a conjunction if one follows the minimum, else after the last of them.
        Time to first audio grows with the first chunk's length (the TTS synthesizes a chunk at
        a time), so a long first sentence is not waited for."""
        words = [m for m in re.finditer(r"\S+", buf) if m.end() < len(buf)]  # complete words
        if len(words) < self.max_first_chunk_words:
            return None
        for w in words[self.min_first_chunk_words : self.max_first_chunk_words]:
            if w.group().lower() in _CONJUNCTIONS:
                return w.start()
        return words[self.max_first_chunk_words - 1].end()

    @staticmethod
    def _is_clause_mark(buf: str, i: int) -> bool:
        ch = buf[i]
        if ch in _CLAUSE_MARKS or ch in _DASHES:
            return True
        # A hyphen is a dash only between spaces ("well - maybe"), never inside a word.
        return ch == "-" and i > 0 and buf[i - 1] == " "

    def _enough_words(self, text: str) -> bool:
        return len(text.split()) >= self.min_first_chunk_words


def _is_abbreviation(buf: str, dot: int) -> bool:
    start = dot
    while start > 0 and not buf[start - 1].isspace():
        start -= 1
    word = buf[start:dot].lstrip(_OPENERS)
    if len(word) == 1 and word.isalpha() and word.isupper():
        return True  # an initial: "J. R. R. Tolkien"
    return word.lower() in _ABBREVIATIONS
