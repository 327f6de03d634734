"""The idle monitor alone: silence counted in media samples of the caller's audio gets the
re-prompt and then the goodbye and a hang-up at the configured times, speech and the agent
speaking re-arm it, and with the default configuration it never pushes a frame."""

from __future__ import annotations

import asyncio

import numpy as np
from stage_harness import StageHarness
from test_stage_consumes import kinds_read

from agent.config import AgentConfig
from agent.frames import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    AudioIn,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    Dtmf,
    HangUp,
    SpeechStarted,
    SpeechStopped,
    TextToSpeak,
    UserTurnEnded,
)
from stages.idle import IdleMonitor

SILENCE = np.zeros(FRAME_SAMPLES, np.int16)
CFG = AgentConfig(idle_reprompt_s=2.0, idle_hangup_s=3.0)


class Call:
    """Feeds a harnessed monitor caller audio on a media clock and tells what it pushed."""

    def __init__(self, h: StageHarness) -> None:
        self.h = h
        self.offset = 0

    def audio(self, seconds: float) -> None:
        for _ in range(round(seconds * SAMPLE_RATE / FRAME_SAMPLES)):
            self.h.pipeline.push(AudioIn(SILENCE, offset=self.offset), Direction.DOWNSTREAM)
            self.offset += FRAME_SAMPLES

    def until_pushed(self, most_s: float = 30.0) -> float:
        """Feed audio frame by frame until the monitor pushes something: the media time then."""
        n = len(self.pushed())
        for _ in range(round(most_s * SAMPLE_RATE / FRAME_SAMPLES)):
            self.audio(FRAME_SAMPLES / SAMPLE_RATE)
            if len(self.pushed()) > n:
                return self.offset / SAMPLE_RATE
        raise AssertionError(f"nothing pushed in {most_s} s")

    def down(self, frame) -> None:
        self.h.pipeline.push(frame, Direction.DOWNSTREAM)

    def agent_says(self, seconds: float) -> None:
        self.h.pipeline.inject_upstream(BotStartedSpeaking())
        self.audio(seconds)
        self.h.pipeline.inject_upstream(BotStoppedSpeaking())

    def pushed(self) -> list:
        return [f for f in self.h.frames if not isinstance(f, AudioIn | SpeechStarted
                                                          | SpeechStopped | UserTurnEnded | Dtmf)]

    def said(self) -> list[str]:
        """What the monitor pushed: ``say: TEXT`` and ``hangup: REASON``."""
        return [f"say: {f.text}" if isinstance(f, TextToSpeak) else f"hangup: {f.reason}"
                for f in self.pushed()]


def run(cfg: AgentConfig, script) -> tuple[Call, StageHarness]:
    async def main():
        async with StageHarness(IdleMonitor(cfg)) as h:
            call = Call(h)
            script(call)
            return call, h

    return asyncio.run(main())


def test_the_reprompt_then_the_goodbye_and_hangup_come_at_the_configured_media_times() -> None:
    times = {}

    def script(call: Call) -> None:
        call.agent_says(1.0)  # the agent's turn ends at 1 s
        times["reprompt"] = call.until_pushed()
        assert call.said() == ["say: Are you still there?"]
        call.agent_says(1.5)  # the re-prompt plays; the hang-up counts from its end
        times["spoken"] = call.offset / SAMPLE_RATE
        times["hangup"] = call.until_pushed()
        call.audio(20.0)  # nothing more, however long the silence

    call, h = run(CFG, script)
    assert times["reprompt"] == 1.0 + 2.0
    assert times["hangup"] == times["spoken"] + 3.0
    # the goodbye's TextToSpeak, then the HangUp right after it
    assert call.said() == ["say: Are you still there?", "say: I'll hang up now. Goodbye.",
                           "hangup: idle"]
    assert isinstance(call.pushed()[-1], HangUp)
    assert [e["event"] for e in h.trace.call_events] == ["idle_reprompt", "idle_hangup"]
    assert h.trace.call_events[0]["silence_s"] == 2.0


def test_caller_speech_re_arms_it_and_nothing_comes_while_the_caller_speaks() -> None:
    times = {}

    def script(call: Call) -> None:
        call.agent_says(0.5)
        call.audio(1.5)
        call.down(SpeechStarted(at=call.offset))
        call.audio(6.0)  # a long utterance: past every idle time, and nothing
        assert call.pushed() == []
        call.down(SpeechStopped(at=call.offset))
        stopped = call.offset / SAMPLE_RATE
        times["reprompt"] = call.until_pushed() - stopped
        call.agent_says(0.5)
        call.audio(1.0)
        call.down(UserTurnEnded("yes I am"))  # the caller answered: it starts over
        turn = call.offset / SAMPLE_RATE
        times["again"] = call.until_pushed() - turn

    call, _ = run(CFG, script)
    assert times["reprompt"] == 2.0
    assert times["again"] == 2.0  # the re-prompt again, not the goodbye
    assert call.said() == ["say: Are you still there?"] * 2


def test_nothing_while_the_agent_speaks_and_a_keypress_re_arms_it() -> None:
    def script(call: Call) -> None:
        call.h.pipeline.inject_upstream(BotStartedSpeaking())
        call.audio(10.0)
        assert call.pushed() == []
        call.h.pipeline.inject_upstream(BotStoppedSpeaking())
        call.audio(1.5)
        call.down(Dtmf("5"))
        call.audio(1.98)
        assert call.pushed() == []
        call.audio(0.02)
        assert len(call.pushed()) == 1

    run(CFG, script)


def test_without_a_reprompt_the_hangup_counts_from_the_agents_turn() -> None:
    times = {}

    def script(call: Call) -> None:
        call.agent_says(1.0)
        times["hangup"] = call.until_pushed()

    call, _ = run(AgentConfig(idle_hangup_s=4.0, idle_goodbye="Bye."), script)
    assert times["hangup"] == 5.0
    assert call.said() == ["say: Bye.", "hangup: idle"]


def test_a_reprompt_that_never_plays_still_leads_to_the_hangup() -> None:
    times = {}

    def script(call: Call) -> None:
        call.agent_says(1.0)
        times["reprompt"] = call.until_pushed()
        times["hangup"] = call.until_pushed()  # no BotStarted: the TTS said nothing

    run(AgentConfig(idle_reprompt_s=1.0, idle_hangup_s=2.0), script)
    assert times == {"reprompt": 2.0, "hangup": 4.0}


def test_a_caller_who_never_speaks_is_idle_from_the_calls_start() -> None:
    times = {}

    def script(call: Call) -> None:
        times["reprompt"] = call.until_pushed()

    run(CFG, script)
    assert times["reprompt"] == 2.0


def test_off_by_default_no_frame_at_all_over_a_long_silence() -> None:
    monitor = IdleMonitor(AgentConfig())
    assert monitor.consumes == frozenset()  # off: the pipeline routes no frame kind to it

    def script(call: Call) -> None:
        call.agent_says(1.0)
        call.audio(60.0)
        call.down(SpeechStarted(at=call.offset))
        call.down(SpeechStopped(at=call.offset))
        call.audio(60.0)

    call, h = run(AgentConfig(), script)
    assert call.pushed() == []
    assert len(h.frames) == round(121.0 * SAMPLE_RATE / FRAME_SAMPLES) + 2
    assert not h.trace.call_events


def test_the_monitor_declares_every_kind_it_reads() -> None:
    declared = tuple(IdleMonitor.consumes)
    assert all(issubclass(k, declared) for k in kinds_read(IdleMonitor))
