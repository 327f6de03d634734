"""A booking over the phone, end to end: a caller (the embedded Piper voice, recorded as a
call) asks for a table; the whole embedded pipeline hears it, the LLM — a real
``llama_cpp.server`` on loopback serving SmolLM2 with function calling, the tool forced with
``tool_choice`` since the small model would not choose one — calls the booking tool once with
arguments its schema allows, the tool's confirmation is what the agent says, and the trace has
the tool call.

llama-cpp-python's chatml-function-calling cannot show the model a tool's result (its template
has no ``tool`` role; tests/e2e/test_llm_server_tools.py), so the booking tool is a ``speak``
tool: its result is the agent's reply, spoken as it is."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import numpy as np
import pytest
from llama_server import llama_server

from agent.commands.run import play_call
from agent.config import Config
from agent.presets import load_models
from agent.tools import Tools, tool

pytestmark = pytest.mark.slow

# One turn whatever the machine's speed: said without a comma, the voice has no gap over 100 ms,
# half the VAD's 200-ms stop. With ", please" Piper pauses 220 ms before the last word: the
# VAD stops there, and whether the turn ended before "please" came down to timing (each
# turn makes the forced tool book again).
CALLER = "I would like to book a table for four people at seven tonight please."
BOOKINGS: list[dict[str, Any]] = []


@tool(side_effects=True, speak=True)
def book_table(
    name: Annotated[str, "the name the booking is under"],
    party_size: Annotated[int, "how many guests"],
    time: Annotated[str, "when, e.g. 7pm"],
) -> str:
    """Book a table at the restaurant."""
    BOOKINGS.append({"name": name, "party_size": party_size, "time": time})
    return f"Your table for {party_size} is booked, confirmation B {len(BOOKINGS)}."


def caller_audio(cfg: Config) -> np.ndarray:
    """The caller's words in the embedded Piper voice at 16 kHz, with silence around them."""
    import soxr

    from stages.tts.piper import PiperTTS

    tts = PiperTTS(cfg.tts)
    voice = np.concatenate(list(tts.synthesize(CALLER)))
    voice = soxr.resample(voice, tts.sample_rate, 16_000).astype(np.int16)
    silence = np.zeros(16_000, np.int16)
    return np.concatenate([silence, voice, silence, silence])


def test_a_caller_books_a_table_through_a_forced_tool_call(tmp_path) -> None:  # noqa: ANN001
    with llama_server(tmp_path, "--chat_format", "chatml-function-calling") as base:
        cfg = Config()
        cfg.llm.backend = "openai"
        cfg.llm.base_url = base
        cfg.llm.timeout_s = 60.0
        cfg.llm.temperature = 0.0
        cfg.llm.tool_choice = "book_table"
        cfg.llm.system_prompt = "You book tables at a restaurant. Call book_table to book."
        models = load_models(cfg)
        models.tools = Tools([book_table])
        events: list[dict[str, Any]] = []
        BOOKINGS.clear()
        _, summary, heard = asyncio.run(
            play_call(cfg, models, caller_audio(cfg), True, events.append, tail_s=20.0))
    assert heard
    finals = [e["text"] for e in events if e["type"] == "transcript" and e["final"]]
    assert "table" in " ".join(finals).lower()
    # the tool ran once, with arguments its schema allows (the runner checked them)
    assert len(BOOKINGS) == 1, BOOKINGS
    (booking,) = BOOKINGS
    assert isinstance(booking["name"], str) and isinstance(booking["time"], str)
    assert isinstance(booking["party_size"], int)
    # its result is what the agent said
    confirmation = f"Your table for {booking['party_size']} is booked, confirmation B 1."
    said = [e["text"] for e in events if e["type"] == "agent_say"]
    assert confirmation in said, said
    # the trace: the tool call (an event with its duration and outcome), and the turn marked
    calls = [e for e in summary.get("events", []) if e["event"] == "tool_call"]
    assert [(c["tool"], c["outcome"]) for c in calls] == [("book_table", "ok")]
    assert 0 < calls[0]["ms"] < 5_000
    turns = [e for e in events if e["type"] == "trace" and e.get("kind") == "turn"]
    # (its first audio may be the filler, said while the call was still being written)
    assert any((t.get("info") or {}).get("calls_tools") for t in turns), json.dumps(turns)[:2000]
