"""Semantic endpointing end to end, on real speech through the real VAD, ASR and turn model: a
mid-sentence pause that a fixed silence takes for the end of the turn stays inside one turn,
and a complete utterance still ends soon after the voice stops."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from agent.audio import read_audio
from agent.config import Config
from agent.frames import SAMPLE_RATE, Frame, UserTurnEnded
from agent.pipeline import Pipeline
from agent.presets import STAGES, load, load_models
from agent.session import Session
from agent.trace import Trace
from transports.file import FileCall

DATA = Path(__file__).resolve().parents[1] / "data"
# Clips whose cut the turn model scores far from its threshold (complete > 0.95, cut < 0.06,
# and so under ±1 LSB of noise: tests/stages/test_smart_turn.py)
CLIPS = ["ls-test-clean-61-70968-0000.wav", "asterisk-queue-youarenext.wav",
         "turn/librivox-sense-and-sensibility-01-0920.wav"]
# The mid-sentence pause the semantic endpointing must hold: short of its waits, with room.
PAUSE_MS = 600
# The fixed-silence control needs a longer one: the turn ends there only once the final of the
# words before it is in, and on an AVX2 EPYC under the suite's load that came 15 ms after a
# 600 ms pause. (A 900 ms pause for the semantic runs failed the other way: where Whisper
# heard the onset of the next word, "... against the wizard.", the words read whole and a
# wait ended the turn as the caller came back.)
CONTROL_PAUSE_MS = 900
# Clips whose cut Smart Turn may take for the end of the turn and whose words there read
# unfinished ("... in charge here, and", "Why should", "... cold-hearted and rather"). Which of
# them the sound cuts moves with the CPU's kernels (1988-24833-0001's cut scored 0.84 on one
# machine and 0.40 on another: tests/stages/test_smart_turn.py), so the test takes every clip
# the sound cuts on this machine, and needs at least one.
WORDS_CLIPS = ["turn/ls-dev-clean-1988-24833-0001.wav", "ls-test-clean-4507-16021-0012.wav",
               "turn/librivox-sense-and-sensibility-01-0890.wav"]
# Their pause: long enough that the sound's verdict comes inside it on a loaded machine, and
# short of the words' own wait (text_wait_ms, 1.5 s). In a 600-ms pause the sound cut two of
# the three ~490 ms in on a quiet first-generation Zen EPYC, and none with the suite on two
# pytest-xdist workers or beside two busy processes (its verdict came after the caller went
# on); in 1,200 ms it cut all three quiet (490-800 ms in) and two beside the busy processes.
WORDS_PAUSE_MS = 1200

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models():
    return load_models(Config(), need_llm=False, need_tts=False)  # the words model too


def clip_with_pause(name: str, pause_ms: int = PAUSE_MS) -> tuple[np.ndarray, int, int]:
    cut = next(c for c in json.loads((DATA / "turn" / "cuts.json").read_text()) if c["file"] == name)
    pcm = read_audio(DATA / name, SAMPLE_RATE)  # the Asterisk prompt is 8 kHz: resampled
    n = pause_ms * SAMPLE_RATE // 1000
    rng = np.random.default_rng(0)
    floor = rng.normal(0, 3, n).astype(np.int16)  # a line is never digitally silent
    at = cut["cut"]
    tail = rng.normal(0, 3, SAMPLE_RATE * 2).astype(np.int16)
    return np.concatenate([pcm[:at], floor, pcm[at:], tail]), at, at + n


async def turns(cfg: Config, models, pcm: np.ndarray) -> list[tuple[int, str]]:
    """Where each turn ended (media sample heard so far) and its text: VAD → ASR → turn."""
    vad = cfg.vad
    if cfg.turn.mode == "semantic":
        vad = dataclasses.replace(vad, stop_ms=min(vad.stop_ms, cfg.turn.pause_ms))
    scorer = models.turn if cfg.turn.mode == "semantic" else None
    session = Session(Pipeline([
        load(STAGES["vad"])(vad, model=models.vad.fork()),
        load(STAGES["asr"])(models.asr, cfg.asr),
        load(STAGES["turn"])(cfg.turn, vad_stop_ms=vad.stop_ms, scorer=scorer,
                             text_scorer=models.turn_words),
    ]), Trace())
    out: list[tuple[int, str]] = []

    def on(frame: Frame) -> None:
        if isinstance(frame, UserTurnEnded):
            out.append((session.offset, frame.text))

    session.listen(on, frozenset({UserTurnEnded}))
    async with session:
        await FileCall(pcm, fast=True, tail_s=3.0).run(session)
    return out


@pytest.mark.parametrize("name", CLIPS)
def test_a_mid_sentence_pause_stays_in_the_turn(models, name: str) -> None:
    pcm, lo, hi = clip_with_pause(name)
    semantic = Config()
    fixed = Config()
    fixed.turn.mode = "vad"
    got = asyncio.run(turns(semantic, models, pcm))
    assert len(got) == 1 and got[0][0] > hi, got  # one turn, ended after the caller went on
    words = got[0][1].split()
    assert len(words) >= 6
    # the same clip and cut with a fixed 300 ms silence ends the turn inside the pause (so the
    # test can fail): the difference is the model's
    pcm, lo, hi = clip_with_pause(name, CONTROL_PAUSE_MS)
    cut = asyncio.run(turns(fixed, models, pcm))
    assert len(cut) == 2 and lo < cut[0][0] <= hi, cut


@pytest.mark.parametrize("words", [False, True], ids=["sound", "sound+words"])
def test_a_complete_utterance_ends_without_the_long_wait(models, words: bool) -> None:
    pcm = read_audio(DATA / CLIPS[0], SAMPLE_RATE)
    rng = np.random.default_rng(1)
    pcm = np.concatenate([pcm, rng.normal(0, 3, SAMPLE_RATE * 3).astype(np.int16)])
    cfg = Config()
    cfg.turn.text_check = words
    got = asyncio.run(turns(cfg, models, pcm))
    assert len(got) == 1
    voice_end = len(pcm) - SAMPLE_RATE * 3
    # ended by the model's verdict at the first pause, far sooner than max_wait_ms (1.5 s)
    assert got[0][0] - voice_end < 900 * SAMPLE_RATE // 1000, got[0][0] - voice_end


def test_words_that_read_unfinished_hold_a_pause_the_sound_takes_for_the_end(models) -> None:
    assert models.turn_words is not None
    by_sound = Config()
    by_sound.turn.text_check = False
    held = 0
    for name in WORDS_CLIPS:
        pcm, lo, hi = clip_with_pause(name, WORDS_PAUSE_MS)
        sound = asyncio.run(turns(by_sound, models, pcm))
        if not any(lo < at <= hi for at, _ in sound):
            continue  # the sound itself waits here: nothing for the words to hold
        # by sound alone a turn ends inside the pause; with the words' check (the default)
        # none does: the turn holds until the caller goes on
        got = asyncio.run(turns(Config(), models, pcm))
        assert not any(lo < at <= hi for at, _ in got), (name, got)
        assert got and got[-1][0] > hi, (name, got)
        held += 1
    assert held >= 1  # the sound cut at least one of them (so the test can fail)
