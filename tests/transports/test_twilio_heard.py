"""Over Twilio, "heard" means the mark came back: after a barge-in the history holds the words
whose audio Twilio confirmed it played (its echo of a mark sent after them), not what was sent
to it, and the report waits for the echoes that follow Twilio's clear (or a deadline)."""

from __future__ import annotations

import asyncio
import re

from heard_agent import MARK, REPLY, SPC, CharTTS, ScriptedLLM, heard_words

from agent.config import AgentConfig, LLMConfig, TTSConfig
from agent.frames import Interrupt, TextToSpeak, UserTurnEnded
from agent.pipeline import Pipeline
from agent.session import Session
from stages.llm.stage import LLMStage
from stages.tts.stage import TTSStage
from transports.twilio.call import HEARD_SETTLE_S, TwilioCall
from transports.twilio.messages import Clear, MarkEcho, SendMark, SendMedia, Start

MS = 1_000_000
T0 = 10**12
PACKET = 320  # 16 kHz samples in one 20 ms packet


class Line:
    """The agent (scripted LLM, character TTS) behind the Twilio call core, ticked by hand."""

    def __init__(self) -> None:
        agent = AgentConfig(first_audio_wait_ms=0, preempt=False, prefill=False)
        self.stage = LLMStage(ScriptedLLM(), LLMConfig(), agent)
        self.tts = TTSStage(CharTTS(), TTSConfig())
        self.session = Session(Pipeline([self.stage, self.tts]))
        self.said: list[str] = []
        self.session.listen(lambda f: isinstance(f, TextToSpeak) and self.said.append(f.text),
                            frozenset({TextToSpeak}))
        self.call = TwilioCall(self.session, Start("MZ1", "CA1"))
        self.now = T0
        self.packets = 0  # media packets sent
        self.marks: list[tuple[str, int]] = []  # (name, media packets sent before it)

    def tick(self) -> list:
        out = self.call.tick(self.now)
        self.now += 20 * MS
        for m in out:
            if isinstance(m, SendMedia):
                self.packets += 1
            elif isinstance(m, SendMark):
                self.marks.append((m.name, self.packets))
        return out

    def echo(self, name: str) -> None:
        self.call.receive(MarkEcho("MZ1", name), self.now)


def word_ends(chunks: list[str]) -> set[int]:
    ends, at = set(), 0
    for chunk in chunks:
        ends |= {at + m.end() for m in re.finditer(r"\S+", chunk)}
        at += len(chunk)
    return ends


async def speak(line: Line) -> None:
    await line.session.start()
    line.session.push(UserTurnEnded("Is there a table for four tonight?"))
    loop = asyncio.get_running_loop()
    end = loop.time() + 5
    while line.stage.busy or line.tts.busy or line.session.playout.queued_samples == 0:
        assert loop.time() < end
        await asyncio.sleep(0.005)
    for _ in range(60):  # 1.2 s of the reply sent to Twilio
        line.tick()


def test_the_history_holds_what_twilio_confirmed_played() -> None:
    async def main() -> None:
        line = Line()
        try:
            await speak(line)
            chunks = [t for t in line.said if t.strip()]
            ends = word_ends(chunks)
            # Twilio played up to a mark that stands well inside a word (a character's margin)
            name, before = next(
                (n, k) for n, k in line.marks
                if ":h" in n and k * PACKET / SPC > 12
                and all(abs(k * PACKET / SPC - e) >= 1 for e in ends))
            record = next(r for r in line.call.stats.marks if r.name == name)
            assert abs(record.position - before * PACKET) < SPC  # (the mark's own position)
            for n, _ in line.marks[: line.marks.index((name, before)) + 1]:
                line.echo(n)
            line.session.push(Interrupt())
            assert isinstance(line.tick()[0], Clear)
            # not settled until Twilio has echoed what the clear dropped
            assert line.stage.history.entries[-1].content == REPLY  # (still the whole reply)
            pending = [n for n, _ in line.marks if n in line.call._pending]
            assert pending
            for n in pending:
                line.echo(n)
            await asyncio.sleep(0.05)
            heard_chars = int(before * PACKET / SPC)
            expected = heard_words(chunks, "".join(chunks)[:heard_chars])
            sent_chars = line.packets * PACKET / SPC
            assert expected and len(expected) < sent_chars - 8  # less than was sent to Twilio
            entry = line.stage.history.entries[-1]
            assert entry.content == expected and entry.truncated
            assert line.stage.history.messages()[-1]["content"] == expected + MARK
        finally:
            await line.session.close()

    asyncio.run(main())


def test_without_the_echoes_the_report_comes_at_the_deadline_with_what_was_confirmed() -> None:
    async def main() -> None:
        line = Line()
        try:
            await speak(line)
            chunks = [t for t in line.said if t.strip()]
            line.echo(line.marks[0][0])  # only the start mark came back
            line.session.push(Interrupt())
            line.tick()
            await asyncio.sleep(0.01)
            assert line.stage.history.entries[-1].content == REPLY  # (not yet known what was heard)
            for _ in range(int(HEARD_SETTLE_S * 1000 / 20) + 2):
                line.tick()
            await asyncio.sleep(0.05)
            start_chars = int(line.marks[0][1] * PACKET / SPC)
            entry = line.stage.history.entries[-1]
            assert entry.truncated and entry.content == heard_words(
                chunks, "".join(chunks)[:start_chars])
        finally:
            await line.session.close()

    asyncio.run(main())
