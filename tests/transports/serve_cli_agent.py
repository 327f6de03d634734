"""``voxline serve`` as the CLI runs it (``agent.cli.main``), with a small agent in place of the
model stack so a subprocess starts in a second on two cores: it speaks back what it hears.

Usage: ``python serve_cli_agent.py serve --port 8089`` (any ``voxline serve`` arguments).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from speak_back import SpeakBack  # noqa: E402

from agent import cli, presets  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from stages.asr.slots import SlotPool  # noqa: E402


def load_models(cfg: Any, *args: Any, **kw: Any) -> Any:
    # a real slot pool stands for the ASR engine's in /healthz and /readyz; no engine samples
    return SimpleNamespace(asr=SimpleNamespace(pool=SlotPool(4, 1.0), metric_samples=lambda: []))


presets.load_models = load_models
# the real per-call set-up (agent.presets.new_session: the trace, --record), this agent's pipeline
presets.build_pipeline = lambda cfg, models: Pipeline([SpeakBack()])
presets.new_echo_guard = lambda cfg, telephony: None

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
