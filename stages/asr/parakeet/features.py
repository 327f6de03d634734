"""The Parakeet log-mel front-end (NeMo's FilterbankFeatures at inference), batched, in torch.

Pre-emphasis, a centred STFT with a symmetric Hann window, a Slaney mel bank, log with an additive
guard, then per-feature normalisation over each utterance's valid frames only. It always runs in
float32: the encoder may run in bf16/fp16, but log-mel statistics need the full range.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from stages.asr.parakeet.dims import FrontEndDims

_STD_FLOOR = 1e-5  # NeMo adds this to every per-feature standard deviation


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mel = hz / (200.0 / 3.0)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = mel * (200.0 / 3.0)
    log_part = 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, hz)


def slaney_mel_bank(
    n_mels: int, n_fft: int, sample_rate: int, low_hz: float, high_hz: float
) -> torch.Tensor:
    """Triangular, area-normalised mel filters, shape (n_mels, n_fft // 2 + 1) — librosa's
    ``filters.mel(norm="slaney", htk=False)``, which NeMo stores in every checkpoint."""
    fft_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges = _mel_to_hz(
        np.linspace(_hz_to_mel(np.array(low_hz)), _hz_to_mel(np.array(high_hz)), n_mels + 2)
    )
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    bank = np.maximum(0.0, np.minimum(rising, falling))
    bank *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return torch.from_numpy(bank.astype(np.float32))


def feature_lengths(samples: torch.Tensor, hop_length: int) -> torch.Tensor:
    """Valid feature frames per utterance. The centred STFT makes one frame more; NeMo masks it."""
    return torch.div(samples, hop_length, rounding_mode="floor")


class LogMelFeatures(nn.Module):
    """Waveforms (B, S) float32 in [-1, 1] plus sample counts -> normalised log-mels (B, M, T)."""

    def __init__(self, dims: FrontEndDims) -> None:
        super().__init__()
        self.dims = dims
        # Checkpoints carry these two buffers; the loader overwrites the computed ones with them.
        self.register_buffer("window", torch.hann_window(dims.win_length, periodic=False))
        self.register_buffer(
            "fb",
            slaney_mel_bank(dims.n_mels, dims.n_fft, dims.sample_rate, dims.low_hz, dims.high_hz)[
                None
            ],
        )

    @torch.no_grad()
    def forward(
        self, audio: torch.Tensor, samples: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.dims
        audio = audio.float()
        in_range = torch.arange(audio.shape[1], device=audio.device)[None, :] < samples[:, None]
        if d.preemph:
            audio = torch.cat((audio[:, :1], audio[:, 1:] - d.preemph * audio[:, :-1]), dim=1)
        audio = audio.masked_fill(~in_range, 0.0)
        with torch.autocast(audio.device.type, enabled=False):
            spec = torch.stft(
                audio,
                n_fft=d.n_fft,
                hop_length=d.hop_length,
                win_length=d.win_length,
                window=self.window.float(),
                center=True,
                pad_mode="constant",
                return_complex=True,
            )
            power = torch.view_as_real(spec).pow(2).sum(-1).sqrt()
            if d.mag_power != 1.0:
                power = power.pow(d.mag_power)
            mel = torch.matmul(self.fb[0].float(), power)
        logmel = torch.log(mel + d.log_guard)

        lengths = feature_lengths(samples, d.hop_length)
        valid = torch.arange(logmel.shape[-1], device=audio.device)[None, :] < lengths[:, None]
        valid3 = valid[:, None, :]
        count = lengths.to(logmel.dtype)[:, None]
        mean = torch.where(valid3, logmel, 0.0).sum(-1) / count.clamp(min=1.0)
        centred = torch.where(valid3, logmel - mean[..., None], 0.0)
        std = (centred.pow(2).sum(-1) / (count - 1.0)).sqrt()
        std = torch.nan_to_num(std, nan=0.0, posinf=0.0) + _STD_FLOOR
        feats = (logmel - mean[..., None]) / std[..., None]
        return feats.masked_fill(~valid3, 0.0), lengths
