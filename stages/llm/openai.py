"""A client for any OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang,
llama.cpp server, Ollama, hosted APIs), streaming the reply as Server-Sent Events over httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass
from typing import Any

from agent.config import LLMConfig
from agent.errors import require
from agent.tools import CALLS_COMING, CallsComing, ToolCall
from stages.faults import LLM_BAD_RESPONSE, LLM_TIMEOUT, LLM_UNAVAILABLE, StageFault
from stages.llm.chat import LLMCapabilities
from stages.llm.sse import MAX_SIZE, SSEParser, SSEProtocolError

# Connecting should fail fast even when a slow model is allowed a long first token.
_CONNECT_TIMEOUT_S = 5.0
# A refused connection is tried once more after this pause (a server restarting): nothing
# was sent, so nothing can be said twice.
_RETRY_PAUSE_S = 0.25
_MAX_ERROR_BODY = 64 << 10  # bytes of an HTTP error's body read for the log

log = logging.getLogger("voxline.llm")

IDLE_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 60.0


class LLMServerError(StageFault):
    """The LLM server answered with an HTTP error (or an error event inside the stream)."""

    code = LLM_UNAVAILABLE

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"LLM server {url} answered HTTP {status}: {message}")
        self.url = url
        self.status = status
        self.server_message = message


class LLMProtocolError(LLMServerError):
    """The server's stream could not be read: not Server-Sent Events of JSON chunks, a line
    over the parser's bound, or no reply at all before it ended."""

    code = LLM_BAD_RESPONSE


class LLMConnectionError(StageFault):
    """The LLM server could not be reached, or the connection broke."""

    code = LLM_UNAVAILABLE


class LLMTimeoutError(LLMConnectionError):
    """The LLM server did not answer within one of the reply's deadlines."""

    code = LLM_TIMEOUT


@dataclass(slots=True, frozen=True)
class ReplyDeadlines:
    """How long one reply may take, counted on the event loop's clock.

    ``first_token_s``: from the request to the first text (connecting, the headers and the
    prompt's evaluation included). ``idle_s``: from each text to the next, while the stream
    has its consumer's attention; SSE comments (keep-alives) and events without text do not
    count, so a server that says one sentence and then only pings still ends. ``total_s``: the
    whole reply, whatever it sends. A reply past any of them ends with
    :class:`LLMTimeoutError`.
    """

    first_token_s: float
    idle_s: float
    total_s: float

    @classmethod
    def for_timeout(cls, timeout_s: float, idle_s: float = IDLE_TIMEOUT_S,
                    total_s: float = REPLY_TIMEOUT_S) -> ReplyDeadlines:
        """From ``[llm] timeout_s``, ``idle_timeout_s`` and ``reply_timeout_s``: the first token
        within ``timeout_s``, at most ``idle_s`` between texts (never longer than the first
        token's wait), and the whole reply within ``total_s`` (or ``timeout_s`` when that is
        longer). A voice reply of 48 tokens streams in a few seconds; 10 s without a word is a
        broken server."""
        return cls(timeout_s, min(timeout_s, idle_s), max(timeout_s, total_s))


