import dataclasses
import time

import numpy as np
import pytest

from agent import frames as F


def test_frames_are_immutable_and_slotted():
    f = F.Transcript("hello", final=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.text = "other"  # type: ignore[misc]
    assert not hasattr(f, "__dict__")
    with pytest.raises((AttributeError, TypeError)):
        f.extra = 1  # type: ignore[attr-defined]


def test_frames_are_stamped_with_monotonic_ns():
    before = time.monotonic_ns()
    f = F.SpeechStarted(at=10)
    after = time.monotonic_ns()
    assert before <= f.t_ns <= after
    assert F.SpeechStarted(at=1, t_ns=5).t_ns == 5


def test_audio_frame_media_range():
    a = F.AudioIn(np.zeros(F.FRAME_SAMPLES, np.int16), offset=640)
    assert a.end == 640 + F.FRAME_SAMPLES
    assert a.sample_rate == 16_000


def test_every_frame_kind_exists():
    for name in ["AudioIn", "SpeechStarted", "SpeechStopped", "Transcript", "UserTurnEnded",
                 "LLMTextDelta", "LLMEnd", "TextToSpeak", "TTSAudio", "BotStartedSpeaking",
                 "BotStoppedSpeaking", "Interrupt", "EndOfCall", "ErrorFrame"]:
        assert issubclass(getattr(F, name), F.Frame)
