"""Tests for stages/speaker/features.py: the Kaldi fbank against an independent Kaldi
implementation (when installed) and both front ends on tones whose answer is known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.audio import int16_to_float, read_audio
from stages.speaker import features as F

DATA = Path(__file__).resolve().parents[1] / "data"
SR = F.RATE


def _tone(hz: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_kaldi_fbank_matches_kaldi_native_fbank_on_speech():
    knf = pytest.importorskip("kaldi_native_fbank")
    x = int16_to_float(read_audio(DATA / "ls-dev-clean-1988-24833-0000.wav"))[:24_000]
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = SR
    opts.mel_opts.num_bins = F.KALDI_BINS
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(SR, x.tolist())
    fbank.input_finished()
    ref = np.array([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])
    ref -= ref.mean(axis=0)
    ours = F.kaldi_fbank(x[None])[0]
    print(f"fbank vs kaldi-native-fbank: max abs diff {np.abs(ours - ref).max():.2e}")
    assert ours.shape == ref.shape == (148, 80)
    assert np.abs(ours - ref).max() < 1e-3  # measured 8e-5 (log energies span ~±9)


def test_frame_counts():
    assert F.kaldi_frames(24_000) == 148 and F.kaldi_frames(399) == 0 and F.kaldi_frames(400) == 1
    assert F.ge2e_frames(24_000) == 151
    assert F.kaldi_fbank(np.zeros((3, 24_000), np.float32)).shape == (3, 148, 80)
    assert F.ge2e_mel(np.zeros((2, 24_000), np.float32)).shape == (2, 151, 40)
    with pytest.raises(ValueError, match="shorter than one"):
        F.kaldi_fbank(np.zeros((1, 300), np.float32))


def _kaldi_centre_hz(b: int) -> float:
    lo, hi = 1127 * np.log1p(20 / 700), 1127 * np.log1p(8000 / 700)
    mel = lo + (b + 1) * (hi - lo) / (F.KALDI_BINS + 1)
    return float(700 * np.expm1(mel / 1127))


@pytest.mark.parametrize("hz", [300.0, 1000.0, 3500.0])
def test_a_tone_lands_in_the_mel_bin_around_it(hz):
    # Kaldi fbank is mean-normalised over time (a steady tone becomes all zeros), so its filters
    # are checked directly: the FFT bin of the tone weighs most in the filter centred nearest
    near = int(np.argmin([abs(_kaldi_centre_hz(b) - hz) for b in range(F.KALDI_BINS)]))
    fft_bin = round(hz / (SR / F.KALDI_FFT))
    assert abs(int(np.argmax(F.kaldi_mel_banks()[fft_bin])) - near) <= 1
    mel = F.ge2e_mel(_tone(hz)[None])[0].mean(axis=0)
    centres = F._slaney_hz(np.linspace(0, F._slaney_mel(SR / 2), F.GE2E_BINS + 2))[1:-1]
    assert abs(int(np.argmax(mel)) - int(np.argmin(abs(centres - hz)))) <= 1


def test_ge2e_levels_are_raised_to_minus_30_dbfs_never_lowered():
    quiet, loud = _tone(1000.0) * 0.01, _tone(1000.0)  # -53.5 and -13.5 dBFS RMS
    q, lo = F.ge2e_mel(quiet[None])[0], F.ge2e_mel(loud[None])[0]
    target = F.ge2e_mel((_tone(1000.0) * (10 ** (-30 / 20) / np.sqrt(np.mean(loud**2))))[None])[0]
    np.testing.assert_allclose(q, target, rtol=1e-3, atol=1e-6 * target.max())
    assert lo.sum() > 30 * q.sum()  # left 16.5 dB (45x in power) above the target


def test_the_filters_are_what_their_scales_say():
    kaldi = F.kaldi_mel_banks()
    assert kaldi.shape == (257, 80) and kaldi[-1].sum() == 0 and kaldi.max() <= 1.0
    assert (kaldi.sum(axis=0) > 0).all()  # no empty filter
    slaney = F.slaney_mel_banks()
    assert slaney.shape == (201, 40)
    area = slaney.sum(axis=0) * (SR / 2 / 200)  # Slaney filters have unit area in Hz
    np.testing.assert_allclose(area[10:], 1.0, atol=0.05)
