"""The OpenAI-compatible client against real servers on loopback: llama.cpp's own server
running SmolLM2, and small scripted HTTP servers for error statuses and odd SSE streams."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_server import free_port, llama_server

from agent.config import LLMConfig
from agent.errors import VoxlineError
from stages.llm.openai import LLMConnectionError, LLMServerError, OpenAILLM

KEY = "test-key"
HELLO = [{"role": "user", "content": "Say hello to me."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port; yields its /v1 base URL."""
    with llama_server(tmp_path_factory.mktemp("llama_server"), api_key=KEY) as base:
        yield base


def client(
    base_url: str, api_key: str = KEY, max_tokens: int = 24, model: str = "", timeout_s: float = 30
) -> OpenAILLM:
    cfg = LLMConfig(
        backend="openai",
        base_url=base_url,
        api_key=api_key,
        model=model,
        max_tokens=max_tokens,
        temperature=0.0,
        timeout_s=timeout_s,
    )
    return OpenAILLM(cfg)


async def collect(llm: OpenAILLM, messages: list[dict[str, str]] = HELLO) -> list[str]:
    try:
        return [t async for t in llm.stream(messages)]
    finally:
        await llm.aclose()


def test_streams_a_reply_from_llama_cpp_server(server: str) -> None:
    deltas = asyncio.run(collect(client(server)))
    assert len(deltas) >= 3 and all(deltas)
    assert "".join(deltas).strip()


def test_cancelling_closes_the_stream_and_the_server_serves_the_next_request(server: str) -> None:
    async def main() -> list[str]:
        llm = client(server, max_tokens=200)
        seen: list[str] = []

        async def consume() -> None:
            async for t in llm.stream([{"role": "user", "content": "Tell me a long story."}]):
                seen.append(t)

        task = asyncio.create_task(consume())
        while len(seen) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        count = len(seen)
        await asyncio.sleep(0.2)
        assert len(seen) == count
        await llm.aclose()
        return await collect(client(server))

    assert asyncio.run(main())


def test_a_wrong_api_key_is_a_401_with_the_servers_message(server: str) -> None:
    with pytest.raises(LLMServerError) as info:
        asyncio.run(collect(client(server, api_key="wrong")))
    assert info.value.status == 401
    assert server in str(info.value) and "401" in str(info.value)
    assert info.value.server_message


def test_a_wrong_path_is_a_404(server: str) -> None:
    with pytest.raises(LLMServerError) as info:
        asyncio.run(collect(client(server.replace("/v1", "/nope"))))
    assert info.value.status == 404


def test_connection_refused_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(LLMConnectionError, match=f"{url}/chat/completions"):
        asyncio.run(collect(client(url)))


