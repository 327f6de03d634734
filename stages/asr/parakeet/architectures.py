"""The published Parakeet-TDT shapes as NeMo ``model_config.yaml`` mappings.

Used to build random-weight models of the real sizes (benchmarks) or scaled-down copies (tests);
a real checkpoint's own config always wins. Sizes: v3 = 24 × 1024, 8192 pieces, no biases;
v2 = the same with 1024 pieces; 110m = 17 × 512, 80 mels, biases, a 1-layer LSTM.
"""

from __future__ import annotations

import copy
from typing import Any

_V3: dict[str, Any] = {
    "sample_rate": 16000,
    "preprocessor": {
        "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
        "window_stride": 0.01, "window": "hann", "features": 128, "n_fft": 512, "log": True,
        "frame_splicing": 1, "dither": 1.0e-05, "pad_to": 0, "pad_value": 0.0,
    },
    "encoder": {
        "feat_in": 128, "feat_out": -1, "n_layers": 24, "d_model": 1024, "use_bias": False,
        "subsampling": "dw_striding", "subsampling_factor": 8, "subsampling_conv_channels": 256,
        "causal_downsampling": False, "ff_expansion_factor": 4, "self_attention_model": "rel_pos",
        "n_heads": 8, "att_context_size": [-1, -1], "att_context_style": "regular",
        "xscaling": False, "untie_biases": True, "pos_emb_max_len": 5000, "conv_kernel_size": 9,
        "conv_norm_type": "batch_norm", "conv_context_size": None, "dropout": 0.1,
    },
    "decoder": {
        "normalization_mode": None, "random_state_sampling": False, "blank_as_pad": True,
        "prednet": {"pred_hidden": 640, "pred_rnn_layers": 2, "t_max": None, "dropout": 0.2},
        "vocab_size": 8192,
    },
    "joint": {
        "num_classes": 8192, "num_extra_outputs": 5,
        "jointnet": {"encoder_hidden": 1024, "pred_hidden": 640, "joint_hidden": 640,
                     "activation": "relu", "dropout": 0.2},
    },
    "decoding": {"strategy": "greedy_batch", "model_type": "tdt", "durations": [0, 1, 2, 3, 4],
                 "greedy": {"max_symbols": 10}},
}  # fmt: skip


def nemo_config(
    kind: str = "v3",
    *,
    n_layers: int | None = None,
    d_model: int | None = None,
    n_heads: int | None = None,
    vocab_size: int | None = None,
    pred_hidden: int | None = None,
    subsampling_channels: int | None = None,
    n_mels: int | None = None,
    durations: list[int] | None = None,
    max_symbols: int | None = None,
) -> dict[str, Any]:
    """A config mapping for ``kind`` ("v3", "v2" or "110m"), optionally scaled down."""
    cfg = copy.deepcopy(_V3)
    if kind == "v2":
        cfg["decoder"]["vocab_size"] = cfg["joint"]["num_classes"] = 1024
    elif kind == "110m":
        cfg["target"] = "nemo.collections.asr.models.EncDecHybridRNNTCTCBPEModel"
        cfg["preprocessor"]["features"] = cfg["encoder"]["feat_in"] = 80
        cfg["encoder"].update(n_layers=17, d_model=512, use_bias=True)
        cfg["decoder"]["vocab_size"] = cfg["joint"]["num_classes"] = 1024
        cfg["decoder"]["prednet"]["pred_rnn_layers"] = 1
        cfg["joint"]["jointnet"]["encoder_hidden"] = 512
        cfg["aux_ctc"] = {"decoder": {"feat_in": 512, "num_classes": 1024}}
    elif kind != "v3":
        raise ValueError(f"unknown Parakeet kind {kind!r}: v3, v2 or 110m")
    enc, dec, joint = cfg["encoder"], cfg["decoder"], cfg["joint"]
    if n_layers is not None:
        enc["n_layers"] = n_layers
    if d_model is not None:
        enc["d_model"] = joint["jointnet"]["encoder_hidden"] = d_model
    if n_heads is not None:
        enc["n_heads"] = n_heads
    if vocab_size is not None:
        dec["vocab_size"] = joint["num_classes"] = vocab_size
    if pred_hidden is not None:
        dec["prednet"]["pred_hidden"] = pred_hidden
        joint["jointnet"]["pred_hidden"] = joint["jointnet"]["joint_hidden"] = pred_hidden
    if subsampling_channels is not None:
        enc["subsampling_conv_channels"] = subsampling_channels
    if n_mels is not None:
        cfg["preprocessor"]["features"] = enc["feat_in"] = n_mels
    if durations is not None:
        cfg["decoding"]["durations"] = list(durations)
        joint["num_extra_outputs"] = len(durations)
    if max_symbols is not None:
        cfg["decoding"]["greedy"]["max_symbols"] = max_symbols
    return cfg
