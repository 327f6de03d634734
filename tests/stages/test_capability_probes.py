"""Capabilities are declared, not probed: the core never asks ``hasattr(x, ...)`` or
``getattr(x, "feature", ...)`` of a backend or stage (STYLE.md). The checker is a plain function
so other parts of the tree can be held to the same rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECKED = (
    "stages/asr/engine.py",
    "stages/asr/backend.py",
    "stages/asr/stage.py",
    "stages/llm/stage.py",
    "agent/presets.py",
)


def capability_probes(source: str, filename: str = "<source>") -> list[str]:
    """Every ``hasattr(...)`` call and every ``getattr(x, "<constant>", ...)`` call in
    ``source``, as ``file:line: code``. A ``getattr`` with a computed name (a registry lookup
    by a configured name) is not a probe and passes."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name = node.func.id
        constant_name = (
            len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        )
        if name == "hasattr" or (name == "getattr" and constant_name):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def probes_in(path: Path) -> list[str]:
    return capability_probes(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))


@pytest.mark.parametrize("relpath", CHECKED)
def test_no_capability_probe_in_the_core(relpath: str) -> None:
    probes = probes_in(ROOT / relpath)
    assert not probes, (
        "capabilities are declared, not probed — put the feature in the backend's protocol "
        "or its capabilities dataclass:\n" + "\n".join(probes)
    )


def test_the_checker_finds_probes_and_passes_lookups_by_name() -> None:
    source = (
        "a = hasattr(backend, 'warmup')\n"
        "b = getattr(backend, 'workers', 1)\n"
        "c = getattr(module, attr)\n"  # a lookup by a computed name
        "d = backend.capabilities.lanes\n"
    )
    assert capability_probes(source, "x.py") == [
        "x.py:1: hasattr(backend, 'warmup')",
        "x.py:2: getattr(backend, 'workers', 1)",
    ]