# --- scripted servers ------------------------------------------------------------------------


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the class's status and body, written in pieces (a number in
    ``pieces`` is a pause in seconds)."""

    status = 200
    content_type = "text/event-stream"
    pieces: list[bytes | float] = []
    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        length = int(self.headers.get("Content-Length", 0))
        type(self).requests.append(
            {"auth": self.headers.get("Authorization"), "body": json.loads(self.rfile.read(length))}
        )
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for piece in self.pieces:
                if isinstance(piece, float):
                    time.sleep(piece)
                    continue
                self.wfile.write(piece)
                self.wfile.flush()
                time.sleep(0.005)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as some tests intend

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def scripted(
    status: int, pieces: list[bytes | float], content_type: str = "text/event-stream"
) -> Iterator[tuple[str, type[Scripted]]]:
    """A loopback HTTP server answering with ``pieces``; yields its /v1 URL and handler class."""
    handler = type(
        "Handler",
        (Scripted,),
        {"status": status, "pieces": pieces, "content_type": content_type, "requests": []},
    )
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.block_on_close = False  # a handler still pausing must not hold up the test
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def chunk(text: str) -> bytes:
    return json.dumps(
        {"choices": [{"index": 0, "delta": {"content": text}}]}, ensure_ascii=False
    ).encode()


def test_a_5xx_carries_the_status_and_the_servers_message() -> None:
    body = json.dumps({"error": {"message": "model is overloaded", "type": "server_error"}})
    with (
        scripted(503, [body.encode()], "application/json") as (url, _),
        pytest.raises(LLMServerError, match="model is overloaded") as info,
    ):
        asyncio.run(collect(client(url)))
    assert info.value.status == 503 and isinstance(info.value, VoxlineError)


def test_odd_but_valid_sse_streams_parse() -> None:
    split = b"data: " + chunk("w\u00e9rld") + b"\n\n"
    cut = split.index(b"\xc3") + 1  # inside the two-byte UTF-8 "é"
    pieces = [
        b": keep-alive\r\n\r\n",
        b"data: " + chunk("Hel") + b"\r\n\r\n",
        b"event: message\nda",
        b"ta: " + chunk("lo, ") + b"\n\n",
        b'data: {"choices": []}\n\n',  # a usage-only chunk
        b":\n\n",
        split[:cut],
        split[cut:-1],
        split[-1:],
        b"data: [DONE]\n\n",
        b"data: " + chunk("after done") + b"\n\n",
    ]
    with scripted(200, pieces) as (url, _):
        assert "".join(asyncio.run(collect(client(url)))) == "Hello, w\u00e9rld"


def test_a_stream_without_done_ends_when_the_server_closes() -> None:
    pieces = [b"data: " + chunk("one") + b"\n\n", b"data: " + chunk(" two")]
    with scripted(200, pieces) as (url, _):
        assert "".join(asyncio.run(collect(client(url)))) == "one two"


def test_an_error_event_inside_the_stream_raises() -> None:
    pieces = [
        b"data: " + chunk("Hi") + b"\n\n",
        b'data: {"error": {"message": "generation crashed"}}\n\n',
    ]
    with (
        scripted(200, pieces) as (url, _),
        pytest.raises(LLMServerError, match="generation crashed"),
    ):
        asyncio.run(collect(client(url)))


def test_the_request_carries_key_model_and_stream_flag() -> None:
    with scripted(200, [b"data: [DONE]\n\n"]) as (url, handler):
        assert asyncio.run(collect(client(url, model="my-model"))) == []
    (req,) = handler.requests
    assert req["auth"] == f"Bearer {KEY}"
    assert req["body"]["model"] == "my-model" and req["body"]["stream"] is True
    assert req["body"]["messages"] == HELLO


def test_a_server_that_stops_answering_times_out_with_a_clear_error() -> None:
    seen: list[str] = []

    async def consume(llm: OpenAILLM) -> None:
        try:
            async for t in llm.stream(HELLO):
                seen.append(t)
        finally:
            await llm.aclose()

    # The first chunk must beat the timeout and the 3-s pause must not: the first chunk came
    # 6-140 ms after the request with four busy loops on 2 cores, so 1 s leaves it a wide margin.
    pieces: list[bytes | float] = [b"data: " + chunk("Hi") + b"\n\n", 3.0, b"data: [DONE]\n\n"]
    with (
        scripted(200, pieces) as (url, _),
        pytest.raises(LLMConnectionError, match="did not answer within 1.0 s"),
    ):
        asyncio.run(consume(client(url, timeout_s=1.0)))
    assert seen == ["Hi"]


# --- deadlines, bounds and fault codes (issue 18) ---------------------------------------------


def test_keepalives_after_a_sentence_do_not_hold_the_reply_open() -> None:
    """The old timeout was per read: a comment every 50 ms kept the reply open for good."""
    from stages.llm.openai import LLMTimeoutError, ReplyDeadlines

    seen: list[str] = []
    pieces: list[bytes | float] = [b"data: " + chunk("One sentence. ") + b"\n\n"]
    pieces += [0.05, b": keep-alive\n\n"] * 200  # ten seconds of nothing but pings

    async def consume(llm: OpenAILLM) -> float:
        t0 = time.monotonic()
        try:
            async for t in llm.stream(HELLO):
                seen.append(t)
        finally:
            await llm.aclose()
        return time.monotonic() - t0

    deadlines = ReplyDeadlines(first_token_s=5.0, idle_s=0.5, total_s=30.0)
    with scripted(200, pieces) as (url, _):
        llm = OpenAILLM(LLMConfig(backend="openai", base_url=url, api_key=KEY), deadlines)
        t0 = time.monotonic()
        with pytest.raises(LLMTimeoutError, match="within 0.5 s of its last token") as info:
            asyncio.run(consume(llm))
    assert 0.4 <= time.monotonic() - t0 < 5.0  # not the ten seconds of pings
    assert seen == ["One sentence. "] and info.value.code == "llm_timeout"


def test_the_deadlines_default_from_timeout_s() -> None:
    from stages.llm.openai import IDLE_TIMEOUT_S, REPLY_TIMEOUT_S, ReplyDeadlines

    assert ReplyDeadlines.for_timeout(30.0) == ReplyDeadlines(30.0, IDLE_TIMEOUT_S, REPLY_TIMEOUT_S)
    assert ReplyDeadlines.for_timeout(2.0) == ReplyDeadlines(2.0, 2.0, REPLY_TIMEOUT_S)
    assert ReplyDeadlines.for_timeout(90.0).total_s == 90.0
    assert client("http://127.0.0.1:9/v1", timeout_s=3.0).deadlines == ReplyDeadlines.for_timeout(3.0)


def test_an_event_over_the_size_bound_is_a_bad_response() -> None:
    from stages.llm.openai import LLMProtocolError

    pieces: list[bytes | float] = [b"data: " + b"x" * 4000 + b"\n\n"]
    with scripted(200, pieces) as (url, _):
        llm = OpenAILLM(LLMConfig(backend="openai", base_url=url), max_event_size=1000)
        with pytest.raises(LLMProtocolError, match="limit of 1000") as info:
            asyncio.run(collect(llm))
    assert info.value.code == "llm_bad_response"


def test_a_200_that_is_no_event_stream_is_a_bad_response_not_an_empty_reply() -> None:
    from stages.llm.openai import LLMProtocolError

    page = [b"<html><body>Welcome to the proxy</body></html>\n"]
    with (
        scripted(200, page, "text/html") as (url, _),
        pytest.raises(LLMProtocolError, match="ended without a reply"),
    ):
        asyncio.run(collect(client(url)))


def test_malformed_json_in_an_event_is_a_bad_response() -> None:
    from stages.llm.openai import LLMProtocolError

    pieces: list[bytes | float] = [b'data: {"choices": [{"delta": {"content": "Hi\n\n']
    with scripted(200, pieces) as (url, _), pytest.raises(LLMProtocolError) as info:
        asyncio.run(collect(client(url)))
    assert info.value.code == "llm_bad_response"


def test_each_failure_carries_its_code() -> None:
    from stages.faults import StageFault
    from stages.llm.openai import LLMProtocolError, LLMTimeoutError

    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(LLMConnectionError) as refused:
        asyncio.run(collect(client(url)))
    assert refused.value.code == "llm_unavailable" and isinstance(refused.value, StageFault)
    body = json.dumps({"error": {"message": "overloaded"}}).encode()
    with scripted(500, [body], "application/json") as (url, _), pytest.raises(LLMServerError) as e:
        asyncio.run(collect(client(url)))
    assert e.value.code == "llm_unavailable"
    assert issubclass(LLMTimeoutError, LLMConnectionError) and LLMTimeoutError.code == "llm_timeout"
    assert issubclass(LLMProtocolError, LLMServerError)


def test_an_error_body_is_read_only_up_to_a_bound() -> None:
    huge = b'{"error": {"message": "' + b"y" * (4 << 20) + b'"}}'
    with scripted(500, [huge], "application/json") as (url, _), pytest.raises(LLMServerError) as e:
        asyncio.run(collect(client(url)))
    assert e.value.status == 500 and len(str(e.value)) < 2000


ECHO_SSE_SERVER = r'''
import asyncio, json, sys
from aiohttp import web

async def complete(request):
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for word in ("You ", "said ", "so."):
        delta = {"choices": [{"delta": {"content": word}, "index": 0}]}
        await resp.write(f"data: {json.dumps(delta)}\n\n".encode())
        await asyncio.sleep(0.002)
    await resp.write(b"data: [DONE]\n\n")
    return resp

async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
'''


def test_replies_cancelled_while_connecting_leave_no_connection_behind() -> None:
    # httpcore keeps a connection for good when a request is cancelled during its set-up
    # (encode/httpcore#1093); calls cut mid-turn and discarded speculative replies cancel
    # replies all the time, and at the pool's limit every later reply would fail
    import random

    srv = subprocess.Popen([sys.executable, "-c", ECHO_SSE_SERVER], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)  # (it logs the cut requests)
    try:
        url = srv.stdout.readline().strip()

        async def main() -> tuple[int, list[str]]:
            llm = OpenAILLM(LLMConfig(backend="openai", base_url=url))
            rnd = random.Random(1)

            async def consume() -> None:
                async for _ in llm.stream(HELLO):
                    await asyncio.sleep(0.005)

            loop = asyncio.get_running_loop()
            for max_ms in (2, 5, 20):
                for _ in range(10):
                    tasks = [asyncio.create_task(consume()) for _ in range(20)]
                    await asyncio.sleep(0)
                    for t in tasks:
                        loop.call_later(rnd.uniform(0, max_ms) / 1000, t.cancel)
                    await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(1.0)
            pool = llm._client._transport._pool  # (the test reads httpcore's own state)
            held = sum(not c.is_idle() and not c.is_closed() for c in pool.connections)
            after = await collect(llm)  # and a reply still comes through
            await llm.aclose()
            return held, after

        held, after = asyncio.run(main())
        assert held == 0
        assert "".join(after) == "You said so."
    finally:
        srv.terminate()
        srv.wait(timeout=10)


# --- server_prefill ----------------------------------------------------------------------------

TURN = "I would like to book a table for four people tonight at seven please"
SYSTEM = {"role": "system", "content": "You are a friendly voice assistant on a phone call."}


def prefilling(base_url: str, api_key: str = "") -> OpenAILLM:
    return OpenAILLM(LLMConfig(backend="openai", base_url=base_url, api_key=api_key,
                               max_tokens=4, temperature=0.0, server_prefill=True))


def evaluated(log: Path) -> int:
    """The prompt tokens llama_cpp.server evaluated for its latest request (its verbose log:
    'Llama.generate: N prefix-match hit, remaining M prompt tokens to eval')."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "prefix-match hit" in ln]
    assert lines, "the server logged no prefix match"
    return int(re.search(r"remaining (\d+) prompt tokens", lines[-1]).group(1))


