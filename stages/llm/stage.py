"""The LLM stage: a finished user turn in, streamed reply text and speakable chunks out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import aclosing

from agent.config import AgentConfig, LLMConfig
from agent.frames import (
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    Frame,
    LLMEnd,
    LLMTextDelta,
    SpeechPaused,
    SpeechStarted,
    TextToSpeak,
    Transcript,
    UserTurnEnded,
)
from agent.stage import DOWN, UP, QueuedStage, StageContext
from stages.llm.chat import ChatHistory, ChatLLM
from stages.llm.sentences import SentenceAggregator


class LLMStage(QueuedStage):
    """Answers each :class:`UserTurnEnded` (forwarded first) with :class:`LLMTextDelta` frames
    as tokens arrive, :class:`TextToSpeak` chunks as they become speakable, then one
    :class:`LLMEnd`.

    On a barge-in the reply in flight is cancelled; the history keeps what was generated so
    far, marked truncated, and an ``LLMEnd(cancelled=True)`` follows.

    The stage owns the configured greeting: it speaks it once, from :meth:`start`, keeps it in
    the history as the agent's first words and traces it as the ``greeting`` turn, timed from
    the call's start.
    """

    name = "llm"
    consumes = frozenset({SpeechPaused, SpeechStarted, Transcript, UserTurnEnded, BotStartedSpeaking, BotStoppedSpeaking})

    def __init__(self, llm: ChatLLM, cfg: LLMConfig, agent: AgentConfig) -> None:
        super().__init__()
        self.llm = llm
        self.cfg = cfg
        self.agent = agent
        self.history = ChatHistory(cfg.system_prompt, cfg.history_turns)
        self._greeted = False
        self._speaking = False
        self._spoke = asyncio.Event()
        self._paused = False  # the caller paused; the VAD has not yet confirmed the end
        self._heard = ""  # the latest partial transcript of the caller's utterance
        self._prefilling: asyncio.Future[None] | None = None
        self.prefills = 0

    def process(self, frame: Frame, direction: Direction) -> None:
        if direction is DOWN:
            if isinstance(frame, SpeechPaused):
                self._paused = True
                self._prefill(self._heard)  # most of the utterance: most of the prompt
            elif isinstance(frame, SpeechStarted | UserTurnEnded):
                self._paused = False
                self._heard = ""
            elif isinstance(frame, Transcript) and not frame.final:
                self._heard = frame.text
                if self._paused:
                    self._prefill(frame.text)
        elif direction is UP:
            if isinstance(frame, BotStartedSpeaking):
                self._speaking = True
                self._spoke.set()
            elif isinstance(frame, BotStoppedSpeaking):
                self._speaking = False
        super().process(frame, direction)

    def _prefill(self, text: str) -> None:
        """The caller has paused and the ASR has the utterance: while the VAD waits out the
        rest of the silence, have a local LLM evaluate the prompt this turn will most likely
        send, so the real request pays only for its first token."""
        text = text.strip()
        if not self.llm.capabilities.prefill or not text or not self.agent.prefill or self.busy:
            return
        if self._prefilling is not None and not self._prefilling.done():
            return
        messages = self.history.messages() + [{"role": "user", "content": text}]
        self.prefills += 1
        self._prefilling = self.llm.prefill(messages)
        self._prefilling.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _yield_to_first_audio(self) -> None:
        """After the reply's first chunk, let the TTS have the CPU until its audio is out (or
        ``first_audio_wait_ms`` passed). The LLM outpaces speech several times over, so the
        pause costs the caller nothing later, and on 2 cores it takes ~100 ms off the first
        audio (a local LLM's generation pauses with its consumer)."""
        if self._speaking or self.agent.first_audio_wait_ms <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._spoke.wait(), self.agent.first_audio_wait_ms / 1000)

    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        if self.agent.greeting and not self._greeted:
            self._greeted = True
            if ctx.trace is not None:
                ctx.trace.begin_turn("greeting", call_start=ctx.started_ns or time.monotonic_ns())
            self.history.add_assistant(self.agent.greeting)
            self.push(TextToSpeak(self.agent.greeting, greeting=True))

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, UserTurnEnded)

    async def handle(self, frame: Frame) -> None:
        assert isinstance(frame, UserTurnEnded)
        self.push(frame)  # the turn's text goes on ahead of its reply (captions, transports)
        text = frame.text.strip()
        if not text:
            return
        trace = self.ctx.trace
        self.history.add_user(text)
        chunks = SentenceAggregator(self.agent.min_first_chunk_words,
                                    self.agent.max_first_chunk_words)
        parts: list[str] = []
        first_chunk = True
        self._spoke.clear()
        if trace is not None:
            trace.event("llm_request")
        try:
            async with aclosing(self.llm.stream(self.history.messages())) as tokens:
                async for token in tokens:
                    if not token:
                        continue
                    if not parts and trace is not None:
                        trace.event("llm_first_token")
                    parts.append(token)
                    self.push(LLMTextDelta(token))
                    for chunk in chunks.feed(token):
                        self.push(TextToSpeak(chunk))
                        if trace is not None:
                            # Noted as it grows: the turn closes at its first audio out,
                            # usually before the reply is complete.
                            trace.note(reply="".join(parts).strip())
                        if first_chunk:
                            first_chunk = False
                            await self._yield_to_first_audio()
        except asyncio.CancelledError:
            # Barge-in: the history keeps only what was generated before it.
            partial = "".join(parts).strip()
            self.history.add_assistant(partial, truncated=True)
            self.push(LLMEnd(text=partial, cancelled=True))
            raise
        except Exception:
            # Close the reply so downstream stages are not left waiting; the failure itself
            # becomes an ErrorFrame. A request that failed outright (too long for the context,
            # server down) is forgotten, so it cannot poison every later request.
            partial = "".join(parts).strip()
            if partial:
                self.history.add_assistant(partial, truncated=True)
            else:
                self.history.discard_turn()
            self.push(LLMEnd(text=partial, cancelled=True))
            raise
        rest = chunks.flush()
        if rest:
            self.push(TextToSpeak(rest))
        reply = "".join(parts).strip()
        self.history.add_assistant(reply)
        self.push(LLMEnd(text=reply))
        if trace is not None:
            trace.note(reply=reply)
