"""SmolLM2 through llama.cpp: real streamed generation, prompt cancellation, and the KV cache
kept across turns and between calls."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from agent.config import LLMConfig
from agent.errors import CapacityError, ModelNotFoundError
from stages.llm.chat import ChatHistory
from stages.llm.kv_reuse import PromptStats
from stages.llm.local import LocalLLM

STORY = [{"role": "user", "content": "Tell me a long story about a dragon who loves to sing."}]


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    pytest.importorskip("llama_cpp")
    model = LocalLLM(LLMConfig(max_tokens=64, temperature=0.0, threads=1))
    model.warmup()
    return model


async def collect(llm: LocalLLM, messages: list[dict[str, str]]) -> list[str]:
    return [token async for token in llm.stream(messages)]


def test_generates_text_streamed_in_several_deltas(llm: LocalLLM) -> None:
    messages = [
        {"role": "system", "content": llm.cfg.system_prompt},
        {"role": "user", "content": "Hello! Who are you?"},
    ]
    deltas = asyncio.run(collect(llm, messages))
    assert len(deltas) >= 3
    assert all(deltas)
    assert len("".join(deltas).split()) >= 2


def test_cancelling_the_consumer_stops_generation_and_frees_the_worker(llm: LocalLLM) -> None:
    asyncio.run(collect(llm, STORY))
    full = llm._llama.n_tokens  # prompt + every generated token

    async def cancel_after_three() -> tuple[list[str], int]:
        seen: list[str] = []
        three = asyncio.Event()

        async def consume() -> None:
            async for token in llm.stream(STORY):
                seen.append(token)
                if len(seen) == 3:
                    three.set()

        task = asyncio.create_task(consume())
        await three.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # stream() waits for the worker as it unwinds, so the count is final here.
        count = len(seen)
        await asyncio.sleep(0.2)
        assert len(seen) == count
        return seen, llm._llama.n_tokens

    seen, cut = asyncio.run(cancel_after_three())
    assert 3 <= len(seen) <= 4
    assert cut < full - 40  # the worker stopped within a token or two, not at max_tokens
    # The worker is free: the next generation runs normally.
    assert asyncio.run(collect(llm, [{"role": "user", "content": "Hi"}]))


def test_a_missing_model_file_says_what_to_pass(tmp_path) -> None:  # noqa: ANN001
    pytest.importorskip("llama_cpp")
    with pytest.raises(ModelNotFoundError, match="--llm-model"):
        LocalLLM(LLMConfig(model=str(tmp_path / "nope.gguf")))


# --- the KV cache across turns ---------------------------------------------------------------

CALLER = [
    "Hi, I'd like to book a table for tonight.",
    "Four people, around seven thirty.",
    "Do you have anything near the window?",
    "Great. Can we bring a dog?",
    "What's on the menu for vegetarians?",
    "Is there parking nearby?",
    "How late is the kitchen open?",
    "Can I pay by card?",
    "Please put it under the name Rivera.",
    "Thanks, that's all for now.",
]


@pytest.fixture(scope="module")
def warm_model() -> LocalLLM:
    pytest.importorskip("llama_cpp")
    model = LocalLLM(LLMConfig(max_tokens=20, temperature=0.0, threads=1))
    model.warmup()
    return model


@pytest.fixture()
def warm(warm_model: LocalLLM) -> LocalLLM:
    """The module's model as warm-up leaves it — the system prompt in the cache, no other
    conversation in it or saved. Which tests ran before this one on its worker varies under
    pytest-xdist, and what they left is not this test's: after the ten-turn test alone, the
    prefill test's first prompt saved that conversation (the same first turns), and its
    prefill of the second turn restored it and evaluated 1 token."""
    warm_model.saved.clear()
    warm_model._truncate(0)  # the live conversation (the worker is idle between tests)
    warm_model.warmup()
    return warm_model


async def talk(llm: LocalLLM, history: ChatHistory, text: str) -> PromptStats:
    """One turn: the caller's words in, the reply streamed, the reply text into the history."""
    history.add_user(text)
    reply = "".join([token async for token in llm.stream(history.messages())])
    history.add_assistant(reply.strip())
    assert llm.last is not None
    return llm.last


def prompt_tokens(llm: LocalLLM, messages: list[dict[str, str]]) -> int:
    return len(llm._fit(messages).tokens)


