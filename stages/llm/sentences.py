"""Turns a stream of LLM tokens into speakable chunks for the TTS.

The first chunk of a reply may end at a clause boundary (comma, semicolon, colon, dash) once it
holds enough words, so the caller hears the agent sooner. So may the second, within a word limit,
so that its audio comes before the first's short audio has played out: the TTS speaks a chunk
at a time, and a long sentence after a two-word start left the caller in silence (see
``AgentConfig.max_second_chunk_words``). Later chunks end at sentences.
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


# A second chunk's clause cut needs this many words ("for any misunderstanding," is worth a
# synthesis of its own; "but," is not).
SECOND_CHUNK_MIN_WORDS = 3


class SentenceAggregator:
    """Feed it LLM text deltas; it returns the chunks that are complete.

    A boundary is decided only once the character after it is known (``3.`` may become
    ``3.5``), so a chunk leaves one delta after its final punctuation. ``flush`` returns what
    is left at the end of the reply and readies the aggregator for the next one.
    """

    def __init__(self, min_first_chunk_words: int = 3, max_first_chunk_words: int = 0,
                 max_second_chunk_words: int = 0) -> None:
        self.min_first_chunk_words = min_first_chunk_words
        self.max_first_chunk_words = max_first_chunk_words
        self.max_second_chunk_words = max_second_chunk_words
        self._buf = ""
        self._cut = 0  # chunks cut from this reply so far

    def feed(self, text: str) -> list[str]:
        self._buf += text
        chunks: list[str] = []
        while (cut := self._find_cut()) is not None:
            chunk = self._buf[:cut].strip()
            self._buf = self._buf[cut:]
            if chunk:
                chunks.append(chunk)
                self._cut += 1
        return chunks

    def flush(self) -> str | None:
        rest = self._buf.strip()
        self._buf = ""
        self._cut = 0
        return rest or None

    def _limits(self) -> tuple[int, int] | None:
        """The next chunk's (fewest words before a clause may end it, most words before it is
        cut at a word; 0: never), or None where only a sentence's end ends it."""
        if self._cut == 0:
            return self.min_first_chunk_words, self.max_first_chunk_words
        if self._cut == 1 and self.max_second_chunk_words:
            return min(SECOND_CHUNK_MIN_WORDS, self.max_second_chunk_words), \
                self.max_second_chunk_words
        return None

    def _find_cut(self) -> int | None:
        buf = self._buf
        n = len(buf)
        limits = self._limits()
        word_cut = self._word_cut(buf, *limits) if limits and limits[1] else None
        for i, ch in enumerate(buf):
            if word_cut is not None and i >= word_cut:
                return word_cut  # the chunk's word limit comes before any boundary
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
            if limits and self._is_clause_mark(buf, i):
                if i + 1 == n and ch not in _DASHES:
                    return None
                if (ch in _DASHES or buf[i + 1].isspace()) and len(buf[:i].split()) >= limits[0]:
                    return i + 1
        return word_cut

    @staticmethod
    def _word_cut(buf: str, least: int, most: int) -> int | None:
        """The chunk has no boundary yet but ``most`` complete words: cut before a conjunction
        if one follows the ``least``-th word, else after the last of them. Time to first audio
        grows with the first chunk's length (the TTS synthesizes a chunk at a time), so a long
        first sentence is not waited for; nor is a long second one, while the first's audio
        plays."""
        words = [m for m in re.finditer(r"\S+", buf) if m.end() < len(buf)]  # complete words
        if len(words) < most:
            return None
        for w in words[least:most]:
            if w.group().lower() in _CONJUNCTIONS:
                return w.start()
        return words[most - 1].end()

    @staticmethod
    def _is_clause_mark(buf: str, i: int) -> bool:
        ch = buf[i]
        if ch in _CLAUSE_MARKS or ch in _DASHES:
            return True
        # A hyphen is a dash only between spaces ("well - maybe"), never inside a word.
        return ch == "-" and i > 0 and buf[i - 1] == " "


def _is_abbreviation(buf: str, dot: int) -> bool:
    start = dot
    while start > 0 and not buf[start - 1].isspace():
        start -= 1
    word = buf[start:dot].lstrip(_OPENERS)
    if len(word) == 1 and word.isalpha() and word.isupper():
        return True  # an initial: "J. R. R. Tolkien"
    return word.lower() in _ABBREVIATIONS


class RepeatWatch:
    """A reply's chunks by their words, case and punctuation aside: ``again(chunk)`` is True
    when the chunk would say again what the reply has said — its words were a chunk or a whole
    sentence of the reply already, or, two words or more, they are the words just said. A
    small model caught in a loop ("I'm sorry, I'm sorry. I'm sorry. ..."; the caller's words
    echoed twice) is stopped by the first repeat, wherever the chunks were cut. A chunk of one
    word may come twice ("No, no."), not three times."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, ...], int] = {}  # chunks' and sentences' words: times said
        self._said: list[str] = []  # every word said, in order
        self._sentence = 0  # where the sentence being said begins in ``_said``

    def again(self, chunk: str) -> bool:
        words = tuple(_WORD.findall(chunk.lower().replace("’", "'")))
        if not words:
            return False
        n = len(words)
        if self._seen.get(words, 0) >= (2 if n == 1 else 1):
            return True
        if n >= 2 and tuple(self._said[-n:]) == words:
            return True
        self._seen[words] = self._seen.get(words, 0) + 1
        self._said.extend(words)
        if chunk.rstrip(_CLOSERS).endswith(tuple(_TERMINATORS)):  # the chunk ends a sentence
            sentence = tuple(self._said[self._sentence:])
            if sentence != words:
                self._seen[sentence] = self._seen.get(sentence, 0) + 1
            self._sentence = len(self._said)
        return False


_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
