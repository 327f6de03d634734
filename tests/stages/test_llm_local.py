"""SmolLM2 through llama.cpp: real streamed generation and prompt cancellation."""

from __future__ import annotations

import asyncio

import pytest

from agent.config import LLMConfig
from agent.errors import ModelNotFoundError
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
