"""The TensorRT path's CPU-checkable half: the ONNX export of the encoder (dynamic batch and
time) run by onnxruntime equals the torch encoder; profile selection covers every input shape.
Building and running the engine needs TensorRT and a GPU (the GPU benchmark does it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stages.asr.parakeet.tensorrt import default_profiles, export_encoder_onnx, pick_profile  # noqa: E402

from .tiny_models import random_model  # noqa: E402


def test_onnx_export_matches_torch_at_other_shapes() -> None:
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    _, model = random_model("110m", seed=21)
    session = ort.InferenceSession(
        export_encoder_onnx(model.encoder), providers=["CPUExecutionProvider"]
    )
    gen = torch.Generator().manual_seed(0)
    for lengths in ([97, 97, 40], [600], [16, 9]):
        feats = torch.randn(len(lengths), model.dims.encoder.n_mels, max(lengths), generator=gen)
        lens = torch.tensor(lengths, dtype=torch.int32)
        feats = feats * (torch.arange(max(lengths))[None, None] < lens[:, None, None])
        (out,) = session.run(None, {"features": feats.numpy(), "lengths": lens.numpy()})
        with torch.no_grad():
            ref, ref_len = model.encoder(feats, lens.long())
        assert out.shape == tuple(ref.shape)
        for i, n in enumerate(ref_len.tolist()):
            assert abs(out[i, :n] - ref[i, :n].numpy()).max() <= 1e-4 * float(
                ref[i, :n].abs().max()
            )


def test_profiles_cover_chunks_utterances_and_windows() -> None:
    profiles = default_profiles(max_batch=64)
    names = [p.name for p in profiles]
    assert names == ["stream", "utterance", "window"]
    assert pick_profile(profiles, 1, 3) == 0  # shorter than any profile: padded into the first
    assert pick_profile(profiles, 16, 100) == 0
    assert pick_profile(profiles, 64, 400) == 0
    assert pick_profile(profiles, 8, 401) == 1
    assert pick_profile(profiles, 64, 3001) == 2
    for frames in range(1, 3002, 50):  # every length up to 30 s has a profile
        pick_profile(profiles, 64, frames)
    with pytest.raises(ValueError):
        pick_profile(profiles, 65, 100)
    with pytest.raises(ValueError):
        pick_profile(profiles, 1, 3002)
