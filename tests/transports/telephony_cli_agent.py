"""``voxline sip`` / ``voxline twilio`` as the CLI runs them (``agent.cli.main``), with a small
agent in place of the model stack so a subprocess starts in a second on two cores: it speaks
back what it hears, and its stop takes ``SLOW_STOP_S`` (as a stage flushing a recording would),
so a test can reach the server while it is shutting down.

Usage: ``python telephony_cli_agent.py sip --port 5070 --json`` (any ``voxline`` arguments).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from types import SimpleNamespace

from agent import cli, presets  # noqa: E402
from agent.commands import telephony  # noqa: E402
from agent.frames import AudioIn, Direction, TTSAudio  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.stage import Stage  # noqa: E402
from stages.asr.slots import SlotPool

SLOW_STOP_S = 1.0


class SpeakBackSlowStop(Stage):
    name = "speak_back"

    def process(self, frame: Any, direction: Direction) -> None:
        if isinstance(frame, AudioIn):
            self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
        else:
            self.push(frame, direction)

    async def stop(self) -> None:
        await asyncio.sleep(SLOW_STOP_S)


# no models to load; a real slot pool stands for the ASR engine's in the stats line (and its
# readiness check), with no engine samples for /metrics
telephony._load = lambda cfg: SimpleNamespace(
    asr=SimpleNamespace(pool=SlotPool(4, 1.0), metric_samples=lambda: []))
# the real per-call set-up (session_factory, agent.presets.new_session: the printer, the trace,
# --record) around this agent's pipeline
presets.build_pipeline = lambda cfg, models: Pipeline([SpeakBackSlowStop()])
presets.new_echo_guard = lambda cfg, telephony: None

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
