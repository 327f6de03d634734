"""An agent for call-core tests: it says back what it hears, so every caller packet becomes
agent audio, and nothing needs a model or an event loop."""

from __future__ import annotations

import numpy as np

from agent.frames import AudioIn, Direction, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage

T0 = 10**12
MS = 1_000_000
TONE = (8000 * np.sin(2 * np.pi * 440 * np.arange(160) / 8000)).astype(np.int16)


class SpeakBack(Stage):
    name = "speak_back"

    def process(self, frame, direction) -> None:
        if isinstance(frame, AudioIn):
            self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
        else:
            self.push(frame, direction)


def speak_back_session() -> Session:
    return Session(Pipeline([SpeakBack()]))
