"""Barge-in end to end: the caller talks over the agent's greeting; the agent's audio stops
within 100 ms of the detected speech in the call recording, and the cancelled work is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from agent.audio import read_wav
from agent.commands.run import play_call
from agent.config import Config
from agent.presets import load_models

DATA = Path(__file__).resolve().parents[1] / "data"
CLIP = DATA / "ls-dev-clean-1988-24833-0000.wav"
GREETING = ("Hello and welcome to the voxline demo line. I can tell you about your account, "
            "your recent orders, our opening hours and our delivery options, so please take "
            "your time and tell me what you need today.")

pytestmark = pytest.mark.slow


def test_caller_interrupts_the_greeting():
    cfg = Config()
    cfg.agent.greeting = GREETING
    clip, _ = read_wav(CLIP)
    lead = 16000 * 2  # the caller starts talking 2 s into the greeting
    audio = np.concatenate([np.zeros(lead, np.int16), clip[:, 0], np.zeros(16000 * 2, np.int16)])
    events: list[dict] = []
    models = load_models(cfg)
    rec, summary, heard = asyncio.run(play_call(cfg, models, audio, False, events.append, tail_s=15))

    interrupts = [e for e in events if e["type"] == "interrupt"]
    assert heard and len(interrupts) == 1
    agent = np.abs(rec.agent.astype(np.int32))
    (at,) = rec.interrupts_at
    assert lead < at < lead + 16000  # detected within a second of the caller starting
    # the greeting was playing when the caller came in...
    assert agent[lead - 8000 : lead].max() > 500
    # ...and stopped within 100 ms of the detection, for good: silence until the caller's
    # speech has ended (nothing of the cancelled greeting comes back later)
    speech_end = lead + len(clip)
    after = agent[at + 1600 : speech_end]
    assert after.max() == 0, f"agent audio {np.flatnonzero(after)[0] / 16:.0f} ms after the cut"
    # the greeting's own span was measured, and after the cut the agent answered the caller
    assert any(e["type"] == "trace" and "greeting" in e["spans"] for e in events)
    replies = [e for e in events if e["type"] == "agent_text" and not e["cancelled"] and e["text"]]
    assert replies and agent[speech_end:].max() > 500
    assert summary["turns"] >= 1