def test_a_ten_turn_conversation_evaluates_only_the_new_tokens(warm: LocalLLM) -> None:
    import llama_cpp

    system = prompt_tokens(warm, [{"role": "system", "content": warm.cfg.system_prompt}]) - 3

    async def call() -> None:
        history = ChatHistory(warm.cfg.system_prompt, 16)
        previous = 0  # the previous request's prompt tokens
        for i, text in enumerate(CALLER):
            before = llama_cpp.llama_perf_context(warm._llama.ctx).n_p_eval
            stats = await talk(warm, history, text)
            decoded = llama_cpp.llama_perf_context(warm._llama.ctx).n_p_eval - before
            # The counter is llama.cpp's own: the tokens it decoded for the prompt.
            assert decoded == stats.evaluated
            assert stats.reused + stats.evaluated == stats.prompt
            # The system prompt, every earlier turn and the previous request's whole prompt
            # come from the cache; what is decoded is the reply's end-of-message token and
            # this turn's message (the user text, ~10 template tokens).
            assert stats.reused >= max(previous, system), (i, stats)
            assert stats.evaluated <= len(text) // 2 + 12, (i, stats)
            assert not stats.shifted
            previous = stats.prompt

    asyncio.run(call())


def test_a_reply_cut_by_a_barge_in_keeps_the_earlier_turns_cached(warm: LocalLLM) -> None:
    async def call() -> tuple[int, PromptStats]:
        history = ChatHistory(warm.cfg.system_prompt, 16)
        await talk(warm, history, CALLER[0])
        history.add_user(STORY[0]["content"])
        asked = prompt_tokens(warm, history.messages())
        parts: list[str] = []
        async with aclosing(warm.stream(history.messages())) as tokens:
            async for token in tokens:
                parts.append(token)
                if len(parts) == 4:
                    break  # the caller barged in: what they heard goes into the history
        history.add_assistant(" ".join("".join(parts).split()[:-1]), truncated=True)
        return asked, await talk(warm, history, CALLER[1])

    asked, stats = asyncio.run(call())
    assert stats.reused >= asked  # the interrupted request's prompt, up to its reply


def test_the_prefix_stays_until_the_history_drops_a_block_which_is_shifted_out(
    warm: LocalLLM,
) -> None:
    async def call() -> list[tuple[PromptStats, int, bool]]:
        history = ChatHistory(warm.cfg.system_prompt, 4)  # drops to 2 turns every 3 turns
        seen: list[tuple[PromptStats, int, bool]] = []
        first = ""
        for text in CALLER:
            stats = await talk(warm, history, text)
            dropped = bool(first) and history.messages()[1]["content"] != first
            seen.append((stats, prompt_tokens(warm, history.messages()), dropped))
            first = history.messages()[1]["content"]
        return seen

    seen = asyncio.run(call())
    # The history dropped old turns after the 5th, 8th reply (4 earlier turns then 2 kept).
    assert [d for _, _, d in seen] == [False] * 4 + [True, False, False, True, False, False]
    for i, (stats, _, _) in enumerate(seen[1:], 1):
        previous_stats, after_reply, dropped = seen[i - 1]
        if dropped:
            # The dropped turns' cells were cut out and the kept ones moved down: the
            # request still evaluates only its new turn.
            assert stats.shifted > 0
            assert stats.reused >= after_reply - 8, (i, stats)
        else:
            assert stats.shifted == 0
            assert stats.reused >= previous_stats.prompt
        assert stats.evaluated <= 40, (i, stats)


def test_two_interleaved_calls_each_keep_their_cache_and_their_replies(warm: LocalLLM) -> None:
    a_turns, b_turns = CALLER[:4], CALLER[6:]

    def fresh() -> None:
        warm.warmup()  # the system prompt cached, nothing of either call
        warm.saved.clear()

    async def alone(turns: list[str]) -> list[str]:
        fresh()
        history = ChatHistory(warm.cfg.system_prompt, 16)
        for text in turns:
            await talk(warm, history, text)
        return [e.content for e in history.entries]

    async def interleaved() -> tuple[list[str], list[str], list[PromptStats]]:
        fresh()
        a = ChatHistory(warm.cfg.system_prompt, 16)
        b = ChatHistory(warm.cfg.system_prompt, 16)
        stats = []
        for text_a, text_b in zip(a_turns, b_turns, strict=True):
            stats.append(await talk(warm, a, text_a))
            stats.append(await talk(warm, b, text_b))
        return [e.content for e in a.entries], [e.content for e in b.entries], stats

    ref_a, ref_b = asyncio.run(alone(a_turns)), asyncio.run(alone(b_turns))
    got_a, got_b, stats = asyncio.run(interleaved())
    # Each request after a call's first was served from that call's saved cache ...
    assert all(s.restored for s in stats[2:])
    assert all(s.evaluated <= 30 for s in stats), stats
    # ... copied out and back in bit for bit: the greedy replies are those of each call alone.
    assert (got_a, got_b) == (ref_a, ref_b)
    assert len(warm.saved.items) == 1  # the paused call (the other one is live)


