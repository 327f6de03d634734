"""The LLM stage: a finished user turn in, streamed reply text and speakable chunks out."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from agent.config import AgentConfig, LLMConfig
from agent.errors import ConfigError
from agent.frames import (
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    EndOfCall,
    Frame,
    HangUp,
    HeardText,
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
    first_capital,
)
from agent.stage import DOWN, UP, QueuedStage, StageContext
from agent.tools import CallsComing, ToolCall, ToolContext, ToolResult, Tools, run_tool
from stages.faults import APOLOGY, LLM_EMPTY_REPLY, LLM_UNAVAILABLE, StageFault, fault_frame
from stages.llm.chat import ChatHistory, ChatLLM, Message
from stages.llm.sentences import RepeatWatch, SentenceAggregator

log = logging.getLogger("voxline.llm")

_speculation_ids = itertools.count(1)
# Keys of agent messages (TextToSpeak.reply), increasing through the process: the playout's
# HeardText says which keys it has seen by the highest one.
_message_keys = itertools.count(1)
# After a barge-in, the next request waits at most this long for the playout's word on what
# the caller heard (at once on most transports; Twilio's marks take a round trip).
HEARD_WAIT_S = 0.5
UNSETTLED_MAX = 8  # agent messages whose playout may still be cut, remembered at most
RUNNING = "(running)"  # a tool message's content until its tool returns
CANCELLED = "error: cancelled — the caller interrupted before the tool finished"
# tools with side effects still running: held here so that they finish even after their call
# (and its task set) is gone
_LINGERING: set[asyncio.Task[Any]] = set()


@dataclass(slots=True)
class Spoken:
    """One agent message as the TTS speaks it: the chunks sent under its ``key``, the history
    message holding it, and, once a barge-in cut the playout, what the caller heard of it."""

    key: int
    said: list[str] = field(default_factory=list)
    message: Message | None = None
    whole: bool = False  # every chunk of it was sent (the message is complete)
    heard: str | None = None


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
    parts: list[str] = field(default_factory=list)  # the tokens so far, every step's
    step_from: int = 0  # where the current step's tokens begin in ``parts``
    spoken: Spoken = field(default_factory=lambda: Spoken(next(_message_keys)))
    calls: list[ToolCall] = field(default_factory=list)  # the step's tool calls, not yet run
    steps: list[str] = field(default_factory=list)  # the text of each step done
    filler: asyncio.Task[None] | None = None  # the step's filler, waiting to be said
    calls_coming: float = 0.0  # (loop time) when the step was known to call tools
    fillers: int = 0  # fillers said in this reply (one at most)
    held: list[Frame] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    # the step stopped before saying a chunk again: (that chunk, when); its text is then what
    # it said
    repeat: tuple[str, int] | None = None

    @property
    def tokens(self) -> int:
        return len(self.parts)

    @property
    def said(self) -> list[str]:
        """The current step's chunks sent to the TTS."""
        return self.spoken.said

    @property
    def step_text(self) -> str:
        if self.repeat is not None:
            return " ".join(self.said)
        return "".join(self.parts[self.step_from:]).strip()

    def end_filler(self) -> None:
        if self.filler is not None:
            self.filler.cancel()
            self.filler = None

    @property
    def answer(self) -> str:
        """All of the reply so far: its steps' texts, then the current step's."""
        return " ".join(t for t in (*self.steps, self.step_text) if t)

    def next_step(self) -> None:
        self.end_filler()
        self.calls_coming = 0.0
        self.steps.append(self.step_text)
        self.step_from = len(self.parts)
        self.repeat = None
        self.spoken = Spoken(next(_message_keys))
        self.calls = []


