"""The layering of DESIGN.md, checked on the source: every import in ``agent/``, ``stages/`` and
``transports/`` (at the top of a module, inside a function, or for type checkers only) read
with ``ast`` and resolved to the module of the tree it names.

Rules: no stage imports a transport and no transport a stage (each may import ``agent/``); the
core (``agent/`` less the composition root: the CLI, its commands and the presets) imports no
stage or transport, and at import time nothing but the standard library, numpy and itself; and
no import cycle anywhere — a lazy or type-only import counts, since it is the same dependency.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "stages", "transports")
# the composition root: the only part of agent/ that chooses concrete stages and transports
COMPOSITION_ROOT = ("agent.cli", "agent.presets", "agent.commands")
CORE_MAY_IMPORT = ("numpy",)  # at import time, besides the standard library and agent itself

TOP, LAZY, TYPING = "top", "lazy", "typing"  # when an import runs: at import, in a call, never


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # the importing module
    target: str  # the module it names: one of the tree's, or a top-level outside package
    when: str  # TOP, LAZY or TYPING
    line: int

    @property
    def internal(self) -> bool:
        return _top(self.target) in PACKAGES

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({_path(self.source)}:{self.line}, {self.when})"


def _top(module: str) -> str:
    return module.partition(".")[0]


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@cache
def modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _path(module: str) -> str:
    return str(modules()[module].relative_to(ROOT))


def _resolve(name: str) -> str:
    """The module of the tree that ``name`` (a module or a name inside one) is, or its outside
    top-level package."""
    if _top(name) not in PACKAGES:
        return _top(name)
    while name not in modules() and "." in name:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.found: list[Import] = []
        self.when = TOP

    def _add(self, name: str, line: int) -> None:
        self.found.append(Import(self.module, _resolve(name), self.when, line))

    def _inside(self, when: str, nodes: list[ast.stmt]) -> None:
        outer, self.when = self.when, (when if self.when == TOP else self.when)
        for node in nodes:
            self.visit(node)
        self.when = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._inside(LAZY, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._inside(TYPING, node.body)
            self._inside(TOP, node.orelse)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:  # relative: from the package this module is in (or is)
            package = self.module.split(".")
            if not self.is_package:
                package = package[:-1]
            base = ".".join(package[: len(package) - node.level + 1])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        for alias in node.names:
            # ``from pkg import mod`` names the module pkg.mod; ``from mod import name``, mod
            full = f"{base}.{alias.name}"
            self._add(full if full in modules() else base, node.lineno)


@cache
def imports() -> tuple[Import, ...]:
    found: list[Import] = []
    for module, path in modules().items():
        finder = _Finder(module, path.name == "__init__.py")
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found += [i for i in finder.found if i.target != module]
    return tuple(found)


def cycles() -> list[list[Import]]:
    """One cycle (its imports in order) per strongly connected group of modules (Tarjan)."""
    edges: dict[str, dict[str, Import]] = {m: {} for m in modules()}
    for i in imports():
        if i.internal:
            edges[i.source].setdefault(i.target, i)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # recursion depth: the longest import chain, a few dozen
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while (w := stack.pop()) != v:
                group.add(w)
            if group:
                groups.append(group | {v})

    for v in sorted(edges):
        if v not in index:
            connect(v)
    found = []
    for group in groups:
        start = min(group)
        # the shortest way back to ``start`` within the group (breadth first)
        came: dict[str, Import] = {}  # how each module was first reached
        frontier = [start]
        while start not in came:
            reached = []
            for v in frontier:
                for w, i in sorted(edges[v].items()):
                    if w in group and w not in came:
                        came[w] = i
                        reached.append(w)
            frontier = reached
        path, at = [], start
        while True:
            path.append(came[at])
            at = came[at].source
            if at == start:
                break
        found.append(path[::-1])
    return found


def _report(what: str, bad: list[Import] | list[str]) -> str:
    return f"{what}:\n  " + "\n  ".join(str(b) for b in bad)


def test_the_tree_is_found_and_read():
    names = modules()
    assert {"agent.audio", "agent.cli", "stages.asr.engine", "transports.file"} <= names.keys()
    assert any(i.source == "agent.commands.transcribe" and i.when == LAZY for i in imports())  # in functions too
    assert all(i.target in names for i in imports() if i.internal)


def test_every_kind_of_import_is_resolved():
    source = """
from __future__ import annotations
import numpy as np
from typing import TYPE_CHECKING
from . import engine
from .long_audio import transcribe_long
from .. import vad
import agent.audio
if TYPE_CHECKING:
    from stages.asr.server import ASRServer
else:
    from agent.errors import require
class Later:
    def run(self):
        from transports.file import FileTransport
"""
    finder = _Finder("stages.asr.openai_api", is_package=False)
    finder.visit(ast.parse(source))
    assert [(i.target, i.when) for i in finder.found] == [
        ("__future__", TOP), ("numpy", TOP), ("typing", TOP), ("stages.asr.engine", TOP),
        ("stages.asr.long_audio", TOP), ("stages.vad", TOP), ("agent.audio", TOP),
        ("stages.asr.server", TYPING), ("agent.errors", TOP), ("transports.file", LAZY)]


def test_no_stage_imports_a_transport():
    bad = [i for i in imports() if _in(i.source, ("stages",)) and _in(i.target, ("transports",))]
    assert not bad, _report("a stage imports a transport (audio code belongs in agent/audio.py)", bad)


def test_no_transport_imports_a_stage():
    bad = [i for i in imports() if _in(i.source, ("transports",)) and _in(i.target, ("stages",))]
    assert not bad, _report("a transport imports a stage (only the composition root joins them)", bad)


def test_the_core_imports_no_stage_or_transport():
    """Only the composition root names stages and transports, and it does so lazily (by import
    path, when a command runs), so ``voxline --help`` imports no model runtime."""
    core = [i for i in imports() if _in(i.source, ("agent",)) and not _in(i.source, COMPOSITION_ROOT)]
    bad = [i for i in core if _in(i.target, ("stages", "transports"))]
    assert not bad, _report("the core imports a stage or a transport", bad)
    eager = [i for i in imports() if _in(i.source, COMPOSITION_ROOT) and i.when == TOP
             and _in(i.target, ("stages", "transports"))]
    assert not eager, _report("the composition root imports a stage or transport at import time", eager)


def test_the_core_needs_only_the_standard_library_and_numpy_at_import_time():
    allowed = set(sys.stdlib_module_names) | set(CORE_MAY_IMPORT) | {"agent", "__future__"}
    bad = [i for i in imports() if _in(i.source, ("agent",)) and i.when == TOP
           and _top(i.target) not in allowed]
    assert not bad, _report("the core imports an optional package at import time (import it where "
                            "it is used, through agent.errors.require)", bad)


def test_no_import_cycle():
    found = cycles()
    assert not found, "import cycles (each import that closes one is listed, the last closes it):\n" + "\n".join(
        "  " + " -> ".join([c[0].source, *(i.target for i in c)]) + "\n    "
        + "\n    ".join(str(i) for i in c) for c in found)
