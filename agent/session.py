"""A session is one call: one pipeline, the transport that feeds it, its playout and its trace.

Session ids are random (``call-`` and 16 hex digits), so traces written by several processes, or
by one process across restarts, never share an id.

On hang-up every stage stops, every task the session spawned is cancelled and awaited, and the
trace is closed — ``close`` is idempotent and safe to call from any path (normal end, a client
that vanished, an error).

The agent ends a call by a stage pushing :class:`~agent.frames.HangUp`: the session records it as
it leaves the pipeline, and :meth:`Session.wait_hangup`, which every transport's shell awaits
beside its receive loop, returns once the agent audio queued before it has played out.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agent import observe
from agent.control import CallControl, Keypad
from agent.echo import EchoCanceller
from agent.frames import (
    ANY_FRAME,
    AudioIn,
    Direction,
    Dtmf,
    EndOfCall,
    Frame,
    HangUp,
    Interrupt,
    PausePlayout,
    ResumePlayout,
    TextToSpeak,
    TTSAudio,
)
from agent.pipeline import Pipeline
from agent.playout import Playout
from agent.recording import CallRecorder
from agent.stage import StageContext
from agent.trace import Trace

log = logging.getLogger("voxline.session")

# what Playout.on_frame reads
PLAYOUT_CONSUMES: frozenset[type[Frame]] = frozenset(
    {TTSAudio, TextToSpeak, Interrupt, PausePlayout, ResumePlayout})
# how often a requested hang-up checks that the agent's audio has played out (one packet time),
# and the most it waits for that (a stage stuck busy must not keep the call up for good)
HANGUP_POLL_S = 0.02
HANGUP_DRAIN_MAX_S = 30.0


def new_session_id() -> str:
    """``call-`` and 64 random bits: unique across processes and restarts without coordination."""
    return f"call-{secrets.token_hex(8)}"


class Session:
    def __init__(
        self,
        pipeline: Pipeline,
        trace: Trace | None = None,
        session_id: str | None = None,
        echo: EchoCanceller | None = None,
        recorder: CallRecorder | None = None,
    ) -> None:
        self.id = session_id or new_session_id()
        self.pipeline = pipeline
        self.trace = trace if trace is not None else Trace(session_id=self.id)
        self.trace.session_id = self.trace.session_id or self.id
        self.ctx = StageContext(self.trace, self.id)
        # the caller's key presses, whatever the transport; what the transport can do to the
        # call (transfer, send keys), set by a transport that can (agent.control)
        self.keypad = Keypad()
        self.control: CallControl | None = None
        self.ctx.call = self
        # a server-side echo canceller hears the playout and cleans the caller's audio
        self.echo = echo
        # the call as a stereo WAV, written as it goes (``--record``)
        self.recorder = recorder
        self.playout = Playout(self.pipeline.inject_upstream, self.trace, echo=echo,
                               recorder=recorder)
        self.offset = 0  # media samples received so far
        self.started_ns = 0
        self.closed = False
        self.summary: dict[str, Any] = {}
        self.hangup_reason = ""  # set when a stage's HangUp left the pipeline
        self._hangup_asked = asyncio.Event()
        self._listeners: list[Callable[[Frame], None]] = []
        self._output_kinds: frozenset[type[Frame]] = PLAYOUT_CONSUMES | {HangUp}
        pipeline.set_output(self._on_output, self._output_kinds)
        pipeline.set_upstream(self._on_upstream)

    # --- wiring ------------------------------------------------------------------------------
    def listen(self, fn: Callable[[Frame], None], consumes: frozenset[type[Frame]] = ANY_FRAME) -> None:
        """Call ``fn`` with every frame that leaves the pipeline (either end).

        ``consumes`` names the kinds ``fn`` reads. Downstream frames of kinds that neither the
        playout nor any listener reads stop at the last stage that consumes them, so a listener
        that declares nothing (every kind) keeps caller audio flowing through the whole chain.
        """
        self._listeners.append(fn)
        kinds = self._output_kinds | consumes
        if kinds != self._output_kinds:
            self._output_kinds = kinds
            self.pipeline.set_output(self._on_output, kinds)

    def _on_output(self, frame: Frame) -> None:
        if isinstance(frame, HangUp):
            self._on_hangup(frame)
        self.playout.on_frame(frame)
        for fn in self._listeners:
            fn(frame)

    def _on_upstream(self, frame: Frame) -> None:
        for fn in self._listeners:
            fn(frame)

    # --- the agent hanging up -----------------------------------------------------------------
    def _on_hangup(self, frame: HangUp) -> None:
        if self.hangup_reason or self.closed:
            return  # the first request stands
        self.hangup_reason = frame.reason or "agent"
        self.trace.call_event("hangup", frame.t_ns, reason=self.hangup_reason)
        self._hangup_asked.set()

    @property
    def hangup_due(self) -> bool:
        """A stage asked to end the call and the agent audio queued before it has played out:
        no stage has work in flight (the TTS may still be speaking the goodbye that the
        ``HangUp`` overtook in its queue) and the playout is idle."""
        if not self.hangup_reason or not self.playout.idle:
            return False
        return not any(s.busy for s in self.pipeline.all_stages)

    async def wait_played(self, exclude: object = None, max_s: float = HANGUP_DRAIN_MAX_S) -> None:
        """Return once the agent's words so far have played out: no stage but ``exclude``
        (the one asking, e.g. the LLM stage running a transfer tool) has work in flight and
        the playout is idle; or after ``max_s``."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + max_s
        while loop.time() < give_up and not self.closed:
            if self.playout.idle and not any(
                    s.busy for s in self.pipeline.all_stages if s is not exclude):
                return
            await asyncio.sleep(HANGUP_POLL_S)

    async def wait_hangup(self) -> str:
        """Wait until the agent ends the call (:attr:`hangup_due`, or ``HANGUP_DRAIN_MAX_S``
        after the request at the latest) and return the reason. Never returns for a call the
        agent does not end: a shell runs it beside its receive loop and cancels it."""
        await self._hangup_asked.wait()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + HANGUP_DRAIN_MAX_S
        while not self.hangup_due and loop.time() < give_up:
            await asyncio.sleep(HANGUP_POLL_S)
        return self.hangup_reason

    # --- life --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.started_ns = self.ctx.started_ns = time.monotonic_ns()
        observe.call_started(self)  # (metrics, spans: before any turn can finish)
        await self.pipeline.start(self.ctx)

    def send_audio(self, pcm: np.ndarray, t_ns: int | None = None) -> None:
        """Caller audio (int16 mono 16 kHz) into the pipeline, stamped with its arrival time."""
        if self.closed:
            return
        if self.recorder is not None:
            self.recorder.caller(pcm)  # (what the caller sent, before any echo is taken out)
        if self.echo is not None:
            pcm = self.echo.process(pcm)  # as many samples, the agent's echo taken out
        frame = AudioIn(pcm, offset=self.offset, t_ns=t_ns or time.monotonic_ns())
        self.offset += len(pcm)
        self.pipeline.push(frame, Direction.DOWNSTREAM)

    def push(self, frame: Frame) -> None:
        if self.closed:
            return
        if isinstance(frame, Dtmf):
            self.keypad.press(frame.digit)
        self.pipeline.push(frame, Direction.DOWNSTREAM)

    @property
    def quiet(self) -> bool:
        """Nobody speaks and nothing is pending: no open turn, no stage busy, no agent audio."""
        if self.trace.current is not None or not self.playout.idle:
            return False
        return not any(s.busy or s.in_speech for s in self.pipeline.all_stages)

    async def close(self, reason: str = "hangup") -> dict[str, Any]:
        if self.closed:
            return self.summary
        self.closed = True
        self.keypad.end()
        try:
            self.pipeline.push(EndOfCall(reason), Direction.DOWNSTREAM)
        except Exception:  # a stage failing on hang-up must not keep resources alive
            log.exception("session %s: EndOfCall failed", self.id)
        try:
            await self.pipeline.stop()
        finally:
            await self.ctx.cancel_all()
            self.summary = self.trace.close(reason)
            if self.echo is not None:
                self.echo.close()
            if self.recorder is not None:
                self.recorder.close()
            if self.started_ns:
                observe.call_ended(self, self.summary)
        return self.summary

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close("error" if exc[0] else (self.hangup_reason or "hangup"))
