"""The LLM stage: a finished user turn in, streamed reply text and speakable chunks out."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field

from agent.config import AgentConfig, LLMConfig
from agent.frames import (
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    EndOfCall,
    Frame,
    Interrupt,
    LLMEnd,
    LLMTextDelta,
    SpeculationResolved,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TextToSpeak,
    Transcript,
    TurnCandidate,
    UserTurnEnded,
)
from agent.stage import DOWN, UP, QueuedStage, StageContext
from stages.faults import APOLOGY, LLM_UNAVAILABLE, StageFault, fault_frame
from stages.llm.chat import ChatHistory, ChatLLM
from stages.llm.sentences import SentenceAggregator

log = logging.getLogger("voxline.llm")

_speculation_ids = itertools.count(1)


@dataclass(slots=True)
class Reply:
    """One reply being generated: to a confirmed turn, or speculatively to a TurnCandidate.

    While a speculative reply is unconfirmed, nothing of it reaches the caller: its text
    frames wait here, its TextToSpeak chunks go to the TTS marked ``held`` (synthesized, not
    played), and its trace events are kept with their times for the turn they will belong to.
    """

    text: str  # the caller's turn it answers
    id: int = 0  # a speculation's id; 0 for a reply to a confirmed turn
    confirmed: bool = True
    parts: list[str] = field(default_factory=list)  # the tokens so far
    said: list[str] = field(default_factory=list)  # the chunks sent to the TTS
    held: list[Frame] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    @property
    def tokens(self) -> int:
        return len(self.parts)


class LLMStage(QueuedStage):
    """Answers each :class:`UserTurnEnded` (forwarded first) with :class:`LLMTextDelta` frames
    as tokens arrive, :class:`TextToSpeak` chunks as they become speakable, then one
    :class:`LLMEnd`.

    Preemption (``agent.preempt``): a :class:`TurnCandidate` — the caller paused, and this is
    what they said if the turn ends now — starts a speculative reply at once. Its text waits
    here and its chunks are synthesized but held by the TTS. When the turn ends with the same
    text the reply is adopted: what was held goes on at once and generation continues. When
    the caller goes on (speech starts or resumes), the text differs, or a barge-in comes, it is
    cancelled and its held work discarded unheard. Nothing speculative is ever spoken, added to
    the history or allowed side effects; the tokens generated and thrown away are counted
    (``tokens_discarded``).

    On a barge-in the reply in flight is cancelled; the history keeps what was generated so
    far, marked truncated, and an ``LLMEnd(cancelled=True)`` follows.

    When the LLM fails (its server refuses, resets, answers an HTTP error, sends a stream that
    cannot be read, or misses a deadline; a local model raises) the caller hears ``apology``
    after whatever of the reply was already sent to the TTS, and the call goes on: the next
    turn is a fresh request. Clients get an :class:`~agent.frames.ErrorFrame` with the fault's
    code and a generic message (``stages.faults``), never the upstream text, which goes to
    the log; ``errors`` counts the failures and the trace records each (the turn's
    ``info.error`` and a call event). The history keeps only what was said: the chunks sent
    to the TTS, marked truncated, or nothing of the turn when nothing was said (a request that
    failed outright, e.g. too long for the context, then cannot poison every later one). The
    apology itself stays out of the history: it is the agent's, not the model's.

    The stage owns the configured greeting: it speaks it once, from :meth:`start`, keeps it in
    the history as the agent's first words and traces it as the ``greeting`` turn, timed from
    the call's start. Text that other stages ask the agent to say (``TextToSpeak`` arriving
    from upstream, e.g. an idle re-prompt) goes on and joins the history as the agent's words.
    """

    name = "llm"
    consumes = frozenset({
        SpeechPaused, SpeechStarted, SpeechResumed, Transcript, TurnCandidate, UserTurnEnded,
        TextToSpeak, BotStartedSpeaking, BotStoppedSpeaking,
    })

    def __init__(
        self, llm: ChatLLM, cfg: LLMConfig, agent: AgentConfig, apology: str = APOLOGY
    ) -> None:
        super().__init__()
        self.llm = llm
        self.cfg = cfg
        self.agent = agent
        self.apology = apology.strip()  # empty: a failed reply ends in silence (and its error)
        self.errors = 0  # replies that failed
        self.history = ChatHistory(cfg.system_prompt, cfg.history_turns)
        self._greeted = False
        self._speaking = False
        self._spoke = asyncio.Event()
        self._paused = False  # the caller paused; the VAD has not yet confirmed the end
        self._heard = ""  # the latest partial transcript of the caller's utterance
        self._prefilling: asyncio.Future[None] | None = None
        self.prefills = 0
        self._speculation: Reply | None = None
        self.speculations = 0  # speculative replies started
        self.adopted = 0  # ... that became the reply
        self.tokens_generated = 0  # every token, speculative or not
        self.tokens_discarded = 0  # tokens of speculative replies thrown away

    def process(self, frame: Frame, direction: Direction) -> None:
        if direction is DOWN:
            if isinstance(frame, TurnCandidate):
                self._speculate(frame.text)
            elif isinstance(frame, SpeechPaused):
                self._paused = True
                if not self.agent.preempt:
                    self._prefill(self._heard)  # most of the utterance: most of the prompt
            elif isinstance(frame, SpeechStarted | SpeechResumed):
                self._paused = False
                self._heard = ""
                self._discard()  # the caller goes on: the candidate turn was not the turn
            elif isinstance(frame, UserTurnEnded):
                self._paused = False
                self._heard = ""
            elif isinstance(frame, Transcript) and not frame.final:
                self._heard = frame.text
                if self._paused and not self.agent.preempt:
                    self._prefill(frame.text)
            elif isinstance(frame, TextToSpeak) and not frame.held and not frame.greeting:
                if frame.text.strip():
                    self.history.add_assistant(frame.text.strip())  # said for another stage
            elif isinstance(frame, EndOfCall):
                self._discard()
        elif direction is UP:
            if isinstance(frame, BotStartedSpeaking):
                self._speaking = True
                self._spoke.set()
            elif isinstance(frame, BotStoppedSpeaking):
                self._speaking = False
        super().process(frame, direction)

    @property
    def busy(self) -> bool:
        spec = self._speculation
        return super().busy or (spec is not None and spec.task is not None and not spec.task.done())

    @property
    def _replying(self) -> bool:
        """A reply to a confirmed turn is queued or being generated."""
        return bool(self._queue) or (self._current is not None and not self._current.done())

    def on_interrupt(self, frame: Interrupt) -> None:
        self._discard()

    # --- speculation ---------------------------------------------------------------------------
    def _speculate(self, text: str) -> None:
        text = text.strip()
        if not self.agent.preempt or not text or self._replying:
            return
        spec = self._speculation
        if spec is not None and spec.text == text:
            return
        self._discard()
        spec = Reply(text, id=next(_speculation_ids), confirmed=False)
        messages = self.history.messages() + [{"role": "user", "content": text}]
        spec.task = self.ctx.spawn(self._generate(messages, spec), name="llm-speculation")
        spec.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._speculation = spec
        self.speculations += 1

    def _discard(self) -> None:
        """Throw the speculative reply away, unheard: its generation and its held audio."""
        spec = self._speculation
        if spec is None:
            return
        self._speculation = None
        if spec.task is not None and not spec.task.done():
            spec.task.cancel()
        self.tokens_discarded += spec.tokens
        self.push(SpeculationResolved(spec.id, confirmed=False))

    def _adopt(self, spec: Reply) -> None:
        """The turn ended with the candidate's text: the speculative reply is the reply."""
        self._speculation = None
        self.adopted += 1
        spec.confirmed = True
        trace = self.ctx.trace
        if trace is not None:
            for name, t_ns in spec.events:
                trace.event(name, t_ns)
            trace.info(preempted=True, preempted_tokens=spec.tokens)
            if spec.parts:
                trace.note(reply="".join(spec.parts).strip())
        held, spec.held = spec.held, []
        for f in held:
            self.push(f)
        self.push(SpeculationResolved(spec.id, confirmed=True))

    # --- prefill -------------------------------------------------------------------------------
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

    # --- the reply -----------------------------------------------------------------------------
    async def handle(self, frame: Frame) -> None:
        assert isinstance(frame, UserTurnEnded)
        self.push(frame)  # the turn's text goes on ahead of its reply (captions, transports)
        text = frame.text.strip()
        if not text:
            self._discard()
            return
        spec = self._speculation
        if spec is not None and spec.text == text and spec.task is not None \
                and not (spec.task.done() and (spec.task.cancelled() or spec.task.exception())):
            reply = spec
            self._adopt(spec)
        else:
            self._discard()
            reply = Reply(text)
        self.history.add_user(text)
        try:
            if reply.task is None:
                self._spoke.clear()
                await self._generate(self.history.messages(), reply)
            else:
                await asyncio.shield(reply.task)
        except asyncio.CancelledError:
            # Barge-in: the history keeps only what was generated before it.
            if reply.task is not None:
                reply.task.cancel()
            partial = "".join(reply.parts).strip()
            self.history.add_assistant(partial, truncated=True)
            self.push(LLMEnd(text=partial, cancelled=True))
            raise
        except Exception as exc:
            self._fail(reply, exc)
            return
        answer = "".join(reply.parts).strip()
        self.history.add_assistant(answer)
        self.push(LLMEnd(text=answer))
        trace = self.ctx.trace
        if trace is not None:
            trace.note(reply=answer)

    def _fail(self, reply: Reply, exc: Exception) -> None:
        """The reply failed: the caller hears the apology after what was said, clients get
        the fault's code, the log gets the detail, and the reply is closed so downstream
        stages are not left waiting."""
        code = exc.code if isinstance(exc, StageFault) else LLM_UNAVAILABLE
        if isinstance(exc, StageFault):
            log.warning("%s: the reply failed (%s): %s", self.name, code, exc)
        else:
            log.error("%s: the reply failed (%s)", self.name, code, exc_info=exc)
        self.errors += 1
        said = " ".join(reply.said)
        if said:
            self.history.add_assistant(said, truncated=True)
        else:
            self.history.discard_turn()
        self.push(fault_frame(code, self.name))
        trace = self.ctx.trace
        if trace is not None:
            trace.info(error=code)
            trace.call_event("error", stage=self.name, code=code)
            trace.note(reply=" ".join([said, self.apology]).strip())
        if self.apology:
            self.push(TextToSpeak(self.apology))
        self.push(LLMEnd(text=said, cancelled=True))

    def _emit(self, reply: Reply, frame: Frame) -> None:
        if reply.confirmed:
            self.push(frame)
        else:
            reply.held.append(frame)

    def _event(self, reply: Reply, name: str) -> None:
        if reply.confirmed:
            trace = self.ctx.trace
            if trace is not None:
                trace.event(name)
        else:
            reply.events.append((name, time.monotonic_ns()))

    async def _generate(self, messages: list[dict[str, str]], reply: Reply) -> None:
        """Stream the reply's tokens into frames; ends with the last chunk pushed (the caller
        closes the reply with LLMEnd and the history)."""
        chunks = SentenceAggregator(self.agent.min_first_chunk_words,
                                    self.agent.max_first_chunk_words)
        first_chunk = True
        if not reply.confirmed:
            self._spoke.clear()
        self._event(reply, "llm_request")
        async with aclosing(self.llm.stream(messages)) as tokens:
            async for token in tokens:
                if not token:
                    continue
                if not reply.parts:
                    self._event(reply, "llm_first_token")
                reply.parts.append(token)
                self.tokens_generated += 1
                self._emit(reply, LLMTextDelta(token))
                for chunk in chunks.feed(token):
                    reply.said.append(chunk)
                    self.push(TextToSpeak(chunk, held=0 if reply.confirmed else reply.id))
                    trace = self.ctx.trace
                    if trace is not None and reply.confirmed:
                        # Noted as it grows: the turn closes at its first audio out,
                        # usually before the reply is complete.
                        trace.note(reply="".join(reply.parts).strip())
                    if first_chunk:
                        first_chunk = False
                        await self._yield_to_first_audio()
        rest = chunks.flush()  # only once the reply is complete: a failed one's tail is unsaid
        if rest:
            reply.said.append(rest)
            self.push(TextToSpeak(rest, held=0 if reply.confirmed else reply.id))
