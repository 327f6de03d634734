"""The shape of a Parakeet-TDT model, read from a NeMo ``model_config.yaml`` mapping.

Every dimension comes from the checkpoint's own config (never hardcoded per release); the loader
then cross-checks these numbers against the tensor shapes in the state dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import VoxlineError

SUPPORTED_SUBSAMPLING = "dw_striding"
SUPPORTED_ATTENTION = "rel_pos"


class CheckpointError(VoxlineError):
    """A .nemo file exists but cannot be used: damaged, unsafe, or not a Parakeet-TDT model."""


@dataclass(slots=True, frozen=True)
class FrontEndDims:
    sample_rate: int = 16000
    n_mels: int = 128
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    preemph: float = 0.97
    low_hz: float = 0.0
    high_hz: float = 8000.0
    log_guard: float = 2.0**-24
    mag_power: float = 2.0
    normalize: str = "per_feature"


@dataclass(slots=True, frozen=True)
class EncoderDims:
    n_mels: int = 128
    n_layers: int = 24
    d_model: int = 1024
    n_heads: int = 8
    ff_dim: int = 4096
    conv_kernel: int = 9
    subsampling_channels: int = 256
    subsampling_factor: int = 8
    use_bias: bool = False
    xscaling: bool = False
    att_context: tuple[int, int] = (-1, -1)  # (left, right) frames; -1 = unlimited

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_strided_convs(self) -> int:
        return self.subsampling_factor.bit_length() - 1

    @property
    def sub_freq_bins(self) -> int:
        f = self.n_mels
        for _ in range(self.n_strided_convs):
            f = (f - 1) // 2 + 1
        return f


@dataclass(slots=True, frozen=True)
class DecoderDims:
    vocab_size: int = 8192  # without blank; blank id == vocab_size
    pred_hidden: int = 640
    pred_layers: int = 2
    joint_hidden: int = 640
    durations: tuple[int, ...] = (0, 1, 2, 3, 4)
    max_symbols: int = 10
    joint_dropout_slot: bool = (
        True  # True: joint_net = [ReLU, Dropout, Linear] -> Linear is index 2
    )

    @property
    def blank_id(self) -> int:
        return self.vocab_size

    @property
    def joint_outputs(self) -> int:
        return self.vocab_size + 1 + len(self.durations)


@dataclass(slots=True, frozen=True)
class ParakeetDims:
    front_end: FrontEndDims
    encoder: EncoderDims
    decoder: DecoderDims


def _get(cfg: Mapping[str, Any], path: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _need(cfg: Mapping[str, Any], path: str) -> Any:
    value = _get(cfg, path)
    if value is None:
        raise CheckpointError(f"model_config.yaml has no `{path}` — is this a Parakeet-TDT .nemo?")
    return value


def dims_from_config(cfg: Mapping[str, Any]) -> ParakeetDims:
    """Read every dimension of a Parakeet-TDT model from its NeMo config mapping."""
    pre = cfg.get("preprocessor") or {}
    sr = int(pre.get("sample_rate", cfg.get("sample_rate", 16000)))
    if sr != 16000:
        raise CheckpointError(f"sample rate {sr} Hz is not supported (voxline runs at 16 kHz)")
    normalize = str(pre.get("normalize", "per_feature"))
    if normalize != "per_feature":
        raise CheckpointError(f"preprocessor.normalize={normalize!r} is not supported")
    if str(pre.get("window", "hann")) != "hann" or pre.get("exact_pad"):
        raise CheckpointError("only a centred Hann-window STFT (exact_pad false) is supported")
    if int(pre.get("frame_splicing", 1)) != 1:
        raise CheckpointError("preprocessor.frame_splicing != 1 is not supported")
    guard_type = str(pre.get("log_zero_guard_type", "add"))
    if guard_type != "add" or not pre.get("log", True):
        raise CheckpointError("only log features with an additive zero guard are supported")
    guard = pre.get("log_zero_guard_value", 2.0**-24)
    if isinstance(guard, str):  # NeMo also accepts the names of float32 constants here
        guard = {"tiny": 1.1754943508222875e-38, "eps": 1.1920928955078125e-07}.get(guard)
        if guard is None:
            raise CheckpointError(
                "preprocessor.log_zero_guard_value must be a number, 'tiny' or 'eps'"
            )
    front = FrontEndDims(
        sample_rate=sr,
        n_mels=int(pre.get("features", pre.get("nfilt", 64))),
        n_fft=int(pre.get("n_fft", 512)),
        win_length=round(float(pre.get("window_size", 0.025)) * sr),
        hop_length=round(float(pre.get("window_stride", 0.01)) * sr),
        preemph=float(pre.get("preemph", 0.97) or 0.0),
        low_hz=float(pre.get("lowfreq", 0.0) or 0.0),
        high_hz=float(pre.get("highfreq") or sr / 2),
        log_guard=float(guard),
        mag_power=float(pre.get("mag_power", 2.0)),
        normalize=normalize,
    )

    enc = _need(cfg, "encoder")
    if enc.get("subsampling", SUPPORTED_SUBSAMPLING) != SUPPORTED_SUBSAMPLING:
        raise CheckpointError(
            f"encoder.subsampling={enc.get('subsampling')!r}; only {SUPPORTED_SUBSAMPLING!r} is implemented"
        )
    if enc.get("self_attention_model", SUPPORTED_ATTENTION) != SUPPORTED_ATTENTION:
        raise CheckpointError(
            f"encoder.self_attention_model={enc.get('self_attention_model')!r}; only 'rel_pos' is implemented"
        )
    if str(enc.get("conv_norm_type", "batch_norm")) != "batch_norm":
        raise CheckpointError("only encoder.conv_norm_type='batch_norm' is implemented")
    if enc.get("causal_downsampling") or enc.get("conv_context_size") not in (None, "null"):
        raise CheckpointError("cache-aware (causal) FastConformer checkpoints are not supported")
    factor = int(enc.get("subsampling_factor", 8))
    if factor not in (2, 4, 8, 16):
        raise CheckpointError(f"encoder.subsampling_factor={factor} is not a power of two")
    d_model = int(_need(cfg, "encoder.d_model"))
    context = enc.get("att_context_size") or [-1, -1]
    if isinstance(context[0], (list, tuple)):  # multi-look-ahead models list several; use the first
        context = context[0]
    encoder = EncoderDims(
        n_mels=int(enc.get("feat_in", front.n_mels)),
        n_layers=int(_need(cfg, "encoder.n_layers")),
        d_model=d_model,
        n_heads=int(enc.get("n_heads", 4)),
        ff_dim=int(d_model * float(enc.get("ff_expansion_factor", 4))),
        conv_kernel=int(enc.get("conv_kernel_size", 31)),
        subsampling_channels=int(enc.get("subsampling_conv_channels", 256)),
        subsampling_factor=factor,
        use_bias=bool(enc.get("use_bias", True)),  # NeMo's ConformerEncoder default is True
        xscaling=bool(enc.get("xscaling", True)),  # ... and so is this one
        att_context=(int(context[0]), int(context[1])),
    )
    if encoder.n_mels != front.n_mels:
        raise CheckpointError(
            f"encoder.feat_in={encoder.n_mels} but the preprocessor makes {front.n_mels} mel bins"
        )

    vocab = int(_get(cfg, "decoder.vocab_size") or _need(cfg, "joint.num_classes"))
    durations = _get(cfg, "decoding.durations") or _get(cfg, "model_defaults.tdt_durations")
    if not durations:
        raise CheckpointError(
            "no TDT durations in decoding.durations or model_defaults.tdt_durations — "
            "this backend decodes TDT models only"
        )
    extra = int(_get(cfg, "joint.num_extra_outputs", len(durations)))
    if extra != len(durations):
        raise CheckpointError(f"joint.num_extra_outputs={extra} but {len(durations)} durations")
    activation = str(_get(cfg, "joint.jointnet.activation", "relu")).lower()
    if activation != "relu":
        raise CheckpointError(f"joint activation {activation!r} is not supported")
    max_symbols = _get(cfg, "decoding.greedy.max_symbols") or _get(
        cfg, "decoding.greedy.max_symbols_per_step"
    )
    pred_hidden = int(_need(cfg, "decoder.prednet.pred_hidden"))
    decoder = DecoderDims(
        vocab_size=vocab,
        pred_hidden=pred_hidden,
        pred_layers=int(_get(cfg, "decoder.prednet.pred_rnn_layers", 1)),
        joint_hidden=int(_get(cfg, "joint.jointnet.joint_hidden", pred_hidden)),
        durations=tuple(int(d) for d in durations),
        max_symbols=int(max_symbols or 10),
        joint_dropout_slot=float(_get(cfg, "joint.jointnet.dropout", 0.0) or 0.0) > 0.0,
    )
    return ParakeetDims(
        front_end=front,
        encoder=encoder,
        decoder=decoder,
    )
