"""Session fixtures for the Parakeet tests: the tiny .nemo files, written once."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from .tiny_models import TINY, write_tiny_nemo  # noqa: E402


@pytest.fixture(scope="session")
def nemo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    root = tmp_path_factory.mktemp("nemo")
    return {
        kind: write_tiny_nemo(root / f"tiny-{kind}.nemo", kind, seed=i)
        for i, kind in enumerate(TINY)
    }
