"""The KV-cache bookkeeping without a model: what of a cache a prompt reuses, the saved
conversations' store, and the oldest turns dropped from a history too long for the context."""

from __future__ import annotations

import ctypes

import numpy as np

from stages.llm.kv_reuse import (
    Reuse,
    SavedConversation,
    SavedConversations,
    common_prefix,
    drop_old_turns,
    plan_reuse,
)


def ids(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.intc)


def test_plan_reuse_finds_the_prefix_and_the_kept_turns_after_a_drop() -> None:
    system, dropped, kept = list(range(10)), list(range(100, 140)), list(range(200, 220))
    cached = ids(*system, *dropped, *kept, 7, 7)
    prompt = ids(*system, *kept, 300, 301)
    assert plan_reuse(prompt, cached, shift=False) == Reuse(10)
    plan = plan_reuse(prompt, cached, shift=True)
    assert plan == Reuse(10, cut=40, tail=20) and (plan.tokens, plan.end) == (30, 70)
    # A short chance match is not worth a shift.
    assert plan_reuse(ids(*system, 200, 201, 5), cached, shift=True) == Reuse(10)
    assert common_prefix(ids(1, 2, 3), ids(1, 2)) == 2


def test_drop_old_turns_keeps_the_system_prompt_and_the_newer_half() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "Hello!"}]
    for i in range(3):
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    messages.append({"role": "user", "content": "now"})
    shorter = drop_old_turns(messages)
    assert shorter is not None
    assert [m["content"] for m in shorter] == ["S", "q1", "a1", "q2", "a2", "now"]
    assert drop_old_turns([{"role": "system", "content": "S"}, {"role": "user", "content": "x"}]) is None


def saved(tokens: list[int], size: int, same_from: int) -> SavedConversation:
    return SavedConversation(ids(*tokens), (ctypes.c_uint8 * 1)(), size, same_from)


def test_saved_conversations_replace_their_older_copy_and_keep_to_the_budget() -> None:
    store = SavedConversations(budget_bytes=100)
    a1 = saved([1, 2, 3, 10, 11], 30, same_from=5)  # a first turn, its message at 3..5
    b = saved([1, 2, 3, 20, 21], 30, same_from=5)
    store.put(a1, shift=False)
    store.put(b, shift=False)
    a2 = saved([1, 2, 3, 10, 11, 12, 13], 40, same_from=5)  # the same call, a turn later
    store.put(a2, shift=False)
    assert store.items == [b, a2]
    found = store.best(ids(1, 2, 3, 20, 21, 22), shift=False)
    assert found is not None and found[0] is b and found[1].tokens == 5
    store.put(saved([9, 9], 50, same_from=1), shift=False)  # over budget: the oldest goes
    assert store.nbytes <= 100 and b not in store.items
    store.take(a2)  # loaded: it is the live cache now, not a saved one
    assert a2 not in store.items and len(store.items) == 1
