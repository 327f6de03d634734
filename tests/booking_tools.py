"""The booking tool the tool-calling tests of both LLM backends offer the model."""

from __future__ import annotations

from typing import Annotated, Any

from agent.tools import CallsComing, Tools, tool


@tool(side_effects=True)
def book_table(
    name: Annotated[str, "the caller's name"],
    party_size: Annotated[int, "how many people"],
    time: Annotated[str, "when, e.g. 7pm"],
) -> str:
    """Book a table at the restaurant."""
    return f"booked a table for {party_size} at {time} under {name}"


TOOLS = Tools([book_table])


def announced(out: list[Any]) -> list[Any]:
    """A backend's stream without its CALLS_COMING, checked: once, before the calls, exactly
    when calls came."""
    kinds = [type(x) for x in out]
    calls = [i for i, x in enumerate(out) if isinstance(x, list)]
    marks = [i for i, x in enumerate(out) if isinstance(x, CallsComing)]
    assert len(marks) == len(calls) <= 1, kinds
    assert not calls or marks[0] < calls[0], kinds
    return [x for x in out if not isinstance(x, CallsComing)]
