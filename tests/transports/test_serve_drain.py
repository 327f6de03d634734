"""SIGTERM to a real ``voxline serve`` process with a WebSocket call live: it drains — the live
call goes on and ends normally when the caller hangs up, a call attempted meanwhile is refused
with the reason, ``/readyz`` turns 503 — and it exits 0 as soon as the live call is over. A call
still live at ``--drain-timeout`` is ended with close code 1001 and a reason."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

AGENT_CLI = Path(__file__).with_name("serve_cli_agent.py")
FRAME = np.full(320, 3000, np.int16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(AGENT_CLI), "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "press Call" in line or proc.poll() is not None:
            break
    assert proc.poll() is None, proc.stdout.read()
    return proc, port


async def _echoes(ws: aiohttp.ClientWebSocketResponse, frames: int = 10) -> int:
    """Send caller frames; the agent audio frames that came back."""
    for _ in range(frames):
        await ws.send_bytes(FRAME.tobytes())
    got = 0
    while True:
        try:
            msg = await ws.receive(timeout=0.5)
        except TimeoutError:
            return got
        if msg.type is aiohttp.WSMsgType.BINARY:
            got += 1
        elif msg.type is not aiohttp.WSMsgType.TEXT:
            return got


async def _call_through_a_drain(proc: subprocess.Popen, port: int, hang_up: bool) -> dict:
    base = f"http://127.0.0.1:{port}"
    out: dict = {}
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{base}/ws")
        assert await _echoes(ws) > 0
        proc.send_signal(signal.SIGTERM)
        out["t_term"] = time.monotonic()
        async with asyncio.timeout(10):
            while (await http.get(f"{base}/readyz")).status != 503:
                await asyncio.sleep(0.05)
        try:
            await http.ws_connect(f"{base}/ws")
            out["refused"] = None
        except aiohttp.WSServerHandshakeError as exc:
            out["refused"] = exc.status
        async with http.get(f"{base}/ws") as r:
            out["refusal_text"] = await r.text()
        out["echoes_during_drain"] = await _echoes(ws)
        if hang_up:
            await ws.send_str(json.dumps({"type": "hangup"}))
        msg = await ws.receive(timeout=30)
        out["close"] = (msg.type, ws.close_code, msg.extra)
        out["t_close"] = time.monotonic()
    return out


def _drained(*args: str, hang_up: bool) -> tuple[dict, int, str]:
    """A call through a drain of ``voxline serve ARGS``: what the caller saw, the exit code and
    the server's output."""
    proc, port = start(*args)
    try:
        got = asyncio.run(_call_through_a_drain(proc, port, hang_up=hang_up))
        return got, proc.wait(timeout=20), proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_lets_the_live_call_end_normally_and_refuses_new_ones():
    got, rc, log = _drained(hang_up=True)
    assert got["refused"] == 503 and "shutting down" in got["refusal_text"]
    assert got["echoes_during_drain"] > 0  # the live call was served through the drain
    assert got["close"][1] == 1000, got["close"]  # ended by its hang-up, normally
    assert rc == 0, log
    assert "draining" in log and "drained in" in log and "served 1 calls" in log


def test_a_call_still_live_at_the_drain_timeout_is_ended_with_going_away():
    got, rc, log = _drained("--drain-timeout", "2", hang_up=False)
    assert got["close"][1] == 1001 and "server stopping" in str(got["close"][2]), got["close"]
    assert 1.5 < got["t_close"] - got["t_term"] < 10
    assert rc == 0, log
    assert "ending 1 call(s) still live" in log
