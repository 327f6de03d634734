"""agent.tools: schemas derived from functions, the registry and its import paths, the runner's
checks, limits and failures, and the call-control built-ins against a fake transport."""

from __future__ import annotations

import asyncio
import datetime
import enum
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import pytest

from agent.control import CallControlError, Keypad
from agent.errors import ConfigError
from agent.tools import (
    MAX_RESULT_CHARS,
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    Tools,
    builtin_tools,
    run_tool,
    tool,
)


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


def run(tools: Tools | Tool, name: str, args: object = None, ctx: ToolContext | None = None,
        default_timeout_s: float | None = 5.0) -> ToolResult:
    registry = tools if isinstance(tools, Tools) else Tools([tools])
    raw = args if isinstance(args, str) else json.dumps(args or {})
    call = ToolCall("call_1", name, raw)
    return asyncio.run(run_tool(registry, call, ctx or ToolContext(), default_timeout_s))


# --- schemas ---------------------------------------------------------------------------------
def test_the_schema_comes_from_hints_defaults_and_the_docstring() -> None:
    @tool
    def book(
        name: str,
        party: int,
        when: Annotated[str, "the time, like 19:30"],
        size: Size = Size.SMALL,
        seating: Literal["inside", "outside"] = "inside",
        tags: list[str] | None = None,
        notes: dict | None = None,
        price: float = 1.5,
        vip: bool = False,
        ctx: ToolContext | None = None,
    ) -> str:
        """Book a table at the restaurant.

        Use it once the caller has given a name and the party's size.

        Args:
            name: the caller's name
            party: how many people
                come, children included
            when: ignored: Annotated wins
        """
        return "ok"

    assert isinstance(book, Tool) and book.name == "book"
    assert book.description == "Book a table at the restaurant."
    assert book.context_param == "ctx" and not book.side_effects and book.timeout_s is None
    params = book.parameters
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["name", "party", "when"]
    props = params["properties"]
    assert "ctx" not in props
    assert props["name"] == {"type": "string", "description": "the caller's name"}
    assert props["party"] == {"type": "integer",
                              "description": "how many people come, children included"}
    assert props["when"] == {"type": "string", "description": "the time, like 19:30"}
    assert props["size"] == {"type": "string", "enum": ["small", "large"], "default": "small"}
    assert props["seating"] == {"type": "string", "enum": ["inside", "outside"],
                                "default": "inside"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["notes"] == {"type": "object"}
    assert props["price"] == {"type": "number", "default": 1.5}
    assert props["vip"] == {"type": "boolean", "default": False}
    assert book.spec() == {"type": "function", "function": {
        "name": "book", "description": book.description, "parameters": params}}
    assert book("Ana", 2, "19:30") == "ok"  # the Tool still calls its function


def test_param_lines_optional_without_default_and_decorator_arguments() -> None:
    @tool(name="look-up", description="Find an order.", side_effects=True, timeout_s=2.5)
    async def find(order: str, year: int | None) -> str:
        """Ignored here.

        :param order: the order number
        :param int year: the year it was placed
        """
        return order

    assert (find.name, find.description, find.side_effects, find.timeout_s) == (
        "look-up", "Find an order.", True, 2.5)
    assert find.parameters["required"] == ["order"]
    assert find.parameters["properties"] == {
        "order": {"type": "string", "description": "the order number"},
        "year": {"type": "integer", "description": "the year it was placed"},
    }


def test_given_parameters_are_used_as_they_are() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "minLength": 2}},
              "required": ["q"]}

    @tool(parameters=schema)
    def search(q, ctx: ToolContext):  # noqa: ANN001, ANN202 - no hints needed with a schema
        return q

    assert search.parameters is schema and search.context_param == "ctx"
    with pytest.raises(TypeError, match="JSON Schema object"):
        tool(lambda: 1, name="x", parameters={"type": "string"})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(a): pass", "parameter 'a' has no type hint"),
        ("def f(a: int, b: set[int]): pass", "parameter 'b': cannot describe"),
        ("def f(a: int | str): pass", "parameter 'a': a union of int, str"),
        ("def f(a: tuple[int, int]): pass", "parameter 'a': cannot describe"),
        ("def f(a: dict[int, str]): pass", "parameter 'a': a JSON object's keys"),
        ("def f(a: Literal['x', 1]): pass", "parameter 'a': Literal values"),
        ("def f(*a: int): pass", "parameter 'a': a tool's parameters are passed by name"),
        ("def f(**kw: int): pass", "parameter 'kw'"),
        ("def f(a: Missing): pass", "cannot resolve its type hints"),
    ],
)
def test_what_a_schema_cannot_say_is_a_type_error_naming_the_parameter(
    source: str, message: str
) -> None:
    scope: dict[str, object] = {"Literal": Literal}
    exec(source, scope)
    with pytest.raises(TypeError, match=message):
        tool(scope["f"])


