"""Barge-in end to end: the caller talks over the agent's greeting; the agent's audio stops
within 100 ms of the detected speech in the call recording, and the cancelled work is gone.
A sound over the agent that carries no words (a hum, an "uh") only pauses it: it goes on from
where it stopped."""

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
    # detected within a second of the caller starting: the agent pauses at once, and the
    # caller's first words cut it off for good
    (at,) = rec.pauses_at
    (cut,) = rec.interrupts_at
    assert lead < at <= cut < lead + 2 * 16000 and rec.resumes_at == []
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


def voiced(ms: int, f0: float, formants: list[tuple[float, float]]) -> np.ndarray:
    """A wordless voiced sound, made here: a glottal pulse train at ``f0`` through resonators
    at the given (frequency, bandwidth) formants, with soft edges (int16, -9 dBFS peak)."""
    n = ms * 16
    t = np.arange(n) / 16000
    phase = np.cumsum(2 * np.pi * f0 * (1 - 0.1 * t / t[-1]) / 16000)
    src = (np.sin(phase) > 0.95).astype(np.float64)
    out = np.zeros(n)
    for f, bw in formants:  # a two-pole resonator per formant
        r, th = np.exp(-np.pi * bw / 16000), 2 * np.pi * f / 16000
        a1, a2 = 2 * r * np.cos(th), -r * r
        y1 = y2 = 0.0
        for i in range(n):
            y = (1 - r) * src[i] + a1 * y1 + a2 * y2
            out[i] += y
            y2, y1 = y1, y
    out *= np.minimum(t / 0.02, 1) * np.minimum((t[-1] - t) / 0.05, 1)
    return (out / np.abs(out).max() * 0.35 * 32767).astype(np.int16)


SOUNDS = {
    "hum": lambda: voiced(500, 130, [(250, 80), (2200, 300)]),  # "mmm"
    "uh": lambda: voiced(350, 120, [(600, 100), (1200, 120), (2500, 200)]),
}


@pytest.fixture(scope="module")
def models():
    cfg = Config()
    return load_models(cfg)


def greeting_call(models, sound: np.ndarray | None) -> tuple:
    cfg = Config()
    cfg.agent.greeting = GREETING
    lead = 16000 * 2
    parts = [np.zeros(lead, np.int16)] + ([sound] if sound is not None else [])
    audio = np.concatenate(parts + [np.zeros(16000 * 3, np.int16)])
    events: list[dict] = []
    rec, _, _ = asyncio.run(play_call(cfg, models, audio, True, events.append, tail_s=20))
    return rec, events, lead


@pytest.mark.parametrize("name", sorted(SOUNDS))
def test_a_wordless_sound_over_the_agent_pauses_it_and_it_resumes(models, name: str) -> None:
    rec, events, lead = greeting_call(models, SOUNDS[name]())
    plain, _, _ = greeting_call(models, None)
    # the sound was taken for speech over the agent: the agent paused within 100 ms of that...
    (at,) = rec.pauses_at
    assert lead < at < lead + 16000
    agent = np.abs(rec.agent.astype(np.int32))
    assert agent[lead - 8000 : lead].max() > 500
    assert agent[at + 1600 : at + 3200].max() == 0
    # ...then heard no words in it and resumed: no interrupt, no turn, the whole greeting said
    (resumed,) = rec.resumes_at
    assert at < resumed and rec.interrupts_at == []
    assert agent[resumed + 1600 :].max() > 500
    assert not [e for e in events if e["type"] == "user_turn"]
    spoken = int((agent > 0).sum())
    full = int((np.abs(plain.agent.astype(np.int32)) > 0).sum())
    # nothing lost or repeated: as much greeting as a call without the sound (Piper samples its
    # phoneme durations, so two syntheses of one text differ by a few per cent — 5.3% seen in
    # one full-suite run; a flushed queue would lose most of it, a repeat add as much again)
    assert abs(spoken - full) < 0.15 * full, (spoken, full)
