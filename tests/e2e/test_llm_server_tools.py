"""A forced tool call end to end: a real ``python -m llama_cpp.server`` on loopback serving the
embedded SmolLM2 with ``--chat_format chatml-function-calling``, our OpenAI client streaming the
call, and the tool runner accepting its arguments.

llama-cpp-python 0.3.36's chatml-function-calling streams a call only when ``tool_choice``
names the tool: with ``"auto"`` it ends a stream with nothing when the model picks a function,
``"required"`` is an HTTP 500, and the tool result of a follow-up request never reaches the
model (its template has no ``tool`` role). So this forces the call by name, the one path
that server supports, and checks the call rather than the model's reply to its result.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from booking_tools import TOOLS, announced
from llama_server import llama_server

from agent.config import LLMConfig
from agent.tools import ToolCall, ToolContext, run_tool
from stages.llm.openai import OpenAILLM

MESSAGES = [
    {"role": "system", "content": "You book tables at a restaurant."},
    {"role": "user", "content": "Book a table for 4 people at 7pm under the name Ana."},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port; yields its /v1 base URL."""
    with llama_server(tmp_path_factory.mktemp("llama_server_tools"), "--chat_format", "chatml-function-calling") as base:
        yield base


def test_a_forced_tool_call_streams_one_call_with_valid_arguments(server: str) -> None:
    async def main() -> tuple[list[object], float]:
        llm = OpenAILLM(LLMConfig(backend="openai", base_url=server, max_tokens=64,
                                  temperature=0.0, timeout_s=60))
        choice = {"type": "function", "function": {"name": "book_table"}}
        start = time.perf_counter()
        try:
            out = announced(
                [t async for t in llm.stream(MESSAGES, tools=TOOLS.specs(), tool_choice=choice)])
        finally:
            await llm.aclose()
        return out, time.perf_counter() - start

    out, seconds = asyncio.run(main())
    calls = [item for item in out if isinstance(item, list)]
    assert len(calls) == 1 and len(calls[0]) == 1, out
    call = calls[0][0]
    assert isinstance(call, ToolCall) and call.name == "book_table" and call.id
    assert not [t for t in out if isinstance(t, str) and t.strip()]  # a call, no text
    args = json.loads(call.arguments)  # the server's grammar keeps it to the schema
    assert set(args) == {"name", "party_size", "time"}
    assert isinstance(args["name"], str) and isinstance(args["party_size"], int)
    result = asyncio.run(run_tool(TOOLS, call, ToolContext(), 5))
    assert result.outcome == "ok" and result.content.startswith("booked a table for ")
    print(f"forced tool call via llama_cpp.server: {seconds * 1000:.0f} ms, {call.arguments}")
