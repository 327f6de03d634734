"""An agent whose ASR is a shared ``voxline asr-serve`` (``--asr-backend remote``) judges turns
with the same readings as one with the model in process: the ASR's P(a sentence ends) comes
over the socket with each final, as the words' check reads it (``turn.text_asr_end``)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from asr_serve import Served

from agent.audio import read_audio
from agent.config import Config
from agent.frames import SAMPLE_RATE, Frame, Transcript, UserTurnEnded
from agent.pipeline import Pipeline
from agent.presets import STAGES, load, load_models
from agent.session import Session
from agent.trace import Trace
from transports.file import FileCall

DATA = Path(__file__).resolve().parents[1] / "data"
CLIP = "ls-test-clean-61-70968-0000.wav"  # one whole sentence (tests/e2e/test_semantic_turns.py)

pytestmark = pytest.mark.slow


async def call(cfg: Config, models, pcm: np.ndarray) -> tuple[list[Transcript], list[str]]:
    vad = dataclasses.replace(cfg.vad, stop_ms=min(cfg.vad.stop_ms, cfg.turn.pause_ms))
    session = Session(Pipeline([
        load(STAGES["vad"])(vad, model=models.vad.fork()),
        load(STAGES["asr"])(models.asr, cfg.asr),
        load(STAGES["turn"])(cfg.turn, vad_stop_ms=vad.stop_ms, scorer=models.turn,
                             text_scorer=models.turn_words),
    ]), Trace())
    finals: list[Transcript] = []
    turns: list[str] = []

    def on(frame: Frame) -> None:
        if isinstance(frame, Transcript) and frame.final and frame.text.strip():
            finals.append(frame)
        elif isinstance(frame, UserTurnEnded):
            turns.append(frame.text)

    session.listen(on, frozenset({Transcript, UserTurnEnded}))
    async with session:
        await FileCall(pcm, fast=True, tail_s=3.0).run(session)
    return finals, turns


def test_an_agent_on_asr_serve_reads_the_asrs_sentence_end(tmp_path) -> None:
    rng = np.random.default_rng(2)
    pcm = read_audio(DATA / CLIP, SAMPLE_RATE)
    pcm = np.concatenate([pcm, rng.normal(0, 3, SAMPLE_RATE * 3).astype(np.int16)])
    served = Served(tmp_path, "--asr-slots", "2")
    try:
        cfg = Config()
        cfg.asr.backend, cfg.asr.model = "remote", served.path
        models = load_models(cfg, need_llm=False, need_tts=False)
        assert models.asr.backend.sentence_ends  # load_models asked: the words' check reads it
        finals, turns = asyncio.run(call(cfg, models, pcm))
        off = dataclasses.replace(cfg, turn=dataclasses.replace(cfg.turn, text_asr_end=0.0))
        untold = load_models(off, need_llm=False, need_tts=False)
        plain, _ = asyncio.run(call(off, untold, pcm))
    finally:
        assert served.stop() == 0
    assert len(turns) == 1 and finals, (turns, finals)
    assert all(f.end_p is not None and 0.0 <= f.end_p <= 1.0 for f in finals), finals
    # where the words' check does not read it, nobody asks the server for it
    assert not untold.asr.backend.sentence_ends and [f.end_p for f in plain] == [None] * len(plain)
