"""Where voxline keeps the model files it derives on this machine (ONNX exports, re-encoded
weights) and looks for ones the user put there: each entry of ``$VOXLINE_MODELS``
(``os.pathsep``-separated), then ``~/.cache/voxline/models``. Nothing is ever downloaded
into them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MODELS_ENV = "VOXLINE_MODELS"
DEFAULT_MODELS_DIR = Path("~/.cache/voxline/models")


def models_dirs() -> list[Path]:
    """The models directories in search order; a derived file is written to the first."""
    dirs = [Path(d).expanduser() for d in os.environ.get(MODELS_ENV, "").split(os.pathsep) if d]
    return [*dirs, DEFAULT_MODELS_DIR.expanduser()]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
