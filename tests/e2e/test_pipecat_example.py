"""``examples/pipecat_bot.py`` as a user runs it: a real pipecat pipeline with voxline's STT,
transcripts only with the engine in the process, and then streaming to a real ``voxline
asr-serve`` with replies from a real ``llama_cpp.server`` serving the embedded SmolLM2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import speech
from asr_serve import Served
from llama_server import llama_server

from stages.asr.wer import corpus_wer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipecat_bot.py"
REF = speech.text("kittens")  # examples/audio/caller.wav is a bit-exact copy of that clip
MAX_WER = 0.15


def run_example(*args: str) -> tuple[dict[str, list[str]], str]:
    """Run the example; its printed lines by speaker (interim, final, agent), and its stderr."""
    out = subprocess.run([sys.executable, str(EXAMPLE), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    lines: dict[str, list[str]] = {"interim": [], "final": [], "agent": []}
    for line in out.stdout.splitlines():
        parts = line.split(None, 3)  # "  1.05 s  interim  the two."
        if len(parts) == 4 and parts[1] == "s" and parts[2] in lines:
            lines[parts[2]].append(parts[3])
    return lines, out.stderr


def test_the_pipecat_example_prints_partials_then_the_final():
    lines, _ = run_example()
    assert lines["interim"], "no partials while the caller spoke"
    assert len(lines["final"]) == 1, lines
    assert corpus_wer([(REF, lines["final"][0])]) <= MAX_WER, lines["final"]
    assert not lines["agent"]  # no LLM given: transcripts only


def test_the_pipecat_example_over_asr_serve_answers_with_the_llm(tmp_path):
    served = Served(tmp_path, "--asr-slots", "1")
    try:
        with llama_server(tmp_path) as url:
            lines, err = run_example("--socket", served.path, "--llm-url", url)
    finally:
        assert served.stop() == 0
    assert len(lines["final"]) == 1, lines
    assert corpus_wer([(REF, lines["final"][0])]) <= MAX_WER, lines["final"]
    assert len(lines["agent"]) == 1 and lines["agent"][0].strip(), (lines, err[-2000:])
    assert not lines["agent"][0].startswith("(interrupted"), lines["agent"]
    assert "no reply within" not in err
