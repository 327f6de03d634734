"""The soak's browser caller: one call over ``/ws`` as ``web/app.js`` makes it (PCM16 16 kHz in
20-ms binary frames of 640 B, JSON events), streaming a speech clip at real-time pace and then
the line's quiet, until the agent has answered; then ``{"type": "hangup"}``. The chaos variant
cuts the TCP connection at a given moment instead (no close frame, no hang-up).

An echo-test caller (``echo_call``, ``/ws/echo``) streams the same way and checks what comes
back: every frame it sent must return, byte for byte and in order (a frame that does not is
lost), and it measures each frame's round trip."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

FRAME_SAMPLES = 320  # 20 ms at 16 kHz
FRAME_S = 0.02
READY_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 5.0
# after the clip, how long the caller listens before judging: the last words' turn (the VAD's
# stop silence, the turn's, the ASR final) must have had time to start
LINGER_S = 1.5
ECHO_TAIL_S = 1.0  # the echo test: quiet sent after the clip, so its last frames come back
ECHO_WAIT_S = 5.0  # then how long it waits for the rest of its audio to come back
LOOK_AHEAD = 50  # frames: how far past a lost frame the echo match looks (1 s)
_DROPPED = re.compile(r"\((\d+) so far\)")


@dataclass(slots=True)
class CallOutcome:
    """One call as the caller saw it. ``status``: completed (answered, hung up, closed cleanly),
    lost (no answer, or an unexpected error or close), failed (never started), killed (chaos:
    cut on purpose; not judged)."""

    kind: str
    clip: str
    status: str = ""
    reason: str = ""
    session: str = ""
    seconds: float = 0.0
    frames_sent: int = 0
    agent_frames: int = 0
    dropped_inbound: int = 0  # caller frames the server said it dropped (over real time)
    answers: int = 0
    # the server's voice_to_voice span of each answered turn (its trace events)
    voice_to_voice_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    killed_at_s: float | None = None
    # the echo test: frames that did not come back, and each returned frame's round trip
    echo_lost: int = 0
    echo_rtt_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """As the call log keeps it: the echo's round trips as a count, median and maximum."""
        out = asdict(self)
        rtt = out.pop("echo_rtt_ms")
        if rtt:
            out["echo_rtt_ms"] = {"frames": len(rtt), "p50": float(np.median(rtt)), "max": max(rtt)}
        return out


