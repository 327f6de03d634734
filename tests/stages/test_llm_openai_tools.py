"""Tool calling through the OpenAI-compatible client, against scripted SSE servers on loopback:
fragments put together by index, parallel calls, whole calls in one delta or in a final
message, llama.cpp's repeated ids and names, malformed calls, and the deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from booking_tools import announced

from agent.config import LLMConfig
from agent.tools import ToolCall, ToolContext, Tools, run_tool, tool
from stages.llm.openai import LLMProtocolError, LLMTimeoutError, OpenAILLM, ReplyDeadlines

TOOLS = [{"type": "function", "function": {
    "name": "book_table", "description": "Book a table.",
    "parameters": {"type": "object", "properties": {"party": {"type": "integer"}},
                   "required": ["party"]}}}]
ASK = [{"role": "user", "content": "A table for two."}]


class Handler(http.server.BaseHTTPRequestHandler):
    pieces: list[bytes | float] = []
    requests: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        length = int(self.headers.get("Content-Length", 0))
        type(self).requests.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for piece in self.pieces:
                if isinstance(piece, float):
                    time.sleep(piece)
                    continue
                self.wfile.write(piece)
                self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def server(pieces: list[bytes | float]) -> Iterator[tuple[str, type[Handler]]]:
    handler = type("H", (Handler,), {"pieces": pieces, "requests": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.block_on_close = False
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def event(delta: dict[str, Any] | None = None, finish: str | None = None,
          message: dict[str, Any] | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    if message is not None:
        choice["message"] = message
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


def frag(index: int | None = None, id: str | None = None, name: str | None = None,
         args: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"function": {}}
    if index is not None:
        part["index"] = index
    if id is not None:
        part["id"], part["type"] = id, "function"
    if name is not None:
        part["function"]["name"] = name
    if args is not None:
        part["function"]["arguments"] = args
    return part


def calls_delta(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(parts)}


DONE = b"data: [DONE]\n\n"


def collect(url: str, tools: list[dict[str, Any]] | None = TOOLS, tool_choice: Any = None,
            deadlines: ReplyDeadlines | None = None) -> list[Any]:
    async def main() -> list[Any]:
        llm = OpenAILLM(LLMConfig(backend="openai", base_url=url, api_key="k", max_tokens=16),
                        deadlines=deadlines)
        try:
            if tools is None:
                return [t async for t in llm.stream(ASK)]
            return announced(
                [t async for t in llm.stream(ASK, tools=tools, tool_choice=tool_choice)])
        finally:
            await llm.aclose()

    return asyncio.run(main())


def test_fragments_by_index_make_one_call_and_the_request_carries_the_tools() -> None:
    choice = {"type": "function", "function": {"name": "book_table"}}
    pieces = [
        event({"role": "assistant", "content": None}),
        event(calls_delta(frag(0, "call_a", "book_table", ""))),
        event(calls_delta(frag(0, args='{"par'))),
        event(calls_delta(frag(0, args='ty": '))),
        event(calls_delta(frag(0, args="2}"))),
        event({}, finish="tool_calls"),
        DONE,
    ]
    with server(pieces) as (url, handler):
        out = collect(url, tool_choice=choice)
    assert out == [[ToolCall("call_a", "book_table", '{"party": 2}')]]
    body = handler.requests[0]
    assert body["tools"] == TOOLS and body["tool_choice"] == choice and body["stream"] is True


def test_parallel_calls_interleaved_come_back_in_index_order() -> None:
    pieces = [
        event(calls_delta(frag(0, "c0", "book_table", '{"party"'))),
        event(calls_delta(frag(1, "c1", "book_table", '{"party": 5}'))),
        event(calls_delta(frag(0, args=": 2}"))),
        event({}, finish="tool_calls"),
        DONE,
    ]
    with server(pieces) as (url, _):
        out = collect(url)
    assert out == [[ToolCall("c0", "book_table", '{"party": 2}'),
                    ToolCall("c1", "book_table", '{"party": 5}')]]


def test_text_then_a_whole_call_in_one_delta_ending_with_stop() -> None:
    pieces = [
        event({"content": "Let me "}),
        event({"content": "check."}),
        event(calls_delta(frag(0, "c9", "book_table", '{"party": 3}'))),
        event({}, finish="stop"),  # some servers say "stop" after calls
        DONE,
    ]
    with server(pieces) as (url, _):
        out = collect(url)
    assert out == ["Let me ", "check.", [ToolCall("c9", "book_table", '{"party": 3}')]]


def test_llama_cpp_repeats_id_and_name_in_every_fragment() -> None:
    # as llama_cpp.server 0.3.36 streams a forced call (see /tmp/h/probe_llama_server_tools.md)
    cid = "call__0_book_table_cmpl-49bb"
    pieces = [event({"role": "assistant", "content": None, "tool_calls": None})]
    pieces += [event({"role": None, "content": None,
                      "function_call": {"name": "book_table", "arguments": a},
                      "tool_calls": [frag(0, cid, "book_table", a)]})
               for a in ['{"', "party", '":', " 2", "}", ""]]
    pieces += [event({"tool_calls": None}, finish="tool_calls"), DONE]
    with server(pieces) as (url, _):
        out = collect(url)
    assert out == [[ToolCall(cid, "book_table", '{"party": 2}')]]


def test_calls_in_a_final_message_replace_what_the_deltas_built() -> None:
    whole = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "m1", "type": "function",
         "function": {"name": "book_table", "arguments": {"party": 4}}}]}
    pieces = [
        event(calls_delta(frag(0, "m1", "book_table", '{"party": 4}'))),
        event(message=whole, finish="tool_calls"),  # the same call again, whole
    ]  # and no [DONE]: the server just closes
    with server(pieces) as (url, _):
        out = collect(url)
    assert out == [[ToolCall("m1", "book_table", '{"party": 4}')]]


def test_missing_index_and_id_are_filled_in() -> None:
    pieces = [event(calls_delta(frag(None, None, "book_table", '{"party": 1}'),
                                frag(None, None, "hang_up", ""))), DONE]
    with server(pieces) as (url, _):
        out = collect(url)
    assert out == [[ToolCall("call_0", "book_table", '{"party": 1}'),
                    ToolCall("call_1", "hang_up", "")]]


def test_malformed_arguments_pass_through_and_the_runner_says_what_is_wrong() -> None:
    pieces = [event(calls_delta(frag(0, "c", "book_table", '{"party": 2'))),
              event({}, finish="length"), DONE]
    with server(pieces) as (url, _):
        out = collect(url)
    assert out == [[ToolCall("c", "book_table", '{"party": 2')]]

    @tool
    def book_table(party: int) -> str:
        return f"booked for {party}"

    result = asyncio.run(run_tool(Tools([book_table]), out[0][0], ToolContext(), 5))
    assert result.outcome == "invalid" and "not valid JSON" in result.content


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        ({"tool_calls": "book_table"}, "tool_calls is not a list"),
        ({"tool_calls": ["x"]}, "a tool call is not an object"),
        ({"tool_calls": [{"index": "0", "function": {"name": "f"}}]}, "cannot be read"),
        ({"tool_calls": [frag(0, "c", None, "{}")]}, "tool call 0 has no function name"),
    ],
)
def test_tool_calls_that_cannot_be_read_are_a_bad_response(
    delta: dict[str, Any], message: str
) -> None:
    with server([event(delta), DONE]) as (url, _), pytest.raises(LLMProtocolError) as err:
        collect(url)
    assert message in str(err.value)


def test_without_tools_the_request_has_none_and_the_old_call_works() -> None:
    pieces = [event({"content": "hi"}), DONE]
    with server(pieces) as (url, handler):
        assert collect(url, tools=None) == ["hi"]
        assert collect(url, tools=[]) == ["hi"]
    assert all("tools" not in b and "tool_choice" not in b for b in handler.requests)


def test_tools_offered_and_a_text_reply_is_just_text() -> None:
    pieces = [event({"role": "assistant", "content": None, "tool_calls": None}),
              event({"content": "Sure."}), event({}, finish="stop"), DONE]
    with server(pieces) as (url, _):
        assert collect(url, tool_choice="auto") == ["Sure."]


def test_an_empty_stream_with_tools_is_still_a_bad_response() -> None:
    # llama_cpp.server's chatml-function-calling with stream + tool_choice "auto" answers
    # 200 and then nothing, when the model picks a function
    with server([]) as (url, _), pytest.raises(LLMProtocolError, match="without a reply"):
        collect(url, tool_choice="auto")


def test_tool_call_fragments_count_as_activity_for_the_deadlines() -> None:
    # 12 fragments 0.1 s apart, no text: 1.2 s, past the 0.6 s first-token wait
    parts: list[bytes | float] = [event(calls_delta(frag(0, "c", "book_table", "")))]
    for a in ['{"party":', " 1", "}"] + [""] * 9:
        parts += [0.1, event(calls_delta(frag(0, args=a)))]
    parts += [DONE]
    deadlines = ReplyDeadlines(first_token_s=0.6, idle_s=0.6, total_s=30)
    with server(parts) as (url, _):
        out = collect(url, deadlines=deadlines)
    assert out == [[ToolCall("c", "book_table", '{"party": 1}')]]
    # and a stall between fragments is still a stall
    stalled: list[bytes | float] = [event(calls_delta(frag(0, "c", "book_table", "{"))), 2.0,
                                    event(calls_delta(frag(0, args="}"))), DONE]
    with server(stalled) as (url, _), pytest.raises(LLMTimeoutError, match="last token"):
        collect(url, deadlines=ReplyDeadlines(first_token_s=5, idle_s=0.4, total_s=30))
