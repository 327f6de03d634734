"""The FastConformer encoder as one multi-profile TensorRT engine (extra ``gpu``).

The encoder is exported to ONNX with dynamic batch and time, then built into a single engine
with one optimisation profile per audio-shape bucket — short streaming chunks, utterances, 30 s
windows. Profiles share the engine's one copy of the weights; each gets kernels tuned for its own
typical shape, so a 1 s chunk never runs kernels tuned for (or padded to) 30 s. At run time the
smallest profile covering (batch, frames) is picked, with one execution context per profile.

Written against TensorRT 10's documented Python API (``build_serialized_network``,
``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``). The ONNX export is tested on
the CPU with onnxruntime; the TensorRT build and run are NOT verified here (no GPU, no TensorRT) —
the GPU benchmark exercises them and compares against the torch encoder.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from agent.errors import require
from stages.asr.parakeet.encoder import FastConformerEncoder, subsampled_lengths

INPUT_FEATURES = "features"
INPUT_LENGTHS = "lengths"
OUTPUT = "encoded"


@dataclass(slots=True, frozen=True)
class Profile:
    """An optimisation profile over (batch, feature frames); frames are 10 ms each."""

    name: str
    min: tuple[int, int]
    opt: tuple[int, int]
    max: tuple[int, int]

    def covers(self, batch: int, frames: int) -> bool:
        return batch <= self.max[0] and frames <= self.max[1] and frames >= self.min[1]


def default_profiles(max_batch: int = 64) -> tuple[Profile, ...]:
    """Streaming chunks up to 4 s, utterances up to 16 s, windows up to 30 s (+1 STFT frame)."""
    return (
        Profile("stream", (1, 16), (min(16, max_batch), 200), (max_batch, 400)),
        Profile("utterance", (1, 401), (min(32, max_batch), 1000), (max_batch, 1600)),
        Profile("window", (1, 1601), (max_batch, 3001), (max_batch, 3001)),
    )


def pick_profile(profiles: Sequence[Profile], batch: int, frames: int) -> int:
    """The first profile covering (batch, frames); inputs shorter than every profile use the
    first one (they are padded up to its minimum)."""
    for k, p in enumerate(profiles):
        if p.covers(batch, frames):
            return k
    if frames < min(p.min[1] for p in profiles) and batch <= profiles[0].max[0]:
        return 0
    raise ValueError(f"no TensorRT profile covers batch {batch} × {frames} frames")


class _ExportedEncoder(nn.Module):
    """(features (B, M, T) float32, lengths (B,) int32) → encoded (B, T', d) float32."""

    def __init__(self, encoder: FastConformerEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.encoder(features, lengths.long())[0]


def export_encoder_onnx(encoder: FastConformerEncoder, frames: int = 301, opset: int = 17) -> bytes:
    """The encoder as ONNX bytes (float32 weights, dynamic batch and time)."""
    require("onnx", what="exporting the Parakeet encoder", extra="gpu")
    module = _ExportedEncoder(copy.deepcopy(encoder).float().cpu()).eval()
    example = (
        torch.zeros(2, encoder.dims.n_mels, frames),
        torch.tensor([frames, frames // 2], dtype=torch.int32),
    )
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            module, example, buf,
            input_names=[INPUT_FEATURES, INPUT_LENGTHS], output_names=[OUTPUT],
            dynamic_axes={INPUT_FEATURES: {0: "batch", 2: "frames"}, INPUT_LENGTHS: {0: "batch"},
                          OUTPUT: {0: "batch", 1: "encoded_frames"}},
            opset_version=opset, dynamo=False,
        )  # fmt: skip
    return buf.getvalue()


def build_engine(
    onnx_model: bytes,
    n_mels: int,
    profiles: Sequence[Profile],
    precision: str = "bf16",
    workspace_gib: float = 8.0,
) -> bytes:
    """Build and serialise one engine holding every profile."""
    trt = require("tensorrt", what="the TensorRT Parakeet encoder", extra="gpu")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse the encoder ONNX: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    if precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    elif precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision != "fp32":
        raise ValueError(f"precision must be bf16, fp16 or fp32, not {precision!r}")
    for p in profiles:
        prof = builder.create_optimization_profile()
        prof.set_shape(
            INPUT_FEATURES,
            (p.min[0], n_mels, p.min[1]),
            (p.opt[0], n_mels, p.opt[1]),
            (p.max[0], n_mels, p.max[1]),
        )
        prof.set_shape(INPUT_LENGTHS, (p.min[0],), (p.opt[0],), (p.max[0],))
        config.add_optimization_profile(prof)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT failed to build the encoder engine (see its log above)")
    return bytes(serialized)


class TensorRTEncoder:
    """Runs a multi-profile engine as a drop-in encoder: ``(features, lengths) → (encoded, lengths)``."""

    def __init__(
        self,
        engine: bytes,
        profiles: Sequence[Profile],
        n_strided_convs: int,
        device: torch.device | str = "cuda",
    ) -> None:
        trt = require("tensorrt", what="the TensorRT Parakeet encoder", extra="gpu")
        self.device = torch.device(device)
        self.profiles = tuple(profiles)
        self.n_strided_convs = n_strided_convs
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(engine)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialise the encoder engine")
        if self.engine.num_optimization_profiles != len(self.profiles):
            raise RuntimeError("engine and profile list disagree; rebuild the engine")
        stream = torch.cuda.current_stream(self.device).cuda_stream
        # Two contexts must never share a profile while running, so each profile owns one.
        self._contexts = []
        for k in range(len(self.profiles)):
            ctx = self.engine.create_execution_context()
            ctx.set_optimization_profile_async(k, stream)
            self._contexts.append(ctx)
        torch.cuda.current_stream(self.device).synchronize()

    @classmethod
    def from_encoder(
        cls,
        encoder: FastConformerEncoder,
        profiles: Sequence[Profile] | None = None,
        precision: str = "bf16",
        cache: Path | None = None,
    ) -> TensorRTEncoder:
        """Export + build (or load ``cache`` when it exists; write it after a build)."""
        profiles = tuple(profiles or default_profiles())
        if cache is not None and cache.is_file():
            engine = cache.read_bytes()
        else:
            engine = build_engine(
                export_encoder_onnx(encoder), encoder.dims.n_mels, profiles, precision
            )
            if cache is not None:
                cache.write_bytes(engine)
        return cls(engine, profiles, encoder.dims.n_strided_convs)

    def __call__(
        self, features: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, m, t = features.shape
        max_batch = max(p.max[0] for p in self.profiles)
        if b > max_batch:  # split: no profile takes it whole
            parts = [
                self(features[i : i + max_batch], lengths[i : i + max_batch])
                for i in range(0, b, max_batch)
            ]
            width = max(p[0].shape[1] for p in parts)
            enc = torch.cat(
                [nn.functional.pad(p[0], (0, 0, 0, width - p[0].shape[1])) for p in parts]
            )
            return enc, torch.cat([p[1] for p in parts])
        k = pick_profile(self.profiles, b, t)
        if t < self.profiles[k].min[1]:
            features = nn.functional.pad(features, (0, self.profiles[k].min[1] - t))
        features = features.float().contiguous()
        lengths32 = lengths.to(torch.int32).contiguous()
        ctx = self._contexts[k]
        ctx.set_input_shape(INPUT_FEATURES, tuple(features.shape))
        ctx.set_input_shape(INPUT_LENGTHS, (b,))
        out = torch.empty(
            tuple(ctx.get_tensor_shape(OUTPUT)), dtype=torch.float32, device=features.device
        )
        ctx.set_tensor_address(INPUT_FEATURES, features.data_ptr())
        ctx.set_tensor_address(INPUT_LENGTHS, lengths32.data_ptr())
        ctx.set_tensor_address(OUTPUT, out.data_ptr())
        if not ctx.execute_async_v3(torch.cuda.current_stream(features.device).cuda_stream):
            raise RuntimeError("TensorRT encoder execution failed")
        # Lengths come from the host formula: reduced-precision engines' own are not trusted.
        enc_lengths = subsampled_lengths(lengths, self.n_strided_convs)
        t_out = subsampled_lengths(torch.tensor([t]), self.n_strided_convs).item()
        return out[:, :t_out], enc_lengths
