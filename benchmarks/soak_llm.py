"""The soak's echo LLM: an OpenAI-compatible ``/v1/chat/completions`` on loopback that streams a
short reply naming the caller's first words, as Server-Sent Events. It stands in for the model
so that 70 calls fit on 2 cores; the servers' LLM stage, HTTP client and SSE parser stay real."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

REPLY_WORDS = 4  # of the caller's words the reply repeats: about 1.5 s of speech


def reply_for(text: str) -> str:
    """What the echo agent says to a caller who said ``text``."""
    words = text.split()[:REPLY_WORDS]
    return f"You said {' '.join(words)}." if words else "Sorry, I did not hear you."


def sse_chunk(content: str) -> bytes:
    event = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}
    return f"data: {json.dumps(event)}\n\n".encode()


class EchoLLM:
    """``await start()`` listens on a free loopback port and returns the base URL to give the
    servers (``--llm-base-url``). ``requests`` counts the replies it was asked for, ``bad`` the
    requests it could not read, ``abandoned`` those whose client went away before the request
    was read (a speculative reply discarded, a call cut)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.requests = 0
        self.bad = 0
        self.abandoned = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://{self.host}:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        try:
            body: Any = await request.json()
            messages = body["messages"]
            said = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        except ConnectionResetError:
            self.abandoned += 1
            return web.Response(status=499)
        except (ValueError, KeyError, TypeError, AttributeError, StopIteration):
            self.bad += 1
            return web.json_response({"error": {"message": "expected chat messages"}}, status=400)
        self.requests += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        # one connection a reply: an idle keep-alive connection in the client's pool would be
        # counted as a descriptor the server leaked
        resp.force_close()
        words = reply_for(str(said)).split(" ")
        try:
            await resp.prepare(request)
            for i, word in enumerate(words):  # one token a word, as a model streams them
                await resp.write(sse_chunk(word if i == 0 else " " + word))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the reply was cancelled (a barge-in, a hang-up)
            self.abandoned += 1
        return resp
