"""A real ``voxline serve`` (the embedded models, eSpeak for speed) as an operator runs it: a
caller speaks a real clip over WebSocket; ``/metrics`` scraped during the call (prometheus-client's
parser) shows the call, its ASR slot, the engine's batches and the turn's spans; OpenTelemetry
spans reach a real OTLP/HTTP receiver started here — one ``call`` span, its turns, and under each
turn its stage spans with their budgets; SIGTERM after the call exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import wave

import aiohttp
import numpy as np
import pytest
import speech
from otlp_receiver import Receiver, attrs
from prom_text import samples

pytestmark = pytest.mark.slow
FRAME = 320  # 20 ms at 16 kHz


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _call(base: str) -> tuple[list[dict], dict, dict]:
    """Speak one clip at real-time pace and wait for the answered turn's trace; the events,
    the metrics scraped while the call was live, and after it."""
    clip = speech.load("kittens")
    pcm = np.concatenate([clip, np.zeros(16000 * 3, np.int16)])
    events: list[dict] = []
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{base}/ws")

        async def read() -> None:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.TEXT:
                    events.append(json.loads(msg.data))

        reader = asyncio.ensure_future(read())
        t0 = time.monotonic()
        for i in range(0, len(pcm), FRAME):
            await ws.send_bytes(pcm[i:i + FRAME].tobytes())
            await asyncio.sleep(max(0.0, t0 + (i + FRAME) / 16000 - time.monotonic()))
        async with asyncio.timeout(60):
            while not any(e["type"] == "trace" and e.get("kind") == "turn" and e["complete"]
                          for e in events):
                await asyncio.sleep(0.05)
        during = samples(await (await http.get(f"{base}/metrics")).text())
        await ws.send_str(json.dumps({"type": "hangup"}))
        async with asyncio.timeout(10):
            await reader
        async with asyncio.timeout(10):
            while (after := samples(await (await http.get(f"{base}/metrics")).text()))[
                    ("voxline_calls_active", ())] != 0:
                await asyncio.sleep(0.05)
    return events, during, after


def test_a_real_call_shows_in_metrics_and_in_otlp_spans(tmp_path):
    pytest.importorskip("opentelemetry.sdk.trace")
    receiver = Receiver(pytest.importorskip(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2"))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONUNBUFFERED="1", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url,
               OTEL_BSP_SCHEDULE_DELAY="200", NO_PROXY="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "serve", "--port", str(port), "--tts-backend",
         "espeak", "--record", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "press Call" in line or proc.poll() is not None:
                break
        assert proc.poll() is None, proc.stdout.read()
        events, during, after = asyncio.run(_call(f"http://127.0.0.1:{port}"))
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        log = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        receiver.close()
    assert rc == 0, log
    finals = [e["text"] for e in events if e["type"] == "transcript" and e["final"]]
    assert "kittens" in " ".join(finals).lower(), finals

    # /metrics during the call
    assert during[("voxline_calls_active", ())] == 1
    assert during[("voxline_asr_slots", (("state", "in_use"),))] == 1
    assert during[("voxline_asr_batches_total", ())] > 0
    assert during[("voxline_asr_batch_wait_seconds_count", ())] > 0
    assert during[("voxline_span_seconds_count", (("span", "voice_to_voice"),))] >= 1
    assert during[("voxline_span_seconds_count", (("span", "llm_first_token"),))] >= 1
    assert during[("voxline_server_info", (("server", "serve"),))] == 1
    assert after[("voxline_calls_ended_total", (("reason", "hangup"),))] == 1

    # the OTLP spans: one call, its turns, each turn's stage spans with their budgets
    spans = [s for _, s in receiver.spans()]
    calls = [s for s in spans if s.name == "call"]
    assert len(calls) == 1
    call = calls[0]
    turns = [s for s in spans if s.name in ("turn", "greeting") and s.parent_span_id == call.span_id]
    answered = [t for t in turns if t.name == "turn" and attrs(t)["voxline.complete"]]
    assert answered, [t.name for t in turns]
    stages = {s.name: s for s in spans if s.parent_span_id == answered[0].span_id}
    assert {"vad_eos", "asr_final", "llm_first_token", "tts_first_audio",
            "voice_to_voice"} <= stages.keys()
    v2v = attrs(stages["voice_to_voice"])
    assert v2v["voxline.budget_ms"] > 0 and isinstance(v2v["voxline.over_budget"], bool)
    for s in stages.values():
        assert answered[0].start_time_unix_nano <= s.start_time_unix_nano
        assert s.end_time_unix_nano <= answered[0].end_time_unix_nano
        assert s.trace_id == call.trace_id
    assert call.start_time_unix_nano <= answered[0].start_time_unix_nano
    assert answered[0].end_time_unix_nano <= call.end_time_unix_nano

    # --record: the call as a stereo WAV (the caller's clip left, the agent's voice right) and
    # its trace, under the session's id
    session = attrs(call)["session.id"]
    with wave.open(str(tmp_path / f"{session}.wav"), "rb") as w:
        assert (w.getnchannels(), w.getframerate()) == (2, 16000)
        stereo = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    clip = speech.load("kittens")
    assert len(stereo) >= len(clip)
    caller, agent = stereo[:, 0], stereo[:, 1]
    assert np.abs(caller).max() == np.abs(clip).max()  # the clip, as it was sent
    assert np.abs(agent).max() > 2000  # the agent spoke (greeting, answer)
    lines = [json.loads(x) for x in (tmp_path / f"{session}.jsonl").read_text().splitlines()]
    assert any(x["type"] == "turn" and x["complete"] for x in lines)
    assert lines[-1]["type"] == "session" and lines[-1]["session"] == session
