"""The GE2E speaker encoder (Wan et al., 2018: three LSTM layers, a projection, ReLU) in
PyTorch, only to load resemblyzer's ``pretrained.pt`` and export it to ONNX once.

Input: [B, frames, 40] mel power; output: [B, 256], the projection of the last layer's final
hidden state (not normalised).
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 40
EMBEDDING = 256


class GE2E(nn.Module):
    """[B, frames, 40] mel power → [B, 256] speaker embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(FEATURES, EMBEDDING, num_layers=3, batch_first=True)
        self.linear = nn.Linear(EMBEDDING, EMBEDDING)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        return torch.relu(self.linear(hidden[-1]))
