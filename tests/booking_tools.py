"""The booking tool the tool-calling tests of both LLM backends offer the model."""

from __future__ import annotations

from typing import Annotated

from agent.tools import Tools, tool


@tool(side_effects=True)
def book_table(
    name: Annotated[str, "the caller's name"],
    party_size: Annotated[int, "how many people"],
    time: Annotated[str, "when, e.g. 7pm"],
) -> str:
    """Book a table at the restaurant."""
    return f"booked a table for {party_size} at {time} under {name}"


TOOLS = Tools([book_table])