def test_bad_names_and_limits_are_refused() -> None:
    def f() -> None: ...

    with pytest.raises(ValueError, match="tool name 'a b'"):
        tool(f, name="a b")
    with pytest.raises(ValueError, match="timeout_s"):
        tool(f, timeout_s=0)


# --- the registry ----------------------------------------------------------------------------
def test_the_registry_adds_tools_and_functions_and_refuses_a_second_name() -> None:
    def ping() -> str:
        """Say pong."""
        return "pong"

    tools = Tools()
    added = tools.add(ping)
    assert isinstance(added, Tool) and tools.get("ping") is added and tools.get("nope") is None
    tools.add(builtin_tools(["hang_up"]).get("hang_up"))
    assert tools.names == ["ping", "hang_up"] and len(tools) == 2 and "ping" in tools
    specs = tools.specs()
    assert [s["function"]["name"] for s in specs] == ["ping", "hang_up"]
    assert tools.specs() is specs  # built once
    with pytest.raises(ValueError, match="two tools are named 'ping'"):
        tools.add(tool(ping))


MODULE = '''
from agent.tools import Tools, tool

def weather(city: str) -> str:
    """The weather in a city."""
    return "sunny in " + city

@tool
def time_now() -> str:
    return "noon"

def a() -> str:
    return "a"

def b() -> str:
    return "b"

PAIR = [a, b]
REGISTRY = Tools([tool(a, name="reg_a")])
NOT_A_TOOL = 42

def unhinted(x):
    return x
'''


@pytest.fixture()
def tool_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_tools_mod.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_tools_mod"
    sys.modules.pop("my_tools_mod", None)


