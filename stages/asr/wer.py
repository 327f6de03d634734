"""Word error rate with the normalisation our benchmarks use: lower case, punctuation removed,
hyphens as spaces, a few spoken forms unified ("mr" → "mister", digits 0–10 as words)."""

from __future__ import annotations

import re

_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
_SUBS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "ok": "okay"}
_SUBS.update({str(i): w for i, w in enumerate(_NUMBERS)})


def normalize(text: str) -> list[str]:
    t = text.lower().replace("-", " ").replace("’", "'")
    t = re.sub(r"[^a-z0-9' ]+", " ", t)
    words = [w.strip("'") for w in t.split()]
    return [_SUBS.get(w, w) for w in words if w]


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(ref: str, hyp: str) -> float:
    """Errors / reference words of one pair (1.0 when the reference is empty and hyp is not)."""
    r, h = normalize(ref), normalize(hyp)
    if not r:
        return 0.0 if not h else 1.0
    return edit_distance(r, h) / len(r)


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    """Total errors over total reference words across (reference, hypothesis) pairs."""
    errors = words = 0
    for ref, hyp in pairs:
        r = normalize(ref)
        errors += edit_distance(r, normalize(hyp))
        words += len(r)
    return errors / max(words, 1)
