"""The KV-cache bookkeeping of :class:`~stages.llm.local.LocalLLM`, without a model: how much
of a prompt a cache of tokens serves, the paused conversations' saved caches, and the oldest
turns dropped from a history too long for the context."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

# A cached run of tokens is moved into place (a KV shift) only from this length: a chance
# match of a few tokens is not the conversation's kept turns.
MIN_SHIFT_TOKENS = 16
# A saved conversation is loaded when it covers at least this many more prompt tokens than
# the live cache: copying 1,400 tokens' cells in takes ~6 ms, evaluating 8 tokens ~35 ms.
MIN_GAIN_TOKENS = 8


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


@dataclass(slots=True, frozen=True)
class Reuse:
    """How a prompt can use a cache of tokens: the cache's first ``keep`` tokens begin the
    prompt; with ``cut`` > 0 the next ``cut`` cached tokens (turns the history dropped) are
    removed and the ``tail`` tokens after them, shifted down, continue it."""

    keep: int
    cut: int = 0
    tail: int = 0

    @property
    def tokens(self) -> int:
        """Prompt tokens that need no evaluation."""
        return self.keep + self.tail

    @property
    def end(self) -> int:
        """The cache position up to which the cached conversation goes on in the prompt."""
        return self.keep + self.cut + self.tail


def plan_reuse(prompt: np.ndarray, cached: np.ndarray, shift: bool) -> Reuse:
    """The most of ``cached`` that ``prompt`` can use: its common prefix, then, with ``shift``,
    the longest later run of the cache that continues the prompt where the prefix ends."""
    keep = common_prefix(prompt, cached)
    best = Reuse(keep)
    if not shift or keep >= len(prompt) or keep + 1 >= len(cached):
        return best
    rest = prompt[keep:]
    for j in np.flatnonzero(cached[keep + 1 :] == rest[0]) + keep + 1:
        tail = common_prefix(rest, cached[j:])
        if tail > best.tail:
            best = Reuse(keep, int(j) - keep, tail)
    return best if best.tail >= MIN_SHIFT_TOKENS else Reuse(keep)


@dataclass(slots=True, frozen=True)
class PromptStats:
    """How one request's prompt met the KV cache."""

    prompt: int  # tokens in the prompt
    reused: int  # of them found in the cache
    evaluated: int  # of them decoded for this request (prompt - reused)
    restored: bool = False  # the conversation's saved KV cache was loaded first
    shifted: int = 0  # cached tokens of dropped turns cut out, the rest moved down instead


@dataclass(slots=True, frozen=True)
class Prompt:
    """A request's tokens, and where they tell its conversation from another's."""

    tokens: np.ndarray
    turn_start: int  # where its last user message begins (0: the template does not say)
    first_turn_end: int = 0  # in a conversation's first turn, where that message ends


@dataclass(slots=True, eq=False)  # one conversation's copy: compared by identity
class SavedConversation:
    tokens: np.ndarray  # what the KV cache holds, token by token
    state: ctypes.Array[ctypes.c_uint8]  # llama.cpp's copy of the sequence's KV cells
    size: int
    # A prompt that reaches this far into ``tokens`` continues this conversation. Usually the
    # last user message's start: a later request may differ from there on (a prefill on
    # partial words, a discarded speculation, a failed turn), never before. After a complete
    # first turn it is that message's end, since every call's first request reaches its start.
    same_from: int


class SavedConversations:
    """Paused conversations' KV caches in host memory, least recently used dropped first.

    Keyed by content, not by call: a prompt finds its conversation as the saved cache sharing
    the most tokens with it, so the caller needs no conversation id, and a wrong pick (two
    calls that began alike) costs evaluation time, never a wrong reply.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.items: list[SavedConversation] = []  # oldest first

    @property
    def nbytes(self) -> int:
        return sum(s.size for s in self.items)

    def best(self, prompt: np.ndarray, shift: bool) -> tuple[SavedConversation, Reuse] | None:
        found = None
        for saved in self.items:
            reuse = plan_reuse(prompt, saved.tokens, shift)
            if found is None or reuse.tokens > found[1].tokens:
                found = (saved, reuse)
        return found

    def take(self, saved: SavedConversation) -> None:
        self.items.remove(saved)

    def put(self, saved: SavedConversation, shift: bool) -> None:
        # An older copy of the same conversation is stale: the new one replaces it.
        self.items = [
            old for old in self.items
            if plan_reuse(saved.tokens, old.tokens, shift).end < old.same_from
        ]
        if saved.size > self.budget:
            return
        self.items.append(saved)
        total = self.nbytes
        while total > self.budget:
            total -= self.items.pop(0).size

    def clear(self) -> None:
        self.items.clear()


def drop_old_turns(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """``messages`` without the oldest half of the turns before the last (the system prompt
    stays); None when only the last turn is left."""
    head = 1 if messages and messages[0]["role"] == "system" else 0
    starts = [i for i in range(head, len(messages)) if messages[i]["role"] == "user"]
    if len(messages) > head and (not starts or starts[0] > head):
        starts.insert(0, head)
    if len(starts) < 2:
        return None
    return messages[:head] + messages[starts[len(starts) // 2] :]