def test_tools_load_by_import_path(tool_module: str) -> None:
    tools = Tools.from_config([f"{tool_module}:weather", f"{tool_module}:time_now",
                               f"{tool_module}:PAIR", f"{tool_module}:REGISTRY",
                               "agent.tools:hang_up"])
    assert tools.names == ["weather", "time_now", "a", "b", "reg_a", "hang_up"]
    assert tools.get("weather").description == "The weather in a city."
    assert run(tools, "weather", {"city": "Oslo"}).content == "sunny in Oslo"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("my_tools_mod", "expected 'package.module:name'"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz (ModuleNotFoundError"),
        ("my_tools_mod:nothing", "my_tools_mod has no 'nothing'"),
        ("my_tools_mod:NOT_A_TOOL", "42 is not a tool"),
        ("my_tools_mod:unhinted", "parameter 'x' has no type hint"),
    ],
)
def test_a_bad_import_path_is_a_config_error_with_the_path_and_reason(
    tool_module: str, path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Tools.from_config([path])
    assert repr(path) in str(err.value) and reason in str(err.value)


def test_the_same_tool_twice_in_the_config_is_an_error(tool_module: str) -> None:
    with pytest.raises(ConfigError, match="two tools are named 'weather'"):
        Tools.from_config([f"{tool_module}:weather", f"{tool_module}:weather"])


# --- the runner: arguments -------------------------------------------------------------------
@tool
def order(item: str, count: int, size: Size = Size.SMALL, weight: float = 1.0,
          note: str | None = None) -> dict:
    """Order something."""
    return {"item": item, "count": count, "size": size, "weight": weight, "note": note}


def test_valid_arguments_reach_the_function_converted_to_its_hints() -> None:
    result = run(order, "order", '{"item": "tea", "count": 2.0, "size": "large", "weight": 3}')
    assert result.outcome == "ok" and not result.side_effects
    assert json.loads(result.content) == {
        "item": "tea", "count": 2, "size": "large", "weight": 3.0, "note": None}
    assert result.call.id == "call_1" and result.duration_s >= 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"item": "tea", "count": ', "not valid JSON"),
        ('["tea", 2]', "expected a JSON object of arguments, got a list"),
        ('{"item": "tea"}', "missing count (an integer)"),
        ('{"item": "tea", "count": "two"}', 'count: expected an integer, got "two" (a string)'),
        ('{"item": "tea", "count": 2.5}', "count: expected an integer, got 2.5 (a number)"),
        ('{"item": "tea", "count": true}', "count: expected an integer, got true"),
        ('{"item": "tea", "count": 1, "size": "huge"}',
         'size: expected one of ["small", "large"], got "huge"'),
        ('{"item": "tea", "count": 1, "colour": "red"}',
         "unknown argument 'colour' (the arguments are: item, count, size, weight, note)"),
        ('{"item": null, "count": 1}', "item: expected a string, got null"),
    ],
)
def test_bad_arguments_are_invalid_with_what_to_fix(raw: str, expected: str) -> None:
    result = run(order, "order", raw)
    assert result.outcome == "invalid", result.content
    assert result.content.startswith("error: invalid arguments for order: ")
    assert expected in result.content


def test_raw_control_characters_inside_strings_are_taken_as_written() -> None:
    # a small model's forced call wrote a newline inside a string value (strict JSON refuses it)
    result = run(order, "order", '{"item": "green\ntea", "count": 2, "note": "for\tme"}')
    assert result.outcome == "ok", result.content
    assert json.loads(result.content)["item"] == "green\ntea"
    assert json.loads(result.content)["note"] == "for\tme"


def test_nested_schemas_are_checked_by_path() -> None:
    schema = {"type": "object", "properties": {
        "rooms": {"type": "array", "items": {"type": "object", "properties": {
            "beds": {"type": "integer"}}, "required": ["beds"]}}}}
    t = tool(lambda rooms: len(rooms), name="rooms", parameters=schema)
    assert run(t, "rooms", {"rooms": [{"beds": 1}, {"beds": 2}]}).content == "2"
    bad = run(t, "rooms", {"rooms": [{"beds": 1}, {"beds": "x"}]})
    assert bad.outcome == "invalid" and "rooms[1].beds: expected an integer" in bad.content
    missing = run(t, "rooms", {"rooms": [{}]})
    assert "missing rooms[0].beds (an integer)" in missing.content


def test_empty_arguments_call_a_tool_without_parameters() -> None:
    t = tool(lambda: "done", name="noargs")
    assert run(t, "noargs", "").content == "done"
    assert run(t, "noargs", "{}").outcome == "ok"


def test_an_unknown_tool_lists_the_known_ones() -> None:
    result = run(Tools([order, tool(lambda: 1, name="other")]), "ordr", {})
    assert result.outcome == "unknown"
    assert result.content == "error: there is no tool named 'ordr' — the tools are: order, other"