def test_a_prefill_of_the_words_so_far_leaves_the_reply_only_the_rest(tmp_path: Path) -> None:
    """A real llama_cpp.server: the reply's request after a prefill of the turn's first nine
    words evaluates only what follows them, against the whole turn without one."""
    with llama_server(tmp_path) as base:
        asyncio.run(_a_prefill_leaves_the_rest(base, tmp_path / "server.log"))


async def _a_prefill_leaves_the_rest(base: str, log: Path) -> None:
    llm = prefilling(base)
    assert llm.capabilities.prefill and llm.capabilities.partial_prefill
    hello = [SYSTEM, {"role": "user", "content": "Hi"}]
    whole = [SYSTEM, {"role": "user", "content": TURN}]
    so_far = [SYSTEM, {"role": "user", "content": " ".join(TURN.split()[:9])}]
    try:
        assert [t async for t in llm.stream(hello)]  # the cache now ends after "Hi"
        assert [t async for t in llm.stream(whole)]
        cold = evaluated(log)
        assert [t async for t in llm.stream(hello)]
        await llm.prefill(so_far, open_turn=True)
        assert llm.prefills == 1
        reply = [t async for t in llm.stream(whole)]
        warm = evaluated(log)
    finally:
        await llm.aclose()
    assert reply
    # measured: 20 tokens cold, 11 after the prefill (the other five words and the turn's
    # close); without one both would be the same
    assert warm <= cold - 6, (cold, warm)


