"""A call's session from start to close, the same for every transport: a start that fails, a
call that fails and a call that ends all close the session (its ASR slot, tasks and trace)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from agent.session import Session

log = logging.getLogger("voxline.transport")


class CallLifecycle:
    """Starts ``session`` and closes it exactly once, on every path.

    ``async with CallLifecycle(session) as life:`` starts the session and closes it when the
    block is left: with ``life.reason`` (the shell sets it as the call ends), or ``"error"``
    when the block raised (a cancelled block keeps its reason). A shell whose call outlives
    one block (SIP, WebRTC: callbacks end it) calls :meth:`start` and :meth:`close` itself.
    Either way a start that fails has closed the session before its error goes on.
    """

    def __init__(self, session: Session, reason: str = "hangup") -> None:
        self.session = session
        self.reason = reason
        self.started = False

    async def start(self) -> None:
        try:
            await self.session.start()
        except BaseException:
            try:
                await self.close("error")
            except Exception:  # the start's error is the one worth reporting
                log.exception("session %s: closing after a failed start failed", self.session.id)
            raise
        self.started = True

    async def agent_hangup(self) -> str:
        """Wait until the agent ends the call (:meth:`Session.wait_hangup`: its last words have
        played out) and make the agent's reason the call's. A shell awaits it beside its
        receive loop, then ends the call on its wire and closes."""
        self.reason = await self.session.wait_hangup()
        return self.reason

    async def close(self, reason: str | None = None) -> dict[str, Any]:
        """Close the session and return its summary (idempotent: the first reason stays)."""
        if reason is not None and not self.session.closed:
            self.reason = reason
        return await self.session.close(self.reason)

    async def __aenter__(self) -> CallLifecycle:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and not issubclass(exc_type, asyncio.CancelledError):
            self.reason = "error"
        await self.close()