# --- the runner: how tools run ---------------------------------------------------------------
def test_a_sync_tool_runs_off_the_event_loop() -> None:
    seen: dict[str, object] = {}

    def slow() -> str:
        seen["thread"] = threading.current_thread().name
        time.sleep(0.05)
        return "done"

    async def main() -> tuple[ToolResult, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        ticker = asyncio.create_task(tick())
        result = await run_tool(Tools([tool(slow)]), ToolCall("1", "slow", "{}"), ToolContext(), 5)
        ticker.cancel()
        seen["loop"] = threading.current_thread().name
        return result, ticks

    result, ticks = asyncio.run(main())
    assert result.outcome == "ok" and result.content == "done"
    assert seen["thread"] != seen["loop"] and str(seen["thread"]).startswith("voxline-tool")
    assert ticks >= 2  # the loop went on while the tool slept


def test_an_async_tool_runs_on_the_loop_with_its_context() -> None:
    @tool
    async def who(ctx: ToolContext) -> str:
        return f"{ctx.call_id} on {threading.current_thread().name}"

    result = run(who, "who", {}, ToolContext(call_id="c-7"))
    assert result.content == f"c-7 on {threading.current_thread().name}"


def test_a_tool_past_its_limit_times_out() -> None:
    @tool(timeout_s=0.05)
    async def stuck() -> str:
        await asyncio.sleep(10)
        return "never"

    def stuck_sync() -> str:
        time.sleep(0.3)
        return "late"

    start = time.monotonic()
    result = run(stuck, "stuck", {}, default_timeout_s=30)
    assert result.outcome == "timeout" and time.monotonic() - start < 5
    assert result.content == "error: stuck timed out after 0.05 s"
    # the runner's default applies when the tool has none
    result = run(tool(stuck_sync), "stuck_sync", {}, default_timeout_s=0.05)
    assert result.outcome == "timeout" and "stuck_sync timed out after 0.05 s" in result.content


def test_an_exception_is_an_error_result_without_a_traceback() -> None:
    def boom() -> str:
        raise ValueError("the table is taken")

    async def own_timeout() -> str:
        raise TimeoutError("the booking service did not answer")

    result = run(tool(boom), "boom", {})
    assert result.outcome == "error"
    assert result.content == "error: ValueError: the table is taken"
    # a TimeoutError of the tool's own is its error, not the runner's timeout
    result = run(tool(own_timeout), "own_timeout", {})
    assert result.outcome == "error"
    assert result.content == "error: TimeoutError: the booking service did not answer"
    assert run(tool(lambda: 1 / 0, name="div"), "div", {}).content.startswith(
        "error: ZeroDivisionError: ")


def test_results_that_are_not_text_are_json_and_long_ones_are_cut() -> None:
    @dataclass
    class Booking:
        table: int
        at: datetime.date

    assert run(tool(lambda: None, name="n"), "n").content == "ok"
    assert run(tool(lambda: [1, "ü"], name="l"), "l").content == '[1, "ü"]'
    booked = run(tool(lambda: Booking(12, datetime.date(2026, 5, 1)), name="b"), "b")
    assert json.loads(booked.content) == {"table": 12, "at": "2026-05-01"}
    long = run(tool(lambda: "x" * 10_000, name="long"), "long").content
    assert long.startswith("x" * MAX_RESULT_CHARS) and "x" * (MAX_RESULT_CHARS + 1) not in long
    assert long.endswith(f"[cut: the first {MAX_RESULT_CHARS} of 10000 characters]")


def test_cancelling_the_runner_cancels_the_tool_and_is_not_swallowed() -> None:
    state = {"started": False, "cancelled": False}

    @tool
    async def wait() -> str:
        state["started"] = True
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return "never"

    async def main() -> None:
        task = asyncio.create_task(
            run_tool(Tools([wait]), ToolCall("1", "wait", "{}"), ToolContext(), 30))
        while not state["started"]:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert state["cancelled"]


# --- built-ins -------------------------------------------------------------------------------
class FakeControl:
    transport = "fake"

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.transfers: list[str] = []
        self.sent: list[str] = []

    async def transfer(self, target: str) -> str:
        if self.fail:
            raise CallControlError(self.fail)
        self.transfers.append(target)
        return f"transferred to {target}"

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None:
        self.sent.append(digits)


BUILTIN = builtin_tools()


def test_the_builtins_and_their_side_effects() -> None:
    assert BUILTIN.names == ["hang_up", "transfer_call", "gather_digits", "send_digits"]
    effects = {t.name: t.side_effects for t in BUILTIN}
    assert effects == {"hang_up": True, "transfer_call": True, "gather_digits": False,
                       "send_digits": True}
    assert all(t.context_param == "ctx" for t in BUILTIN)
    assert builtin_tools(["send_digits"]).names == ["send_digits"]
    with pytest.raises(ConfigError, match="unknown built-in tool.*'dial'"):
        builtin_tools(["dial"])


def test_hang_up_asks_the_call_to_end() -> None:
    ctx = ToolContext()
    result = run(BUILTIN, "hang_up", {"reason": "caller said bye"}, ctx)
    assert result.outcome == "ok" and result.side_effects and ctx.hangup == "agent"
    assert "caller said bye" in result.content
    ctx = ToolContext()
    assert run(BUILTIN, "hang_up", "", ctx).outcome == "ok" and ctx.hangup == "agent"


def test_transfer_call_goes_through_the_call_control() -> None:
    control = FakeControl()
    ctx = ToolContext(control=control)
    result = run(BUILTIN, "transfer_call", {"target": "+15550100"}, ctx)
    assert result.outcome == "ok" and result.content == "transferred to +15550100"
    assert control.transfers == ["+15550100"] and ctx.hangup == "transferred"
    # refused: the model hears why, the call goes on
    ctx = ToolContext(control=FakeControl(fail="the line is busy"))
    result = run(BUILTIN, "transfer_call", {"target": "+15550100"}, ctx)
    assert result.outcome == "error" and ctx.hangup == ""
    assert result.content == "error: CallControlError: the line is busy"
    # no call control at all (a browser call)
    result = run(BUILTIN, "transfer_call", {"target": "x"}, ToolContext())
    assert result.outcome == "error" and result.content.startswith("error: NotSupported: ")


def test_gather_digits_reads_the_keypad() -> None:
    async def main() -> tuple[ToolResult, ToolResult, ToolResult]:
        keypad = Keypad()
        ctx = ToolContext(keypad=keypad)
        for key in "42#9":  # typed ahead of the prompt: kept for the gather
            keypad.press(key)
        first = await run_tool(BUILTIN, ToolCall("1", "gather_digits", "{}"), ctx, 5)
        later = asyncio.create_task(run_tool(
            BUILTIN, ToolCall("2", "gather_digits", '{"count": 3, "timeout_s": 2}'), ctx, 5))
        await asyncio.sleep(0.02)
        for key in "12":
            keypad.press(key)
        second = await later
        none = await run_tool(BUILTIN, ToolCall("3", "gather_digits", '{"timeout_s": 0.05}'),
                              ToolContext(keypad=Keypad()), 5)
        return first, second, none

    first, second, none = asyncio.run(main())
    assert first.outcome == "ok" and not first.side_effects
    assert first.content == "the caller entered 42 (ended by terminator); digits: 42"
    assert second.content == "the caller entered 912 (ended by count); digits: 912"
    assert none.content == "the caller entered no digits (timeout); digits: (none)"
    result = run(BUILTIN, "gather_digits", {}, ToolContext())
    assert result.outcome == "error" and "NotSupported: this call has no keypad" in result.content


def test_send_digits_presses_keys_on_the_line() -> None:
    control = FakeControl()
    result = run(BUILTIN, "send_digits", {"digits": "12#"}, ToolContext(control=control))
    assert result.outcome == "ok" and control.sent == ["12#"] and result.content == "sent 12#"
    bad = run(BUILTIN, "send_digits", {"digits": "12x"}, ToolContext(control=control))
    assert bad.outcome == "error" and "use only 0-9 * # A-D" in bad.content
    assert control.sent == ["12#"]
    missing = run(BUILTIN, "send_digits", {"digits": "1"}, ToolContext())
    assert missing.outcome == "error" and "NotSupported" in missing.content