def as_message(text: str) -> str:
    """The caller's words as the LLM gets them: with a capital first letter
    (``first_capital``), so the words a local LLM took into its cache while the caller spoke
    (:meth:`_prefill_spoken`) still count at the turn's end: on 12 clips of the speech set the
    first letter's case alone made 3 of 14 replies evaluate the caller's whole message again
    (~9 ms a token on one thread of an AVX2 EPYC). The open turn and the final go through here
    both, so they agree."""
    return first_capital(text)


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
    the history or allowed side effects (a speculative reply that calls tools stops there; the
    tools run once the turn is confirmed); the tokens generated and thrown away are counted
    (``tokens_discarded``).

    **Tools** (``tools``, ``[llm] tools``). Each request of a reply offers the tools (the first
    with ``[llm] tool_choice``); when the model calls some, the calls run at once, in parallel,
    each within its time limit, their results join the history after the assistant message
    that called them, and the model is asked again, up to ``max_tool_steps`` requests that may
    call tools. A tool that fails, times out or gets bad arguments answers the model with the
    error, so the reply goes on. When the tools have run ``filler_delay_ms`` and the agent has
    said nothing of this request, it says ``filler`` ("One moment."). A barge-in cancels the
    reply and the tools without side effects; a tool with side effects runs to its end, even
    past the end of the call, and its result stays in the history (the next request waits for
    it). Each call is a ``tool_call`` event in the trace (tool, ms, outcome); a turn that
    calls tools has ``info.calls_tools`` (set as soon as the calls are announced) and
    ``info.tools``. A tool that hangs up (``ToolContext.hang_up``) ends the call after the
    agent's words, with ``goodbye`` when it had said nothing.

    **The history holds what the caller heard.** Every agent message's chunks carry its key
    (``TextToSpeak.reply``). When a barge-in cuts the playout, the playout reports what of each
    message reached the caller (:class:`HeardText`), and the message in the history becomes
    exactly that, marked truncated (sent with ``[llm] interrupted_mark``); a reply cut before
    its first audio was never heard, and the caller's next turn joins the turn it answered
    (:class:`~stages.llm.chat.ChatHistory`). This holds whether the reply was still being
    generated or already complete and playing, and the message keeps its place in the
    history. The next request waits briefly for that report (``HEARD_WAIT_S``), so it always
    carries the heard text; an ``LLMEnd(cancelled=True)`` closes a reply cut mid-generation.

    When the LLM fails (its server refuses, resets, answers an HTTP error, sends a stream that
    cannot be read, or misses a deadline; a local model raises) the caller hears ``apology``
    after whatever of the reply was already sent to the TTS, and the call goes on: the next
    turn is a fresh request. Clients get an :class:`~agent.frames.ErrorFrame` with the fault's
    code and a generic message (``stages.faults``), never the upstream text, which goes to
    the log; ``errors`` counts the failures and the trace records each (the turn's
    ``info.error`` and a call event). The history keeps only what was said: the chunks sent
    to the TTS, marked truncated, or nothing of the turn when nothing was said (a request that
    failed outright, e.g. too long for the context, then cannot poison every later one). The
    apology itself stays out of the history: it is the agent's, not the model's. A reply with
    no word in it (empty, or only punctuation such as the interrupted mark) would leave the
    caller in silence, so it fails the same way (``llm_empty_reply``).

    The stage owns the configured greeting: it speaks it once, from :meth:`start`, keeps it in
    the history as the agent's first words and traces it as the ``greeting`` turn, timed from
    the call's start. Text that other stages ask the agent to say (``TextToSpeak`` arriving
    from upstream, e.g. an idle re-prompt) goes on and joins the history as the agent's words.
    """

    name = "llm"
    consumes = frozenset({
        SpeechPaused, SpeechStarted, SpeechResumed, Transcript, TurnCandidate, UserTurnEnded,
        TextToSpeak, BotStartedSpeaking, BotStoppedSpeaking, HeardText,
    })

    def __init__(
        self, llm: ChatLLM, cfg: LLMConfig, agent: AgentConfig, apology: str = APOLOGY,
        tools: Tools | None = None,
    ) -> None:
        super().__init__()
        self.llm = llm
        self.cfg = cfg
        self.agent = agent
        self.apology = apology.strip()  # empty: a failed reply ends in silence (and its error)
        self.tools = tools if tools is not None and len(tools) else None
        if self.tools is not None and not llm.capabilities.tools:
            raise ConfigError(
                f"the LLM backend {type(llm).__name__} cannot call tools — use a model and "
                "backend that can (the openai backend against a server with function calling, "
                "or the local backend), or configure no tools")
        self.errors = 0  # replies that failed
        self.history = ChatHistory(cfg.system_prompt, cfg.history_turns,
                                   interrupted_mark=cfg.interrupted_mark)
        self._greeted = False
        self._speaking = False
        self._spoke = asyncio.Event()
        self._paused = False  # the caller paused; the VAD has not yet confirmed the end
        self._heard = ""  # the latest partial transcript of the caller's utterance
        self._prefilling: asyncio.Future[None] | None = None
        self._prefilled = ""  # the words of the caller's turn last prefilled as an open message
        self._said: list[str] = []  # the finals of the caller's turn so far
        self.prefills = 0
        self._speculation: Reply | None = None
        self.speculations = 0  # speculative replies started
        self.adopted = 0  # ... that became the reply
        self.tokens_generated = 0  # every token, speculative or not
        self.tokens_discarded = 0  # tokens of speculative replies thrown away
        # agent messages whose playout a barge-in may still cut, oldest first
        self._unsettled: list[Spoken] = []
        self._heard_due = asyncio.Event()  # set: no HeardText is awaited
        self._heard_due.set()
        self._side_effects: set[asyncio.Task[ToolResult]] = set()  # tools left running
        self.tool_calls = 0
        self.fillers = 0
        self.repeats_stopped = 0  # replies (said) stopped where they would say a chunk again

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
                self._said.clear()
                self._prefilled = ""
            elif isinstance(frame, Transcript) and frame.final:
                if frame.text.strip():
                    self._said.append(frame.text.strip())  # (as the turn detector joins them)
            elif isinstance(frame, Transcript):
                self._heard = frame.text
                if self._paused and not self.agent.preempt:
                    self._prefill(frame.text)
                elif not self._paused and not frame.speculative:
                    self._prefill_spoken(frame)
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
            elif isinstance(frame, HeardText):
                self._on_heard(frame)
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
        if self._unsettled:
            self._heard_due.clear()  # the playout's HeardText is on its way

    # --- what the caller heard -------------------------------------------------------------------
    def _track(self, spoken: Spoken) -> None:
        self._unsettled.append(spoken)
        del self._unsettled[:-UNSETTLED_MAX]

    def _on_heard(self, frame: HeardText) -> None:
        heard = dict(frame.heard)
        for sp in self._unsettled:
            if sp.key in heard:
                text = heard[sp.key]
            elif sp.key > frame.newest:
                text = ""  # none of its audio reached the playout
            else:
                continue  # played whole before the cut
            if sp.whole and text == " ".join(sp.said):
                continue
            sp.heard = text
            if sp.message is not None:
                sp.message = self.history.revise(sp.message, text, truncated=True)
        self._unsettled.clear()
        self._heard_due.set()

    async def _before_request(self) -> None:
        """Let the history settle before it is sent: what the caller heard of a cut reply, and
        the results of tools with side effects still running from an interrupted one."""
        if not self._heard_due.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heard_due.wait(), HEARD_WAIT_S)
            self._heard_due.set()  # (no playout reported: the history keeps what was sent)
        if self._side_effects:
            await asyncio.wait(set(self._side_effects))

    # --- speculation ---------------------------------------------------------------------------
    def _speculate(self, text: str) -> None:
        text = text.strip()
        if not self.agent.preempt or not text or self._replying:
            return
        spec = self._speculation
        if spec is not None and spec.text == text:
            return
        if self._side_effects or not self._heard_due.is_set():
            return  # the history is about to change: a reply to it now would be wasted
        self._discard()
        spec = Reply(text, id=next(_speculation_ids), confirmed=False)
        messages = self.history.messages_with(as_message(text))
        spec.task = self.ctx.spawn(self._generate(messages, spec, 0), name="llm-speculation")
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
                trace.note(reply=spec.answer)
        self._note_repeat(spec)
        held, spec.held = spec.held, []
        for f in held:
            self.push(f)
        self.push(SpeculationResolved(spec.id, confirmed=True))
        if spec.calls_coming:
            self._mark_tool_turn()
            self._arm_filler(spec)  # its calls are being written: cover the wait from then

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
        messages = self.history.messages_with(as_message(text))
        self.prefills += 1
        self._prefilling = self.llm.prefill(messages)
        self._prefilling.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _prefill_spoken(self, frame: Transcript) -> None:
        """While the caller speaks, the words of the partial the ASR will not take back (its
        stable prefix, up to the last whole word) go into a local LLM's cache as the turn's
        open user message, so the reply's request at the pause evaluates only the words after
        them and the turn's end. Measured on 15 clips of the speech set
        (``benchmarks/voice_turn.py``, one prompt thread): the reply's first token p50 157 ->
        94 ms after its request. The backend skips it while it has a reply to work on."""
        if not (self.agent.prefill and self.llm.capabilities.partial_prefill) or self.busy:
            return
        if self._prefilling is not None and not self._prefilling.done():
            return
        stable = " ".join([*self._said, frame.stable_words()]).strip()
        if not stable or stable == self._prefilled:
            return
        self._prefilled = stable
        messages = self.history.messages_with(as_message(stable))
        self.prefills += 1
        self._prefilling = self.llm.prefill(messages, open_turn=True)
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
            spoken = Spoken(next(_message_keys), [self.agent.greeting], whole=True)
            spoken.message = self.history.add_assistant(self.agent.greeting)
            self._track(spoken)
            self.push(TextToSpeak(self.agent.greeting, greeting=True, reply=spoken.key))

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
            await self._before_request()
        self.history.add_user(as_message(text))
        self._track(reply.spoken)
        try:
            await self._answer(reply)
        except asyncio.CancelledError:
            # Barge-in: the history keeps what the caller heard of this step (known already,
            # or revised when the playout's report comes).
            if reply.task is not None:
                reply.task.cancel()
            reply.end_filler()
            sp = reply.spoken
            if sp.message is None:  # (cut while generating; else while its tools ran)
                heard = sp.heard if sp.heard is not None else " ".join(sp.said)
                sp.message = self.history.add_assistant(heard, truncated=True,
                                                        tool_calls=_call_dicts(reply.calls))
                for call in reply.calls:  # called, never run: the model must know they did not
                    self.history.add_tool_result(call.id, call.name, CANCELLED)
            self.push(LLMEnd(text=reply.answer, cancelled=True))
            raise
        except Exception as exc:
            self._fail(reply, exc)
            return
        answer = reply.answer
        self.push(LLMEnd(text=answer))
        trace = self.ctx.trace
        if trace is not None:
            trace.note(reply=answer)

    async def _answer(self, reply: Reply) -> None:
        """The reply's requests: the first (maybe already run as a speculation), then one more
        after each step that called tools, its results in the history."""
        step = 0
        while True:
            if reply.task is not None:
                await asyncio.shield(reply.task)
                reply.task = None
            else:
                if step == 0:
                    self._spoke.clear()
                await self._generate(self.history.messages(), reply, step)
            calls, sp = reply.calls, reply.spoken
            if not calls and not _speakable(reply.said):
                raise EmptyReply(f"the model's reply has nothing to say: {reply.step_text!r}")
            sp.whole = True
            sp.message = self.history.add_assistant(reply.step_text, tool_calls=_call_dicts(calls))
            if not calls:
                reply.end_filler()  # (announced calls that never came)
                return
            reply.calls = []
            hung_up, results = await self._run_tools(reply, calls)
            reply.end_filler()  # (the tools are done: the answer comes next)
            if hung_up:
                if not any(s.strip() for s in reply.parts):
                    self.push(TextToSpeak(self.agent.goodbye))
                self.push(HangUp(hung_up))
                return
            step += 1
            reply.next_step()
            self._track(reply.spoken)
            spoken = self._spoken_results(results)
            if spoken:  # the tools' results are the reply: said as they are, no more requests
                reply.parts.append(spoken)
                self._say(reply, spoken)
                reply.spoken.whole = True
                reply.spoken.message = self.history.add_assistant(spoken)
                return

    # --- tools ---------------------------------------------------------------------------------
    def _mark_tool_turn(self, names: list[str] | None = None) -> None:
        """The open turn calls tools (``info.calls_tools``; ``info.tools`` once they are known):
        marked before its first audio, which may be the filler, closes it."""
        trace = self.ctx.trace
        if trace is not None:
            trace.info(calls_tools=True, **({"tools": names} if names else {}))

    def _arm_filler(self, reply: Reply) -> None:
        """From now, a step that has said nothing says the filler after ``filler_delay_ms``
        (unless its tools are done by then): armed when the backend knows calls are coming,
        so the wait covered is the calls' writing and their running both."""
        if reply.filler is not None or reply.fillers or not self.agent.filler \
                or self.agent.filler_delay_ms < 0:
            return
        sp = reply.spoken
        loop = asyncio.get_running_loop()
        since = loop.time() - reply.calls_coming if reply.calls_coming else 0.0

        async def later() -> None:
            await asyncio.sleep(max(0.0, self.agent.filler_delay_ms / 1000 - since))
            if not sp.said and reply.spoken is sp:
                self.fillers += 1
                reply.fillers += 1
                self.push(TextToSpeak(self.agent.filler))

        reply.filler = self.ctx.spawn(later(), name="llm-filler")

    def _spoken_results(self, results: list[ToolResult]) -> str:
        """The text the agent says for a step whose every call was to a ``speak`` tool that
        worked ("" otherwise: the model answers from the results)."""
        assert self.tools is not None
        tools = [self.tools.get(r.call.name) for r in results]
        if not results or not all(t is not None and t.speak for t in tools):
            return ""
        if any(r.outcome != "ok" for r in results):
            return ""
        return " ".join(r.content.strip() for r in results if r.content.strip())

    async def _played(self) -> None:
        """What the agent has said so far has played (the TTS and the playout are done)."""
        call = self.ctx.call
        if call is not None:
            await call.wait_played(exclude=self)

    def _tool_context(self) -> ToolContext:
        call = self.ctx.call
        return ToolContext(
            call_id=self.ctx.session_id,
            keypad=call.keypad if call is not None else None,
            control=call.control if call is not None else None,
            speaker=lambda text: self.push(TextToSpeak(text)),
            played=self._played,
        )

    async def _run_tools(self, reply: Reply, calls: list[ToolCall]) -> tuple[str, list[ToolResult]]:
        """Run the step's tool calls at once, each within its limit, the filler said when they
        take long; returns the hang-up reason a tool asked for ("" for none) and the results
        in the calls' order."""
        assert self.tools is not None
        tool_ctx = self._tool_context()
        trace = self.ctx.trace
        self._mark_tool_turn([c.name for c in calls])
        if trace is not None:
            trace.event("tool_start")
        tasks: list[tuple[ToolCall, asyncio.Task[ToolResult]]] = []
        loop = asyncio.get_running_loop()
        for c in calls:
            message = self.history.add_tool_result(c.id, c.name, RUNNING)
            run = self._tool(c, tool_ctx, message)
            tool = self.tools.get(c.name)
            if tool is not None and tool.side_effects:
                # not the call's task: a booking under way finishes even if the call ends
                task = loop.create_task(run, name=f"tool-{c.name}")
                _LINGERING.add(task)
                task.add_done_callback(_LINGERING.discard)
            else:
                task = self.ctx.spawn(run, name=f"tool-{c.name}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            tasks.append((c, task))
        self.tool_calls += len(calls)
        self._arm_filler(reply)  # (armed already when the backend said calls were coming)
        try:
            await asyncio.wait({t for _, t in tasks})
        except asyncio.CancelledError:
            for c, task in tasks:
                tool = self.tools.get(c.name)
                if tool is not None and tool.side_effects and not task.done():
                    self._side_effects.add(task)  # it finishes; its result stays in the history
                    task.add_done_callback(self._side_effects.discard)
                else:
                    task.cancel()
            raise
        if trace is not None:
            trace.event("tool_end")
        return tool_ctx.hangup, [t.result() for _, t in tasks]

    async def _tool(self, call: ToolCall, tool_ctx: ToolContext, message: Message) -> ToolResult:
        assert self.tools is not None
        start = time.monotonic_ns()
        try:
            result = await run_tool(self.tools, call, tool_ctx, self.cfg.tool_timeout_s)
        except asyncio.CancelledError:
            self.history.revise(message, CANCELLED, truncated=False)
            self._trace_tool(call, start, "cancelled", False)
            raise
        self.history.revise(message, result.content, truncated=False)
        self._trace_tool(call, start, result.outcome, result.side_effects)
        if result.outcome != "ok":
            log.warning("%s: tool %s ended %s: %s", self.name, call.name, result.outcome,
                        result.content[:200])
        return result

    def _trace_tool(self, call: ToolCall, start: int, outcome: str, side_effects: bool) -> None:
        trace = self.ctx.trace
        if trace is not None:
            trace.call_event("tool_call", start, tool=call.name, outcome=outcome,
                             ms=round((time.monotonic_ns() - start) / 1e6, 3),
                             side_effects=side_effects)

    def _tool_offer(self, step: int) -> tuple[list[dict[str, Any]] | None, Any]:
        """The tools and tool_choice a request of step ``step`` sends."""
        if self.tools is None or step >= self.cfg.max_tool_steps:
            return None, None
        choice = self.cfg.tool_choice.strip() if step == 0 else "auto"
        if choice in ("", "auto"):
            return self.tools.specs(), None
        if choice in ("none", "required"):
            return self.tools.specs(), choice
        return self.tools.specs(), {"type": "function", "function": {"name": choice}}

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
        reply.end_filler()
        said = " ".join(reply.said) if _speakable(reply.said) else ""
        if said or reply.step_from:
            reply.spoken.message = self.history.add_assistant(said, truncated=True)
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

    def _say(self, reply: Reply, chunk: str) -> None:
        reply.said.append(chunk)
        self.push(TextToSpeak(chunk, held=0 if reply.confirmed else reply.id,
                              reply=reply.spoken.key))

    async def _generate(self, messages: list[dict[str, Any]], reply: Reply, step: int) -> None:
        """Stream one request's tokens into frames; ends with the last chunk pushed and the
        tool calls it made in ``reply.calls`` (the caller closes the step: the history, the
        tools, LLMEnd)."""
        chunks = SentenceAggregator(self.agent.min_first_chunk_words,
                                    self.agent.max_first_chunk_words,
                                    self.agent.max_second_chunk_words)
        first_chunk = step == 0
        repeats = RepeatWatch() if self.agent.stop_repeats else None
        if not reply.confirmed:
            self._spoke.clear()
        self._event(reply, "llm_request")
        tools, choice = self._tool_offer(step)
        stream = (self.llm.stream(messages) if tools is None
                  else self.llm.stream(messages, tools=tools, tool_choice=choice))
        async with aclosing(stream) as tokens:
            async for token in tokens:
                if isinstance(token, CallsComing):
                    if tools is not None:
                        reply.calls_coming = asyncio.get_running_loop().time()
                        if reply.confirmed:
                            self._mark_tool_turn()
                            self._arm_filler(reply)  # (a speculative one: once adopted)
                    continue
                if isinstance(token, list):
                    if tools is not None:
                        reply.calls.extend(token)
                    else:  # (none were offered: a backend's mistake, not something to run)
                        log.warning("%s: the model called tools none were offered", self.name)
                    continue
                if not token:
                    continue
                if not reply.parts:
                    self._event(reply, "llm_first_token")
                reply.parts.append(token)
                self.tokens_generated += 1
                self._emit(reply, LLMTextDelta(token))
                for chunk in chunks.feed(token):
                    if repeats is not None and repeats.again(chunk):
                        self._stop_repeat(reply, chunk)
                        return  # (leaving the stream stops the model)
                    self._say(reply, chunk)
                    trace = self.ctx.trace
                    if trace is not None and reply.confirmed:
                        # Noted as it grows: the turn closes at its first audio out,
                        # usually before the reply is complete.
                        trace.note(reply=reply.answer)
                    if first_chunk:
                        first_chunk = False
                        await self._yield_to_first_audio()
        rest = chunks.flush()  # only once the reply is complete: a failed one's tail is unsaid
        if rest and repeats is not None and repeats.again(rest):
            self._stop_repeat(reply, rest)
        elif rest:
            self._say(reply, rest)

    def _stop_repeat(self, reply: Reply, chunk: str) -> None:
        """The step would say ``chunk`` again: it ends with what it has said, which is all the
        history keeps of it (a loop the model saw in its own history it would go on with)."""
        reply.repeat = (chunk, time.monotonic_ns())
        log.info("%s: the reply stopped before saying %r again", self.name, chunk)
        if reply.confirmed:
            self._note_repeat(reply)

    def _note_repeat(self, reply: Reply) -> None:
        """The trace's record of a reply stopped at a repeat: an event of the call (the turn
        itself is usually written by then, at its first audio), with what was said and the
        chunk that was not; and the turn's info while it is still open."""
        if reply.repeat is None:
            return
        self.repeats_stopped += 1  # (a speculation's only once it is the reply)
        trace = self.ctx.trace
        if trace is None:
            return
        chunk, t_ns = reply.repeat
        trace.info(repeat_stopped=True)
        trace.call_event("repeat_stopped", t_ns, stage=self.name, said=reply.step_text,
                         not_said=chunk)


class EmptyReply(StageFault):
    """The model's reply has no word to say."""

    code = LLM_EMPTY_REPLY


def _speakable(chunks: list[str]) -> bool:
    """Whether the chunks hold a word (a letter or digit) for the caller to hear."""
    return any(ch.isalnum() for chunk in chunks for ch in chunk)


def _call_dicts(calls: list[ToolCall]) -> tuple[dict[str, Any], ...]:
    """Tool calls as an assistant message carries them."""
    return tuple({"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls)
