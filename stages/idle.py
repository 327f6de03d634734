"""The idle caller: silence after the agent's turn gets a re-prompt, and more silence a goodbye
and a hang-up. Silence is counted in media samples of the caller's audio, so a fast file call
re-prompts at the same point of its recording as a live call does."""

from __future__ import annotations

from enum import Enum

from agent.config import AgentConfig
from agent.frames import (
    SAMPLE_RATE,
    AudioIn,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    Dtmf,
    EndOfCall,
    Frame,
    HangUp,
    SpeechStarted,
    SpeechStopped,
    TextToSpeak,
    UserTurnEnded,
)
from agent.stage import DOWN, UP, Stage


class Next(Enum):
    """What the silence being counted leads to."""

    REPROMPT = "reprompt"
    HANGUP = "hangup"
    NOTHING = "nothing"  # off, re-prompted with no hang-up configured, or the call is ending


class IdleMonitor(Stage):
    """Counts the caller's silence while nobody speaks and acts on it.

    The count starts at the call's start (a caller who never speaks is idle too), when the agent
    stops speaking (``BotStoppedSpeaking``, upstream from the playout), when the caller's speech
    stops and when a user turn ends or a key is pressed; it stops while the caller speaks
    (``SpeechStarted`` … ``SpeechStopped``) or the agent does (``BotStartedSpeaking``).
    ``idle_reprompt_s`` of it pushes ``TextToSpeak(idle_reprompt)``; ``idle_hangup_s`` more,
    counted from when the re-prompt has played (from the re-prompt itself if it never plays),
    pushes ``TextToSpeak(idle_goodbye)`` and then ``HangUp("idle")``: the session ends the call
    once the goodbye has played out. Anything the caller does starts over from the re-prompt.

    A turn's count runs while the LLM prepares its reply (a reply slower than the re-prompt
    time gets the re-prompt first), so an empty or failed reply cannot leave the call unwatched.
    With both times 0 (the default) the stage consumes nothing and never pushes a frame.
    """

    name = "idle"
    # AudioIn is the clock; the Bot* frames arrive upstream
    consumes = frozenset({
        AudioIn, SpeechStarted, SpeechStopped, UserTurnEnded, Dtmf,
        BotStartedSpeaking, BotStoppedSpeaking,
    })

    def __init__(self, cfg: AgentConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._reprompt_after = max(0, round(cfg.idle_reprompt_s * SAMPLE_RATE))
        self._hangup_after = max(0, round(cfg.idle_hangup_s * SAMPLE_RATE))
        if self._reprompt_after:
            self._first = Next.REPROMPT
        elif self._hangup_after:
            self._first = Next.HANGUP
        else:
            self._first = Next.NOTHING
            self.consumes = frozenset()  # off: no frame kind needs to reach this stage
        self._next = self._first
        self._since: int | None = 0 if self._first is not Next.NOTHING else None
        self._heard = 0  # media sample where the latest AudioIn ended
        self._caller_speaking = False
        self._agent_speaking = False
        self._ended = False  # hung up, or the call ended: nothing more from this stage
        self.reprompts = 0
        self.hangups = 0

    @property
    def counting_since(self) -> int | None:
        """The media sample the silence being counted began at (None: not counting)."""
        return self._since

    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)
        if self._first is Next.NOTHING:
            return
        if isinstance(frame, AudioIn):
            if direction is DOWN:
                self._heard = frame.end
                since = self._since
                if since is not None and self._heard - since >= self._limit():
                    self._act()
        elif isinstance(frame, SpeechStarted):
            self._caller_speaking = True
            self._caller_active()
        elif isinstance(frame, SpeechStopped):
            self._caller_speaking = False
            self._caller_active()
        elif isinstance(frame, UserTurnEnded | Dtmf):
            self._caller_active()
        elif isinstance(frame, BotStartedSpeaking):
            if direction is UP:
                self._agent_speaking = True
                self._since = None
        elif isinstance(frame, BotStoppedSpeaking):
            if direction is UP:
                self._agent_speaking = False
                self._arm()
        elif isinstance(frame, EndOfCall):
            self._end()

    def _limit(self) -> int:
        return self._reprompt_after if self._next is Next.REPROMPT else self._hangup_after

    def _caller_active(self) -> None:
        if not self._ended:
            self._next = self._first  # the caller is there: a later silence starts over
        self._arm()

    def _end(self) -> None:
        self._ended = True
        self._next, self._since = Next.NOTHING, None

    def _arm(self) -> None:
        """Count from now, unless someone is speaking or nothing is left to do."""
        quiet = not (self._caller_speaking or self._agent_speaking)
        self._since = self._heard if quiet and self._next is not Next.NOTHING else None

    def _act(self) -> None:
        since = self._since if self._since is not None else self._heard
        trace = self.ctx.trace
        at_s = round(self._heard / SAMPLE_RATE, 3)
        silence_s = round((self._heard - since) / SAMPLE_RATE, 3)
        if self._next is Next.REPROMPT:
            self.reprompts += 1
            self._next = Next.HANGUP if self._hangup_after else Next.NOTHING
            # counted on until the re-prompt plays (its BotStarted stops the count): a TTS
            # that says nothing must not keep an idle call up for good
            self._since = self._heard if self._next is Next.HANGUP else None
            if trace is not None:
                trace.call_event("idle_reprompt", at_s=at_s, silence_s=silence_s)
            if self.cfg.idle_reprompt.strip():
                self.push(TextToSpeak(self.cfg.idle_reprompt))
            return
        self.hangups += 1
        self._end()
        if trace is not None:
            trace.call_event("idle_hangup", at_s=at_s, silence_s=silence_s)
        if self.cfg.idle_goodbye.strip():
            self.push(TextToSpeak(self.cfg.idle_goodbye))
        self.push(HangUp("idle"))
