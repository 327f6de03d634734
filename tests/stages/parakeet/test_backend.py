"""ParakeetBackend honours the engine's ASRBackend contract with a small random-weight .nemo:
one hypothesis per buffer, in order, batched equal to one by one, text and times consistent."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from agent.config import ASRConfig  # noqa: E402
from agent.errors import ModelNotFoundError  # noqa: E402
from stages.asr.backend import ASRBackend, ASRCapabilities, BatchCost, Hypothesis  # noqa: E402
from stages.asr.parakeet.backend import ParakeetBackend  # noqa: E402


def _audio() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(24000) / 16000
    return [
        (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32),
        (0.1 * rng.standard_normal(11000)).astype(np.float32),
        np.zeros(0, dtype=np.float32),
        (0.2 * rng.standard_normal(50)).astype(np.float32),
        (0.2 * np.sign(np.sin(2 * np.pi * 3 * t[:16000]))).astype(np.float32),
    ]


@pytest.fixture(scope="module")
def backend(nemo_files) -> ParakeetBackend:
    return ParakeetBackend(
        ASRConfig(backend="parakeet", model=str(nemo_files["v3"][0]), threads=1), max_batch=3
    )


def test_implements_the_backend_protocol(backend: ParakeetBackend) -> None:
    assert isinstance(backend, ASRBackend)
    assert backend.sample_rate == 16000 and backend.name == "parakeet"
    assert backend.device == "cpu"
    assert backend.capabilities == ASRCapabilities(
        sample_rate=16000, max_batch=3, lanes=1, batch_cost=BatchCost.SUBLINEAR,
        prompts=False, word_times=True, stateful=False,
    )
    assert backend.max_batch == 3
    backend.warmup()


def test_batched_equals_one_by_one_and_keeps_order(backend: ParakeetBackend) -> None:
    audio = _audio()
    batched = backend.transcribe_batch(audio)
    singles = [backend.transcribe_batch([a])[0] for a in audio]
    assert len(batched) == len(audio)
    assert all(isinstance(h, Hypothesis) for h in batched)
    assert batched == singles
    assert batched[2] == Hypothesis(text="")  # empty buffer
    assert any(h.tokens for h in batched)  # a random model still says something


def test_text_words_and_times_agree(backend: ParakeetBackend) -> None:
    audio = _audio()
    for a, h in zip(audio, backend.transcribe_batch(audio), strict=True):
        assert h.text == backend.tokenizer.text(h.tokens)
        assert len(h.token_times) == len(h.tokens)
        assert list(h.token_times) == sorted(h.token_times)
        assert all(0.0 <= s < len(a) / 16000 + 0.08 for s in h.token_times)
        assert " ".join(w.text for w in h.words) == " ".join(h.text.split())
        assert all(w.start < w.end for w in h.words)


def test_bfloat16_on_cpu_runs(nemo_files) -> None:
    bf16 = ParakeetBackend(
        ASRConfig(model=str(nemo_files["110m"][0]), compute_type="bfloat16", threads=1)
    )
    assert bf16.transcriber.dtype == torch.bfloat16
    hyps = bf16.transcribe_batch(_audio()[:2])
    assert len(hyps) == 2


def test_missing_model_says_what_to_pass(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="--asr-model PATH.nemo"):
        ParakeetBackend(ASRConfig(backend="parakeet", model=str(tmp_path / "absent.nemo")))
    with pytest.raises(ModelNotFoundError, match="--asr-model PATH.nemo"):
        ParakeetBackend(ASRConfig(backend="parakeet", model=""))
