"""LLM backends declare what they can do (``LLMCapabilities``), and the LLM stage prefills
only a backend that declares it — with a scripted fake, no model needed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from stage_harness import StageHarness

from agent.config import AgentConfig, LLMConfig
from agent.frames import Direction, LLMEnd, SpeechPaused, SpeechStarted, Transcript, UserTurnEnded
from stages.llm.chat import LLMCapabilities
from stages.llm.stage import LLMStage

DOWN = Direction.DOWNSTREAM


class Scripted:
    """Replies "ok"; records the prompts it was asked to prefill."""

    def __init__(self, prefill: bool) -> None:
        self.capabilities = LLMCapabilities(prefill=prefill)
        self.prefilled: list[list[dict[str, str]]] = []

    async def stream(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        yield "ok"

    def prefill(self, messages: list[dict[str, str]]) -> asyncio.Future[None]:
        if not self.capabilities.prefill:
            raise AssertionError("prefill called on a backend that does not declare it")
        self.prefilled.append(messages)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def warmup(self) -> None:
        pass


def run_turn(llm: Scripted) -> int:
    async def main() -> int:
        stage = LLMStage(llm, LLMConfig(), AgentConfig(prefill=True, preempt=False, first_audio_wait_ms=0))
        async with StageHarness(stage) as h:
            h.pipeline.push(SpeechStarted(at=0), DOWN)
            h.pipeline.push(Transcript("what time is it", final=False), DOWN)
            h.pipeline.push(SpeechPaused(at=16000), DOWN)
            h.pipeline.push(UserTurnEnded("what time is it"), DOWN)
            await h.until(lambda fs: any(isinstance(f, LLMEnd) for f in fs))
            return stage.prefills

    return asyncio.run(main())


def test_the_stage_prefills_only_a_backend_that_declares_it() -> None:
    able, unable = Scripted(prefill=True), Scripted(prefill=False)
    assert run_turn(able) == 1 and able.prefilled[-1][-1]["content"] == "What time is it"  # as_message
    assert run_turn(unable) == 0 and unable.prefilled == []


def test_the_backends_declare_prefill() -> None:
    from stages.llm.local import LocalLLM

    assert LocalLLM.capabilities.prefill
    pytest.importorskip("httpx")
    from stages.llm.openai import OpenAILLM

    remote = OpenAILLM(LLMConfig())
    assert not remote.capabilities.prefill

    async def noop() -> bool:
        fut = remote.prefill([{"role": "user", "content": "hi"}])
        await remote.aclose()
        return fut.done()

    assert asyncio.run(noop())
