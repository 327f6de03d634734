"""The margin every transcript test relies on: the clips in tests/speech.py come out right with
Whisper tiny.en whatever the numeric noise — int8 and float32 weights, samples one step up, one
step down, or randomly dithered by one step — alone and in the longer buffers the tests build.
And the asr-serve suite passes as a whole with every input one step off."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import speech

from agent.audio import int16_to_float
from agent.config import ASRConfig
from stages.asr.long_audio import cut_points
from stages.asr.wer import wer

pytest.importorskip("ctranslate2")
pytest.importorskip("faster_whisper")

from stages.asr.whisper import WhisperBackend  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# The tests allow one wrong word in a clip (MAX_WER 0.15 over 9+ words). Here no variant may
# lose more than half of that: a clip that passes only at the edge does not belong in CLIPS.
MARGIN_WER = 0.075


@pytest.fixture(scope="module", params=["int8", "float32"])
def backend(request):
    return WhisperBackend(ASRConfig(compute_type=request.param))


def test_every_clip_keeps_its_margin(backend):
    worst = {}
    for name in speech.CLIPS:
        pcm = speech.samples(name)
        buffers = [int16_to_float(speech.perturb(pcm, how)) for how in speech.STEPS]
        texts = [h.text for h in backend.transcribe_batch(buffers)]
        worst[name] = max(zip((wer(speech.text(name), t) for t in texts), texts, strict=True))
    assert all(w <= MARGIN_WER for w, _ in worst.values()), worst


def test_the_longer_buffers_keep_their_margin(backend):
    """The 13-s buffer of three sentences test_asr_whisper transcribes in one call, and the 43-s
    file asr-serve's shared-memory and remote tests cut into chunks."""
    one, one_ref = speech.joined(speech.ONE_BUFFER, tail_s=1.0, perturbed=False)
    long, long_ref = speech.joined(speech.LONG_FILE, gap_s=0.5, tail_s=0.5, perturbed=False)
    worst = []
    for how in speech.STEPS:
        (hyp,) = backend.transcribe_batch([int16_to_float(speech.perturb(one, how))])
        worst.append((wer(one_ref, hyp.text), how, "one buffer"))
        x = speech.perturb(long, how)
        chunks = [int16_to_float(x[a:b]) for a, b in cut_points(x)]
        text = " ".join(h.text for h in backend.transcribe_batch(chunks))
        worst.append((wer(long_ref, text), how, "long file"))
    assert max(worst)[0] <= MARGIN_WER, worst


@pytest.mark.parametrize("how", ["+1", "-1"])
def test_the_asr_server_suite_passes_with_every_input_one_step_off(how):
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/stages/test_asr_server.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, speech.PERTURB_ENV: how},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"{speech.PERTURB_ENV}={how}" in r.stdout  # the inputs really were perturbed