def test_prefill_is_off_by_default_and_then_sends_nothing() -> None:
    with scripted(200, [b"data: " + chunk("Hi") + b"\n\n", b"data: [DONE]\n\n"]) as (url, h):
        llm = client(url)
        assert not llm.capabilities.prefill and not llm.capabilities.partial_prefill

        async def go() -> None:
            await llm.prefill(HELLO)
            await llm.aclose()

        asyncio.run(go())
        assert h.requests == [] and llm.prefills == 0


def test_a_prefill_asks_for_one_token_and_never_while_a_reply_streams() -> None:
    pieces: list[bytes | float] = [b"data: " + chunk("Sure,") + b"\n\n", 0.4,
                                   b"data: [DONE]\n\n"]
    with scripted(200, pieces) as (url, h):
        asyncio.run(_one_token_and_never_while_a_reply_streams(url, h))


async def _one_token_and_never_while_a_reply_streams(url: str, h: type[Scripted]) -> None:
    llm = prefilling(url, api_key=KEY)
    tools = [{"type": "function", "function": {"name": "book", "parameters": {}}}]
    try:
        await llm.prefill(HELLO, tools)
        assert len(h.requests) == 1
        body = h.requests[0]["body"]
        assert body["messages"] == HELLO and body["tools"] == tools
        assert body["max_tokens"] == 1 and body["stream"] is False
        assert h.requests[0]["auth"] == f"Bearer {KEY}"
        stream = llm.stream(HELLO)
        assert await anext(stream) == "Sure,"  # the reply is streaming: its server is busy
        skipped = llm.prefill(HELLO)
        assert skipped.done()
        assert [t async for t in stream] == []
        await asyncio.sleep(0.05)
        assert len(h.requests) == 2 and llm.prefills == 1
    finally:
        await llm.aclose()


def test_a_prefill_to_a_dead_server_fails_quietly_and_the_reply_says_why() -> None:
    async def go() -> None:
        llm = prefilling(f"http://127.0.0.1:{free_port()}/v1")
        try:
            await llm.prefill(HELLO)  # no exception: a prefill is best effort
            with pytest.raises(LLMConnectionError, match="cannot connect"):
                [t async for t in llm.stream(HELLO)]
        finally:
            await llm.aclose()

    asyncio.run(go())
