"""The two front ends the speaker-embedding networks were trained on, in numpy, batched.

CAM++ takes Kaldi's 80-bin log mel filterbank (25 ms frames every 10 ms, snip-edges framing,
DC removal, 0.97 pre-emphasis, the "povey" window, a 512-point FFT, mel bins from 20 Hz to
Nyquist), mean-normalised over each window. GE2E takes a 40-bin *power* (not log) mel
spectrogram: centred 400-point frames, a periodic Hann window, Slaney-style mel filters, on audio
brought up to -30 dBFS. Both work on a batch of equal-length windows at once.
"""

from __future__ import annotations

from functools import cache

import numpy as np

RATE = 16_000
FRAME = 400  # 25 ms
HOP = 160  # 10 ms
KALDI_FFT = 512
KALDI_BINS = 80
GE2E_BINS = 40
GE2E_TARGET_DBFS = -30.0
_EPS = np.float32(np.finfo(np.float32).eps)


def kaldi_frames(samples: int) -> int:
    """How many fbank frames a window of ``samples`` has (Kaldi's snip-edges framing)."""
    return 0 if samples < FRAME else 1 + (samples - FRAME) // HOP


def _kaldi_mel(f: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log1p(f / 700.0)


@cache
def kaldi_mel_banks() -> np.ndarray:
    """[257, 80] triangular filters, equally spaced on Kaldi's mel scale from 20 Hz to 8 kHz;
    the Nyquist bin has no weight, as in Kaldi."""
    lo, hi = _kaldi_mel(np.float64(20.0)), _kaldi_mel(np.float64(RATE / 2))
    delta = (hi - lo) / (KALDI_BINS + 1)
    left = lo + delta * np.arange(KALDI_BINS)
    centre, right = left + delta, left + 2 * delta
    mel = _kaldi_mel(np.arange(KALDI_FFT // 2) * (RATE / KALDI_FFT))[:, None]
    up = (mel - left) / (centre - left)
    down = (right - mel) / (right - centre)
    banks = np.where((mel > left) & (mel <= centre), up, 0.0)
    banks = np.where((mel > centre) & (mel < right), down, banks)
    return np.vstack([banks, np.zeros((1, KALDI_BINS))]).astype(np.float32)


@cache
def _povey_window() -> np.ndarray:
    n = np.arange(FRAME)
    return ((0.5 - 0.5 * np.cos(2 * np.pi * n / (FRAME - 1))) ** 0.85).astype(np.float32)


def _frame(batch: np.ndarray, count: int) -> np.ndarray:
    """[B, samples] → [B, count, 400] views at a 160-sample hop."""
    view = np.lib.stride_tricks.sliding_window_view(batch, FRAME, axis=1)
    return view[:, : (count - 1) * HOP + 1 : HOP]


def kaldi_fbank(batch: np.ndarray) -> np.ndarray:
    """[B, samples] float audio in [-1, 1] → [B, frames, 80] float32 log mel energies, each
    window's mean over time removed (what CAM++ expects)."""
    batch = np.asarray(batch, dtype=np.float32)
    count = kaldi_frames(batch.shape[1])
    if count == 0:
        raise ValueError(f"a window of {batch.shape[1]} samples is shorter than one 25 ms frame")
    frames = _frame(batch, count).astype(np.float32)  # a copy, worked on in place below
    frames -= frames.mean(axis=2, keepdims=True)
    frames[:, :, 1:] -= 0.97 * frames[:, :, :-1]
    frames[:, :, 0] *= 1.0 - 0.97
    frames *= _povey_window()
    power = np.abs(np.fft.rfft(frames, n=KALDI_FFT, axis=2)) ** 2
    feats = np.log(np.maximum(power.astype(np.float32) @ kaldi_mel_banks(), _EPS))
    return feats - feats.mean(axis=1, keepdims=True)


def ge2e_frames(samples: int) -> int:
    """How many mel frames a window of ``samples`` has (centred framing)."""
    return 1 + samples // HOP


def _slaney_mel(f: np.ndarray | float) -> np.ndarray:
    """Hz → Slaney's mel: linear to 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log_part, f * 3.0 / 200.0)


def _slaney_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), m * 200.0 / 3.0)


@cache
def slaney_mel_banks() -> np.ndarray:
    """[201, 40] area-normalised triangular filters from 0 Hz to 8 kHz on Slaney's mel scale."""
    hz = _slaney_hz(np.linspace(0.0, _slaney_mel(RATE / 2), GE2E_BINS + 2))
    freqs = np.linspace(0.0, RATE / 2, FRAME // 2 + 1)[:, None]
    up = (freqs - hz[:-2]) / (hz[1:-1] - hz[:-2])
    down = (hz[2:] - freqs) / (hz[2:] - hz[1:-1])
    banks = np.maximum(0.0, np.minimum(up, down)) * (2.0 / (hz[2:] - hz[:-2]))
    return banks.astype(np.float32)


@cache
def _hann_periodic() -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)


def ge2e_mel(batch: np.ndarray) -> np.ndarray:
    """[B, samples] float audio in [-1, 1] → [B, frames, 40] float32 mel power, each window
    first raised (never lowered) to -30 dBFS RMS, as GE2E was trained."""
    batch = np.asarray(batch, dtype=np.float32)
    rms = np.sqrt(np.mean(np.square(batch, dtype=np.float64), axis=1, keepdims=True))
    gain = np.maximum(1.0, 10.0 ** (GE2E_TARGET_DBFS / 20.0) / np.maximum(rms, 1e-9))
    padded = np.pad(batch * gain.astype(np.float32), ((0, 0), (FRAME // 2, FRAME // 2)), "reflect")
    frames = _frame(padded, ge2e_frames(batch.shape[1])) * _hann_periodic()
    power = np.abs(np.fft.rfft(frames, axis=2)) ** 2
    return (power.astype(np.float32) @ slaney_mel_banks()).astype(np.float32)
