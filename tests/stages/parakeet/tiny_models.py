"""Builders for the Parakeet tests: tiny random-weight models mirroring the v3, v2 and 110m
configs, written as real .nemo files with a SentencePiece tokenizer trained on the transcripts of
the project's speech manifest; and the Hugging Face transformers reference built from a config."""

from __future__ import annotations

import functools
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stages.asr.parakeet.architectures import nemo_config  # noqa: E402
from stages.asr.parakeet.dims import ParakeetDims, dims_from_config  # noqa: E402
from stages.asr.parakeet.model import ParakeetTDT  # noqa: E402
from stages.asr.parakeet.nemo import write_nemo  # noqa: E402
from stages.asr.parakeet.weights import voxline_to_nemo_state  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MANIFEST = Path("/work/shared/data/speech/manifest.jsonl")
_FALLBACK_TEXT = [
    "the two stray kittens gradually make themselves at home",
    "she does not pick them up but just having them in the room",
    "somehow or other cat has taught them that he is in charge here",
]
TOKENIZER_NAME = "0123456789abcdef0123456789abcdef_tokenizer.model"

# Small enough to run in milliseconds, large enough that every code path is exercised.
TINY = {
    "v3": dict(
        n_layers=2, d_model=64, n_heads=4, vocab_size=64, pred_hidden=48, subsampling_channels=16
    ),
    "v2": dict(
        n_layers=2, d_model=48, n_heads=2, vocab_size=48, pred_hidden=32, subsampling_channels=8
    ),
    "110m": dict(
        n_layers=3, d_model=32, n_heads=4, vocab_size=56, pred_hidden=40, subsampling_channels=8
    ),
}


def tiny_config(kind: str, **overrides: Any) -> dict[str, Any]:
    return nemo_config(kind, **{**TINY[kind], **overrides})


def randomize(model: ParakeetTDT, seed: int, scale: float = 0.2) -> ParakeetTDT:
    """Random weights everywhere (BatchNorm statistics and position biases included), except the
    blank embedding row, which NeMo keeps at zero (padding_idx)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.parameters():
            t.copy_(torch.randn(t.shape, generator=gen) * scale)
        for name, t in model.named_buffers():
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            elif name.endswith("running_mean"):
                t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
        model.decoder.embed.weight[model.dims.decoder.blank_id].zero_()
    return model.eval()


def random_model(kind: str, seed: int = 0, **overrides: Any) -> tuple[dict[str, Any], ParakeetTDT]:
    cfg = tiny_config(kind, **overrides)
    return cfg, randomize(ParakeetTDT(dims_from_config(cfg)), seed)


def training_text() -> list[str]:
    if MANIFEST.is_file():
        return [
            json.loads(line)["text"].lower() for line in MANIFEST.read_text().splitlines() if line
        ]
    return _FALLBACK_TEXT


@functools.cache
def train_tokenizer(vocab_size: int) -> bytes:
    """A BPE SentencePiece model (at least 48 pieces: the transcripts use 43 characters)."""
    spm = pytest.importorskip("sentencepiece")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text()), model_writer=buf, vocab_size=vocab_size,
        model_type="bpe", character_coverage=1.0, bos_id=-1, eos_id=-1, minloglevel=2,
    )  # fmt: skip
    return buf.getvalue()


def nemo_state(model: ParakeetTDT, cfg: dict[str, Any]) -> dict[str, Any]:
    """The model's NeMo-named state, plus the keys a real checkpoint carries that inference
    ignores (and, for the 110m hybrid, its CTC head)."""
    state = voxline_to_nemo_state(model)
    if "aux_ctc" in cfg:
        d, v = model.dims.encoder.d_model, model.dims.decoder.vocab_size
        state["ctc_decoder.decoder_layers.0.weight"] = torch.randn(v + 1, d, 1)
        state["ctc_decoder.decoder_layers.0.bias"] = torch.randn(v + 1)
    state["spec_augmentation.dummy"] = torch.zeros(1)
    return state


def write_tiny_nemo(
    path: Path, kind: str, seed: int = 0, *, compress: bool = False
) -> tuple[Path, ParakeetTDT]:
    cfg, model = random_model(kind, seed)
    vocab = cfg["decoder"]["vocab_size"]
    sp_model = train_tokenizer(vocab)
    cfg["tokenizer"] = {"dir": None, "type": "bpe", "model_path": f"nemo:{TOKENIZER_NAME}"}
    write_nemo(path, cfg, nemo_state(model, cfg), {TOKENIZER_NAME: sp_model}, compress=compress)
    return path, model


# --- the Hugging Face transformers reference ------------------------------------------------------

_NEMO_TO_HF = [  # transformers' convert_nemo_to_hf.py table, applied in order
    (r"encoder\.pre_encode\.conv\.", "encoder.subsampling.layers."),
    (r"encoder\.pre_encode\.out\.", "encoder.subsampling.linear."),
    (r"encoder\.layers\.(\d+)\.conv\.batch_norm\.", r"encoder.layers.\1.conv.norm."),
    (r"linear_([kv])\.", r"\1_proj."),
    (r"linear_out\.", "o_proj."),
    (r"linear_q\.", "q_proj."),
    (r"pos_bias_([uv])", r"bias_\1"),
    (r"linear_pos\.", "relative_k_proj."),
    (r"decoder\.prediction\.embed\.", "decoder.embedding."),
    (r"decoder\.prediction\.dec_rnn\.lstm\.", "decoder.lstm."),
    (r"joint\.enc\.", "encoder_projector."),
    (r"joint\.pred\.", "decoder.decoder_projector."),
    (r"joint\.joint_net\.[12]\.", "joint.head."),
]


def hf_reference(model: ParakeetTDT) -> Any:
    """A transformers ``ParakeetForTDT`` (random init offline from a config) holding ``model``'s
    weights through the NeMo → HF key mapping."""
    tf = pytest.importorskip("transformers")
    dims: ParakeetDims = model.dims
    e, d = dims.encoder, dims.decoder
    enc_cfg = tf.ParakeetEncoderConfig(
        hidden_size=e.d_model, num_hidden_layers=e.n_layers, num_attention_heads=e.n_heads,
        intermediate_size=e.ff_dim, conv_kernel_size=e.conv_kernel, subsampling_factor=e.subsampling_factor,
        subsampling_conv_channels=e.subsampling_channels, num_mel_bins=e.n_mels, scale_input=e.xscaling,
        attention_bias=e.use_bias, convolution_bias=e.use_bias, dropout=0.0, dropout_positions=0.0,
        layerdrop=0.0, activation_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    cfg = tf.ParakeetTDTConfig(
        encoder_config=enc_cfg.to_dict(), vocab_size=d.vocab_size + 1, decoder_hidden_size=d.pred_hidden,
        num_decoder_layers=d.pred_layers, durations=list(d.durations), blank_token_id=d.blank_id,
        pad_token_id=0, max_symbols_per_step=d.max_symbols,
    )  # fmt: skip
    hf = tf.ParakeetForTDT(cfg).eval()
    hf_state = {}
    for key, value in voxline_to_nemo_state(model).items():
        if key.startswith("preprocessor."):
            continue
        for pattern, repl in _NEMO_TO_HF:
            key = re.sub(pattern, repl, key)
        hf_state[key] = value
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if not k.endswith("inv_freq")], missing
    hf.generation_config.decoder_start_token_id = d.blank_id
    return hf
