"""Preemptive replies with SmolLM2 and a real TTS: a speculative reply to a TurnCandidate is
prepared but never heard until the turn is confirmed with the same text, and is discarded
unheard when the caller goes on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from agent.config import AgentConfig, LLMConfig, TTSConfig
from agent.frames import (
    Direction,
    Frame,
    Interrupt,
    LLMEnd,
    LLMTextDelta,
    SpeculationResolved,
    SpeechResumed,
    SpeechStarted,
    TextToSpeak,
    TTSAudio,
    TurnCandidate,
    UserTurnEnded,
)
from agent.pipeline import Pipeline
from agent.stage import StageContext
from agent.trace import Trace
from stages.llm.local import LocalLLM
from stages.llm.stage import LLMStage
from stages.tts.espeak import EspeakTTS
from stages.tts.stage import TTSStage

DOWN = Direction.DOWNSTREAM
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    pytest.importorskip("llama_cpp")
    model = LocalLLM(LLMConfig(max_tokens=32, temperature=0.0, threads=1, context=512))
    model.warmup()
    return model


@pytest.fixture(scope="module")
def espeak() -> EspeakTTS:
    return EspeakTTS(TTSConfig(backend="espeak"))


class CountingLLM:
    """The real model, counting the requests made to it."""

    def __init__(self, inner: LocalLLM) -> None:
        self.inner = inner
        self.requests: list[str] = []

    @property
    def capabilities(self):  # noqa: ANN201
        return self.inner.capabilities

    async def stream(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        self.requests.append(messages[-1]["content"])
        async for token in self.inner.stream(messages):
            yield token

    def prefill(self, messages: list[dict[str, str]]):  # noqa: ANN201
        return self.inner.prefill(messages)

    def warmup(self) -> None:
        self.inner.warmup()


class Call:
    """LLM → TTS in one pipeline, collecting what reaches the transport, in order."""

    def __init__(self, llm: LocalLLM, tts: EspeakTTS, agent: AgentConfig | None = None) -> None:
        self.model = CountingLLM(llm)
        self.llm = LLMStage(self.model, llm.cfg, agent or AgentConfig(first_audio_wait_ms=0))
        self.tts = TTSStage(tts, TTSConfig(chunk_ms=20))
        self.out: list[Frame] = []
        self.changed = asyncio.Event()
        self.pipe = Pipeline([self.llm, self.tts], on_output=self._out)
        self.trace = Trace()
        self.ctx = StageContext(trace=self.trace)

    def _out(self, frame: Frame) -> None:
        self.out.append(frame)
        self.changed.set()

    def push(self, frame: Frame) -> None:
        self.pipe.push(frame, DOWN)

    async def until(self, pred, timeout: float = 60.0) -> None:  # noqa: ANN001
        async def wait() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), timeout)

    async def polled(self, pred, timeout: float = 60.0) -> None:  # noqa: ANN001
        """Until ``pred()`` holds of state no frame announces (checked every 10 ms)."""
        async def wait() -> None:
            while not pred():
                await asyncio.sleep(0.01)
        await asyncio.wait_for(wait(), timeout)

    def of(self, kind: type) -> list:  # noqa: ANN401
        return [f for f in self.out if isinstance(f, kind)]

    async def __aenter__(self) -> Call:
        await self.pipe.start(self.ctx)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pipe.stop()
        await self.ctx.cancel_all()


def test_a_confirmed_candidate_plays_without_a_new_llm_call(llm: LocalLLM, espeak: EspeakTTS) -> None:
    async def main() -> tuple[Call, int, int]:
        async with Call(llm, espeak) as call:
            call.push(TurnCandidate(QUESTION))
            await asyncio.sleep(0.8)  # the reply and its first audio are prepared meanwhile
            held = [f for f in call.out if not isinstance(f, TurnCandidate)]  # nothing of it
            prepared = call.llm._speculation.tokens if call.llm._speculation else -1
            call.trace.begin_turn(speech_end=1)
            call.push(UserTurnEnded(QUESTION))
            await call.until(lambda: call.of(LLMEnd) and any(
                isinstance(f, TTSAudio) and f.last for f in call.out[-3:]))
            return call, held, prepared

    call, held, prepared = asyncio.run(main())
    assert held == [] and prepared > 0
    assert call.model.requests == [QUESTION]  # one LLM call: the speculative one, adopted
    assert call.llm.speculations == 1 and call.llm.adopted == 1 and call.llm.tokens_discarded == 0
    # the turn's text goes first, then the reply: text and audio, none of it marked held
    assert isinstance(call.out[1], UserTurnEnded)  # after the candidate itself
    (end,) = call.of(LLMEnd)
    assert not end.cancelled and end.text == "".join(d.text for d in call.of(LLMTextDelta)).strip()
    assert call.of(TTSAudio) and all(not f.held for f in call.of(TextToSpeak))
    assert " ".join(f.text for f in call.of(TextToSpeak)).split() == end.text.split()
    # the prepared audio was already there: the first audio came with the confirmation
    turn_events = call.trace.turns[-1]["events_ms"] if call.trace.turns else call.trace.current.events
    assert "llm_first_token" in turn_events and "tts_first_audio" in turn_events
    assert [(m.role, m.content) for m in call.llm.history.entries] == [
        ("user", QUESTION), ("assistant", end.text)]


def test_the_same_reply_with_and_without_preemption(llm: LocalLLM, espeak: EspeakTTS) -> None:
    async def reply(preempt: bool) -> str:
        async with Call(llm, espeak, AgentConfig(preempt=preempt, first_audio_wait_ms=0)) as call:
            call.push(TurnCandidate(QUESTION))
            await asyncio.sleep(0.2)
            call.push(UserTurnEnded(QUESTION))
            await call.until(lambda: bool(call.of(LLMEnd)))
            assert call.llm.adopted == (1 if preempt else 0)
            return call.of(LLMEnd)[0].text

    assert asyncio.run(reply(True)) == asyncio.run(reply(False)) != ""


@pytest.mark.parametrize("goes_on", [SpeechResumed(at=48_000), SpeechStarted(at=48_000),
                                     Interrupt(at=48_000)])
def test_a_candidate_the_caller_goes_on_from_is_discarded_unheard(
        llm: LocalLLM, espeak: EspeakTTS, goes_on: Frame) -> None:
    async def main() -> Call:
        async with Call(llm, espeak) as call:
            call.push(TurnCandidate("I would like to book"))

            def held_audio() -> int:
                spec = call.llm._speculation
                return sum(isinstance(f, TTSAudio) for f in call.tts._held.get(spec.id, [])) \
                    if spec else 0

            await call.polled(lambda: held_audio() > 0)  # held text and audio exist (any CPU)
            call.push(goes_on)
            await asyncio.sleep(0.3)
            return call

    call = asyncio.run(main())
    heard = [f for f in call.out if isinstance(f, TTSAudio | TextToSpeak | LLMTextDelta | LLMEnd)]
    assert heard == []  # nothing of the speculative reply ever left the pipeline
    assert call.llm.tokens_discarded > 0 and call.llm.adopted == 0
    assert call.tts.held_discarded > 0 and call.tts._held == {}
    assert call.llm.history.entries == []
    if not isinstance(goes_on, Interrupt):
        assert [f.confirmed for f in call.of(SpeculationResolved)] == [False]


def test_a_turn_with_other_text_discards_the_candidate_and_answers_afresh(
        llm: LocalLLM, espeak: EspeakTTS) -> None:
    async def main() -> Call:
        async with Call(llm, espeak) as call:
            call.push(TurnCandidate("What is the capital"))
            # the candidate's reply has begun (so there are tokens to throw away)
            await call.polled(lambda: bool(call.llm._speculation and call.llm._speculation.tokens))
            call.push(UserTurnEnded(QUESTION))
            await call.until(lambda: bool(call.of(LLMEnd)))
            return call

    call = asyncio.run(main())
    assert call.model.requests == ["What is the capital", QUESTION]
    assert call.llm.adopted == 0 and call.llm.tokens_discarded > 0
    assert [(m.role, m.content) for m in call.llm.history.entries][0] == ("user", QUESTION)


def test_no_speculation_when_preemption_is_off_or_a_reply_is_in_flight(
        llm: LocalLLM, espeak: EspeakTTS) -> None:
    async def main() -> tuple[int, int]:
        async with Call(llm, espeak, AgentConfig(preempt=False)) as off:
            off.push(TurnCandidate(QUESTION))
            await asyncio.sleep(0.1)
        async with Call(llm, espeak, AgentConfig(first_audio_wait_ms=0)) as busy:
            busy.push(UserTurnEnded("Tell me a story."))
            await asyncio.sleep(0.05)
            busy.push(TurnCandidate(QUESTION))  # the caller speaks while the agent replies
            await busy.until(lambda: bool(busy.of(LLMEnd)))
        return off.llm.speculations + len(off.model.requests), busy.llm.speculations

    assert asyncio.run(main()) == (0, 0)