def test_a_prefill_leaves_its_prompt_for_the_real_request(warm: LocalLLM) -> None:
    history = ChatHistory(warm.cfg.system_prompt, 16)
    asyncio.run(talk(warm, history, CALLER[0]))

    async def turn(heard: str, said: str) -> tuple[PromptStats, PromptStats]:
        await warm.prefill(history.messages() + [{"role": "user", "content": heard}])
        prefilled = warm.last
        assert prefilled is not None
        history.add_user(said)
        async for _ in warm.stream(history.messages()):
            pass
        assert warm.last is not None
        history.add_assistant("Sure.")
        return prefilled, warm.last

    prefilled, real = asyncio.run(turn(CALLER[1], CALLER[1]))
    assert prefilled.evaluated > 5
    assert (real.reused, real.evaluated) == (real.prompt - 1, 1)  # only its last token again
    # The caller said more after the pause: the prefill's prompt up to its words still counts.
    prefilled, real = asyncio.run(turn("Do you have", "Do you have anything near the window?"))
    closing = len(warm._tokenize("<|im_end|>\n<|im_start|>assistant\n"))
    assert real.reused >= prefilled.prompt - closing  # all but the template's closing tokens


def test_an_open_prefill_of_the_words_so_far_leaves_the_request_only_the_rest(
    warm: LocalLLM,
) -> None:
    import numpy as np

    history = ChatHistory(warm.cfg.system_prompt, 16)
    asyncio.run(talk(warm, history, CALLER[0]))
    heard, said = "Do you have anything near", "Do you have anything near the window?"

    async def turn() -> tuple[np.ndarray, PromptStats]:
        before = warm.open_prefills
        await warm.prefill(history.messages() + [{"role": "user", "content": heard}],
                           open_turn=True)
        assert warm.open_prefills == before + 1
        opened = np.array(warm._llama.input_ids[: warm._llama.n_tokens])
        history.add_user(said)
        async for _ in warm.stream(history.messages()):
            pass
        assert warm.last is not None
        return opened, warm.last

    opened, real = asyncio.run(turn())
    # The open message is the caller's words and no more: not its end, not the reply's header.
    text = warm._llama.detokenize(opened.tolist(), special=True).decode()
    assert text.endswith("<|im_start|>user\n" + heard)
    # The request went on from there: every open token reused, only the rest evaluated.
    closed = warm._fit(history.messages()).tokens  # the request's own prompt
    assert np.array_equal(closed[: len(opened)], opened)
    rest = len(warm._tokenize(" the window?<|im_end|>\n<|im_start|>assistant\n"))
    assert real.reused >= len(opened) and real.evaluated <= rest + 1


def test_an_open_prefill_never_makes_a_reply_wait(warm: LocalLLM) -> None:
    async def main() -> tuple[bool, int]:
        before = warm.open_prefills
        stream = warm.stream(STORY)
        await anext(stream)  # the worker is generating
        skipped = warm.prefill([{"role": "user", "content": "Tell me about"}], open_turn=True)
        done = skipped.done()
        await stream.aclose()
        return done, warm.open_prefills - before

    done, evaluated = asyncio.run(main())
    assert done and evaluated == 0


def test_a_history_too_long_for_the_context_loses_its_oldest_turns_not_the_request() -> None:
    pytest.importorskip("llama_cpp")
    llm = LocalLLM(LLMConfig(max_tokens=16, temperature=0.0, threads=1, context=256))
    messages = [{"role": "system", "content": llm.cfg.system_prompt}]
    for text in CALLER:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    messages.append({"role": "user", "content": "And one more thing."})
    assert asyncio.run(collect(llm, messages))
    assert llm.last is not None and llm.last.prompt + 16 <= 256
    with pytest.raises(CapacityError, match="--llm-context"):
        asyncio.run(collect(llm, [{"role": "user", "content": "word " * 300}]))
    llm.close()
