"""The core declares what stages and backends can do; it never probes for it. Walks every module
of ``agent/`` for ``hasattr(...)`` and ``getattr(x, "name", ...)`` with a constant name."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"


def probes(path: Path) -> list[str]:
    """``file:line: call`` for each probe in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        named = (
            node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        )
        if node.func.id == "hasattr" or named:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_walk_finds_probes(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    text = 'a = hasattr(x, "warmup")\nb = getattr(s, "busy", False)\nc = getattr(m, name)\n'
    sample.write_text(text, encoding="utf-8")
    assert probes(sample) == [
        "sample.py:1: hasattr(x, 'warmup')",
        "sample.py:2: getattr(s, 'busy', False)",
    ]


def test_no_capability_probe_in_the_core() -> None:
    files = sorted(AGENT.rglob("*.py"))
    assert len(files) > 10 and AGENT / "presets.py" in files
    found = [f"{f.parent.relative_to(AGENT.parent)}/{p}" for f in files for p in probes(f)]
    assert found == [], "declare the capability instead of probing for it:\n" + "\n".join(found)
