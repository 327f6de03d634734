"""The FastConformer encoder against transformers' ParakeetEncoder holding the same weights:
v3-style (no biases, 128 mels) and 110m-style (biases, 80 mels), padded batches, edge lengths,
and the reduced-precision dtypes."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from stages.asr.parakeet.encoder import subsampled_lengths  # noqa: E402

from .tiny_models import hf_reference, random_model  # noqa: E402


@pytest.fixture(scope="module", params=["v3", "110m"])
def pair(request: pytest.FixtureRequest):
    _, model = random_model(request.param, seed=11)
    return model, hf_reference(model)


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def test_encoder_matches_transformers_per_utterance(pair) -> None:
    model, hf = pair
    gen = torch.Generator().manual_seed(0)
    # 301 frames → 38 encoder frames; 9 → 2; 17 → 3 (odd); 1 → 1 (the rel-shift edge cases)
    lengths = [301, 173, 17, 9, 1]
    feats = torch.randn(len(lengths), model.dims.encoder.n_mels, max(lengths), generator=gen)
    for i, n in enumerate(lengths):
        feats[i, :, n:] = 0
    with torch.no_grad():
        ours, ours_len = model.encoder(feats, torch.tensor(lengths))
        for i, n in enumerate(lengths):
            ref = hf.encoder(
                input_features=feats[i : i + 1, :, :n].transpose(1, 2)
            ).last_hidden_state[0]
            m = int(ours_len[i])
            assert m == ref.shape[0]
            assert _rel_err(ours[i, :m], ref) <= 1e-4


def test_encoder_matches_transformers_on_the_padded_batch(pair) -> None:
    model, hf = pair
    lengths = torch.tensor([240, 97, 33])
    feats = torch.randn(
        3, model.dims.encoder.n_mels, 240, generator=torch.Generator().manual_seed(1)
    )
    feats = feats * (torch.arange(240)[None, None, :] < lengths[:, None, None])
    with torch.no_grad():
        ours, ours_len = model.encoder(feats, lengths)
        out = hf.encoder(
            input_features=feats.transpose(1, 2),
            attention_mask=torch.arange(240)[None] < lengths[:, None],
        )
    assert out.attention_mask.sum(-1).tolist() == ours_len.tolist()
    for i, m in enumerate(ours_len.tolist()):
        assert _rel_err(ours[i, :m], out.last_hidden_state[i, :m]) <= 1e-4


def test_subsampled_lengths_follow_nemo() -> None:
    got = subsampled_lengths(torch.tensor([0, 1, 2, 8, 9, 16, 17, 301, 1000]), 3).tolist()
    # NeMo's calc_length, in float math: floor((L + 2·1 − 3) / 2 + 1), three times
    expected = []
    for n in [0, 1, 2, 8, 9, 16, 17, 301, 1000]:
        for _ in range(3):
            n = math.floor((n + 2 - 3) / 2 + 1)
        expected.append(n)
    assert got == expected == [0, 1, 1, 1, 2, 2, 3, 38, 125]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_stays_close(pair, dtype: torch.dtype) -> None:
    model, _ = pair
    feats = torch.randn(
        2, model.dims.encoder.n_mels, 160, generator=torch.Generator().manual_seed(2)
    )
    lengths = torch.tensor([160, 120])
    feats[1, :, 120:] = 0
    with torch.no_grad():
        ref, _ = model.encoder(feats, lengths)
        low = type(model)(model.dims)
        low.load_state_dict(model.state_dict())
        low.eval().to_dtype(dtype)
        out, out_len = low.encoder(feats.to(dtype), lengths)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    m = int(out_len[1])
    # bf16 keeps 8 mantissa bits: a few percent of the largest activation after LayerNorms
    assert _rel_err(out[0].float(), ref[0]) < 0.1
    assert _rel_err(out[1, :m].float(), ref[1, :m]) < 0.1
