"""Tools the agent's LLM may call: a Python function made a tool (its JSON Schema and the checks
of a call's arguments: :mod:`agent.tool_schema`), a registry loaded by import path, the runner
that runs a call within its time limit, and the call-control built-ins (hang up, transfer, read
and press keypad digits)."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import importlib
import inspect
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any

from agent.control import DIGITS, CallControl, Keypad, NotSupported
from agent.errors import ConfigError
from agent.tool_schema import InvalidArguments, arguments, from_signature

# What one tool result may put in the prompt: ~1,000 tokens. A tool that returns a whole web
# page would otherwise fill a small model's context (2,048 tokens) in one call.
MAX_RESULT_CHARS = 4000
# OpenAI's rule for function names; other servers accept at least these.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Sync tools run here, not on the loop's default executor: one that hangs past its timeout
# keeps its thread (Python cannot stop it), and must not take a thread others wait for.
_TOOL_THREADS = 8
_threads: ThreadPoolExecutor | None = None
_threads_lock = threading.Lock()


@dataclass(slots=True)
class ToolContext:
    """What a tool may use of the call it runs in; a tool receives it by declaring a parameter
    annotated ``ToolContext`` (left out of its schema).

    ``call_id``: the session's id (for logs, or a backend's own records). ``keypad``: the
    caller's key presses (:class:`~agent.control.Keypad`), None when the call has none.
    ``control``: the transport's :class:`~agent.control.CallControl`, None when it offers
    none (a browser call). ``hangup``: set by :meth:`hang_up` (or a transfer that worked):
    the reason the call is to end once the agent's current words have played, ``""`` while
    it goes on. The tools of one step share one context.
    """

    call_id: str = ""
    keypad: Keypad | None = None
    control: CallControl | None = None
    hangup: str = ""
    # set by the LLM stage: speak a text now (the agent's words, outside the history), and
    # wait until what the agent has said so far has played to the caller
    speaker: Callable[[str], None] | None = None
    played: Callable[[], Awaitable[None]] | None = None

    def say(self, text: str) -> None:
        """Have the agent say ``text`` now, while the tool runs ("Please type the number of
        guests, then the hash key.")."""
        if self.speaker is not None and text.strip():
            self.speaker(text.strip())

    async def wait_played(self) -> None:
        """Return once the agent's words so far have played to the caller (bounded)."""
        if self.played is not None:
            await self.played()

    def hang_up(self, reason: str = "agent") -> None:
        """End the call after what the agent is saying now (the LLM stage asks no more)."""
        self.hangup = reason or "agent"

    async def transfer(self, target: str) -> str:
        """Hand the call to ``target`` through the transport; the call then ends here
        (``hangup`` becomes ``"transferred"``). Raises
        :class:`~agent.control.CallControlError` (``NotSupported`` without call control)."""
        if self.control is None:
            raise NotSupported("this call cannot be transferred (its transport has no call control)")
        await self.wait_played()  # the caller hears "I'll put you through" before the hand-over
        text = await self.control.transfer(target)
        self.hangup = "transferred"
        return text


@dataclass(slots=True, frozen=True, eq=False)
class Tool:
    """One tool: what the model is told (``name``, ``description``, ``parameters``, a JSON
    Schema object) and the function that runs it (sync: on a worker thread; async: on the
    loop). ``side_effects``: it changes the world (a booking, a transfer), so a barge-in
    lets it finish rather than cancelling it. ``timeout_s``: its time limit (None: the
    runner's default). ``context_param``: the parameter that receives the
    :class:`ToolContext`. ``speak``: the tool's result is what the agent says — spoken as
    it is, and the model is not asked again this turn (a confirmation that must be exact, or
    a model server that cannot read tool results). Calling the Tool calls its function."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    side_effects: bool = False
    timeout_s: float | None = None
    context_param: str | None = None
    speak: bool = False
    # per parameter, how a JSON value becomes what the function's type hint says (an Enum
    # member, a float from 4, an int from 4.0); None for tools whose schema was given
    convert: dict[str, Callable[[Any], Any]] = field(default_factory=dict, repr=False)
    fill_none: tuple[str, ...] = field(default=(), repr=False)  # optional, without default

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def spec(self) -> dict[str, Any]:
        """The tool as an OpenAI ``tools`` entry."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    side_effects: bool = False,
    timeout_s: float | None = None,
    speak: bool = False,
) -> Any:
    """Make ``fn`` a :class:`Tool`; bare (``@tool``) or with arguments (``@tool(name=...)``).

    Without ``parameters`` the schema comes from the type hints: ``str``, ``int``, ``float``,
    ``bool``, ``list[X]``, ``dict``, ``Literal[...]`` and ``Enum`` (an ``enum``), ``X | None``
    or a default (not required), ``Annotated[X, "what it is"]`` (its description). The
    docstring's first paragraph is the description; a Google-style ``Args:`` section or
    ``:param x:`` lines describe the parameters. A parameter without a hint, or of a type
    JSON Schema cannot say, is a TypeError naming it.
    """

    def make(f: Callable[..., Any]) -> Tool:
        return _from_function(f, name, description, parameters, side_effects, timeout_s, speak)

    return make(fn) if fn is not None else make


