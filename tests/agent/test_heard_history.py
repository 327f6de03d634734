"""After a barge-in the history holds exactly what the caller heard: the text whose audio left
the transport (whole chunks, then the whole words of the cut one), in order, marked
interrupted, and the next request sends it.

The TTS here speaks each character as its own block of samples (a value per character), so
what left the transport is read back from the audio itself, independently of the playout's
bookkeeping."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from heard_agent import MARK, REPLY, SPC, CharTTS, ScriptedLLM, decode, heard_words

from agent.config import AgentConfig, LLMConfig, TTSConfig
from agent.frames import Frame, Interrupt, LLMEnd, TextToSpeak, UserTurnEnded
from agent.pipeline import Pipeline
from agent.session import Session
from stages.llm.stage import LLMStage
from stages.tts.stage import TTSStage


class Call:
    def __init__(self, llm: ScriptedLLM) -> None:
        self.llm = llm
        # (first chunks of 2-4 words: the chunk boundaries these cases cut inside)
        agent = AgentConfig(first_audio_wait_ms=0, preempt=False, prefill=False,
                            min_first_chunk_words=2, max_first_chunk_words=4)
        self.stage = LLMStage(llm, LLMConfig(), agent)
        self.tts = TTSStage(CharTTS(), TTSConfig())
        self.session = Session(Pipeline([self.stage, self.tts]))
        self.pulled: list[np.ndarray] = []
        self.said: list[str] = []  # the texts the TTS began to speak, in order
        self.ends: list[LLMEnd] = []
        self.session.listen(self._out, frozenset({TextToSpeak, LLMEnd}))

    def _out(self, frame: Frame) -> None:
        if isinstance(frame, TextToSpeak):
            self.said.append(frame.text)
        elif isinstance(frame, LLMEnd):
            self.ends.append(frame)

    async def until(self, ok, timeout: float = 5.0) -> None:  # noqa: ANN001
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not ok():
            assert loop.time() < end, "timed out"
            await asyncio.sleep(0.002)

    def pull(self, samples: int) -> None:
        """Send ``samples`` of queued agent audio (in 20 ms frames), as a transport would."""
        while samples > 0:
            frame = self.session.playout.pull()
            assert frame is not None, "nothing queued to send"
            self.pulled.append(frame.copy())
            samples -= len(frame)

    def queued_text(self, chars: int) -> bool:
        return self.session.playout.queued_samples >= chars * SPC


def chunks_of(call: Call) -> list[str]:
    return [t for t in call.said if t.strip()]


async def barge_in(call: Call, after_chars: int) -> str:
    """The caller speaks a turn, hears about ``after_chars`` characters of the reply, and
    cuts in; returns what the history holds of the reply."""
    call.session.push(UserTurnEnded("Is there a table for four tonight?"))
    if after_chars:
        # Each text the cut may fall in has all its audio queued, so the playout knows its
        # length (a later text began, or the LLM and the TTS are done); a text whose audio is
        # still coming is measured by the voice's usual pace instead, which CharTTS's is not.
        await call.until(lambda: call.queued_text(after_chars + 40) or (
            not call.stage.busy and not call.tts.busy and call.queued_text(after_chars)))
        call.pull(after_chars * SPC + SPC // 2)  # half-way into the next character
    else:
        await call.until(lambda: call.stage.tokens_generated > 0)
    call.session.push(Interrupt())
    await call.until(lambda: call.ends or not call.stage.busy)
    await asyncio.sleep(0.05)
    return call.stage.history.entries[-1].content


async def next_request(call: Call) -> list[dict[str, Any]]:
    call.session.push(UserTurnEnded("Yes please."))
    await call.until(lambda: len(call.llm.requests) == 2)
    return call.llm.requests[1]


@pytest.mark.parametrize("after_chars", [0, 13, 61])
def test_the_history_is_the_text_whose_audio_left(after_chars: int) -> None:
    asyncio.run(_the_history_is_the_text_whose_audio_left(after_chars))


async def _the_history_is_the_text_whose_audio_left(after_chars: int) -> None:
    """At 0 ms (a marker only), mid-way into the first chunk, and after several chunks."""
    call = Call(ScriptedLLM())
    await call.session.start()
    try:
        content = await barge_in(call, after_chars)
        played = decode(call.pulled)
        assert len(played) == after_chars
        expected = heard_words(chunks_of(call), played)
        if after_chars == 61:
            assert len(chunks_of(call)) >= 3 and expected.count(" ") >= 8  # several chunks
        if after_chars == 13:
            assert 0 < len(expected) < len(chunks_of(call)[0])  # inside the first chunk
        assert content == expected
        last = call.stage.history.entries[-1]
        assert last.role == "assistant" and last.truncated
        request = await next_request(call)
        if not expected:  # the caller heard nothing of it: for them, they spoke twice in a row
            assert [m["role"] for m in request] == ["system", "user"]
            assert request[-1]["content"] == "Is there a table for four tonight? Yes please."
            return
        assert [m["role"] for m in request[-3:]] == ["user", "assistant", "user"]
        assert request[-3]["content"] == "Is there a table for four tonight?"
        assert request[-2]["content"] == expected + MARK
        assert request[-1]["content"] == "Yes please."
    finally:
        await call.session.close()


def test_a_reply_cut_while_still_being_generated_keeps_what_was_heard() -> None:
    asyncio.run(_a_reply_cut_while_still_being_generated_keeps_what_was_heard())


async def _a_reply_cut_while_still_being_generated_keeps_what_was_heard() -> None:
    """The LLM is slow (a word every 30 ms): the cut comes mid-generation, and the history
    holds the heard words, not the generated ones that ran ahead of playout."""
    call = Call(ScriptedLLM(delay_s=0.03))
    await call.session.start()
    try:
        call.session.push(UserTurnEnded("Is there a table for four tonight?"))
        await call.until(lambda: call.queued_text(40))
        call.pull(30 * SPC + 100)
        assert call.stage.busy  # still generating
        call.session.push(Interrupt())
        await call.until(lambda: bool(call.ends))
        assert call.ends[-1].cancelled
        expected = heard_words(chunks_of(call), decode(call.pulled))
        assert expected and len(expected) < len(call.ends[-1].text)
        assert call.stage.history.entries[-1].content == expected
        request = await next_request(call)
        assert request[-2] == {"role": "assistant", "content": expected + MARK}
    finally:
        await call.session.close()


def test_a_reply_heard_whole_stays_whole_and_unmarked() -> None:
    asyncio.run(_a_reply_heard_whole_stays_whole_and_unmarked())


async def _a_reply_heard_whole_stays_whole_and_unmarked() -> None:
    call = Call(ScriptedLLM())
    await call.session.start()
    try:
        call.session.push(UserTurnEnded("Is there a table for four tonight?"))
        await call.until(lambda: not call.stage.busy and not call.tts.busy
                         and call.session.playout.idle is False)
        call.pull(call.session.playout.queued_samples)
        assert decode(call.pulled) == "".join(chunks_of(call))
        call.session.push(Interrupt())  # a barge-in after the reply was heard to its end
        await asyncio.sleep(0.05)
        entry = call.stage.history.entries[-1]
        assert entry.content == REPLY and not entry.truncated
        request = await next_request(call)
        assert request[-2] == {"role": "assistant", "content": REPLY}
    finally:
        await call.session.close()


def test_an_earlier_reply_played_whole_is_not_touched_by_a_later_cut() -> None:
    asyncio.run(_an_earlier_reply_played_whole_is_not_touched_by_a_later_cut())


async def _an_earlier_reply_played_whole_is_not_touched_by_a_later_cut() -> None:
    """Two replies: the first heard whole, the second cut at 0 ms. Only the second changes,
    and the order of the history is the order spoken."""
    call = Call(ScriptedLLM())
    await call.session.start()
    try:
        call.session.push(UserTurnEnded("Hello?"))
        await call.until(lambda: not call.stage.busy and not call.tts.busy and len(call.ends) == 1)
        call.pull(call.session.playout.queued_samples)
        call.session.push(UserTurnEnded("Is there a table?"))
        await call.until(lambda: call.stage.tokens_generated > len(REPLY.split(" ")))
        call.session.push(Interrupt())
        await call.until(lambda: len(call.ends) == 2)
        await asyncio.sleep(0.05)
        roles = [(e.role, e.content, e.truncated) for e in call.stage.history.entries]
        assert roles == [("user", "Hello?", False), ("assistant", REPLY, False),
                         ("user", "Is there a table?", False), ("assistant", "", True)]
    finally:
        await call.session.close()
