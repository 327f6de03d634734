"""Transformer-XL relative-position self-attention as FastConformer uses it (NeMo ``rel_pos``).

The position term (q + v_bias) · Wpos(pe) is rel-shifted into a (T, T) score matrix and handed to
``scaled_dot_product_attention`` as an additive mask, so fused attention kernels still apply.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# NeMo masks with -10000 rather than -inf: fully padded query rows then stay finite.
_MASKED = -10000.0


def relative_positions(
    length: int, d_model: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Sinusoidal embeddings for relative distances length-1 … -(length-1), shape (2T-1, d)."""
    distance = torch.arange(length - 1, -length, -1, device=device, dtype=torch.float32)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, device=device, dtype=torch.float32)
        * (-math.log(10000.0) / d_model)
    )
    angles = distance[:, None] * inv_freq[None, :]
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(2 * length - 1, d_model)
    return pe.to(dtype)


def rel_shift(scores: torch.Tensor) -> torch.Tensor:
    """Turn (B, H, T, 2T-1) scores indexed by relative distance into (B, H, T, T) by key index."""
    b, h, t, p = scores.shape
    padded = F.pad(scores, (1, 0))
    shifted = padded.view(b, h, p + 1, t)[:, :, 1:].reshape(b, h, t, p)
    return shifted[..., :t]


class RelPositionAttention(nn.Module):
    """Multi-head self-attention with untied per-layer position biases (``pos_bias_u/v``)."""

    def __init__(self, d_model: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.linear_q = nn.Linear(d_model, d_model, bias=bias)
        self.linear_k = nn.Linear(d_model, d_model, bias=bias)
        self.linear_v = nn.Linear(d_model, d_model, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.head_dim))

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        """x (B, T, d); pos (2T-1, d); keep (B, 1, T, T) bool — True where query i may see key j."""
        b, t, _ = x.shape
        h, dk = self.n_heads, self.head_dim
        q = self.linear_q(x).view(b, t, h, dk).transpose(1, 2)
        k = self.linear_k(x).view(b, t, h, dk).transpose(1, 2)
        v = self.linear_v(x).view(b, t, h, dk).transpose(1, 2)
        p = self.linear_pos(pos).view(-1, h, dk).transpose(0, 1)  # (H, 2T-1, dk)

        q_u = q + self.pos_bias_u[None, :, None, :]
        q_v = q + self.pos_bias_v[None, :, None, :]
        bd = rel_shift(torch.matmul(q_v, p.transpose(-1, -2)[None])) * (1.0 / math.sqrt(dk))
        if keep is not None:
            bd = bd.masked_fill(~keep, _MASKED)
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bd)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, h * dk))
