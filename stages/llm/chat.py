"""The streaming chat interface every LLM backend implements, and the conversation history."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, frozen=True)
class LLMCapabilities:
    """What an LLM backend can do, as data.

    ``prefill``: it can evaluate a prompt ahead of the request that will send it (a local
    model's KV cache), so the LLM stage calls :meth:`ChatLLM.prefill` while the end of the
    caller's speech is being confirmed.
    """

    prefill: bool = False


class ChatLLM(Protocol):
    """A chat model that streams its reply.

    ``stream`` yields text deltas as they are generated. Cancelling the task that consumes it
    (or closing the iterator) stops generation promptly and frees whatever runs it.
    """

    @property
    def capabilities(self) -> LLMCapabilities: ...

    def stream(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]: ...

    def prefill(self, messages: list[dict[str, str]]) -> asyncio.Future[None]:
        """Evaluate the prompt for ``messages`` now, so that a request starting with them later
        pays only for its first token. Called on the event loop, and only when
        ``capabilities.prefill`` is true; the future is done when the prompt is in."""
        ...

    def warmup(self) -> None:
        """Load what the first request would otherwise wait for. Blocking; call it off the loop."""
        ...


@dataclass(slots=True, frozen=True)
class Message:
    role: str  # system | user | assistant
    content: str
    truncated: bool = False  # an assistant reply cut short by a barge-in


class ChatHistory:
    """The system prompt plus the last ``max_turns`` turns before the current one.

    A turn is a user message and what follows it; assistant messages before the first user
    message (the greeting) count as a turn of their own.
    """

    def __init__(self, system_prompt: str, max_turns: int) -> None:
        self.system_prompt = system_prompt
        self.max_turns = max(0, max_turns)
        self.entries: list[Message] = []

    def add_user(self, text: str) -> None:
        self.entries.append(Message("user", text))
        self._trim()

    def add_assistant(self, text: str, truncated: bool = False) -> None:
        self.entries.append(Message("assistant", text, truncated))

    def discard_turn(self) -> None:
        """Forget the last user message and what followed it."""
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i].role == "user":
                del self.entries[i:]
                return

    def messages(self) -> list[dict[str, str]]:
        """The request payload. Empty assistant messages (a reply interrupted before its first
        word) are left out; the truncation flag stays here, since strict servers reject
        unknown message fields."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        out.extend(
            {"role": m.role, "content": m.content}
            for m in self.entries
            if m.content or m.role != "assistant"
        )
        return out

    def _trim(self) -> None:
        starts = [i for i, m in enumerate(self.entries) if m.role == "user"]
        if starts and starts[0] > 0:
            starts.insert(0, 0)
        keep = self.max_turns + 1  # the earlier turns plus the one just begun
        if len(starts) > keep:
            del self.entries[: starts[-keep]]
