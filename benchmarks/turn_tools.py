"""The tool the ``tools`` mode of ``voice_turn.py`` gives the agent: a table lookup that takes
as long as a small remote service (``LOOKUP_S``), so a tool turn's first audio is the filler
("One moment.") or the answer, whichever the pipeline gets out first."""

from __future__ import annotations

import asyncio
from typing import Annotated

from agent.tools import Tools, tool

LOOKUP_S = 0.5


@tool
async def check_table(
    party_size: Annotated[int, "how many guests"] = 2,
) -> str:
    """Check whether the restaurant has a free table tonight."""
    await asyncio.sleep(LOOKUP_S)
    return f"A table for {max(1, party_size)} is free at seven tonight."


TOOLS = Tools([check_table])
