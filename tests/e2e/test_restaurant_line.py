"""The restaurant line of examples/telephony_bot.py, its tools driven by a scripted model: the
party size typed on the keypad, the free times looked up, a booking made and its confirmation
spoken exactly, a transfer to the front desk after the agent's words played, and the call hung
up. (Which tool to call when is the model's part; here the script decides.)"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from agent.config import AgentConfig, LLMConfig
from agent.frames import Dtmf, Frame, HangUp, LLMEnd, TextToSpeak, UserTurnEnded
from agent.pipeline import Pipeline
from agent.session import Session
from agent.tools import ToolCall
from stages.llm.chat import LLMCapabilities
from stages.llm.stage import LLMStage

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "telephony_bot.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("telephony_bot_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Script:
    """Each request gets the next step; the requests are kept."""

    capabilities = LLMCapabilities(tools=True)

    def __init__(self, *steps: list[Any]) -> None:
        self.steps = list(steps)
        self.requests: list[list[dict[str, Any]]] = []

    async def stream(self, messages, tools=None, tool_choice=None):  # noqa: ANN001, ANN201
        self.requests.append(messages)
        for item in self.steps.pop(0):
            yield item

    def prefill(self, messages):  # noqa: ANN001, ANN201
        raise AssertionError

    def warmup(self) -> None:
        pass


def calls(tool_name: str, **args: Any) -> list[ToolCall]:
    return [ToolCall(f"call-{tool_name}", tool_name, json.dumps(args))]


class FrontDesk:
    transport = "test"

    def __init__(self, session: Session) -> None:
        self.session = session
        self.targets: list[str] = []

    async def transfer(self, target: str) -> str:
        assert self.session.playout.idle  # the caller heard "I'll put you through" first
        self.targets.append(target)
        return f"transferred to {target}"

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None:
        raise AssertionError


def test_a_booking_by_keypad_then_a_transfer() -> None:
    example = load_example()
    tables = example.Tables()
    tools = example.restaurant_tools(tables, "sip:frontdesk@127.0.0.1")
    llm = Script(
        [calls("ask_party_size")],
        [calls("free_tables", party_size=4)],
        ["We have 18:00, 20:00 or 21:00. Which would you like?"],
        [calls("book_table", name="Ana", party_size=4, time="20:00")],
        ["I'll put you through now.", calls("transfer_to_human")],
    )
    agent = AgentConfig(first_audio_wait_ms=0, preempt=False, prefill=False, filler="")
    stage = LLMStage(llm, LLMConfig(), agent, tools=tools)
    session = Session(Pipeline([stage]))
    desk = FrontDesk(session)
    session.control = desk
    out: list[Frame] = []
    session.listen(out.append, frozenset({TextToSpeak, LLMEnd, HangUp}))
    # a TTS's part: each text becomes 0.2 s of audio in the playout; the test is the transport
    session.listen(lambda f: isinstance(f, TextToSpeak) and session.playout.write(
        np.ones(3200, np.int16), last=True), frozenset({TextToSpeak}))

    async def until(ok) -> None:  # noqa: ANN001
        for _ in range(1000):
            if ok():
                return
            while session.playout.pull() is not None:
                pass
            await asyncio.sleep(0.005)
        raise AssertionError("timed out")

    async def main() -> None:
        await session.start()
        try:
            session.push(UserTurnEnded("I'd like a table tonight."))
            await until(lambda: any("keypad" in getattr(f, "text", "") for f in out))
            for key in "4#":
                session.push(Dtmf(key))
            await until(lambda: sum(isinstance(f, LLMEnd) for f in out) == 1)
            session.push(UserTurnEnded("Eight o'clock, under Ana."))
            await until(lambda: sum(isinstance(f, LLMEnd) for f in out) == 2)
            session.push(UserTurnEnded("Can I talk to someone about allergies?"))
            await until(lambda: any(isinstance(f, HangUp) for f in out))
        finally:
            await session.close()

    asyncio.run(main())
    said = [f.text for f in out if isinstance(f, TextToSpeak)]
    assert said[0] == "Please type the number of guests on your keypad, then press the hash key."
    tool_results = [m for m in llm.requests[1] if m["role"] == "tool"]
    assert tool_results[-1]["content"] == "4 guests"
    assert [m for m in llm.requests[2] if m["role"] == "tool"][-1]["content"] == (
        "free at 18:00, 20:00, 21:00")
    assert "Booked: a table for 4 at 20:00, under Ana. Your code is L100." in said
    assert tables.bookings == [("L100", "20:00", 4, 4)] and tables.free["20:00"] == [6]
    assert desk.targets == ["sip:frontdesk@127.0.0.1"]
    hang = next(f for f in out if isinstance(f, HangUp))
    assert hang.reason == "transferred"
    assert " ".join(said).endswith("I'll put you through now.")
