"""The pipecat STT service at the edges of a call, in real pipecat pipelines with the real
model: audio at another rate, an interruption, a mute, a pipeline ended or cancelled while the
caller speaks, an engine with no free slot, and pipecat not installed."""

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soxr
import speech
from pipecat.frames.frames import InterruptionFrame, STTMuteFrame
from pipecat_pipeline import FRAME_MS, play

from agent.config import ASRConfig, VADConfig
from stages.adapters.pipecat_stt import VoxlineSTTService
from stages.asr.wer import corpus_wer, normalize

ROOT = Path(__file__).resolve().parents[2]
MAX_WER = 0.15
LEAD = np.zeros(8000, np.int16)


def padded(name: str, tail_s: float = 1.5, rate: int = 16_000) -> np.ndarray:
    pcm = np.concatenate([LEAD, speech.load(name), np.zeros(int(tail_s * 16_000), np.int16)])
    if rate == 16_000:
        return pcm
    return soxr.resample(pcm, 16_000, rate).astype(np.int16)


def frame_at(pcm_s: float) -> int:
    return int(pcm_s * 1000 / FRAME_MS)


def test_audio_at_8_khz_is_resampled_and_transcribed():
    stt = VoxlineSTTService()
    played = asyncio.run(play(stt, padded("wizard", rate=8000), rate=8000))
    assert corpus_wer([(speech.text("wizard"), played.text)]) <= MAX_WER, played.text


def test_an_interruption_mid_utterance_loses_none_of_the_callers_words():
    # the bot was talking and the user barged in: pipecat broadcasts an InterruptionFrame while
    # the user is speaking; the utterance in progress must go on
    stt = VoxlineSTTService()
    played = asyncio.run(play(stt, padded("quilter"), inject={frame_at(2.0): InterruptionFrame()}))
    assert corpus_wer([(speech.text("quilter"), played.text)]) <= MAX_WER, played.text


def test_a_mute_finalises_what_was_heard_and_nothing_muted_is_transcribed():
    stt = VoxlineSTTService()
    # quilter is ~5.8 s: muted 2.5 s into the pipeline, the rest of the sentence is not heard
    played = asyncio.run(play(stt, padded("quilter"), inject={frame_at(2.5): STTMuteFrame(mute=True)}))
    words = normalize(played.text)
    ref = normalize(speech.text("quilter"))
    assert len(played.finals) == 1 and played.finals[0].finalized
    assert 2 <= len(words) < len(ref) - 4, played.text
    assert words == ref[: len(words)] or corpus_wer([(" ".join(ref[: len(words)]), played.text)]) <= 0.34


def test_an_end_while_the_caller_speaks_still_delivers_the_final_before_the_end():
    stt = VoxlineSTTService()
    pcm = np.concatenate([LEAD, speech.load("wizard")])  # no silence after: the VAD never stops
    played = asyncio.run(play(stt, pcm))
    assert played.finals and played.finals[-1].finalized
    assert corpus_wer([(speech.text("wizard"), played.text)]) <= MAX_WER, played.text
    assert not stt.holds_slot


def test_a_cancel_while_the_caller_speaks_frees_the_slot_at_once():
    cfg = ASRConfig(slots=1)
    stt = VoxlineSTTService(asr_config=cfg)
    pcm = np.concatenate([LEAD, speech.load("wizard")[: 16_000 * 3]])
    asyncio.run(play(stt, pcm, end="cancel"))
    assert not stt.holds_slot and stt.engine.pool.in_use == 0
    again = VoxlineSTTService(asr_config=cfg)  # the one slot is free for the next pipeline
    played = asyncio.run(play(again, padded("kittens")))
    assert corpus_wer([(speech.text("kittens"), played.text)]) <= MAX_WER, played.text


def test_a_pipeline_finding_no_free_slot_is_told_why():
    cfg = ASRConfig(slots=1, window_ms=11.0)  # an engine of its own: one slot
    holder = VoxlineSTTService(asr_config=cfg)
    late = VoxlineSTTService(asr_config=cfg)

    async def both():
        first = asyncio.create_task(play(holder, padded("kittens")))
        while not holder.holds_slot:
            await asyncio.sleep(0.02)
        second = await play(late, padded("kittens", tail_s=0.5))
        return await first, second

    _, refused = asyncio.run(both())
    assert refused.errors and "no ASR slot free" in refused.errors[0].error
    assert not refused.finals


@pytest.mark.parametrize("missing", ["pipecat", "pipecat.services.stt_service"])
def test_without_pipecat_the_error_names_the_extra(missing):
    code = (f"import sys; sys.modules[{missing!r}] = None\n"
            "try:\n    import stages.adapters.pipecat_stt\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert "MissingExtraError" in out.stdout and "pip install 'voxline[pipecat]'" in out.stdout, out


def test_pauses_use_pipecat_s_silero_file_without_silero_vad_and_stay_off_without_onnxruntime(
        monkeypatch):
    import pipecat.audio.vad

    from agent.errors import MissingExtraError
    from stages.adapters import pipecat_stt

    def missing(*_args, **_kw):
        raise MissingExtraError("Silero VAD", "embedded", "silero-vad")

    pipecat_stt._load_pause_model.cache_clear()
    monkeypatch.setattr(pipecat_stt, "silero_model_path", missing)
    model = pipecat_stt._pause_model()
    assert model is not None
    assert model.path == Path(pipecat.audio.vad.__file__).parent / "data" / "silero_vad.onnx"
    assert 0.0 <= model.fork().prob(np.zeros(512, np.float32)) < 0.5

    pipecat_stt._load_pause_model.cache_clear()
    monkeypatch.setattr(pipecat_stt, "SileroModel", missing)  # as without onnxruntime
    assert pipecat_stt._pause_model() is None and pipecat_stt._pause_model() is None
    pipecat_stt._load_pause_model.cache_clear()  # the next service loads the real one again


def test_services_starting_at_once_share_one_pause_model(monkeypatch):
    from stages.adapters import pipecat_stt

    made = []

    class SlowModel:  # as a real session takes a while to load
        def __init__(self, *_args):
            time.sleep(0.2)
            made.append(self)

    pipecat_stt._load_pause_model.cache_clear()
    monkeypatch.setattr(pipecat_stt, "SileroModel", SlowModel)
    got = []
    threads = [threading.Thread(target=lambda: got.append(pipecat_stt._pause_model()))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pipecat_stt._load_pause_model.cache_clear()  # the next service loads the real one again
    assert len(made) == 1 and got == made * 4


def test_pause_vad_is_refused_with_pauses_off():
    with pytest.raises(ValueError, match="pause_vad"):
        VoxlineSTTService(pauses=False, pause_vad=VADConfig())
