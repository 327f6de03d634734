"""A small real agent for transport tests: it answers caller audio with a tone, holds a slot from
a pool and a long-running task while its call lives, like a model stage would."""

import asyncio
import time

import numpy as np
import pytest

from agent.frames import AudioIn, Transcript, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from agent.trace import Trace


class SlotPool:
    def __init__(self, size):
        self.size = size
        self.free = list(range(size))

    def take(self):
        if not self.free:
            raise RuntimeError("no free slot")
        return self.free.pop()

    def give(self, slot):
        self.free.append(slot)


class ToneAgent(Stage):
    """After every ``every`` frames of caller audio: a final transcript naming the loudest
    sample heard, then 300 ms of 440 Hz as agent audio, traced as one turn."""

    def __init__(self, pool, every=10):
        super().__init__("tone-agent")
        self.pool = pool
        self.every = every
        self.frames = 0
        self.peak = 0
        self.slot = None
        self.task = None

    async def start(self, ctx):
        await super().start(ctx)
        self.slot = self.pool.take()
        self.task = ctx.spawn(asyncio.sleep(3600), name="tone-agent-idle")

    async def stop(self):
        self.pool.give(self.slot)
        self.slot = None

    def process(self, frame, direction):
        self.push(frame, direction)
        if not isinstance(frame, AudioIn):
            return
        self.frames += 1
        self.peak = max(self.peak, int(np.abs(frame.pcm.astype(np.int32)).max()))
        if self.frames % self.every:
            return
        trace = self.ctx.trace
        now = time.monotonic_ns()
        trace.begin_turn(speech_end=now, vad_decision=now, asr_final=now)
        self.push(Transcript(f"peak {self.peak}", final=True, end=frame.end))
        trace.event("tts_request")
        t = np.arange(4800) / 16000
        tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
        trace.event("tts_first_audio")
        self.push(TTSAudio(tone, last=True, text="tone"))


@pytest.fixture
def pool():
    return SlotPool(64)


@pytest.fixture
def new_session(pool):
    sessions = []

    def make():
        agent = ToneAgent(pool)
        s = Session(Pipeline([agent]), Trace({"voice_to_voice": 800.0}))
        s.agent = agent
        sessions.append(s)
        return s

    make.sessions = sessions
    return make
