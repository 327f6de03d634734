"""CAM++ (Wang et al., 2023: a 2-D convolutional front module, then densely connected TDNN
blocks with context-aware masking) in PyTorch, only to load the 3D-Speaker weights and export
them to ONNX once.

Parameter names follow the checkpoint (``campplus_cn_en_common.pt``): ``head.*`` for the 2-D
front, ``xvector.*`` for the rest. Input: [B, frames, 80] mean-normalised log fbank; output:
[B, 192] embeddings (not normalised). The context mask's segment pooling is a padded reshape
whose sums are divided by the frames each segment really has, and the mask is computed once per
segment: both export to ONNX with the frame count left dynamic.
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 80
EMBEDDING = 192
GROWTH = 32  # channels each dense layer adds
BOTTLENECK = 128  # a dense layer's inner width (4 x growth)
SEGMENT = 100  # frames per segment of the context pooling
BLOCKS = ((12, 1), (24, 2), (16, 2))  # (layers, dilation) of the three dense blocks


def _bn_relu(channels: int) -> nn.Sequential:
    seq = nn.Sequential()
    seq.add_module("batchnorm", nn.BatchNorm1d(channels))
    seq.add_module("relu", nn.ReLU())
    return seq


class _ResBlock2d(nn.Module):
    """Two 3x3 convolutions with a residual path; a stride halves the frequency axis only."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        s = (stride, 1)
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=s, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, channels, 1, stride=s, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class _Head(nn.Module):
    """The 2-D front: 80 mel bins x 1 channel → 10 bins x 32 channels, flattened to 320."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(_ResBlock2d(channels, 2), _ResBlock2d(channels, 1))
        self.layer2 = nn.Sequential(_ResBlock2d(channels, 2), _ResBlock2d(channels, 1))
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        y = torch.relu(self.bn2(self.conv2(self.layer2(self.layer1(y)))))
        return y.flatten(1, 2)


class _Tdnn(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(cin, cout, 5, stride=2, padding=2, bias=False)
        self.nonlinear = _bn_relu(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class _ContextMask(nn.Module):
    """A local dilated convolution, gated by a mask computed from the utterance mean plus the
    mean of the 100-frame segment each frame falls in."""

    def __init__(self, dilation: int) -> None:
        super().__init__()
        self.linear_local = nn.Conv1d(
            BOTTLENECK, GROWTH, 3, padding=dilation, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(BOTTLENECK, BOTTLENECK // 2, 1)
        self.linear2 = nn.Conv1d(BOTTLENECK // 2, GROWTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        segments = (frames + SEGMENT - 1) // SEGMENT
        padded = nn.functional.pad(x, (0, segments * SEGMENT - frames))
        sums = padded.unflatten(-1, (segments, SEGMENT)).sum(-1)
        counts = torch.clamp(
            frames - torch.arange(segments, device=x.device) * SEGMENT, max=SEGMENT
        )
        context = x.mean(-1, keepdim=True) + sums / counts.to(x.dtype)
        # the mask is constant over a segment: computed once per segment, then spread to its
        # frames (the same numbers as computing it per frame, at a fraction of the work)
        mask = torch.sigmoid(self.linear2(torch.relu(self.linear1(context))))
        segment_of = torch.div(
            torch.arange(frames, device=x.device), SEGMENT, rounding_mode="floor"
        )
        return self.linear_local(x) * mask[..., segment_of]


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, dilation: int) -> None:
        super().__init__()
        self.nonlinear1 = _bn_relu(cin)
        self.linear1 = nn.Conv1d(cin, BOTTLENECK, 1, bias=False)
        self.nonlinear2 = _bn_relu(BOTTLENECK)
        self.cam_layer = _ContextMask(dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.nonlinear2(self.linear1(self.nonlinear1(x)))
        return torch.cat([x, self.cam_layer(y)], dim=1)


class _Transit(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.nonlinear = _bn_relu(cin)
        self.linear = nn.Conv1d(cin, cout, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class _Embedding(nn.Module):
    """Mean and standard deviation over time → 192 dims, batch-normalised without affine."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(2 * cin, EMBEDDING, 1, bias=False)
        self.nonlinear = nn.Sequential()
        self.nonlinear.add_module("batchnorm", nn.BatchNorm1d(EMBEDDING, affine=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        # the unbiased standard deviation, spelled out: torch's std exports with a bad rank
        std = torch.sqrt((x - mean).square().sum(-1, keepdim=True) / (x.shape[-1] - 1))
        stats = torch.cat([mean, std], dim=1)
        return self.nonlinear(self.linear(stats).squeeze(-1))


class CAMPPlus(nn.Module):
    """[B, frames, 80] fbank → [B, 192] speaker embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.head = _Head()
        channels = 128
        xvector = nn.Sequential()
        xvector.add_module("tdnn", _Tdnn(320, channels))
        for i, (layers, dilation) in enumerate(BLOCKS, start=1):
            block = nn.Sequential()
            for j in range(layers):
                block.add_module(f"tdnnd{j + 1}", _DenseLayer(channels + j * GROWTH, dilation))
            xvector.add_module(f"block{i}", block)
            channels += layers * GROWTH
            xvector.add_module(f"transit{i}", _Transit(channels, channels // 2))
            channels //= 2
        out = nn.Sequential()
        out.add_module("batchnorm", nn.BatchNorm1d(channels))
        out.add_module("relu", nn.ReLU())
        xvector.add_module("out_nonlinear", out)
        xvector.add_module("dense", _Embedding(channels))
        self.xvector = xvector

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.xvector(self.head(feats.transpose(1, 2)))
