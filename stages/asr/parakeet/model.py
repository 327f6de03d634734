"""A whole Parakeet-TDT network: front-end, FastConformer encoder, prediction network, joint."""

from __future__ import annotations

import torch
from torch import nn

from stages.asr.parakeet.decoder import Joint, PredictionNetwork
from stages.asr.parakeet.dims import ParakeetDims
from stages.asr.parakeet.encoder import FastConformerEncoder
from stages.asr.parakeet.features import LogMelFeatures


class ParakeetTDT(nn.Module):
    """Weights and forward passes only; decoding lives in ``tdt`` and ``cuda_graphs``."""

    def __init__(self, dims: ParakeetDims) -> None:
        super().__init__()
        self.dims = dims
        self.features = LogMelFeatures(dims.front_end)
        self.encoder = FastConformerEncoder(dims.encoder)
        self.decoder = PredictionNetwork(dims.decoder)
        self.joint = Joint(dims.encoder.d_model, dims.decoder)

    def to_dtype(self, dtype: torch.dtype) -> ParakeetTDT:
        """Cast the networks but keep the front-end (and its mel bank) in float32."""
        self.encoder.to(dtype)
        self.decoder.to(dtype)
        self.joint.to(dtype)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.joint.out.weight.dtype

    @torch.inference_mode()
    def encode(
        self, audio: torch.Tensor, samples: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded waveforms (B, S) + sample counts → projected encoder frames (B, T', J) + lengths."""
        feats, lengths = self.features(audio, samples)
        enc, enc_lengths = self.encoder(feats.to(self.dtype), lengths)
        return self.joint.project_encoder(enc), enc_lengths