# --- the Tool, from a function (its schema: agent.tool_schema) ---------------------------------
def _from_function(
    fn: Callable[..., Any], name: str | None, description: str | None,
    parameters: dict[str, Any] | None, side_effects: bool, timeout_s: float | None,
    speak: bool = False,
) -> Tool:
    if isinstance(fn, Tool):
        raise TypeError(f"{fn.name} is a Tool already")
    if not callable(fn):
        raise TypeError(f"a tool needs a function, not {fn!r}")
    if name is None:
        try:
            name = fn.__name__
        except AttributeError:
            raise TypeError(f"{fn!r} has no __name__: pass tool(..., name=...)") from None
    if not _NAME.fullmatch(name):
        raise ValueError(f"tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"tool {name}: timeout_s must be > 0 (None: the runner's default)")
    sig = from_signature(fn, name, parameters, ToolContext)
    return Tool(name, sig.summary if description is None else description, sig.parameters, fn,
                side_effects, timeout_s, sig.context_param, speak=speak, convert=sig.convert,
                fill_none=sig.fill_none)


# --- calls and results -------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class ToolCall:
    """One call the model made: its ``id`` (echoed in the tool message that answers it), the
    tool's ``name`` and ``arguments``, the JSON text exactly as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True, frozen=True)
class CallsComing:
    """What an LLM backend's stream yields as soon as it knows the reply calls tools, before
    the calls are complete (their arguments are still being written): the agent can start
    covering the wait ("One moment.") from then. At most once per request, before the calls."""


CALLS_COMING = CallsComing()


@dataclass(slots=True, frozen=True)
class ToolResult:
    """What running a :class:`ToolCall` gave: ``content`` is what the model is sent;
    ``outcome`` one of ``"ok"``, ``"error"`` (the tool raised), ``"timeout"``, ``"invalid"``
    (arguments the schema does not allow) and ``"unknown"`` (no such tool);
    ``side_effects`` is what the tool declares (False for an unknown one)."""

    call: ToolCall
    content: str
    outcome: str
    duration_s: float
    side_effects: bool = False


class Tools:
    """The tools an agent may call, by name. ``specs()`` is the request's ``tools`` list
    (built once, shared: do not change it)."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: list[dict[str, Any]] | None = None
        for t in tools:
            self.add(t)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a Tool, or a function made one with :func:`tool`; a second tool of the same
        name is a ValueError."""
        t = item if isinstance(item, Tool) else tool(item)
        if t.name in self._tools:
            raise ValueError(f"two tools are named {t.name!r}")
        self._tools[t.name] = t
        self._specs = None
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        if self._specs is None:
            self._specs = [t.spec() for t in self._tools.values()]
        return self._specs

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def load(self, path: str) -> list[Tool]:
        """Add what ``"package.module:attr"`` names: a Tool, a function, a list or tuple of
        them, or a Tools. Anything wrong is a ConfigError with the path and the reason."""
        module_name, sep, attr = path.strip().partition(":")
        if not sep or not module_name or not attr:
            raise ConfigError(f"tool {path!r}: expected 'package.module:name'")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise ConfigError(f"tool {path!r}: cannot import {module_name} "
                              f"({type(exc).__name__}: {exc})") from None
        try:
            value = getattr(module, attr)
        except AttributeError:
            raise ConfigError(f"tool {path!r}: {module_name} has no {attr!r}") from None
        items = (list(value) if isinstance(value, Tools | list | tuple) else [value])
        added = []
        for item in items:
            if not (isinstance(item, Tool) or inspect.isroutine(item)):
                raise ConfigError(f"tool {path!r}: {item!r} is not a tool (a Tool, a function, "
                                  "a list of them, or a Tools)")
            try:
                added.append(self.add(item))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"tool {path!r}: {exc}") from None
        return added

    @classmethod
    def from_config(cls, paths: Iterable[str]) -> Tools:
        """One registry of everything ``paths`` name (``[llm] tools``)."""
        tools = cls()
        for path in paths:
            tools.load(path)
        return tools


async def run_tool(
    tools: Tools, call: ToolCall, ctx: ToolContext, default_timeout_s: float | None
) -> ToolResult:
    """Run ``call``: never raises for the tool's own failures, which become a result the model
    reads (bad arguments, an unknown tool, an exception, a timeout). Cancelling it cancels an
    async tool; a sync one runs on to its end on its thread, its result unused."""
    start = time.perf_counter()
    t = tools.get(call.name)
    if t is None:
        known = ", ".join(tools.names) or "none"
        return _result(call, start, "unknown",
                       f"error: there is no tool named {call.name!r} — the tools are: {known}")
    try:
        args = arguments(call.arguments, t.parameters, t.fill_none, t.convert)
    except InvalidArguments as exc:
        return _result(call, start, "invalid",
                       f"error: invalid arguments for {t.name}: {exc} — call it again with "
                       "arguments that match its parameters", t.side_effects)
    if t.context_param:
        args[t.context_param] = ctx
    limit = t.timeout_s if t.timeout_s is not None else default_timeout_s
    try:
        async with asyncio.timeout(limit if limit and limit > 0 else None) as deadline:
            value = await _invoke(t.fn, args)
    except TimeoutError as exc:
        if deadline.expired():
            return _result(call, start, "timeout",
                           f"error: {t.name} timed out after {limit:g} s", t.side_effects)
        return _result(call, start, "error", _error_text(exc), t.side_effects)
    except Exception as exc:
        return _result(call, start, "error", _error_text(exc), t.side_effects)
    return _result(call, start, "ok", _content(value), t.side_effects)


async def _invoke(fn: Callable[..., Any], args: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        return await fn(**args)
    loop = asyncio.get_running_loop()
    run = contextvars.copy_context().run
    value = await loop.run_in_executor(_executor(), lambda: run(fn, **args))
    if inspect.isawaitable(value):  # a sync wrapper around a coroutine
        value = await value
    return value


def _executor() -> ThreadPoolExecutor:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = ThreadPoolExecutor(_TOOL_THREADS, thread_name_prefix="voxline-tool")
        return _threads


def _result(call: ToolCall, start: float, outcome: str, content: str,
            side_effects: bool = False) -> ToolResult:
    return ToolResult(call, _cap(content), outcome, time.perf_counter() - start, side_effects)


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"error: {type(exc).__name__}: {text}" if text else f"error: {type(exc).__name__}"


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "ok"
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)


def _cap(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return (f"{text[:MAX_RESULT_CHARS]}… [cut: the first {MAX_RESULT_CHARS} of "
            f"{len(text)} characters]")


# --- built-ins: call control -------------------------------------------------------------------
@tool(side_effects=True)
async def hang_up(
    ctx: ToolContext,
    reason: Annotated[str, "why the call ends, in a few words"] = "",
) -> str:
    """End the call once you have finished speaking. Use it when the caller says goodbye or
    asks to end the call; say goodbye first."""
    ctx.hang_up("agent")
    return f"the call ends after your last words ({reason})" if reason else (
        "the call ends after your last words")


@tool(side_effects=True, timeout_s=60.0)
async def transfer_call(
    ctx: ToolContext,
    target: Annotated[str, "the phone number or SIP address to transfer the call to"],
) -> str:
    """Transfer the caller to another number or person. Tell the caller before you call it."""
    return await ctx.transfer(target)


@tool(timeout_s=120.0)  # the keypad's own waits end it
async def gather_digits(
    ctx: ToolContext,
    count: Annotated[int, "how many digits to collect; 0: until the terminator key"] = 0,
    terminator: Annotated[str, "the key that ends the entry ('#'); empty: none"] = "#",
    timeout_s: Annotated[float, "seconds to wait for each key"] = 5.0,
) -> str:
    """Collect digits the caller types on the phone keypad (an account number, a PIN). Ask
    the caller to type them before you call it."""
    if ctx.keypad is None:
        raise NotSupported("this call has no keypad")
    if terminator and any(k not in DIGITS for k in terminator):
        raise ValueError(f"terminator {terminator!r}: use one of 0-9 * # A-D")
    got = await ctx.keypad.gather(count, terminator, timeout_s)
    return f"{got.describe()}; digits: {got.digits or '(none)'}"


@tool(side_effects=True)
async def send_digits(
    ctx: ToolContext,
    digits: Annotated[str, "the keys to press: 0-9, *, #, A-D"],
) -> str:
    """Press keys on the phone line (DTMF), e.g. to navigate another system's menu."""
    bad = sorted({k for k in digits if k not in DIGITS})
    if not digits or bad:
        raise ValueError(f"digits {digits!r}: use only 0-9 * # A-D")
    if ctx.control is None:
        raise NotSupported("this call cannot send keypad tones (its transport has no call control)")
    await ctx.control.send_dtmf(digits)
    return f"sent {digits}"


BUILTINS: dict[str, Tool] = {
    t.name: t for t in (hang_up, transfer_call, gather_digits, send_digits)}


def builtin_tools(names: Iterable[str] | None = None) -> Tools:
    """The built-in call-control tools named (all of them by default)."""
    chosen = list(BUILTINS) if names is None else list(names)
    unknown = [n for n in chosen if n not in BUILTINS]
    if unknown:
        raise ConfigError(f"unknown built-in tool(s) {', '.join(map(repr, unknown))} — the "
                          f"built-ins are {', '.join(BUILTINS)}")
    return Tools(BUILTINS[n] for n in chosen)
