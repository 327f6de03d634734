"""The FastConformer encoder: depthwise-striding x8 subsampling, then macaron Conformer blocks.

Module and parameter names follow NeMo's ``ConformerEncoder`` so a ``.nemo`` state dict loads
without renaming. Input is normalised log-mels (B, M, T); output is (B, T', d) plus lengths.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from stages.asr.parakeet.attention import RelPositionAttention, relative_positions
from stages.asr.parakeet.dims import EncoderDims


def subsampled_lengths(lengths: torch.Tensor, n_strided_convs: int) -> torch.Tensor:
    """Frames left after each stride-2, kernel-3, padding-1 convolution (NeMo ``calc_length``)."""
    for _ in range(n_strided_convs):
        lengths = torch.div(lengths + 2 - 3, 2, rounding_mode="floor") + 1
    return lengths.clamp(min=0)


def _time_mask(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Zero frames past each length on the time axis (dim 2 of (B, C, T, F))."""
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]
    return x * valid[:, None, :, None].to(x.dtype)


class DepthwiseStridingSubsampling(nn.Module):
    """Conv2d(1→C, s2) + ReLU, then (depthwise s2 + pointwise + ReLU) per further halving.

    Padded frames are zeroed before every convolution, as NeMo's masked sequential does, so a
    padded batch gives the same valid frames as each utterance alone.
    """

    def __init__(self, dims: EncoderDims) -> None:
        super().__init__()
        c = dims.subsampling_channels
        layers: list[nn.Module] = [nn.Conv2d(1, c, 3, stride=2, padding=1), nn.ReLU()]
        for _ in range(dims.n_strided_convs - 1):
            layers += [
                nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c),
                nn.Conv2d(c, c, 1),
                nn.ReLU(),
            ]
        self.conv = nn.Sequential(*layers)
        self.out = nn.Linear(c * dims.sub_freq_bins, dims.d_model)

    def forward(
        self, feats: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = feats.transpose(1, 2).unsqueeze(1)  # (B, 1, T, M)
        for layer in self.conv:
            if isinstance(layer, nn.Conv2d):
                x = _time_mask(x, lengths)
                x = layer(x)
                if layer.stride[0] == 2:
                    lengths = subsampled_lengths(lengths, 1)
            else:
                x = layer(x)
        x = _time_mask(x, lengths)
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ff_dim: int, bias: bool) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, ff_dim, bias=bias)
        self.linear2 = nn.Linear(ff_dim, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.silu(self.linear1(x)))


class ConvolutionModule(nn.Module):
    def __init__(self, d_model: int, kernel: int, bias: bool) -> None:
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(
            d_model, d_model, kernel, padding=(kernel - 1) // 2, groups=d_model, bias=bias
        )
        self.batch_norm = nn.BatchNorm1d(d_model)
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, 1, bias=bias)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
        # The pointwise convolutions run as matmuls on (B, T, d): same numbers, and on the CPU
        # far faster than a kernel-1 Conv1d.
        c1, c2 = self.pointwise_conv1, self.pointwise_conv2
        x = F.glu(F.linear(x, c1.weight[:, :, 0], c1.bias), dim=-1)
        if pad is not None:  # padded frames must not leak into valid ones through the kernel
            x = x.masked_fill(pad[:, :, None], 0.0)
        x = F.silu(self.batch_norm(self.depthwise_conv(x.transpose(1, 2))))
        return F.linear(x.transpose(1, 2), c2.weight[:, :, 0], c2.bias)


class ConformerLayer(nn.Module):
    """FF/2 → self-attention → convolution → FF/2 → LayerNorm, each with a residual."""

    def __init__(self, dims: EncoderDims) -> None:
        super().__init__()
        d, bias = dims.d_model, dims.use_bias
        self.norm_feed_forward1 = nn.LayerNorm(d)
        self.feed_forward1 = FeedForward(d, dims.ff_dim, bias)
        self.norm_self_att = nn.LayerNorm(d)
        self.self_attn = RelPositionAttention(d, dims.n_heads, bias)
        self.norm_conv = nn.LayerNorm(d)
        self.conv = ConvolutionModule(d, dims.conv_kernel, bias)
        self.norm_feed_forward2 = nn.LayerNorm(d)
        self.feed_forward2 = FeedForward(d, dims.ff_dim, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        keep: torch.Tensor | None,
        pad: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pos, keep)
        x = x + self.conv(self.norm_conv(x), pad)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class FastConformerEncoder(nn.Module):
    """Normalised log-mels (B, M, T) + lengths → encoder frames (B, T', d) + lengths (80 ms frames)."""

    def __init__(self, dims: EncoderDims) -> None:
        super().__init__()
        self.dims = dims
        self.pre_encode = DepthwiseStridingSubsampling(dims)
        self.layers = nn.ModuleList(ConformerLayer(dims) for _ in range(dims.n_layers))

    def masks(self, lengths: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention keep mask (B, 1, T, T), padding mask (B, T)). Built even when nothing is
        padded: no data-dependent branch, so the encoder exports and captures as one graph."""
        left, right = self.dims.att_context
        idx = torch.arange(t, device=lengths.device)
        valid = idx[None, :] < lengths[:, None]
        keep = valid[:, None, :, None] & valid[:, None, None, :]
        if left >= 0 or right >= 0:  # a banded context: query i sees keys i-left … i+right
            offset = idx[None, :] - idx[:, None]  # key - query
            band = torch.ones(t, t, dtype=torch.bool, device=lengths.device)
            if left >= 0:
                band &= offset >= -left
            if right >= 0:
                band &= offset <= right
            keep = keep & band
        return keep, ~valid

    def forward(
        self, feats: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, lengths = self.pre_encode(feats, lengths)
        if self.dims.xscaling:
            x = x * math.sqrt(self.dims.d_model)
        pos = relative_positions(x.shape[1], self.dims.d_model, x.device, x.dtype)
        keep, pad = self.masks(lengths, x.shape[1])
        for layer in self.layers:
            x = layer(x, pos, keep, pad)
        return x, lengths
