"""Each stage's ``consumes`` names every frame kind its code reads: the pipeline stops a kind
after its last declared consumer, so a kind read but not declared would silently stop arriving.
Read from the source: every ``isinstance(frame, Kind)`` in the stage's class and its bases."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap

import pytest

from agent.frames import ANY_FRAME, CONTROL_FRAMES, Frame
from agent.stage import Stage

STAGES = [
    "stages.vad:VADStage",
    "stages.asr.stage:StreamingASR",
    "stages.turn:TurnDetector",
    "stages.llm.stage:LLMStage",
    "stages.tts.stage:TTSStage",
]


def load(path: str) -> type[Stage]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def names(node: ast.expr) -> list[str]:
    """The names in an isinstance class argument: ``A``, ``(A, B)`` or ``A | B``."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in names(elt)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return names(node.left) + names(node.right)
    return []


def kinds_read(cls: type[Stage]) -> set[type[Frame]]:
    read: set[type[Frame]] = set()
    for klass in cls.__mro__:
        if klass in (Stage, object):
            break
        scope = vars(sys.modules[klass.__module__])
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2):
                for name in names(node.args[1]):
                    kind = scope.get(name)
                    if (isinstance(kind, type) and issubclass(kind, Frame)
                            and not issubclass(kind, CONTROL_FRAMES)):
                        read.add(kind)
    return read


def test_the_reader_finds_what_a_stage_reads() -> None:
    cls = load("stages.turn:TurnDetector")
    assert {k.__name__ for k in kinds_read(cls)} >= {"AudioIn", "Transcript", "SpeechPaused"}


@pytest.mark.parametrize("path", STAGES)
def test_a_stage_declares_every_kind_it_reads(path: str) -> None:
    cls = load(path)
    declared = tuple(cls.consumes)
    missing = {k.__name__ for k in kinds_read(cls) if not issubclass(k, declared)}
    assert not missing, f"{path} reads {sorted(missing)} but does not declare them in consumes"


@pytest.mark.parametrize("path", [p for p in STAGES if p != "stages.asr.stage:StreamingASR"])
def test_the_voice_stages_declare_what_they_consume(path: str) -> None:
    assert load(path).consumes != ANY_FRAME
