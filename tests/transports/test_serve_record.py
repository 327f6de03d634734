"""``voxline serve --record DIR``: each call as a stereo WAV (caller left, agent right, on the
caller's media clock) and its trace, under the session's id. The agent here speaks back what it
hears, so the right channel is the left one again, a packet or so later."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import wave

import aiohttp
import numpy as np
from test_serve_drain import AGENT_CLI, free_port  # noqa: F401 (the same small agent)
from test_serve_drain import start as start_serve

RATE = 16000


def test_a_recorded_call_has_both_sides_aligned_and_its_trace(tmp_path):
    tone = (6000 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.int16)
    pcm = np.concatenate([np.zeros(RATE // 2, np.int16), tone, np.zeros(RATE, np.int16)])
    proc, port = start_serve("--record", str(tmp_path))

    async def call() -> str:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{port}/ws")
            ready = json.loads((await ws.receive(timeout=10)).data)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            for k, i in enumerate(range(0, len(pcm), 320)):  # real time
                await ws.send_bytes(pcm[i:i + 320].tobytes())
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - loop.time()))
            await ws.send_str(json.dumps({"type": "hangup"}))
            while (await ws.receive(timeout=10)).type is aiohttp.WSMsgType.TEXT:
                pass
            return ready["session"]

    try:
        session = asyncio.run(call())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with wave.open(str(tmp_path / f"{session}.wav"), "rb") as w:
        assert (w.getnchannels(), w.getframerate()) == (2, RATE)
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    caller, agent = data[:, 0].astype(np.float64), data[:, 1].astype(np.float64)
    assert abs(len(data) - len(pcm)) < RATE // 4  # the call's length, on the media clock
    assert np.abs(caller).max() > 5000 and np.abs(agent).max() > 5000
    # the agent's echo of the tone lies beside the tone: the lag of best match is small
    lags = range(0, RATE // 4, 80)
    best = max(lags, key=lambda d: float(np.dot(caller[: len(caller) - d], agent[d:])))
    assert best < RATE // 10, best / RATE  # within 100 ms
    # the tone's onset in each channel (the first loud sample)
    onset = [int(np.argmax(np.abs(ch) > 3000)) for ch in (caller, agent)]
    assert 0 <= onset[1] - onset[0] < RATE // 10, onset
    summary = [json.loads(x) for x in (tmp_path / f"{session}.jsonl").read_text().splitlines()]
    assert summary[-1]["type"] == "session" and summary[-1]["session"] == session


def test_a_record_dir_that_is_not_there_is_refused_before_anything_loads(tmp_path):
    done = subprocess.run([sys.executable, str(AGENT_CLI), "serve", "--port", str(free_port()),
                           "--record", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--record" in done.stderr and "create it first" in done.stderr