@dataclass(slots=True)
class _Listen:
    """What the reader has heard so far."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None
    close_reason: str = ""
    fatal: str = ""
    pending: bool = False  # a user turn waits for its answer
    answering: bool = False  # the agent is speaking that answer
    echo: EchoCheck | None = None  # an echo-test call: what came back is matched here


@dataclass(slots=True)
class EchoCheck:
    """Matches the frames an echo-test call gets back against those it sent, in order."""

    sent: list[tuple[float, bytes]] = field(default_factory=list)  # (monotonic s, frame)
    matched: int = 0  # sent frames accounted for (returned, or skipped as lost)
    lost: int = 0
    rtt_ms: list[float] = field(default_factory=list)

    def back(self, t: float, frame: bytes) -> None:
        """A frame came back: the next one sent, or one a little later (those between were
        lost); anything else (the playout's silence) matches nothing."""
        for k in range(self.matched, min(len(self.sent), self.matched + LOOK_AHEAD)):
            if self.sent[k][1] == frame:
                self.lost += k - self.matched
                self.rtt_ms.append(round((t - self.sent[k][0]) * 1000, 1))
                self.matched = k + 1
                return


def speech_frames(pcm: np.ndarray) -> list[bytes]:
    """A clip as whole 20-ms frames (the last one padded with zeros)."""
    n = -(-len(pcm) // FRAME_SAMPLES) * FRAME_SAMPLES
    padded = np.zeros(n, np.int16)
    padded[: len(pcm)] = pcm
    return [padded[i : i + FRAME_SAMPLES].astype("<i2").tobytes() for i in range(0, n, FRAME_SAMPLES)]


def quiet_frames(seconds: float = 2.0, rms: float = 12.0, seed: int = 0) -> list[bytes]:
    """The line between utterances: low noise (about -69 dBFS), never digital silence."""
    rng = np.random.default_rng(seed)
    pcm = np.clip(rng.standard_normal(int(seconds * 16000)) * rms, -32768, 32767).astype(np.int16)
    return speech_frames(pcm)


def _on_event(ev: dict[str, Any], heard: _Listen, out: CallOutcome) -> None:
    kind = ev.get("type")
    if kind == "ready":
        out.session = str(ev.get("session", ""))
        heard.ready.set()
    elif kind == "user_turn":
        heard.pending = True
    elif kind == "bot_started":
        heard.answering = heard.answering or heard.pending
    elif kind == "trace":
        span = (ev.get("spans") or {}).get("voice_to_voice")
        if ev.get("kind") == "turn" and isinstance(span, dict):
            out.voice_to_voice_ms.append(float(span.get("ms", 0.0)))
    elif kind == "bot_stopped":
        if heard.answering and not ev.get("interrupted"):
            out.answers += 1
            heard.pending = False
        heard.answering = False
    elif kind == "error":
        message = str(ev.get("message", ""))
        m = _DROPPED.search(message)
        if "faster than real time" in message and m:
            out.dropped_inbound = max(out.dropped_inbound, int(m.group(1)))
        else:
            out.errors.append(message[:200])
        if ev.get("fatal"):
            heard.fatal = message[:200]
    elif kind == "hangup":
        out.errors.append(f"the agent hung up: {ev.get('reason')}")


async def _read(ws: ClientConnection, heard: _Listen, out: CallOutcome) -> None:
    try:
        async for msg in ws:
            if isinstance(msg, bytes):
                out.agent_frames += len(msg) // (2 * FRAME_SAMPLES)
                if heard.echo is not None:
                    heard.echo.back(time.monotonic(), msg)
            else:
                _on_event(json.loads(msg), heard, out)
    except ConnectionClosed:
        pass
    finally:
        if ws.close_code is not None:
            heard.close_code, heard.close_reason = ws.close_code, ws.close_reason or ""
        heard.closed.set()


async def browser_call(url: str, clip_id: str, speech: list[bytes], quiet: list[bytes], *,
                       answer_timeout_s: float, kill_at_s: float | None = None,
                       echo: bool = False) -> CallOutcome:
    """One call; never raises (every way it can go is in the outcome). ``echo``: ``url`` is the
    echo test, and the call checks that its audio comes back instead of waiting for answers."""
    out = CallOutcome("echo" if echo else "browser", clip_id)
    t0 = time.monotonic()
    try:
        ws = await asyncio.wait_for(
            connect(url, max_size=1 << 20, ping_interval=None, compression=None), READY_TIMEOUT_S)
    except Exception as exc:  # refused, reset, an HTTP error status, a timeout
        out.status, out.reason = "failed", f"connect: {type(exc).__name__}: {str(exc)[:160]}"
        out.seconds = time.monotonic() - t0
        return out
    heard = _Listen(echo=EchoCheck() if echo else None)
    reader = asyncio.create_task(_read(ws, heard, out))
    try:
        await _talk(ws, heard, out, speech, quiet, t0, answer_timeout_s, kill_at_s)
        if heard.echo is not None:
            out.echo_lost, out.echo_rtt_ms = heard.echo.lost, heard.echo.rtt_ms
    except Exception as exc:  # the socket broke under a send
        if not out.status:
            out.status, out.reason = "lost", f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        if out.status == "killed":
            ws.transport.abort()  # a tab closed, a phone gone: no close frame, no FIN wait
        elif not heard.closed.is_set():
            await _close(ws, heard, out)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        out.seconds = round(time.monotonic() - t0, 3)
    if out.status == "completed" and out.errors:
        out.status, out.reason = "lost", "unexpected error: " + out.errors[0]
    return out


async def _talk(ws: ClientConnection, heard: _Listen, out: CallOutcome, speech: list[bytes],
                quiet: list[bytes], t0: float, answer_timeout_s: float,
                kill_at_s: float | None) -> None:
    ready = asyncio.create_task(heard.ready.wait())
    closed = asyncio.create_task(heard.closed.wait())
    await asyncio.wait((ready, closed), timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    ready.cancel()
    closed.cancel()
    if not heard.ready.is_set():
        out.status = "failed"
        out.reason = heard.fatal or (f"closed before ready ({heard.close_code})" if heard.closed.is_set()
                                     else f"no ready event in {READY_TIMEOUT_S:g} s")
        return
    start = time.monotonic()
    clip_end = start + len(speech) * FRAME_S
    k = 0
    while True:
        now = time.monotonic()
        if heard.closed.is_set():
            out.status = "lost"
            out.reason = heard.fatal or f"the server closed the call ({heard.close_code} {heard.close_reason})"
            return
        if kill_at_s is not None and now - t0 >= kill_at_s:
            out.status, out.killed_at_s = "killed", round(now - t0, 3)
            return
        if heard.echo is not None and k >= len(speech) and now >= clip_end + ECHO_TAIL_S:
            await _echo_verdict(ws, heard, heard.echo, out)
            return
        if heard.echo is None and k >= len(speech) and now >= clip_end + LINGER_S:
            if out.answers and not heard.pending and not heard.answering:
                await ws.send(json.dumps({"type": "hangup"}))
                out.status = "completed"
                return
            if now >= clip_end + answer_timeout_s:
                out.status = "lost"
                out.reason = (f"no answer {answer_timeout_s:g} s after the clip" if not out.answers
                              else "the last turn got no answer")
                return
        frame = speech[k] if k < len(speech) else quiet[(k - len(speech)) % len(quiet)]
        if heard.echo is not None:
            heard.echo.sent.append((time.monotonic(), frame))
        await ws.send(frame)
        out.frames_sent += 1
        k += 1
        await asyncio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))


async def _echo_verdict(ws: ClientConnection, heard: _Listen, echo: EchoCheck,
                        out: CallOutcome) -> None:
    """The caller has stopped sending: every frame it sent must come back (the jitter buffer
    and the playout queue still hold the last ones), within ``ECHO_WAIT_S``."""
    until = time.monotonic() + ECHO_WAIT_S
    while echo.matched < len(echo.sent) and time.monotonic() < until and not heard.closed.is_set():
        await asyncio.sleep(FRAME_S)
    echo.lost += len(echo.sent) - echo.matched
    echo.matched = len(echo.sent)
    if echo.lost:
        out.status, out.reason = "lost", f"{echo.lost} frames did not come back"
        return
    await ws.send(json.dumps({"type": "hangup"}))
    out.status = "completed"


async def _close(ws: ClientConnection, heard: _Listen, out: CallOutcome) -> None:
    """After our hang-up the server closes (1000); a close that never comes is an error."""
    if out.status == "completed":
        try:
            await asyncio.wait_for(heard.closed.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            out.errors.append(f"the server did not close {CLOSE_TIMEOUT_S:g} s after the hang-up")
        else:
            if heard.close_code not in (1000, None):
                out.errors.append(f"closed with {heard.close_code} after the hang-up")
    with contextlib.suppress(Exception):  # already gone: nothing left to close
        await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)


async def hold_call(url: str, verdicts: list[str], release: asyncio.Event) -> None:
    """The slot probe's call: connect and say nothing; append ``admitted`` to ``verdicts`` once
    the call is ready (it holds an ASR slot), or why it is not; hang up when ``release`` is set."""
    try:
        ws = await asyncio.wait_for(
            connect(url, max_size=1 << 20, ping_interval=None, compression=None), READY_TIMEOUT_S)
    except Exception as exc:
        verdicts.append(f"failed: {type(exc).__name__}")
        return
    heard = _Listen()
    reader = asyncio.create_task(_read(ws, heard, CallOutcome("probe", "")))
    try:
        ready = asyncio.create_task(heard.ready.wait())
        closed = asyncio.create_task(heard.closed.wait())
        await asyncio.wait((ready, closed), timeout=READY_TIMEOUT_S,
                           return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        closed.cancel()
        if not heard.ready.is_set():
            verdicts.append(f"refused: {heard.fatal or heard.close_code}")
            return
        verdicts.append("admitted")
        await release.wait()
        await ws.send(json.dumps({"type": "hangup"}))
        await asyncio.wait_for(heard.closed.wait(), CLOSE_TIMEOUT_S)
    except Exception:  # the hang-up of a probe call: nothing to judge
        pass
    finally:
        with contextlib.suppress(Exception):  # already gone
            await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
