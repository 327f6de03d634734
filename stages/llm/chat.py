"""The streaming chat interface every LLM backend implements, and the conversation history."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from agent.tools import CallsComing, ToolCall

INTERRUPTED_MARK = "…"


@dataclass(slots=True, frozen=True)
class LLMCapabilities:
    """What an LLM backend can do, as data.

    ``prefill``: it can evaluate a prompt ahead of the request that will send it (a local
    model's KV cache), so the LLM stage calls :meth:`ChatLLM.prefill` while the end of the
    caller's speech is being confirmed.
    ``partial_prefill``: ``prefill`` also takes ``open_turn=True`` — the last (user) message is
    the caller's words so far and stays open, so a later prompt whose message goes on from them
    reuses them — the LLM stage then prefills while the caller is still speaking.
    ``tools``: :meth:`ChatLLM.stream` takes ``tools`` and ``tool_choice`` and yields the calls.
    """

    prefill: bool = False
    tools: bool = False
    partial_prefill: bool = False


class ChatLLM(Protocol):
    """A chat model that streams its reply.

    ``stream`` yields text deltas as they are generated. Cancelling the task that consumes it
    (or closing the iterator) stops generation promptly and frees whatever runs it.
    """

    @property
    def capabilities(self) -> LLMCapabilities: ...

    def stream(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> AsyncGenerator[str | CallsComing | list[ToolCall], None]:
        """Text deltas; with ``tools`` (only when ``capabilities.tools``), then, in a reply
        that calls tools, :data:`~agent.tools.CALLS_COMING` as soon as that is known and one
        ``list[ToolCall]`` at the end. ``tool_choice``: None
        (the model decides), ``"none"``, ``"required"``, or ``{"type": "function",
        "function": {"name": ...}}`` (that tool must be called)."""
        ...

    def prefill(self, messages: list[dict[str, str]], *, open_turn: bool = False
                ) -> asyncio.Future[None]:
        """Evaluate the prompt for ``messages`` now, so that a request starting with them later
        pays only for its first token. Called on the event loop, and only when
        ``capabilities.prefill`` is true; the future is done when the prompt is in.
        ``open_turn`` (passed only when ``capabilities.partial_prefill``): the last message's
        text goes in without its end or the reply's header; a backend that is busy may skip it."""
        ...

    def warmup(self) -> None:
        """Load what the first request would otherwise wait for. Blocking; call it off the loop."""
        ...


@dataclass(slots=True, frozen=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str
    truncated: bool = False  # an assistant reply cut short by a barge-in (or a failure)
    # an assistant message that called tools: the calls, as the request sends them
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""  # a tool message: the call it answers, and the tool's name
    name: str = ""


class ChatHistory:
    """The system prompt plus at most ``max_turns`` turns before the current one.

    A turn is a user message and what follows it; assistant messages before the first user
    message (the greeting) count as a turn of their own.

    The history only grows at its end, so every request begins with the previous request and
    a model server's cache of it (llama.cpp's KV cache, vLLM's prefix cache) covers all but the
    new turn. A window that slid by one turn would change the prompt's beginning every turn and
    leave nothing to reuse. So when the earlier turns would pass ``max_turns``, the oldest go in
    one block, leaving the ``keep_turns`` most recent (default half of ``max_turns``); the
    prompt's beginning then changes once every ``max_turns - keep_turns + 1`` turns.

    The arithmetic for the defaults (``history_turns`` 16, context 2048, ``max_tokens`` 48,
    SmolLM2's tokenizer): a turn is the caller's words (~20 tokens for a typical 14-word turn),
    the reply (at most 48) and ~10 tokens of chat template, so ~70 tokens, ~100 with a long
    question and a full reply. The system prompt is ~30, so 16 earlier turns, the current one
    and its reply come to ~1,200 tokens typically and ~1,700 at worst: inside 2048. The block
    drop happens once every 9 turns; ``keep_turns == max_turns`` is the old one-turn slide.

    An assistant message cut by a barge-in holds what the caller heard of it (see
    :meth:`revise`) and is sent with ``interrupted_mark`` after it. A reply to the caller cut
    before its first word was never heard: for the caller, they spoke twice in a row. So the
    caller's next words join their previous message and the unheard reply goes (a small model
    shown a reply that is only the mark answers with the mark, which says nothing). Anywhere
    else (a greeting cut before its first word, a reply that called tools) the message is sent
    as the mark alone, so the model sees that it was interrupted and the turns still alternate.
    """

    def __init__(self, system_prompt: str, max_turns: int, keep_turns: int | None = None,
                 interrupted_mark: str = INTERRUPTED_MARK) -> None:
        self.interrupted_mark = interrupted_mark
        self.system_prompt = system_prompt
        self.max_turns = max(0, max_turns)
        keep = self.max_turns // 2 if keep_turns is None else keep_turns
        self.keep_turns = min(max(0, keep), self.max_turns)
        self.entries: list[Message] = []

    def add_user(self, text: str) -> None:
        entries = self.entries
        if self._unheard_reply():
            del entries[-1]
            entries[-1] = replace(entries[-1], content=f"{entries[-1].content} {text}".strip())
        else:
            entries.append(Message("user", text))
        self._trim(current=True)

    def messages_with(self, text: str) -> list[dict[str, Any]]:
        """The request payload once the caller's ``text`` is added (as :meth:`add_user` would
        add it); the history itself stays as it is. For requests made ahead of the turn's end
        (a prefill, a speculative reply), so they send what the turn's request will."""
        saved = list(self.entries)
        try:
            self.add_user(text)
            return self.messages()
        finally:
            self.entries = saved

    def _unheard_reply(self) -> bool:
        """The last message is a reply to the caller's message before it, cut before its first
        word and without tool calls: the caller heard nothing of it."""
        e = self.entries
        return (len(e) >= 2 and e[-1].role == "assistant" and e[-1].truncated
                and not e[-1].content.strip() and not e[-1].tool_calls and e[-2].role == "user")

    def add_assistant(self, text: str, truncated: bool = False,
                      tool_calls: tuple[dict[str, Any], ...] = ()) -> Message:
        message = Message("assistant", text, truncated, tool_calls)
        self.entries.append(message)
        # Trimmed already here, not only when the next turn begins: a prefill or speculative
        # request for that turn (history + the caller's words so far) then sends the same
        # beginning as the turn's real request.
        self._trim(current=False)
        return message

    def add_tool_result(self, call_id: str, name: str, content: str) -> Message:
        message = Message("tool", content, tool_call_id=call_id, name=name)
        self.entries.append(message)
        return message

    def revise(self, message: Message, content: str, truncated: bool = True) -> Message | None:
        """Replace ``message``'s content where it stands (what the caller heard of a reply, a
        tool's late result); None when the message is no longer in the history."""
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i] is message:
                self.entries[i] = replace(message, content=content, truncated=truncated)
                return self.entries[i]
        return None

    def discard_turn(self) -> None:
        """Forget the last user message and what followed it."""
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i].role == "user":
                del self.entries[i:]
                return

    def messages(self) -> list[dict[str, Any]]:
        """The request payload. An interrupted reply carries ``interrupted_mark``; an empty
        assistant message that was not interrupted (nothing was said) is left out. Flags stay
        here: strict servers reject unknown message fields."""
        out: list[dict[str, Any]] = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        mark = self.interrupted_mark
        for m in self.entries:
            if m.role == "tool":
                out.append({"role": "tool", "tool_call_id": m.tool_call_id, "name": m.name,
                            "content": m.content})
                continue
            content = m.content
            if m.role == "assistant" and m.truncated and mark:
                content = f"{content}{mark}" if content else mark
            if m.tool_calls:
                out.append({"role": "assistant", "content": content, "tool_calls": list(m.tool_calls)})
            elif content or m.role != "assistant":
                out.append({"role": m.role, "content": content})
        return out

    def _trim(self, current: bool) -> None:
        """Drop the oldest turns in one block once the earlier turns pass ``max_turns``; with
        ``current`` the last turn is the one just begun and not an earlier one."""
        starts = [i for i, m in enumerate(self.entries) if m.role == "user"]
        if self.entries and (not starts or starts[0] > 0):
            starts.insert(0, 0)
        earlier = len(starts) - current
        if earlier > self.max_turns:
            cut = earlier - self.keep_turns
            del self.entries[: starts[cut] if cut < len(starts) else len(self.entries)]
