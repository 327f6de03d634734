"""The TDT prediction network (embedding + LSTM) and joint network.

The joint is split the way the decoding loop uses it: the encoder projection runs once per
utterance, the prediction projection once per emitted label, and only the cheap sum → ReLU →
Linear runs per decoding step. Output logits are [tokens + blank | durations].
"""

from __future__ import annotations

import torch
from torch import nn

from stages.asr.parakeet.dims import DecoderDims

LSTMState = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, B, P)


class PredictionNetwork(nn.Module):
    """Embedding(V+1, P, padding_idx=blank) + LSTM. Blank's row is zero, so feeding blank is the
    start-of-sequence input."""

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        self.dims = dims
        self.embed = nn.Embedding(dims.vocab_size + 1, dims.pred_hidden, padding_idx=dims.blank_id)
        self.lstm = nn.LSTM(
            dims.pred_hidden, dims.pred_hidden, num_layers=dims.pred_layers, batch_first=True
        )

    def initial_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> LSTMState:
        shape = (self.dims.pred_layers, batch, self.dims.pred_hidden)
        return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(
            shape, device=device, dtype=dtype
        )

    def step(self, labels: torch.Tensor, state: LSTMState) -> tuple[torch.Tensor, LSTMState]:
        """One label per row (B,) → output (B, P) and the next state.

        On CUDA the step runs torch's fused LSTM cell layer by layer, not cuDNN's LSTM: with
        cuDNN the TDT decoder's full graph (two nested conditional loops) crashed in capture_end
        (torch 2.11, CUDA 13, H200; ``scripts/gpu_probe.py``). Every decoder mode runs this same
        cell, so their tokens stay identical; no global cuDNN switch is touched."""
        x = self.embed(labels)
        if not x.is_cuda:
            out, new_state = self.lstm(x[:, None, :], state)
            return out[:, 0], new_state
        h, c = state
        hs, cs = [], []
        for layer in range(self.lstm.num_layers):
            x, c_next = torch.lstm_cell(x, (h[layer], c[layer]), *self._cell_weights(layer))
            hs.append(x)
            cs.append(c_next)
        return x, (torch.stack(hs), torch.stack(cs))

    def _cell_weights(self, layer: int) -> tuple[torch.Tensor | None, ...]:
        lstm = self.lstm
        return (
            getattr(lstm, f"weight_ih_l{layer}"),
            getattr(lstm, f"weight_hh_l{layer}"),
            getattr(lstm, f"bias_ih_l{layer}", None),
            getattr(lstm, f"bias_hh_l{layer}", None),
        )


class Joint(nn.Module):
    def __init__(self, encoder_dim: int, dims: DecoderDims) -> None:
        super().__init__()
        self.enc = nn.Linear(encoder_dim, dims.joint_hidden)
        self.pred = nn.Linear(dims.pred_hidden, dims.joint_hidden)
        self.out = nn.Linear(dims.joint_hidden, dims.joint_outputs)

    def project_encoder(self, enc: torch.Tensor) -> torch.Tensor:
        return self.enc(enc)

    def project_prediction(self, g: torch.Tensor) -> torch.Tensor:
        return self.pred(g)

    def logits(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        """Already projected encoder and prediction vectors (broadcastable) → joint logits."""
        return self.out(torch.relu(enc_proj + pred_proj))
