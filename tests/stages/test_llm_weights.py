"""The embedded SmolLM2's weights (``[llm] weights``): the Q8_0 copy of the shipped Q4_1 file is
written once to the models directory, found again, and where it cannot be written the shipped
file loads; and the copy is the same model up to rounding."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from agent.config import Config, LLMConfig
from agent.errors import ConfigError
from agent.models_dir import MODELS_ENV, sha256_file
from agent.presets import load_models
from stages.llm import local
from stages.llm.local import embedded_llm_path, smollm2_path

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture
def fresh(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """An empty home and models directory, and no path remembered from earlier calls."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models"))
    local._reencoded.cache_clear()
    yield tmp_path
    local._reencoded.cache_clear()


def file_type(path) -> int:  # noqa: ANN001
    model = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return int(model.metadata["general.file_type"])


def test_the_q8_copy_is_written_once_and_found_again(fresh) -> None:  # noqa: ANN001
    shipped = smollm2_path()
    path = embedded_llm_path("q8_0")
    sha = sha256_file(shipped)[:16]
    assert path == fresh / "models" / f"{shipped.stem}-{sha}-q8_0.gguf"
    assert file_type(shipped) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    assert file_type(path) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    stamp = path.stat().st_mtime_ns
    local._reencoded.cache_clear()
    assert embedded_llm_path("q8_0") == path
    assert path.stat().st_mtime_ns == stamp  # found, not written again


def test_a_copy_in_a_later_models_directory_is_used_not_made_again(fresh, monkeypatch) -> None:  # noqa: ANN001
    made = embedded_llm_path("q8_0")
    first = fresh / "first"
    monkeypatch.setenv(MODELS_ENV, f"{first}:{made.parent}")
    local._reencoded.cache_clear()
    assert embedded_llm_path("q8_0") == made
    assert not first.exists()


def test_where_no_copy_can_be_written_the_shipped_weights_load(fresh, monkeypatch, caplog) -> None:  # noqa: ANN001
    blocker = fresh / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(MODELS_ENV, str(blocker / "models"))
    with caplog.at_level(logging.WARNING, logger="voxline.llm"):
        assert embedded_llm_path("q8_0") == smollm2_path()
    assert "loading the shipped weights" in caplog.text


def test_shipped_and_unknown_weights(fresh) -> None:  # noqa: ANN001
    assert embedded_llm_path("shipped") == smollm2_path()
    assert not (fresh / "models").exists()
    with pytest.raises(ConfigError, match="llm.weights: expected one of q8_0, shipped"):
        embedded_llm_path("q4_0")
    assert LLMConfig().weights == "q8_0"
    cfg = Config()
    cfg.llm.weights = "q4_0"
    with pytest.raises(ConfigError, match="llm.weights: expected one of q8_0, shipped"):
        load_models(cfg)  # before the ASR, the LLM or the TTS loads


# The user's message cut mid-sentence: the next word is open, so the distribution is broad.
PROMPTS = [
    "Hello! Who are",
    "What's the weather like",
    "Can you book a table for two at",
    "The two stray kittens gradually make",
    "I need to change my flight to",
    "Tell me a joke about",
    "How many legs does a",
    "My name is Anna and I am calling about my",
]


class NextWord:
    """log P(next token) after a user message's words, for one GGUF."""

    def __init__(self, path) -> None:  # noqa: ANN001
        self.model = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, verbose=False)

    def __call__(self, text: str) -> np.ndarray:
        m = self.model
        m.reset()
        m.eval(m.tokenize(f"<|im_start|>user\n{text}".encode(), add_bos=False, special=True))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(m.ctx, -1),
                                       shape=(m.n_vocab(),)).astype(np.float64)
        return logits - (logits.max() + math.log(np.exp(logits - logits.max()).sum()))


def test_the_q8_copy_is_the_shipped_model_up_to_rounding(fresh) -> None:  # noqa: ANN001
    # Measured over these 8 prompts, KL(shipped || copy) of the next token: 0.001-0.020 nats,
    # the same top token in all 8. For scale: a Q4_0 copy of the same weights (rounded twice)
    # is 0.05-0.77 nats away (median 0.36), and the next position of the same text 1.4-9.6.
    shipped, q8 = NextWord(smollm2_path()), NextWord(embedded_llm_path("q8_0"))
    kl, same = [], 0
    for text in PROMPTS:
        a, b = shipped(text), q8(text)
        kl.append(float((np.exp(a) * (a - b)).sum()))
        same += int(np.argmax(a)) == int(np.argmax(b))
    assert same >= len(PROMPTS) - 1, same
    assert np.median(kl) < 0.03 and max(kl) < 0.1, np.round(kl, 4)
