"""The prediction network and joint against transformers' ParakeetForTDT with the same weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from .tiny_models import hf_reference, random_model  # noqa: E402


@pytest.mark.parametrize("kind", ["v3", "110m"])
def test_prediction_network_and_joint_match_transformers(kind: str) -> None:
    _, model = random_model(kind, seed=5)
    hf = hf_reference(model)
    d = model.dims.decoder
    labels = torch.tensor([[d.blank_id, 3, 7, 1], [5, 5, 0, d.blank_id]])
    with torch.no_grad():
        state = model.decoder.initial_state(2, torch.device("cpu"), torch.float32)
        ours = []
        for step in range(labels.shape[1]):
            g, state = model.decoder.step(labels[:, step], state)
            ours.append(model.joint.project_prediction(g))
        ours_g = torch.stack(ours, 1)
        ref_g = hf.decoder(labels)  # embedding + LSTM + decoder_projector (= NeMo joint.pred)
        assert (ours_g - ref_g).abs().max().item() <= 1e-6

        enc = torch.randn(
            2, 5, model.dims.encoder.d_model, generator=torch.Generator().manual_seed(0)
        )
        f = model.joint.project_encoder(enc)
        assert (f - hf.encoder_projector(enc)).abs().max().item() <= 1e-6
        ours_logits = model.joint.logits(f[:, :, None, :], ours_g[:, None, :, :])
        ref_logits = hf.joint(
            decoder_hidden_states=ref_g[:, None],
            encoder_hidden_states=hf.encoder_projector(enc)[:, :, None],
        )
        assert ours_logits.shape == (2, 5, 4, d.joint_outputs)
        assert (ours_logits - ref_logits).abs().max().item() <= 1e-5


def test_blank_is_the_start_symbol() -> None:
    """Feeding blank from a zero state is the start of sequence: its embedding row is zero."""
    _, model = random_model("v2", seed=1)
    blank = model.dims.decoder.blank_id
    assert model.decoder.embed.weight[blank].abs().max().item() == 0.0
