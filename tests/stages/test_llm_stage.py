"""The LLM stage with SmolLM2: deltas, speakable chunks, history, greeting, barge-in, errors."""

from __future__ import annotations

import asyncio

import pytest
from stage_harness import StageHarness

from agent.config import AgentConfig, LLMConfig
from agent.frames import (
    Direction,
    ErrorFrame,
    Frame,
    Interrupt,
    LLMEnd,
    LLMTextDelta,
    TextToSpeak,
    Transcript,
    UserTurnEnded,
)
from stages.faults import APOLOGY, LLM_EMPTY_REPLY, LLM_UNAVAILABLE, fault_frame
from stages.llm.chat import LLMCapabilities
from stages.llm.local import LocalLLM
from stages.llm.stage import LLMStage

DOWN = Direction.DOWNSTREAM


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    pytest.importorskip("llama_cpp")
    model = LocalLLM(LLMConfig(max_tokens=64, temperature=0.0, threads=1, context=512))
    model.warmup()
    return model


class Harness(StageHarness):
    def __init__(self, llm: LocalLLM, agent: AgentConfig | None = None) -> None:
        super().__init__(LLMStage(llm, llm.cfg, agent or AgentConfig()), timeout=60.0)

    def of(self, kind: type) -> list:  # noqa: ANN401
        return [f for f in self.frames if isinstance(f, kind)]


def ends(frames: list[Frame]) -> int:
    return sum(isinstance(f, LLMEnd) for f in frames)


