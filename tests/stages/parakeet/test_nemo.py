"""The .nemo loader: round trips of generated v3/v2/110m-shaped files, and clear errors for
missing keys, wrong shapes, unsafe members and files that are not .nemo at all."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agent.errors import ModelNotFoundError  # noqa: E402
from stages.asr.parakeet.dims import CheckpointError, dims_from_config  # noqa: E402
from stages.asr.parakeet.nemo import list_models, read_nemo, resolve_model, write_nemo  # noqa: E402
from stages.asr.parakeet.weights import build_model  # noqa: E402

from .tiny_models import TOKENIZER_NAME, nemo_state, random_model, train_tokenizer  # noqa: E402


@pytest.mark.parametrize("kind", ["v3", "v2", "110m"])
def test_round_trip(nemo_files, kind: str) -> None:
    path, model = nemo_files[kind]
    archive = read_nemo(path)
    dims = dims_from_config(archive.config)
    assert dims == model.dims
    loaded = build_model(dims, archive.state_dict)
    ours, theirs = loaded.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert archive.tokenizer_model() is not None
    with tarfile.open(path) as tar:  # NeMo's layout: ./ prefixed members, an uncompressed tar
        names = tar.getnames()
    assert "./model_config.yaml" in names and "./model_weights.ckpt" in names


def test_published_shapes_are_read_from_the_config(nemo_files) -> None:
    v3 = dims_from_config(read_nemo(nemo_files["v3"][0]).config)
    small = dims_from_config(read_nemo(nemo_files["110m"][0]).config)
    assert (v3.encoder.use_bias, v3.decoder.pred_layers, v3.front_end.n_mels) == (False, 2, 128)
    assert (small.encoder.use_bias, small.decoder.pred_layers, small.front_end.n_mels) == (
        True,
        1,
        80,
    )
    assert not v3.encoder.xscaling and v3.decoder.durations == (0, 1, 2, 3, 4)


def _write(tmp_path: Path, name: str, mutate=None, **kwargs) -> Path:
    cfg, model = random_model("v2", seed=3)
    state = nemo_state(model, cfg)
    if mutate:
        mutate(state)
    return write_nemo(
        tmp_path / name,
        cfg,
        state,
        {TOKENIZER_NAME: train_tokenizer(cfg["decoder"]["vocab_size"])},
        **kwargs,
    )


def test_gzip_tar_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, "old.nemo", compress=True)
    with open(path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    archive = read_nemo(path)
    build_model(dims_from_config(archive.config), archive.state_dict)


def test_missing_key_is_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "missing.nemo", lambda s: s.pop("encoder.layers.1.self_attn.linear_q.weight")
    )
    archive = read_nemo(path)
    with pytest.raises(
        CheckpointError, match=r"missing key encoder\.layers\.1\.self_attn\.linear_q\.weight"
    ):
        build_model(dims_from_config(archive.config), archive.state_dict)


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    def widen(state):
        state["joint.enc.weight"] = torch.zeros(7, 3)

    archive = read_nemo(_write(tmp_path, "shape.nemo", widen))
    with pytest.raises(CheckpointError, match=r"joint\.enc\.weight: shape \(7, 3\)"):
        build_model(dims_from_config(archive.config), archive.state_dict)


def test_bias_mismatch_between_config_and_weights(tmp_path: Path) -> None:
    def add_bias(state):
        state["encoder.layers.0.self_attn.linear_q.bias"] = torch.zeros(
            state["encoder.layers.0.self_attn.linear_q.weight"].shape[0]
        )

    archive = read_nemo(_write(tmp_path, "bias.nemo", add_bias))
    with pytest.raises(
        CheckpointError, match="unexpected key encoder.layers.0.self_attn.linear_q.bias"
    ):
        build_model(dims_from_config(archive.config), archive.state_dict)


def _tar_with(tmp_path: Path, name: str, add) -> Path:
    path = tmp_path / name
    with tarfile.open(path, "w") as tar:
        for member_name in ("./model_config.yaml", "./model_weights.ckpt"):
            info = tarfile.TarInfo(member_name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
        add(tar)
    return path


@pytest.mark.parametrize("evil", ["../../etc/evil", "/abs/evil", "./sub/../../evil"])
def test_path_traversal_member_is_refused(tmp_path: Path, evil: str) -> None:
    def add(tar):
        info = tarfile.TarInfo(evil)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))

    with pytest.raises(CheckpointError, match="unsafe member"):
        read_nemo(_tar_with(tmp_path, "evil.nemo", add))


def test_link_member_is_refused(tmp_path: Path) -> None:
    def add(tar):
        info = tarfile.TarInfo("./tokenizer.model")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)

    with pytest.raises(CheckpointError, match="link member"):
        read_nemo(_tar_with(tmp_path, "link.nemo", add))


def test_not_a_tar(tmp_path: Path) -> None:
    path = tmp_path / "notes.nemo"
    path.write_bytes(b"this is not a tar archive at all" * 40)
    with pytest.raises(CheckpointError, match="not a tar archive"):
        read_nemo(path)


def test_tar_without_weights(tmp_path: Path) -> None:
    path = tmp_path / "empty.nemo"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("./model_config.yaml")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(CheckpointError, match="no model_weights.ckpt"):
        read_nemo(path)


def test_pickled_objects_are_not_loaded(tmp_path: Path) -> None:
    """weights_only=True: a checkpoint that needs arbitrary unpickling is rejected."""
    cfg, model = random_model("v2", seed=3)
    state = nemo_state(model, cfg)
    state["evil"] = Path("/tmp")  # not a tensor, not a safe type
    path = write_nemo(tmp_path / "pickle.nemo", cfg, state)
    with pytest.raises(CheckpointError, match="cannot be loaded as plain tensors"):
        read_nemo(path)


def test_unresolved_interpolation_is_refused(tmp_path: Path) -> None:
    cfg, model = random_model("v2", seed=3)
    cfg["encoder"]["feat_in"] = "${model.preprocessor.features}"
    path = write_nemo(tmp_path / "interp.nemo", cfg, nemo_state(model, cfg))
    with pytest.raises(CheckpointError, match="unresolved interpolation at encoder.feat_in"):
        read_nemo(path)


def test_missing_file_says_how_to_pass_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="--asr-model PATH.nemo"):
        read_nemo(tmp_path / "nope.nemo")
    with pytest.raises(ModelNotFoundError, match="--asr-model PATH.nemo"):
        resolve_model("parakeet-tdt-0.6b-v3")
    with pytest.raises(ModelNotFoundError, match="--asr-model PATH.nemo"):
        resolve_model("")


def test_list_models_and_resolve_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nemo_files
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "tiny.nemo").write_bytes(nemo_files["v2"][0].read_bytes())
    (second / "tiny.nemo").write_bytes(b"shadowed")
    (second / "other.nemo").write_bytes(b"x")
    (second / "readme.txt").write_text("not a model")
    monkeypatch.setenv("VOXLINE_MODELS", f"{first}:{second}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    found = list_models()
    assert [(m["name"], Path(m["dir"])) for m in found] == [("tiny", first), ("other", second)]
    assert found[0]["size_bytes"] == nemo_files["v2"][0].stat().st_size
    assert resolve_model("tiny") == first / "tiny.nemo"
    assert resolve_model("tiny.nemo") == first / "tiny.nemo"


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("encoder", "self_attention_model", "rel_pos_local_attn", "only 'rel_pos'"),
        ("encoder", "subsampling", "striding", "only 'dw_striding'"),
        ("encoder", "causal_downsampling", True, "cache-aware"),
        ("preprocessor", "normalize", "all_features", "normalize"),
        ("preprocessor", "exact_pad", True, "exact_pad"),
    ],
)
def test_unsupported_shapes_are_refused_by_name(
    section: str, key: str, value, message: str
) -> None:
    cfg, _ = random_model("v2", seed=3)
    cfg[section][key] = value
    with pytest.raises(CheckpointError, match=message):
        dims_from_config(cfg)


def test_no_durations_means_not_a_tdt_model() -> None:
    cfg, _ = random_model("v2", seed=3)
    del cfg["decoding"]["durations"]
    with pytest.raises(CheckpointError, match="TDT"):
        dims_from_config(cfg)
