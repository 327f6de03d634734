"""The log-mel front-end against transformers' ParakeetFeatureExtractor (same algorithm, written
independently): mel bank, normalised features and lengths, on padded batches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from stages.asr.parakeet.dims import FrontEndDims  # noqa: E402
from stages.asr.parakeet.features import LogMelFeatures, slaney_mel_bank  # noqa: E402


def _audio(lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        t = np.arange(n) / 16000
        x = 0.3 * np.sin(2 * np.pi * (150 + 40 * rng.random()) * t) * np.hanning(
            n
        ) + 0.02 * rng.standard_normal(n)
        out.append(x.astype(np.float32))
    return out


@pytest.mark.parametrize("n_mels", [128, 80])
def test_mel_bank_matches_transformers(n_mels: int) -> None:
    ours = slaney_mel_bank(n_mels, 512, 16000, 0.0, 8000.0)
    ref = tf.ParakeetFeatureExtractor(feature_size=n_mels).mel_filters
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-6


@pytest.mark.parametrize("n_mels", [128, 80])
def test_features_match_transformers_on_a_padded_batch(n_mels: int) -> None:
    audio = _audio([16000, 12345, 3210, 330])  # >= 2 frames: HF's std is NaN for one
    fe = LogMelFeatures(FrontEndDims(n_mels=n_mels))
    longest = max(len(a) for a in audio)
    batch = torch.zeros(len(audio), longest)
    for i, a in enumerate(audio):
        batch[i, : len(a)] = torch.from_numpy(a)
    samples = torch.tensor([len(a) for a in audio])
    feats, lengths = fe(batch, samples)

    ref = tf.ParakeetFeatureExtractor(feature_size=n_mels)(
        audio, sampling_rate=16000, return_tensors="pt"
    )
    ref_feats = ref.input_features.transpose(1, 2)  # HF is (B, T, M)
    assert lengths.tolist() == ref.attention_mask.sum(-1).tolist() == [len(a) // 160 for a in audio]
    t = min(feats.shape[-1], ref_feats.shape[-1])
    err = (feats[..., :t] - ref_feats[..., :t]).abs().max().item()
    assert err <= 1e-4, err
    # the frame past each length (the centred STFT's extra frame) is masked to zero
    for i, n in enumerate(lengths.tolist()):
        assert feats[i, :, n:].abs().max().item() == 0.0


def test_batch_equals_each_utterance_alone() -> None:
    audio = _audio([9000, 4000], seed=3)
    fe = LogMelFeatures(FrontEndDims())
    batch = torch.zeros(2, 9000)
    batch[0] = torch.from_numpy(audio[0])
    batch[1, :4000] = torch.from_numpy(audio[1])
    feats, lengths = fe(batch, torch.tensor([9000, 4000]))
    alone, alone_len = fe(torch.from_numpy(audio[1])[None], torch.tensor([4000]))
    n = int(alone_len[0])
    assert int(lengths[1]) == n
    assert (feats[1, :, :n] - alone[0, :, :n]).abs().max().item() <= 1e-5