class OpenAILLM:
    """Streams chat completions from an OpenAI-compatible server.

    Cancelling the consumer closes the HTTP response, which tells the server to stop
    generating (vLLM, SGLang and llama.cpp all abort a request whose client went away).

    Every failure is a :class:`~stages.faults.StageFault` whose ``code`` says what kind it was
    (unavailable: refused, reset, an HTTP error; timeout: past a :class:`ReplyDeadlines`;
    bad response: a stream that cannot be read) and whose text says what happened, URL and
    server message included, for the log. ``max_event_size`` bounds one SSE line or event
    (:class:`~stages.llm.sse.SSEParser`).

    **Prefill** (``[llm] server_prefill``): the server owns the model and its prompt cache, so
    :meth:`prefill` asks it for one token of the prompt so far; a server that keeps a matching
    prefix (llama.cpp's servers, vLLM with prefix caching) then evaluates only what the reply's
    request adds. Measured with ``llama_cpp.server`` and SmolLM2 (one thread): the first token
    of a 14-word turn 200 ms after the request, 100-130 ms once two thirds to all but the last
    word of it were prefilled. Off by default: each is a request, and a hosted API bills it.

    Tools are sent as OpenAI's ``tools``; whether the model calls them is the server's affair
    (vLLM with --enable-auto-tool-choice, llama.cpp's llama-server --jinja, hosted APIs).
    """

    capabilities = LLMCapabilities(prefill=False, tools=True)  # (with server_prefill: both)

    def __init__(
        self,
        cfg: LLMConfig,
        deadlines: ReplyDeadlines | None = None,
        max_event_size: int = MAX_SIZE,
    ) -> None:
        httpx = require("httpx", what="the OpenAI-compatible LLM client", extra="openai")
        self._httpx = httpx
        self.cfg = cfg
        self.deadlines = deadlines or ReplyDeadlines.for_timeout(
            cfg.timeout_s, cfg.idle_timeout_s, cfg.reply_timeout_s)
        self.max_event_size = max_event_size
        if cfg.server_prefill:
            self.capabilities = LLMCapabilities(prefill=True, tools=True, partial_prefill=True)
        self._replies = 0  # replies streaming now
        self._prefilling: asyncio.Task[None] | None = None
        self.prefills = 0  # prefill requests sent
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {"Accept": "text/event-stream"}
        api_key = cfg.resolved_api_key()
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        d = self.deadlines
        self._orphans: set[asyncio.Future[Any]] = set()  # closings of cancelled requests
        # httpx's own per-read timeout is only a backstop: the deadlines end a reply first.
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(
                max(d.first_token_s, d.idle_s) + 1.0,
                connect=min(_CONNECT_TIMEOUT_S, d.first_token_s),
            ),
        )

    def warmup(self) -> None:
        """Nothing to load: the server owns the model."""

    def prefill(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
        open_turn: bool = False,
    ) -> asyncio.Future[None]:
        """With ``server_prefill``: ask the server for one token of ``messages`` (and ``tools``,
        which its template puts in the prompt), so that its prompt cache holds them when a
        request starting with the same messages comes. ``open_turn``: the last message is the
        caller's words so far; the server closes it as a whole message, and the reply's prompt,
        whose message goes on from those words, reuses everything before the close.

        Best effort, and it never makes a reply wait: skipped (a done future) without
        ``server_prefill``, while a reply of this client streams or another prefill is out;
        a failure is logged at debug level and the reply's own request says what is wrong."""
        loop = asyncio.get_running_loop()
        running = self._prefilling
        if not self.cfg.server_prefill or self._replies or (running is not None
                                                            and not running.done()):
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        body: dict[str, Any] = {"messages": messages, "stream": False, "max_tokens": 1,
                                "temperature": self.cfg.temperature}
        if self.cfg.model:
            body["model"] = self.cfg.model
        if tools:
            body["tools"] = tools
        self.prefills += 1
        self._prefilling = loop.create_task(self._prefill(body), name="llm-server-prefill")
        return self._prefilling

    async def _prefill(self, body: dict[str, Any]) -> None:
        httpx = self._httpx
        try:
            async with asyncio.timeout(self.deadlines.first_token_s):
                response = await self._client.post(self.url, json=body)
            if response.status_code >= 400:
                log.debug("prefill: %s answered HTTP %d: %s", self.url, response.status_code,
                          _error_message(response.content[:_MAX_ERROR_BODY]))
        except (httpx.HTTPError, TimeoutError) as exc:
            log.debug("prefill: %s: %r", self.url, exc)

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> AsyncGenerator[str | CallsComing | list[ToolCall], None]:
        """The reply's text deltas; with ``tools`` (OpenAI tool specs, and ``tool_choice``
        when given), then one ``list[ToolCall]`` at the end of a reply that called tools.
        Tool-call fragments count as activity for the deadlines; a reply of calls alone is
        a reply."""
        httpx = self._httpx
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
        }
        if self.cfg.model:
            body["model"] = self.cfg.model
        calls = None
        found: list[ToolCall] = []
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
            calls = ToolCallAssembler(self.url)
        loop = asyncio.get_running_loop()
        d = self.deadlines
        start = loop.time()
        end = start + d.total_s
        first = min(end, start + d.first_token_s)
        self._replies += 1
        try:
            async with AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout_at(first):
                        response = await self._open(stack, body, first)
                        if response.status_code >= 400:
                            raw = await _read_some(response.aiter_bytes(), _MAX_ERROR_BODY)
                            raise LLMServerError(
                                self.url, response.status_code, _error_message(raw)
                            )
                except TimeoutError:
                    raise self._timeout(d.first_token_s, "for its first token") from None
                parser = SSEParser(self.max_event_size)
                chunks = await stack.enter_async_context(aclosing(response.aiter_bytes()))
                said = False  # any text (or tool-call fragment) yet
                announced = False  # CALLS_COMING yielded
                heard = start  # when the wait for the next text began
                done = False  # the server's [DONE]
                while True:
                    deadline = min(end, heard + d.idle_s) if said else first
                    try:
                        async with asyncio.timeout_at(deadline):
                            chunk = await anext(chunks, None)
                    except TimeoutError:
                        if deadline == end:
                            raise self._timeout(d.total_s, "for the whole reply") from None
                        if said:
                            raise self._timeout(d.idle_s, "of its last token") from None
                        raise self._timeout(d.first_token_s, "for its first token") from None
                    for event in parser.feed(chunk) if chunk is not None else parser.close():
                        if event.data.strip() == "[DONE]":
                            done = True
                            break
                        if calls is None:
                            text = self._delta(event.data)
                        else:
                            choice = self._choice(event.data)
                            text = _content(choice)
                            if choice is not None and calls.feed(choice):
                                said = True
                                heard = loop.time()
                                if not announced:
                                    announced = True
                                    yield CALLS_COMING
                        if text:
                            said = True
                            yield text
                            heard = loop.time()  # the consumer's own pauses do not count
                    if done or chunk is None:
                        break
                if calls is not None and calls:
                    found = calls.finish()
                elif not said and not done:
                    # A 200 that ended with nothing to say: an HTML page, a proxy's banner.
                    raise LLMProtocolError(self.url, 200, "the stream ended without a reply")
        except SSEProtocolError as exc:
            raise LLMProtocolError(self.url, 200, str(exc)) from None
        except httpx.ConnectError as exc:
            raise LLMConnectionError(
                f"cannot connect to the LLM server at {self.url} ({exc}) — start it, or pass "
                "--llm-base-url with the right address"
            ) from None
        except httpx.TimeoutException as exc:
            raise self._timeout(self.cfg.timeout_s, f"({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise LLMConnectionError(
                f"talking to the LLM server at {self.url} failed: {exc!r}"
            ) from None
        finally:
            self._replies -= 1
        if found:
            yield found  # the response is closed: the tools may take their time

    async def _open(self, stack: AsyncExitStack, body: dict[str, Any], deadline: float) -> Any:
        """The response's headers, the connection tried once more if it was refused and
        there is time left before ``deadline``."""
        httpx = self._httpx
        loop = asyncio.get_running_loop()
        try:
            return await self._request(stack, body)
        except httpx.ConnectError:
            if loop.time() + _RETRY_PAUSE_S >= deadline:
                raise
        await asyncio.sleep(_RETRY_PAUSE_S)
        return await self._request(stack, body)

    async def _request(self, stack: AsyncExitStack, body: dict[str, Any]) -> Any:
        """Send the request and wait for the response's headers, with that opening shielded
        from cancellation. httpcore keeps a connection in its pool for good when a request is
        cancelled while the connection is being set up (encode/httpcore#1093; measured: 18 of
        400 replies cancelled within 20 ms leaked one each, and at the pool's 100 every reply
        fails) — and calls cut mid-turn, discarded speculative replies and deadlines all
        cancel. Cancelled, the opening runs to its end on its own and is then closed."""
        opener = self._client.stream("POST", self.url, json=body)
        opening = asyncio.ensure_future(opener.__aenter__())
        try:
            response = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(lambda done: self._close_orphan(done, opener))
            raise
        stack.push_async_exit(opener.__aexit__)
        return response

    def _close_orphan(self, opening: asyncio.Future[Any], opener: Any) -> None:
        """The opening of a cancelled request has ended: close its response, if it got one."""
        if opening.cancelled() or opening.exception() is not None:
            return  # (the exception is retrieved: nothing to close, nothing to log)
        closing = asyncio.ensure_future(opener.__aexit__(None, None, None))
        self._orphans.add(closing)
        closing.add_done_callback(self._orphans.discard)

    def _timeout(self, seconds: float, what: str) -> LLMTimeoutError:
        return LLMTimeoutError(
            f"the LLM server at {self.url} did not answer within {seconds} s {what} — raise "
            "--llm-timeout-s or check the server"
        )

    def _delta(self, data: str) -> str:
        return _content(self._choice(data))

    def _choice(self, data: str) -> dict[str, Any] | None:
        """The event's first choice (None for an event without one)."""
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, RecursionError):
            raise LLMProtocolError(
                self.url, 200, f"not a JSON stream event: {data[:200]!r}"
            ) from None
        if not isinstance(obj, dict):
            return None
        if "error" in obj:
            raise LLMServerError(self.url, 200, _error_text(obj))
        choices = obj.get("choices") or ()
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            return None  # e.g. a trailing usage-only chunk
        return choices[0]

    async def aclose(self) -> None:
        if self._prefilling is not None:
            self._prefilling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prefilling
        await asyncio.gather(*self._orphans, return_exceptions=True)
        await self._client.aclose()


