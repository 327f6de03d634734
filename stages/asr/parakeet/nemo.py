"""Reading and writing NeMo ``.nemo`` checkpoints, and finding them on disk.

A ``.nemo`` file is a tar (plain, or gzip for old ones) holding ``model_config.yaml``,
``model_weights.ckpt`` (a torch-saved flat state dict, read here with ``weights_only=True``) and
artifacts such as the SentencePiece tokenizer, named ``<uuid>_tokenizer.model`` and referenced from
the config as ``nemo:<uuid>_tokenizer.model``. Nothing is extracted to disk; members that could
escape a directory (absolute paths, ``..``, links, devices) are refused all the same.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ModelNotFoundError
from agent.models_dir import DEFAULT_MODELS_DIR, MODELS_ENV, models_dirs
from stages.asr.parakeet.dims import CheckpointError

CONFIG_NAME = "model_config.yaml"
WEIGHTS_NAME = "model_weights.ckpt"


@dataclass(slots=True, frozen=True)
class NemoArchive:
    """The parts of a .nemo file voxline uses, all in memory."""

    path: Path
    config: dict[str, Any]
    state_dict: dict[str, Any]  # str -> torch.Tensor
    artifacts: dict[str, bytes] = field(default_factory=dict)  # basename -> bytes (not the weights)

    def tokenizer_model(self) -> bytes | None:
        """The SentencePiece model the config points at, else any ``*tokenizer.model`` member."""
        ref = str((self.config.get("tokenizer") or {}).get("model_path") or "")
        name = ref.removeprefix("nemo:").rsplit("/", 1)[-1]
        if name and name in self.artifacts:
            return self.artifacts[name]
        for member, data in self.artifacts.items():
            if member.endswith("tokenizer.model"):
                return data
        return None


def _check_member(member: tarfile.TarInfo, path: Path) -> str:
    """The member's name without a leading ``./``, or an error if it could escape a directory."""
    name = member.name
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        raise CheckpointError(f"{path}: refusing unsafe member {name!r} (absolute path or '..')")
    if member.issym() or member.islnk():
        raise CheckpointError(f"{path}: refusing link member {name!r} -> {member.linkname!r}")
    if not (member.isfile() or member.isdir()):
        raise CheckpointError(f"{path}: refusing special member {name!r} (device, fifo)")
    return name[2:] if name.startswith("./") else name


def read_nemo(path: str | os.PathLike[str]) -> NemoArchive:
    """Open a .nemo file and load its config, weights and artifacts (weights on the CPU)."""
    import torch
    import yaml

    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelNotFoundError(
            f"Parakeet model file not found: {p} — pass --asr-model PATH.nemo "
            f"(or put .nemo files in ${MODELS_ENV} or {DEFAULT_MODELS_DIR})"
        )
    try:
        tar = tarfile.open(p, "r:*")  # noqa: SIM115 - closed by the `with` below; plain or gzip
    except (tarfile.TarError, OSError) as exc:
        raise CheckpointError(f"{p} is not a .nemo file (not a tar archive): {exc}") from None
    files: dict[str, bytes] = {}
    with tar:
        for member in tar.getmembers():
            name = _check_member(member, p)
            if not member.isfile():
                continue
            base = name.rsplit("/", 1)[-1]
            if base in files:
                raise CheckpointError(
                    f"{p}: more than one {base!r} (a model-parallel checkpoint?) — not supported"
                )
            handle = tar.extractfile(member)
            if handle is None:
                raise CheckpointError(f"{p}: cannot read member {name!r}")
            files[base] = handle.read()

    for needed in (CONFIG_NAME, WEIGHTS_NAME):
        if needed not in files:
            raise CheckpointError(f"{p}: no {needed} inside — is this a NeMo .nemo checkpoint?")
    try:
        config = yaml.safe_load(files.pop(CONFIG_NAME).decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{p}: {CONFIG_NAME} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{p}: {CONFIG_NAME} is not a mapping")
    if isinstance(config.get("model"), dict) and "encoder" not in config:
        config = config["model"]  # some exports wrap the model config one level down
    _reject_interpolations(config, p)
    try:
        state = torch.load(
            io.BytesIO(files.pop(WEIGHTS_NAME)), map_location="cpu", weights_only=True
        )
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds here; all mean "bad weights"
        raise CheckpointError(
            f"{p}: {WEIGHTS_NAME} cannot be loaded as plain tensors: {exc}"
        ) from None
    if (
        isinstance(state, Mapping)
        and "state_dict" in state
        and isinstance(state["state_dict"], Mapping)
    ):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{p}: {WEIGHTS_NAME} does not hold a state dict")
    return NemoArchive(path=p, config=config, state_dict=dict(state), artifacts=files)


def _reject_interpolations(node: Any, path: Path, where: str = "") -> None:
    """Saved configs are resolved; a leftover ``${...}`` would silently mean a wrong value."""
    if isinstance(node, str) and "${" in node:
        raise CheckpointError(f"{path}: unresolved interpolation at {where or 'top'}: {node!r}")
    if isinstance(node, Mapping):
        for k, v in node.items():
            _reject_interpolations(v, path, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _reject_interpolations(v, path, f"{where}[{i}]")


def write_nemo(
    path: str | os.PathLike[str],
    config: Mapping[str, Any],
    state_dict: Mapping[str, Any],
    artifacts: Mapping[str, bytes] | None = None,
    *,
    compress: bool = False,
) -> Path:
    """Write a .nemo file with NeMo's layout (``./model_config.yaml``, ``./model_weights.ckpt``,
    ``./<artifact>``). ``compress`` writes the gzip variant older NeMo versions produced."""
    import torch
    import yaml

    p = Path(path)
    members: dict[str, bytes] = {
        CONFIG_NAME: yaml.safe_dump(dict(config), sort_keys=False).encode()
    }
    buf = io.BytesIO()
    torch.save(dict(state_dict), buf)
    members[WEIGHTS_NAME] = buf.getvalue()
    members.update(artifacts or {})
    with tarfile.open(p, "w:gz" if compress else "w:") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return p


def model_search_dirs() -> list[Path]:
    """Where ``.nemo`` files are looked for: each entry of $VOXLINE_MODELS (os.pathsep-separated),
    then ~/.cache/voxline/models."""
    return models_dirs()


def list_models() -> list[dict[str, Any]]:
    """Every ``.nemo`` file in the search directories, as plain dicts for ``voxline models``:
    ``{"name", "path", "size_bytes", "dir", "backend": "parakeet"}``; a name found twice keeps
    its first (highest-priority) location."""
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    for d in model_search_dirs():
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.nemo")):
            if f.stem in seen or not f.is_file():
                continue
            seen.add(f.stem)
            found.append(
                {
                    "name": f.stem,
                    "path": str(f),
                    "size_bytes": f.stat().st_size,
                    "dir": str(d),
                    "backend": "parakeet",
                }
            )
    return found


def resolve_model(name_or_path: str) -> Path:
    """A path to an existing file, or a model name found in the search directories."""
    if not name_or_path:
        raise ModelNotFoundError(
            "the Parakeet backend needs a model — pass --asr-model PATH.nemo "
            f"(searched: {', '.join(str(d) for d in model_search_dirs())})"
        )
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    stem = p.name.removesuffix(".nemo")
    for d in model_search_dirs():
        candidate = d / f"{stem}.nemo"
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"Parakeet model not found: {name_or_path} — pass --asr-model PATH.nemo, or put "
        f"{stem}.nemo in one of: {', '.join(str(d) for d in model_search_dirs())}"
    )