def test_a_turn_streams_deltas_chunks_and_one_end(llm: LocalLLM) -> None:
    async def main() -> Harness:
        async with Harness(llm) as h:
            h.trace.begin_turn(speech_end=1)
            h.pipeline.push(UserTurnEnded("Hello! Who are you and what can you do?"), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            return h

    h = asyncio.run(main())
    deltas, chunks, (end,) = h.of(LLMTextDelta), h.of(TextToSpeak), h.of(LLMEnd)
    assert len(deltas) >= 3 and not end.cancelled
    assert end.text == "".join(d.text for d in deltas).strip() != ""
    assert chunks and " ".join(c.text for c in chunks).split() == end.text.split()
    assert not any(c.greeting for c in chunks)
    assert isinstance(h.frames[0], UserTurnEnded) and isinstance(h.frames[-1], LLMEnd)
    turn = h.trace.current
    assert turn is not None and turn.reply == end.text
    assert turn.events["llm_request"] <= turn.events["llm_first_token"]
    assert [(e.role, e.content) for e in h.stage.history.entries] == [
        ("user", "Hello! Who are you and what can you do?"),
        ("assistant", end.text),
    ]


def test_greeting_is_pushed_once_at_start_and_remembered(llm: LocalLLM) -> None:
    async def main() -> Harness:
        async with Harness(llm, AgentConfig(greeting="Hi, this is Vox. How can I help?")) as h:
            await h.until(lambda fs: len(fs) >= 1)
            h.greeting_turn = h.trace.current  # the stage opened the greeting's trace turn
            h.pipeline.push(UserTurnEnded("What is your name?"), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            return h

    h = asyncio.run(main())
    first = h.frames[0]
    assert isinstance(first, TextToSpeak) and first.greeting
    assert first.text == "Hi, this is Vox. How can I help?"
    assert sum(isinstance(f, TextToSpeak) and f.greeting for f in h.frames) == 1
    assert h.greeting_turn is not None and h.greeting_turn.kind == "greeting"
    assert h.greeting_turn.events["call_start"] > 0
    assert [m["role"] for m in h.stage.history.messages()] == [
        "system",
        "assistant",
        "user",
        "assistant",
    ]


def test_interrupt_cancels_the_reply_and_keeps_only_what_went_to_the_tts(llm: LocalLLM) -> None:
    async def main() -> Harness:
        async with Harness(llm) as h:
            h.pipeline.push(UserTurnEnded("Tell me a long story about a dragon who sings."), DOWN)
            await h.until(lambda fs: sum(isinstance(f, LLMTextDelta) for f in fs) >= 3)
            h.pipeline.push(Interrupt(), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            await asyncio.sleep(0.2)
            h.pipeline.push(UserTurnEnded("Thanks."), DOWN)
            await h.until(lambda fs: ends(fs) == 2)
            return h

    h = asyncio.run(main())
    cut = next(i for i, f in enumerate(h.frames) if isinstance(f, Interrupt))
    end = next(f for f in h.frames if isinstance(f, LLMEnd))
    assert end.cancelled
    said = "".join(f.text for f in h.frames[:cut] if isinstance(f, LLMTextDelta)).strip()
    assert end.text == said
    between = h.frames[cut + 1 : h.frames.index(end)]
    assert not any(isinstance(f, (LLMTextDelta, TextToSpeak)) for f in between)
    # no playout here to say what was heard: the history holds what went to the TTS (the
    # chunks), never the words generated past them (tests/agent/test_heard_history.py has
    # the playout's account)
    spoken = " ".join(f.text for f in h.frames[:cut] if isinstance(f, TextToSpeak))
    story_reply = h.stage.history.entries[1]
    assert story_reply.role == "assistant" and story_reply.truncated
    assert story_reply.content == spoken and len(spoken) < len(said)
    last_end = h.of(LLMEnd)[-1]
    assert not last_end.cancelled and last_end.text  # the stage went on serving


def test_a_failing_local_request_is_apologized_for_and_the_stage_goes_on(llm: LocalLLM) -> None:
    """The local backend raising (here: a turn far beyond the 512-token context) gets what a
    failing server gets: the apology, an error event with a code and no detail, a counter."""
    too_long = "word " * 2000

    async def main() -> Harness:
        async with Harness(llm) as h:
            h.pipeline.push(UserTurnEnded(too_long), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            h.pipeline.push(UserTurnEnded("Hello there."), DOWN)
            await h.until(lambda fs: ends(fs) == 2)
            return h

    h = asyncio.run(main())
    (error,) = h.of(ErrorFrame)
    assert error.stage == "llm" and error.message == fault_frame(LLM_UNAVAILABLE, "llm").message
    assert "context" not in error.message and "token" not in error.message  # the detail is logged
    failed, answered = h.of(LLMEnd)
    assert failed.cancelled and failed.text == "" and not answered.cancelled and answered.text
    sorry = h.frames[h.frames.index(error) + 1]
    assert isinstance(sorry, TextToSpeak) and sorry.text == APOLOGY
    assert h.frames.index(sorry) < h.frames.index(failed)
    assert h.stage.errors == 1
    assert [e.content for e in h.stage.history.entries if e.role == "user"] == ["Hello there."]
    assert APOLOGY not in [e.content for e in h.stage.history.entries]
    assert [(e["event"], e["code"]) for e in h.trace.call_events] == [("error", LLM_UNAVAILABLE)]


def test_generation_pauses_after_the_first_chunk_until_its_audio_is_out(llm: LocalLLM) -> None:
    from agent.frames import BotStartedSpeaking

    agent = AgentConfig(min_first_chunk_words=2, max_first_chunk_words=3, first_audio_wait_ms=5000)

    async def main() -> tuple[int, int, int]:
        async with Harness(llm, agent) as h:
            h.pipeline.push(UserTurnEnded("Tell me about the weather in spring, please."), DOWN)
            await h.until(lambda fs: any(isinstance(f, TextToSpeak) for f in fs))
            at_first_chunk = sum(isinstance(f, LLMTextDelta) for f in h.frames)
            await asyncio.sleep(0.6)  # no audio out yet: the reply must not go on
            while_waiting = sum(isinstance(f, LLMTextDelta) for f in h.frames)
            h.pipeline.inject_upstream(BotStartedSpeaking())
            await h.until(lambda fs: any(isinstance(f, LLMEnd) for f in fs))
            total = sum(isinstance(f, LLMTextDelta) for f in h.frames)
            return at_first_chunk, while_waiting, total

    at_first_chunk, while_waiting, total = asyncio.run(main())
    assert while_waiting == at_first_chunk  # paused, not a single delta more
    assert total > while_waiting  # and resumed once the first audio was out


# The prefill test compares two greedy replies word for word, so its question is one whose reply
# wins every token by a wide logit margin: 0.86 for this one, against 0.08 for "What is the
# capital of France?". Rounding differences between CPUs' kernels are far smaller (thread counts
# change nothing at all), and even evaluating the prompt token by token instead of in one batch
# moves SmolLM2's top logits by up to 0.2 here: two of them moved apart shrink a margin by 0.4,
# which test_the_prefill_question_is_far_from_a_greedy_tie checks is still covered. What was heard
# at the pause gets another reply ("The opposite of a negative is a positive"), so a prefill that
# leaked into the answer would show.
PREFILL_HEARD = "What is the opposite of"
PREFILL_QUESTION = "What is the opposite of up?"


def test_the_prefill_question_is_far_from_a_greedy_tie(llm: LocalLLM) -> None:
    import numpy as np

    margins: list[float] = []

    def margin(_ids: object, logits: np.ndarray) -> np.ndarray:
        second, first = np.partition(logits, -2)[-2:]
        margins.append(float(first - second))
        return logits

    messages = [
        {"role": "system", "content": llm.cfg.system_prompt},
        {"role": "user", "content": PREFILL_QUESTION},
    ]
    llm._llama.create_chat_completion(
        messages=messages, max_tokens=llm.cfg.max_tokens, temperature=0.0,
        logits_processor=[margin],
    )
    assert len(margins) >= 3 and min(margins) > 0.4, margins


def test_prefill_on_a_pause_does_not_change_the_reply(llm: LocalLLM) -> None:
    from agent.frames import SpeechPaused, SpeechStarted

    question = PREFILL_QUESTION

    async def reply(prefill: bool) -> tuple[str, int]:
        agent = AgentConfig(prefill=prefill, preempt=False, first_audio_wait_ms=0)
        async with Harness(llm, agent) as h:
            push = h.pipeline.push
            push(SpeechStarted(at=0), DOWN)
            push(Transcript(PREFILL_HEARD, final=False), DOWN)
            push(SpeechPaused(at=16000), DOWN)  # prefill with what was heard so far
            push(Transcript(question, final=False), DOWN)
            await asyncio.sleep(0.3)
            push(UserTurnEnded(question), DOWN)
            await h.until(lambda fs: any(isinstance(f, LLMEnd) for f in fs))
            end = next(f for f in h.frames if isinstance(f, LLMEnd))
            return end.text, h.stage.prefills

    with_prefill, n = asyncio.run(reply(True))
    without, m = asyncio.run(reply(False))
    assert n >= 1 and m == 0
    assert with_prefill and with_prefill == without  # temperature 0: the same words


def test_the_words_said_so_far_are_prefilled_while_the_caller_speaks(llm: LocalLLM) -> None:
    from agent.frames import SpeechPaused, SpeechStarted

    def cached() -> str:
        ids = llm._llama.input_ids[: llm._llama.n_tokens].tolist()
        return llm._llama.detokenize(ids, special=True).decode()

    async def reply(prefill: bool) -> tuple[str, list[str], int]:
        agent = AgentConfig(prefill=prefill, first_audio_wait_ms=0)
        seen: list[str] = []
        async with Harness(llm, agent) as h:
            push = h.pipeline.push
            push(SpeechStarted(at=0), DOWN)
            # the stable prefix ends inside a word: only the whole words before it go in
            push(Transcript("What is the opposite", final=False, stable=len("What is the op")), DOWN)
            await asyncio.sleep(0.3)
            seen.append(cached())
            push(Transcript("What is the opposite of", final=False,
                            stable=len("What is the opposite ")), DOWN)
            await asyncio.sleep(0.3)
            seen.append(cached())
            push(SpeechPaused(at=16000), DOWN)  # paused: the speculative request's turn, not ours
            push(Transcript(PREFILL_QUESTION, final=False, stable=len(PREFILL_QUESTION),
                            speculative=True), DOWN)
            push(UserTurnEnded(PREFILL_QUESTION), DOWN)
            await h.until(lambda fs: any(isinstance(f, LLMEnd) for f in fs))
            end = next(f for f in h.frames if isinstance(f, LLMEnd))
            return end.text, seen, h.stage.prefills

    with_prefill, seen, n = asyncio.run(reply(True))
    assert n == 2
    assert seen[0].endswith("<|im_start|>user\nWhat is the")
    assert seen[1].endswith("<|im_start|>user\nWhat is the opposite")
    without, _, m = asyncio.run(reply(False))
    assert m == 0
    assert with_prefill and with_prefill == without  # temperature 0: the same words


def test_a_partial_in_lower_case_is_prefilled_as_the_final_is_spelled(llm: LocalLLM) -> None:
    # Whisper's partials may begin "what is ..." where the final begins "What is ...": the
    # words in the cache must be the final's, or the reply evaluates the whole message again.
    from agent.frames import SpeechPaused, SpeechStarted

    async def run() -> tuple[str, object]:
        async with Harness(llm, AgentConfig(first_audio_wait_ms=0)) as h:
            push = h.pipeline.push
            push(SpeechStarted(at=0), DOWN)
            push(Transcript("what is the opposite of", final=False,
                            stable=len("what is the opposite of")), DOWN)
            await asyncio.sleep(0.3)
            ids = llm._llama.input_ids[: llm._llama.n_tokens].tolist()
            cached = llm._llama.detokenize(ids, special=True).decode()
            push(SpeechPaused(at=16000), DOWN)
            push(Transcript(PREFILL_QUESTION, final=False, stable=len(PREFILL_QUESTION),
                            speculative=True), DOWN)
            push(UserTurnEnded(PREFILL_QUESTION), DOWN)
            await h.until(lambda fs: any(isinstance(f, LLMEnd) for f in fs))
            return cached, llm.last

    cached, stats = asyncio.run(run())
    assert cached.endswith("<|im_start|>user\nWhat is the opposite of")
    # the reply evaluated only " up?" and the turn's end (~7 tokens), not the caller's words
    rest = llm._tokenize(" up?<|im_end|>\n<|im_start|>assistant\n")
    assert stats is not None and stats.evaluated <= len(rest) + 1, stats


class _ReplyOfMarks:
    """A model that answers with punctuation only: "…", the interrupted mark it was shown
    (SmolLM2 does that when the history ends with a reply that is the mark alone)."""

    capabilities = LLMCapabilities()

    def __init__(self) -> None:
        self.requests = 0

    async def stream(self, messages):  # noqa: ANN001, ANN201
        self.requests += 1
        yield "…" if self.requests == 1 else "Of course."

    def warmup(self) -> None:
        pass


def test_a_reply_with_no_word_is_apologized_for_not_left_silent() -> None:
    async def main() -> StageHarness:
        llm = _ReplyOfMarks()
        async with StageHarness(LLMStage(llm, LLMConfig(), AgentConfig()), timeout=10.0) as h:
            h.pipeline.push(UserTurnEnded("Your call is now first in line."), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            h.pipeline.push(UserTurnEnded("Can you help?"), DOWN)
            await h.until(lambda fs: ends(fs) == 2)
            return h

    h = asyncio.run(main())
    (error,) = [f for f in h.frames if isinstance(f, ErrorFrame)]
    assert error.code == LLM_EMPTY_REPLY and h.stage.errors == 1
    spoken = [f.text for f in h.frames if isinstance(f, TextToSpeak)]
    assert spoken[-2:] == [APOLOGY, "Of course."]  # the caller heard why, then the next answer
    failed, answered = [f for f in h.frames if isinstance(f, LLMEnd)]
    assert failed.cancelled and not answered.cancelled
    assert [(e.role, e.content) for e in h.stage.history.entries] == [
        ("user", "Can you help?"), ("assistant", "Of course.")]


class _Loop:
    """A model caught in a loop, as SmolLM2 was in a call (its reply to "Laughing."): the text
    in 3-character deltas; ``sent`` counts the deltas the stage took before it closed the
    stream."""

    capabilities = LLMCapabilities()
    TEXT = "I'm sorry, I'm sorry. I'm sorry. I'm sorry. I'm sorry. I'm sorry. I'm sorry."

    def __init__(self, text: str = TEXT) -> None:
        self.text = text
        self.sent = 0
        self.closed = False

    async def stream(self, messages):  # noqa: ANN001, ANN201
        try:
            for i in range(0, len(self.text), 3):
                self.sent += 1
                yield self.text[i:i + 3]
                await asyncio.sleep(0)
        finally:
            self.closed = True

    def warmup(self) -> None:
        pass


def _loop_call(model: _Loop, agent: AgentConfig) -> StageHarness:
    async def main() -> StageHarness:
        async with StageHarness(LLMStage(model, LLMConfig(), agent), timeout=10.0) as h:
            h.trace.begin_turn(speech_end=1)
            h.pipeline.push(UserTurnEnded("Laughing."), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            return h

    return asyncio.run(main())


def test_a_reply_that_would_say_a_chunk_again_stops_there() -> None:
    model = _Loop()
    h = _loop_call(model, AgentConfig())
    spoken = [f.text for f in h.frames if isinstance(f, TextToSpeak)]
    assert spoken == ["I'm sorry,"]  # "I'm sorry." is the same words: not said again
    (end,) = [f for f in h.frames if isinstance(f, LLMEnd)]
    assert end.text == "I'm sorry," and not end.cancelled
    # the model was stopped (the stream closed a delta after the repeat), not read to its end
    assert model.closed and model.sent < len(model.TEXT) // 3 // 2
    assert h.stage.repeats_stopped == 1
    # the history keeps what was said, not the loop the model would go on with next turn
    assert [(e.role, e.content) for e in h.stage.history.entries] == [
        ("user", "Laughing."), ("assistant", "I'm sorry,")]
    assert h.trace.current is not None and h.trace.current.info.get("repeat_stopped") is True
    (event,) = h.trace.call_events  # written at once: the turn is usually closed by then
    assert (event["event"], event["said"], event["not_said"]) == (
        "repeat_stopped", "I'm sorry,", "I'm sorry.")


def test_a_loop_of_two_sentences_stops_at_the_first_sentence_said_again() -> None:
    model = _Loop("No, no, no, no. No, no, no. That's a good story. That's a good story. No, no")
    h = _loop_call(model, AgentConfig())
    spoken = [f.text for f in h.frames if isinstance(f, TextToSpeak)]
    assert spoken == ["No,", "no, no, no."]
    assert h.stage.history.entries[-1].content == "No, no, no, no."


def test_a_speculative_reply_stopped_at_a_repeat_is_adopted_as_said() -> None:
    """Prepared at the pause, stopped at its repeat, then confirmed: the turn records the stop
    and its reply as said, and the model was asked once."""
    from agent.frames import TurnCandidate

    model = _Loop()

    async def main() -> StageHarness:
        agent = AgentConfig(first_audio_wait_ms=0)  # (no TTS here to say the audio is out)
        async with StageHarness(LLMStage(model, LLMConfig(), agent), timeout=10.0) as h:
            h.pipeline.push(TurnCandidate("Laughing."), DOWN)
            await asyncio.sleep(0.2)
            assert model.closed  # stopped before the turn was confirmed
            h.trace.begin_turn(speech_end=1)
            h.pipeline.push(UserTurnEnded("Laughing."), DOWN)
            await h.until(lambda fs: ends(fs) == 1)
            return h

    h = asyncio.run(main())
    assert h.stage.speculations == 1 and h.stage.adopted == 1 and model.closed
    assert h.stage.repeats_stopped == 1
    assert [f.text for f in h.frames if isinstance(f, TextToSpeak)] == ["I'm sorry,"]
    (end,) = [f for f in h.frames if isinstance(f, LLMEnd)]
    assert end.text == "I'm sorry,"
    turn = h.trace.current
    assert turn is not None and turn.info.get("repeat_stopped") is True
    assert turn.reply == "I'm sorry,"
    assert [e["event"] for e in h.trace.call_events] == ["repeat_stopped"]


def test_with_stop_repeats_off_the_reply_is_said_whole() -> None:
    model = _Loop()
    h = _loop_call(model, AgentConfig(stop_repeats=False))
    spoken = [f.text for f in h.frames if isinstance(f, TextToSpeak)]
    assert " ".join(spoken) == model.TEXT and len(spoken) == 7
    assert model.sent == -(-len(model.TEXT) // 3) and h.stage.repeats_stopped == 0
    assert not h.trace.call_events
    assert h.stage.history.entries[-1].content == model.TEXT
