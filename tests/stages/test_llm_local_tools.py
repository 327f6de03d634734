"""Tool calling on the local model: tool turns written as text any chat template accepts, the
mark held back from speech, the call grammar, and SmolLM2 making forced calls whose arguments
fit the schema."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from booking_tools import announced, book_table

from agent.config import LLMConfig
from agent.errors import ConfigError
from agent.tools import ToolCall, ToolContext, Tools, builtin_tools, run_tool
from stages.llm.local import LocalLLM, _offer
from stages.llm.tool_text import (
    TOOL_END,
    TOOL_MARK,
    CallWatch,
    call_grammar,
    call_text,
    parse_calls,
    tool_turns_as_text,
    tools_addendum,
)

TOOLS = Tools([book_table, *builtin_tools(["hang_up"])])
SPECS = TOOLS.specs()
ASK = [
    {"role": "system", "content": "You book tables at a restaurant."},
    {"role": "user", "content": "Book a table for 4 people at 7pm under the name Ana."},
]
NAMED = {"type": "function", "function": {"name": "book_table"}}


# --- without the model -----------------------------------------------------------------------
def feed_all(watch: CallWatch, deltas: list[str]) -> list[str]:
    out = []
    for d in deltas:
        said = watch.feed(d)
        if said:
            out.append(said)
        if watch.found:
            break
    return out


def test_the_watch_holds_back_what_could_begin_the_mark() -> None:
    watch = CallWatch()
    assert feed_all(watch, ["Sure, ", "one moment <to", "ol_", "call>{", '"name"']) == [
        "Sure, ", "one moment "]
    assert watch.found and watch.text == "Sure, one moment "
    # a "<" that turns out to be something else is said after all, in order
    watch = CallWatch()
    assert feed_all(watch, ["a <", "tool", "s> b", " <"]) == ["a ", "<tools> b", " "]
    assert not watch.found and watch.flush() == "<" and watch.text == "a <tools> b <"


def test_tool_turns_become_text_a_plain_template_accepts() -> None:
    plain = [{"role": "user", "content": "hi"}]
    assert tool_turns_as_text(plain, None) is plain  # nothing to change: the same list
    call = {"id": "c1", "type": "function",
            "function": {"name": "book_table", "arguments": '{"party_size": 2}'}}
    messages = ASK + [
        {"role": "assistant", "content": "Let me book it.", "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "c1", "name": "book_table", "content": "booked"},
        {"role": "tool", "tool_call_id": "c1", "name": "book_table", "content": "taken"},
        {"role": "assistant", "content": "Done."},
    ]
    out = tool_turns_as_text(messages, SPECS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert all(set(m) == {"role", "content"} for m in out)
    assert out[0]["content"] == ASK[0]["content"] + tools_addendum(SPECS)
    one = '<tool_call>{"name": "book_table", "arguments": {"party_size": 2}}</tool_call>'
    assert call_text("book_table", '{"party_size": 2}') == one
    assert out[2]["content"] == f"Let me book it.\n{one}\n{one}"
    assert out[3]["content"] == ('<tool_response name="book_table">\nbooked\n</tool_response>\n'
                                 '<tool_response name="book_table">\ntaken\n</tool_response>')
    # no system prompt: the tools get one of their own
    alone = tool_turns_as_text([{"role": "user", "content": "hi"}], SPECS)
    assert alone[0] == {"role": "system", "content": tools_addendum(SPECS).lstrip()}


def test_the_addendum_describes_every_tool_the_same_way_each_time() -> None:
    text = tools_addendum(SPECS)
    assert text == tools_addendum(json.loads(json.dumps(SPECS)))
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert [t["name"] for t in lines] == ["book_table", "hang_up"]
    assert lines[0]["parameters"] == book_table.parameters
    assert TOOL_MARK in text and TOOL_END in text


def test_calls_are_read_back_from_what_the_grammar_let_the_model_write() -> None:
    text = ('{"name": "book_table", "arguments": {"party_size": 2} }</tool_call>\n'
            '<tool_call>{"name": "hang_up", "arguments": {}}</tool_call>')
    calls = parse_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("book_table", '{"party_size": 2}'), ("hang_up", "{}")]
    assert calls[0].id != calls[1].id
    cut = parse_calls('{"name": "book_table", "arguments": {"party_size": 2, "na')
    assert [(c.name, c.arguments) for c in cut] == [("book_table", '{"party_size": 2, "na')]
    assert parse_calls("nonsense") == []


def test_the_grammar_keeps_to_the_tools_and_the_count() -> None:
    every = call_grammar(SPECS)
    assert '\\"name\\": \\"book_table\\"' in every and '\\"name\\": \\"hang_up\\"' in every
    assert "{0,2}" in every  # up to three calls
    one = call_grammar(SPECS, "hang_up", calls=1)
    assert "book_table" not in one and "{0," not in one
    named = call_grammar(SPECS, "book_table", calls=1, named=True)
    assert "call ::= \" \" args-0" in named  # the envelope is in the prompt
    with pytest.raises(ConfigError, match="'dial'"):
        call_grammar(SPECS, "dial")


def test_tool_choice_values() -> None:
    assert _offer(None, "required") is None and _offer([], None) is None
    assert _offer(SPECS, None).force is None and _offer(SPECS, "auto").allowed
    assert not _offer(SPECS, "none").allowed
    assert _offer(SPECS, "required").force == ""
    assert _offer(SPECS, NAMED).force == "book_table"
    for bad in ("book_table", {"type": "function", "function": {"name": "dial"}}):
        with pytest.raises(ConfigError, match="tool_choice"):
            _offer(SPECS, bad)


# --- SmolLM2 ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    pytest.importorskip("llama_cpp")
    model = LocalLLM(LLMConfig(max_tokens=24, temperature=0.0, threads=1))
    model.warmup()
    return model


def stream(llm: LocalLLM, messages: list[dict[str, Any]], tools: Any = SPECS,
           choice: Any = None) -> tuple[list[Any], float]:
    async def main() -> tuple[list[Any], float]:
        start = time.perf_counter()
        out = [x async for x in llm.stream(messages, tools=tools, tool_choice=choice)]
        return announced(out), time.perf_counter() - start

    return asyncio.run(main())


def only_call(out: list[Any]) -> ToolCall:
    assert len(out) == 1 and isinstance(out[0], list) and len(out[0]) == 1, out
    return out[0][0]


def test_the_model_declares_tools(llm: LocalLLM) -> None:
    assert llm.capabilities.tools and llm.capabilities.prefill


def test_a_named_tool_choice_is_one_call_with_arguments_the_schema_allows(
    llm: LocalLLM,
) -> None:
    stream(llm, ASK, choice=NAMED)  # the tools' prompt into the cache
    out, seconds = stream(llm, ASK, choice=NAMED)
    call = only_call(out)
    assert call.name == "book_table"
    args = json.loads(call.arguments)
    assert set(args) == {"name", "party_size", "time"} and isinstance(args["party_size"], int)
    result = asyncio.run(run_tool(TOOLS, call, ToolContext(), 5))
    assert result.outcome == "ok", result.content
    print(f"forced call on SmolLM2: {seconds * 1000:.0f} ms, {call.arguments}, {llm.last}")


def test_required_is_one_call_to_an_offered_tool(llm: LocalLLM) -> None:
    call = only_call(stream(llm, ASK, choice="required")[0])
    assert call.name in TOOLS
    assert asyncio.run(run_tool(TOOLS, call, ToolContext(), 5)).outcome == "ok"


def test_the_follow_up_with_the_result_continues_the_cached_prompt(llm: LocalLLM) -> None:
    call = only_call(stream(llm, ASK, choice=NAMED)[0])
    first = llm.last
    history = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": "booked"},
    ]
    out, _ = stream(llm, history, choice="none")
    assert out and all(isinstance(x, str) for x in out)  # no call allowed: text only
    assert TOOL_MARK not in "".join(out)
    # the call's prompt (the tools described, the caller's words, the call's beginning) is
    # all in the cache; from there the model may have chosen other tokens than the text's own
    # (" " "{" for " {"), so what it wrote may be evaluated again
    assert llm.last.reused >= first.prompt - 1, (first, llm.last)


def test_without_tools_the_reply_is_text_as_before(llm: LocalLLM) -> None:
    out, _ = stream(llm, ASK, tools=None)
    assert out and all(isinstance(x, str) for x in out)


def test_a_schema_that_makes_no_grammar_is_a_clear_error(llm: LocalLLM) -> None:
    odd = [{"type": "function", "function": {
        "name": "fetchy", "description": "",
        "parameters": {"type": "object", "properties": {
            "x": {"$ref": "https://example.com/schema.json"}}}}}]
    with pytest.raises(ConfigError, match="cannot call the tools fetchy"):
        stream(llm, ASK, tools=odd, choice="required")
    out, _ = stream(llm, ASK, tools=None)  # the model is still fine
    assert out
