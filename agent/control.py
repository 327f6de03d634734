"""Call control: what the agent may do to its call beyond speaking — read the keypad, press keys,
hand the call to someone else.

A transport that can do these things gives its session a :class:`CallControl`
(``session.control``); the session's :class:`Keypad` hears every :class:`~agent.frames.Dtmf`
the transport pushes, whatever the transport. Tools (``agent.tools``) reach both through their
:class:`~agent.tools.ToolContext`; nothing here knows SIP or Twilio.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Protocol

DIGITS = frozenset("0123456789*#ABCD")


class CallControlError(Exception):
    """A call-control request failed; the text says why, for the LLM and the log."""


class NotSupported(CallControlError):
    """This transport cannot do what was asked (a browser call has no keypad and no transfer)."""


class CallControl(Protocol):
    """What a transport lets the agent do to its call.

    ``transfer`` hands the call to ``target`` (a SIP URI, a phone number) and returns once the
    transport knows the hand-over worked, with a short text saying so; it raises
    :class:`CallControlError` with the reason when it did not (refused, timed out, the target
    failed). After a transfer that worked the agent's side of the call ends: the transport
    ends it (``"transferred"``) itself.

    ``send_dtmf`` presses ``digits`` (of :data:`DIGITS`) on the line, each ``duration_ms``
    long with ``gap_ms`` between them, and returns once the last has been sent.
    """

    transport: str

    async def transfer(self, target: str) -> str: ...

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None: ...


@dataclass(slots=True, frozen=True)
class Gathered:
    """What :meth:`Keypad.gather` collected: ``digits`` (terminator excluded) and why it
    stopped: ``"count"`` (enough digits), ``"terminator"``, ``"timeout"`` (no key within the
    wait), or ``"ended"`` (the call ended)."""

    digits: str
    reason: str

    def describe(self) -> str:
        if self.digits:
            return f"the caller entered {self.digits} (ended by {self.reason})"
        return f"the caller entered no digits ({self.reason})"


class Keypad:
    """The caller's key presses, as the transport reports them.

    Presses nobody is gathering are kept (the last ``keep`` of them), so a caller who types
    ahead of the prompt loses nothing; :meth:`gather` takes them first. One gather at a time:
    a second one waits for the first.
    """

    def __init__(self, keep: int = 32) -> None:
        self._pending: deque[str] = deque(maxlen=keep)
        self._changed = asyncio.Event()
        self._lock: asyncio.Lock | None = None
        self._ended = False
        self.pressed = 0

    def press(self, digit: str) -> None:
        if digit not in DIGITS:
            return
        self.pressed += 1
        self._pending.append(digit)
        self._changed.set()

    def end(self) -> None:
        """The call ended: every gather returns what it has."""
        self._ended = True
        self._changed.set()

    def clear(self) -> None:
        self._pending.clear()

    async def gather(
        self,
        count: int = 0,
        terminator: str = "#",
        timeout_s: float = 5.0,
        first_timeout_s: float | None = None,
    ) -> Gathered:
        """Collect digits until ``count`` of them (0: no limit), the ``terminator`` key
        (empty: none), or ``timeout_s`` without a key (``first_timeout_s`` for the first key,
        default ``timeout_s``). At least one of ``count`` and ``terminator`` must end it, or
        only the timeout will."""
        if count < 0 or timeout_s <= 0:
            raise ValueError("gather needs count >= 0 and timeout_s > 0")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            digits: list[str] = []
            wait = first_timeout_s if first_timeout_s is not None else timeout_s
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while True:
                while self._pending:
                    key = self._pending.popleft()
                    if terminator and key in terminator:
                        return Gathered("".join(digits), "terminator")
                    digits.append(key)
                    if count and len(digits) >= count:
                        return Gathered("".join(digits), "count")
                    deadline = loop.time() + timeout_s
                if self._ended:
                    return Gathered("".join(digits), "ended")
                self._changed.clear()
                left = deadline - loop.time()
                if left <= 0:
                    return Gathered("".join(digits), "timeout")
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    return Gathered("".join(digits), "timeout")
