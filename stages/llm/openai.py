"""A client for any OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang,
llama.cpp server, Ollama, hosted APIs), streaming the reply as Server-Sent Events over httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from agent.config import LLMConfig
from agent.errors import VoxlineError, require
from stages.llm.chat import LLMCapabilities
from stages.llm.sse import SSEParser

# Connecting should fail fast even when a slow model is allowed a long read timeout.
_CONNECT_TIMEOUT_S = 5.0


class LLMServerError(VoxlineError):
    """The LLM server answered with an HTTP error (or an error event inside the stream)."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"LLM server {url} answered HTTP {status}: {message}")
        self.url = url
        self.status = status
        self.server_message = message


class LLMConnectionError(VoxlineError):
    """The LLM server could not be reached, or stopped answering in time."""


class OpenAILLM:
    """Streams chat completions from an OpenAI-compatible server.

    Cancelling the consumer closes the HTTP response, which tells the server to stop
    generating (vLLM, SGLang and llama.cpp all abort a request whose client went away).
    """

    # The server owns the model and its prompt cache; nothing to evaluate ahead from here.
    capabilities = LLMCapabilities(prefill=False)

    def __init__(self, cfg: LLMConfig) -> None:
        httpx = require("httpx", what="the OpenAI-compatible LLM client", extra="openai")
        self._httpx = httpx
        self.cfg = cfg
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {"Accept": "text/event-stream"}
        api_key = cfg.resolved_api_key()
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(cfg.timeout_s, connect=min(_CONNECT_TIMEOUT_S, cfg.timeout_s)),
        )

    def warmup(self) -> None:
        """Nothing to load: the server owns the model."""

    def prefill(self, messages: list[dict[str, str]]) -> asyncio.Future[None]:
        """Nothing to do (``capabilities.prefill`` is false): a future that is already done."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def stream(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        httpx = self._httpx
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
        }
        if self.cfg.model:
            body["model"] = self.cfg.model
        try:
            async with self._client.stream("POST", self.url, json=body) as response:
                if response.status_code >= 400:
                    raw = await response.aread()
                    raise LLMServerError(self.url, response.status_code, _error_message(raw))
                parser = SSEParser()
                async for chunk in response.aiter_bytes():
                    for event in parser.feed(chunk):
                        if event.data.strip() == "[DONE]":
                            return
                        text = self._delta(event.data)
                        if text:
                            yield text
                for event in parser.close():
                    if event.data.strip() != "[DONE]" and (text := self._delta(event.data)):
                        yield text
        except httpx.ConnectError as exc:
            raise LLMConnectionError(
                f"cannot connect to the LLM server at {self.url} ({exc}) — start it, or pass "
                "--llm-base-url with the right address"
            ) from None
        except httpx.TimeoutException as exc:
            raise LLMConnectionError(
                f"the LLM server at {self.url} did not answer within {self.cfg.timeout_s} s "
                f"({type(exc).__name__}) — raise --llm-timeout-s or check the server"
            ) from None
        except httpx.HTTPError as exc:
            raise LLMConnectionError(
                f"talking to the LLM server at {self.url} failed: {exc!r}"
            ) from None

    def _delta(self, data: str) -> str:
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            raise LLMServerError(
                self.url, 200, f"not a JSON stream event: {data[:200]!r}"
            ) from None
        if not isinstance(obj, dict):
            return ""
        if "error" in obj:
            raise LLMServerError(self.url, 200, _error_text(obj))
        choices = obj.get("choices") or ()
        if not choices:
            return ""  # e.g. a trailing usage-only chunk
        delta = choices[0].get("delta") or {}
        content = delta.get("content")
        return content if isinstance(content, str) else ""

    async def aclose(self) -> None:
        await self._client.aclose()


def _error_message(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text[:500] or "(empty body)"
    return _error_text(obj) if isinstance(obj, dict) else text[:500]


def _error_text(obj: dict[str, Any]) -> str:
    """The message out of the error shapes servers use: OpenAI ``{"error": {"message"}}``,
    FastAPI ``{"detail": ...}``, or a bare ``{"error": "..."}``."""
    err = obj.get("error", obj.get("detail", obj))
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:500]
    if isinstance(err, list):  # FastAPI validation errors
        return "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in err)[:500]
    return str(err)[:500]