def _content(choice: dict[str, Any] | None) -> str:
    if choice is None:
        return ""
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


class ToolCallAssembler:
    """Tool calls put together from a stream's chunks (sans-I/O).

    OpenAI sends each call's ``id`` and ``name`` in its first ``delta.tool_calls`` fragment and
    its ``function.arguments`` in pieces, calls told apart by ``index``. Servers differ: some
    send a whole call in one delta, llama.cpp's server repeats ``id`` and the whole ``name``
    in every fragment, some leave ``index`` out (the list position stands in), some put the
    calls in a final ``message`` rather than deltas (that message's calls replace what the
    deltas built). Whatever ``finish_reason`` says ("tool_calls", or "stop" from some
    servers), the calls assembled are the step's calls. Arguments are kept as the model
    wrote them, valid JSON or not: the tool runner tells the model what was wrong.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, choice: dict[str, Any]) -> bool:
        """Take a chunk's first choice; True when it carried tool-call fragments."""
        fed = False
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("tool_calls"):
            self._take(delta["tool_calls"], whole=False)
            fed = True
        message = choice.get("message")
        if isinstance(message, dict) and message.get("tool_calls"):
            self._take(message["tool_calls"], whole=True)
            fed = True
        return fed

    def _take(self, parts: Any, whole: bool) -> None:
        if not isinstance(parts, list):
            raise self._bad(f"tool_calls is not a list: {parts!r:.200}")
        for position, part in enumerate(parts):
            if not isinstance(part, dict):
                raise self._bad(f"a tool call is not an object: {part!r:.200}")
            index = part.get("index", position)
            fn = part.get("function") or {}
            if not isinstance(index, int) or not isinstance(fn, dict):
                raise self._bad(f"a tool call that cannot be read: {part!r:.200}")
            call = self._calls.setdefault(index, ["", "", ""])
            if whole:
                call[:] = ["", "", ""]
            cid, name, args = part.get("id"), fn.get("name"), fn.get("arguments")
            if isinstance(cid, str) and cid and not call[0]:
                call[0] = cid
            if isinstance(name, str) and name and name != call[1]:
                call[1] = name if not call[1] else call[1] + name
            if isinstance(args, dict):  # an object rather than its JSON text
                call[2] = json.dumps(args, ensure_ascii=False)
            elif isinstance(args, str):
                call[2] += args

    def finish(self) -> list[ToolCall]:
        """The calls, in index order; ids made up where the server sent none."""
        out = []
        for n, index in enumerate(sorted(self._calls)):
            cid, name, args = self._calls[index]
            if not name:
                raise self._bad(f"tool call {index} has no function name")
            out.append(ToolCall(cid or f"call_{n}", name, args))
        return out

    def _bad(self, what: str) -> LLMProtocolError:
        return LLMProtocolError(self.url, 200, what)


async def _read_some(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """At most about ``limit`` bytes of a body: an error page is logged, never held whole."""
    raw = bytearray()
    async for part in chunks:
        raw += part
        if len(raw) >= limit:
            break
    return bytes(raw[:limit])


def _error_message(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text[:500] or "(empty body)"
    return _error_text(obj) if isinstance(obj, dict) else text[:500]


def _error_text(obj: dict[str, Any]) -> str:
    """The message out of the error shapes servers use: OpenAI ``{"error": {"message"}}``,
    FastAPI ``{"detail": ...}``, or a bare ``{"error": "..."}``."""
    err = obj.get("error", obj.get("detail", obj))
    try:
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:500]
        if isinstance(err, list):  # FastAPI validation errors
            return "; ".join(
                str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in err
            )[:500]
        return str(err)[:500]
    except RecursionError:
        return "(an error object nested too deeply to show)"
