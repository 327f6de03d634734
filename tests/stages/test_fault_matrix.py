"""Faults the caller can hear (issue 18): the LLM stage on the OpenAI-compatible client and the
TTS stage on real eSpeak NG, against a real HTTP server on loopback that refuses, hangs after its
headers, says one sentence and then only keep-alives, trickles forever, answers 500 naming an
internal address, sends malformed SSE or resets the connection mid-stream; and a TTS that raises.

For each: what comes out of the stages (the apology's text and audio after what was already
said), the error event (a code, no upstream detail), the counters and the history, and that the
next turn works once the server behaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import numpy as np
import pytest
from stage_harness import StageHarness

from agent.config import AgentConfig, LLMConfig, TTSConfig
from agent.events import frame_event
from agent.frames import (
    Direction,
    ErrorFrame,
    Frame,
    LLMEnd,
    TextToSpeak,
    TTSAudio,
    UserTurnEnded,
)
from agent.pipeline import Pipeline
from agent.stage import StageContext
from agent.trace import Trace
from stages.faults import (
    APOLOGY,
    LLM_BAD_RESPONSE,
    LLM_TIMEOUT,
    LLM_UNAVAILABLE,
    TTS_FAILED,
    fault_frame,
)
from stages.llm.openai import OpenAILLM, ReplyDeadlines
from stages.llm.stage import LLMStage
from stages.tts.espeak import EspeakTTS
from stages.tts.stage import TTSStage

pytest.importorskip("httpx")

DOWN = Direction.DOWNSTREAM
SECRET = "http://10.20.30.40:8001/internal/gpu-pool-7"
SENTENCE = "Here is one sentence."
REPLY = ["Hello", " again.", " How can", " I help?"]
# Short deadlines so a hang ends within seconds; the scripted server answers in milliseconds.
DEADLINES = ReplyDeadlines(first_token_s=1.5, idle_s=1.0, total_s=30.0)


def sse(text: str) -> bytes:
    event = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Connection: close\r\n\r\n")


class FaultServer:
    """An OpenAI-compatible endpoint on a raw asyncio socket server, misbehaving as ``mode``
    says for every request until the test sets it back to ``"ok"``."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._modes: dict[str, Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                        Awaitable[None]]] = {
            "ok": self._ok, "hang": self._hang, "keepalive": self._keepalive,
            "trickle": self._trickle, "500": self._error_500, "malformed": self._malformed,
            "reset": self._reset, "tts_bomb": self._tts_bomb,
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            self.requests += 1
            await self._modes[self.mode](reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away, as the timeouts intend
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def _ok(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD)
        for piece in REPLY:
            await self._send(writer, sse(piece))
        await self._send(writer, b"data: [DONE]\n\n")

    async def _hang(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD)
        await reader.read()  # nothing more, until the client gives up and closes

    async def _keepalive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD + sse(SENTENCE + " "))
        while True:  # what some proxies and servers send while a generation is stuck
            await asyncio.sleep(0.05)
            await self._send(writer, b": keep-alive\n\n")

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD)
        while True:  # a word every 0.2 s, never idle and never done
            await self._send(writer, sse("la "))
            await asyncio.sleep(0.2)

    async def _error_500(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = json.dumps({"error": {"message": f"upstream {SECRET} failed: CUDA out of memory",
                                     "type": "server_error"}}).encode()
        await self._send(writer, b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                         % len(body) + body)

    async def _malformed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD + b'data: {"choices": [{"delta": {"content": "Hi\n\n')
        await reader.read()

    async def _reset(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD + sse(SENTENCE) + sse(" And then"))
        await asyncio.sleep(0.3)  # the client has read it all
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # with SO_LINGER 0: an RST, not a FIN

    async def _tts_bomb(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._send(writer, SSE_HEAD + sse("Oh, kaboom. ")
                         + sse("And this is the rest.") + b"data: [DONE]\n\n")


class BrittleTTS:
    """Real eSpeak NG that raises on any text containing ``breaks_on`` (all text while
    ``broken``), as a voice may on text it cannot handle."""

    def __init__(self, breaks_on: str = "kaboom") -> None:
        self.inner = EspeakTTS(TTSConfig(backend="espeak"))
        self.breaks_on = breaks_on
        self.broken = False

    @property
    def sample_rate(self) -> int:
        return self.inner.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        if self.broken or self.breaks_on in text:
            raise RuntimeError(f"voice model at /opt/models/secret.onnx failed on {text!r}")
        return self.inner.synthesize(text)

    def warmup(self) -> None:
        self.inner.warmup()


class CallHarness(StageHarness):
    """The stage harness over the reply's two stages, LLM then TTS: what leaves it is what a
    transport plays to the caller and what its listeners turn into client events."""

    def __init__(self, llm: OpenAILLM, tts: BrittleTTS) -> None:
        self.frames: list[Frame] = []
        # (first chunks of 2-4 words: the chunks these expectations were written for)
        agent = AgentConfig(first_audio_wait_ms=0, min_first_chunk_words=2, max_first_chunk_words=4)
        self.llm_stage = LLMStage(llm, llm.cfg, agent)
        self.tts_stage = TTSStage(tts, TTSConfig(chunk_ms=20))  # type: ignore[arg-type]
        self.stage = self.llm_stage
        self.pipeline = Pipeline([self.llm_stage, self.tts_stage], on_output=self._out)
        self.trace = Trace()
        self.ctx = StageContext(trace=self.trace)
        self.changed = asyncio.Event()
        self.timeout = 20.0

    def of(self, kind: type) -> list:  # noqa: ANN401
        return [f for f in self.frames if isinstance(f, kind)]

    async def turn(self, text: str) -> list[Frame]:
        """One caller turn; the frames it produced once its reply is out and voiced."""
        before, ends = len(self.frames), len(self.of(LLMEnd))
        self.trace.begin_turn(speech_end=time.monotonic_ns())
        self.pipeline.push(UserTurnEnded(text), DOWN)

        def voiced(fs: list[Frame]) -> bool:
            new = fs[before:]
            says = sum(isinstance(f, TextToSpeak) for f in new)
            lasts = sum(isinstance(f, TTSAudio) and f.last for f in new)
            return len(self.of(LLMEnd)) > ends and says == lasts and not self.tts_stage.busy

        await self.until(voiced)
        return self.frames[before:]


def spoken(frames: list[Frame]) -> list[str]:
    """The texts the TTS voiced, in order (each ``TTSAudio(last=True)`` closes one)."""
    return [f.text for f in frames if isinstance(f, TTSAudio) and f.last]


def audio_of(frames: list[Frame], text: str) -> int:
    """Samples of audio pushed for the utterance ``text`` (from its TextToSpeak to its last)."""
    start = next(i for i, f in enumerate(frames) if isinstance(f, TextToSpeak) and f.text == text)
    end = next(i for i, f in enumerate(frames) if isinstance(f, TTSAudio) and f.last
               and f.text == text and i > start)
    return sum(len(f.pcm) for f in frames[start:end + 1] if isinstance(f, TTSAudio))


def assert_no_detail(error: ErrorFrame, server: FaultServer) -> None:
    event = json.dumps(frame_event(error))
    for leak in ("10.20.30.40", "internal", "127.0.0.1", str(server.port), "HTTP", "CUDA",
                 "secret", "/opt/"):
        assert leak not in event, (leak, event)


@contextlib.asynccontextmanager
async def call(mode: str, tts: BrittleTTS | None = None,
               deadlines: ReplyDeadlines = DEADLINES) -> AsyncIterator[tuple[CallHarness, FaultServer]]:
    server = FaultServer()
    await server.start()
    server.mode = mode
    llm = OpenAILLM(LLMConfig(backend="openai", base_url=server.url, api_key="k", max_tokens=32),
                    deadlines=deadlines)
    try:
        async with CallHarness(llm, tts or BrittleTTS()) as h:
            yield h, server
    finally:
        await llm.aclose()
        await server.stop()


async def assert_next_turn_works(h: CallHarness, server: FaultServer) -> None:
    server.mode = "ok"
    errors, requests = len(h.of(ErrorFrame)), server.requests
    frames = await h.turn("Are you there?")
    (end,) = [f for f in frames if isinstance(f, LLMEnd)]
    assert not end.cancelled and end.text == "".join(REPLY).strip()
    assert spoken(frames) == ["Hello again.", "How can I help?"]
    assert audio_of(frames, "How can I help?") > 8000  # real speech, not a closed stub
    assert len(h.of(ErrorFrame)) == errors and server.requests == requests + 1
    assert h.llm_stage.history.entries[-1].content == end.text


def llm_fault(frames: list[Frame], code: str, server: FaultServer) -> ErrorFrame:
    """The one LLM error of a failed turn, checked: the generic message of ``code``."""
    (error,) = [f for f in frames if isinstance(f, ErrorFrame)]
    assert error.stage == "llm" and not error.fatal
    assert error.message == fault_frame(code, "llm").message
    assert error.message.startswith(code + ":")
    assert_no_detail(error, server)
    return error


def assert_apologized(frames: list[Frame], after: Sequence[str] = ()) -> None:
    assert spoken(frames) == [*after, APOLOGY]
    assert audio_of(frames, APOLOGY) > 16000  # over a second of the apology, really voiced
    (end,) = [f for f in frames if isinstance(f, LLMEnd)]
    assert end.cancelled and end.text == " ".join(after)


# --- the LLM fault matrix -------------------------------------------------------------------


def test_a_refused_connection_is_apologized_for_and_the_next_turn_works_once_it_is_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with call("ok") as (h, server):
            port = server.port
            await server.stop()  # nothing listens there now: connections are refused
            frames = await h.turn("Hello?")
            llm_fault(frames, LLM_UNAVAILABLE, server)
            assert_apologized(frames)
            assert h.llm_stage.errors == 1 and h.tts_stage.errors == 0
            assert [e.role for e in h.llm_stage.history.entries] == []  # the failed turn is gone
            await server.start(port)  # the fault is gone
            await assert_next_turn_works(h, server)

    with caplog.at_level(logging.WARNING, logger="voxline.llm"):
        asyncio.run(main())
    assert "cannot connect to the LLM server at http://127.0.0.1:" in caplog.text  # for the log


def test_a_refused_first_connect_is_retried_once_before_any_text_and_never_double_speaks() -> None:
    async def main() -> None:
        async with call("ok") as (h, server):
            port = server.port
            await server.stop()

            async def come_back() -> None:
                await asyncio.sleep(0.05)  # up again within the retry's 0.25 s pause
                await server.start(port)

            back = asyncio.create_task(come_back())
            frames = await h.turn("Hello?")
            await back
            assert spoken(frames) == ["Hello again.", "How can I help?"]  # once each
            assert server.requests == 1 and not h.of(ErrorFrame)

    asyncio.run(main())


def test_a_server_that_hangs_after_its_headers_ends_in_the_apology_at_the_first_token_deadline(
) -> None:
    async def main() -> None:
        async with call("hang") as (h, server):
            t0 = time.monotonic()
            frames = await h.turn("Hello?")
            waited = time.monotonic() - t0
            llm_fault(frames, LLM_TIMEOUT, server)
            assert_apologized(frames)
            assert DEADLINES.first_token_s - 0.1 <= waited < 15, waited
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_one_sentence_then_only_keepalives_ends_at_the_idle_deadline_after_what_was_said() -> None:
    """The old client's timeout was per read: keep-alive comments every 50 ms kept this reply
    open for good, and the caller heard nothing more and got no next turn."""

    async def main() -> None:
        async with call("keepalive") as (h, server):
            t0 = time.monotonic()
            frames = await h.turn("Say one thing.")
            waited = time.monotonic() - t0
            llm_fault(frames, LLM_TIMEOUT, server)
            assert_apologized(frames, after=[SENTENCE])  # the apology follows what was said
            assert DEADLINES.idle_s - 0.1 <= waited < 15, waited
            said = h.llm_stage.history.entries[-1]
            assert said.role == "assistant" and said.content == SENTENCE and said.truncated
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_a_reply_that_never_idles_and_never_ends_is_cut_at_the_total_deadline() -> None:
    deadlines = ReplyDeadlines(first_token_s=1.5, idle_s=1.0, total_s=2.0)

    async def main() -> None:
        async with call("trickle", deadlines=deadlines) as (h, server):
            t0 = time.monotonic()
            frames = await h.turn("Sing.")
            waited = time.monotonic() - t0
            llm_fault(frames, LLM_TIMEOUT, server)
            assert spoken(frames)[-1] == APOLOGY
            assert 1.9 <= waited < 15, waited
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_a_500_naming_an_internal_url_reaches_the_log_only(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with call("500") as (h, server):
            frames = await h.turn("Hello?")
            error = llm_fault(frames, LLM_UNAVAILABLE, server)
            assert SECRET not in error.message
            assert_apologized(frames)
            assert server.requests == 1  # an HTTP error is not retried
            await assert_next_turn_works(h, server)

    with caplog.at_level(logging.WARNING, logger="voxline.llm"):
        asyncio.run(main())
    assert SECRET in caplog.text and "HTTP 500" in caplog.text


def test_malformed_sse_is_a_bad_response() -> None:
    async def main() -> None:
        async with call("malformed") as (h, server):
            frames = await h.turn("Hello?")
            llm_fault(frames, LLM_BAD_RESPONSE, server)
            assert_apologized(frames)
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_a_reset_mid_stream_keeps_what_was_said_and_is_not_retried() -> None:
    async def main() -> None:
        async with call("reset") as (h, server):
            frames = await h.turn("Say one thing.")
            llm_fault(frames, LLM_UNAVAILABLE, server)
            # "And then" had arrived but was never a whole chunk: unsaid, and not in the history
            assert_apologized(frames, after=[SENTENCE])
            assert server.requests == 1  # text was out: a retry could say it twice
            said = h.llm_stage.history.entries[-1]
            assert said.content == SENTENCE and said.truncated
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_a_speculative_reply_that_fails_after_its_adoption_is_apologized_for_once() -> None:
    """Preemption: the reply starts at the caller's pause and is adopted when the turn ends;
    its sentence was held, then heard; the keep-alives that follow end in one apology, and
    nothing is requested (or said) twice."""
    from agent.frames import TurnCandidate

    async def main() -> None:
        async with call("keepalive") as (h, server):
            before = len(h.frames)
            h.pipeline.push(TurnCandidate("Say one thing."), DOWN)
            await asyncio.sleep(0.2)
            frames = await h.turn("Say one thing.")
            assert h.llm_stage.adopted == 1 and server.requests == 1
            llm_fault(h.frames[before:], LLM_TIMEOUT, server)
            assert_apologized(frames, after=[SENTENCE])
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_a_speculative_reply_that_failed_before_the_turn_ended_is_asked_again() -> None:
    from agent.frames import TurnCandidate

    async def main() -> None:
        async with call("500") as (h, server):
            h.pipeline.push(TurnCandidate("Hello?"), DOWN)
            await asyncio.sleep(0.3)  # the speculative request failed, unheard and unreported
            assert server.requests == 1 and not h.of(ErrorFrame) and not h.of(TextToSpeak)
            frames = await h.turn("Hello?")
            llm_fault(frames, LLM_UNAVAILABLE, server)
            assert_apologized(frames)
            assert server.requests == 2 and h.llm_stage.errors == 1
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_each_fault_is_counted_and_recorded_for_the_calls_end() -> None:
    async def main() -> None:
        async with call("500") as (h, server):
            await h.turn("One.")
            server.mode = "malformed"
            await h.turn("Two.")
            assert h.llm_stage.errors == 2
            summary = h.trace.close("hangup")
            assert [(e["event"], e["stage"], e["code"]) for e in summary["events"]] == [
                ("error", "llm", LLM_UNAVAILABLE), ("error", "llm", LLM_BAD_RESPONSE),
            ]
            assert [t.get("info", {}).get("error") for t in h.trace.turns] == [
                LLM_UNAVAILABLE, LLM_BAD_RESPONSE,
            ]

    asyncio.run(main())


# --- the TTS --------------------------------------------------------------------------------


def test_a_tts_that_raises_on_one_text_is_followed_by_the_apology_and_the_reply_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with call("tts_bomb") as (h, server):
            frames = await h.turn("Go on.")
            (error,) = [f for f in frames if isinstance(f, ErrorFrame)]
            assert error.stage == "tts" and error.message == fault_frame(TTS_FAILED, "tts").message
            assert_no_detail(error, server)
            # the failed text's utterance is closed, the apology spoken, and the reply goes on
            assert spoken(frames) == ["Oh, kaboom.", APOLOGY, "And this is the rest."]
            assert audio_of(frames, "Oh, kaboom.") == 0
            assert audio_of(frames, APOLOGY) > 16000
            assert h.tts_stage.errors == 1 and h.llm_stage.errors == 0
            await assert_next_turn_works(h, server)

    with caplog.at_level(logging.ERROR, logger="voxline.tts"):
        asyncio.run(main())
    assert "/opt/models/secret.onnx" in caplog.text


def test_a_tts_that_fails_on_everything_leaves_error_events_and_recovers() -> None:
    tts = BrittleTTS()

    async def main() -> None:
        async with call("ok", tts=tts) as (h, server):
            tts.broken = True
            frames = await h.turn("Hello?")
            errors = [f for f in frames if isinstance(f, ErrorFrame)]
            # each failed text is an error event; the apology was tried once and failed too
            assert [e.message for e in errors] == [fault_frame(TTS_FAILED, "tts").message] * 2
            assert spoken(frames) == ["Hello again.", APOLOGY, "How can I help?"]
            assert sum(len(f.pcm) for f in frames if isinstance(f, TTSAudio)) == 0
            assert h.tts_stage.errors == 2
            tts.broken = False
            await assert_next_turn_works(h, server)

    asyncio.run(main())


def test_when_the_llm_fails_and_the_tts_cannot_say_the_apology_the_error_events_remain() -> None:
    tts = BrittleTTS(breaks_on="trouble")  # the apology's own words

    async def main() -> None:
        async with call("500", tts=tts) as (h, server):
            frames = await h.turn("Hello?")
            assert [e.stage for e in frames if isinstance(e, ErrorFrame)] == ["llm", "tts"]
            assert spoken(frames) == [APOLOGY]  # tried once (closed, silent), not again
            assert h.tts_stage.errors == 1
            await assert_next_turn_works(h, server)

    asyncio.run(main())
