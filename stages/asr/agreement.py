"""Local agreement for streaming partials: the words two consecutive hypotheses agree on are
committed, and every later partial starts with what was committed, so it never flickers back."""

from __future__ import annotations

import re

_NOT_WORD = re.compile(r"[^\w']+")
# How far (in words) the end of the committed prefix is looked for around its expected place in
# a new hypothesis, when the model inserted or dropped a word inside the committed part.
_ALIGN_SLACK = 2


def _key(word: str) -> str:
    """A word as agreement compares it: case and punctuation do not count ("Home." == "home")."""
    return _NOT_WORD.sub("", word.lower())


class LocalAgreement:
    """Commits the longest word prefix on which the last two hypotheses agree.

    ``update`` takes the newest hypothesis of the growing utterance and returns the partial to
    show: the committed words followed by the rest of the newest hypothesis, and how many of its
    leading characters are stable (the committed text). The committed prefix only grows.
    """

    __slots__ = ("_committed", "_keys", "_previous_tail", "committed_text")

    def __init__(self) -> None:
        self._committed: list[str] = []
        self._keys: list[str] = []
        self._previous_tail: list[str] = []  # keys of the last hypothesis past the committed part
        self.committed_text = ""

    def reset(self) -> None:
        self._committed.clear()
        self._keys.clear()
        self._previous_tail = []
        self.committed_text = ""

    def update(self, hypothesis: str) -> tuple[str, int]:
        """The partial to show for ``hypothesis`` and its number of stable characters."""
        words = hypothesis.split()
        tail = words[self._tail_start(words) :]
        tail_keys = [_key(w) for w in tail]
        agreed = 0
        for a, b in zip(self._previous_tail, tail_keys, strict=False):
            if a != b:
                break
            agreed += 1
        if agreed:
            self._committed.extend(tail[:agreed])
            self._keys.extend(tail_keys[:agreed])
            self.committed_text = " ".join(self._committed)
            tail, tail_keys = tail[agreed:], tail_keys[agreed:]
        self._previous_tail = tail_keys
        text = " ".join(self._committed + tail)
        return text, len(self.committed_text)

    def _tail_start(self, words: list[str]) -> int:
        """Where the words after the committed prefix begin in ``words``.

        Usually right after as many words as were committed; if the hypothesis gained or lost a
        word inside the committed part, the end of that part is found by its last words.
        """
        n = len(self._keys)
        if n == 0:
            return 0
        keys = [_key(w) for w in words[: n + _ALIGN_SLACK]]
        if keys[:n] == self._keys:
            return n
        last = self._keys[-2:]
        for shift in sorted(range(-_ALIGN_SLACK, _ALIGN_SLACK + 1), key=abs):
            end = n + shift
            if len(last) <= end <= len(keys) and keys[end - len(last) : end] == last:
                return end
        return min(n, len(words))
