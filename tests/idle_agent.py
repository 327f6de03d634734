"""A small agent for the hang-up tests: the real idle monitor in front of a TTS that speaks a
tone for each text (20 ms per character, after a short synthesis delay, so a HangUp queued behind
a goodbye always overtakes its audio)."""

from __future__ import annotations

import asyncio

import numpy as np

from agent.config import AgentConfig
from agent.frames import SAMPLE_RATE, Frame, TextToSpeak, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import QueuedStage
from agent.trace import Trace
from stages.idle import IdleMonitor

SECONDS_PER_CHAR = 0.02
SYNTHESIS_S = 0.03
AMPLITUDE = 8000


def tone_seconds(text: str) -> float:
    return len(text) * SECONDS_PER_CHAR


class ToneTTS(QueuedStage):
    name = "tts"
    consumes = frozenset({TextToSpeak})

    def __init__(self) -> None:
        super().__init__()
        self.spoken: list[str] = []

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, TextToSpeak)

    async def handle(self, frame: Frame) -> None:
        assert isinstance(frame, TextToSpeak)
        self.push(frame)
        await asyncio.sleep(SYNTHESIS_S)
        n = round(tone_seconds(frame.text) * SAMPLE_RATE)
        pcm = (AMPLITUDE * np.sin(2 * np.pi * 440 * np.arange(n) / SAMPLE_RATE)).astype(np.int16)
        self.push(TTSAudio(pcm[: n // 2]))
        await asyncio.sleep(SYNTHESIS_S)  # the rest comes later: the utterance stays open
        self.push(TTSAudio(pcm[n // 2:], last=True, text=frame.text))
        self.spoken.append(frame.text)


# short times and words, so a whole idle call takes about two seconds
IDLE = AgentConfig(idle_reprompt_s=0.5, idle_reprompt="Still there?",
                   idle_hangup_s=0.5, idle_goodbye="Goodbye now.")


def idle_session(cfg: AgentConfig = IDLE, trace: Trace | None = None) -> Session:
    return Session(Pipeline([IdleMonitor(cfg), ToneTTS()]), trace)
