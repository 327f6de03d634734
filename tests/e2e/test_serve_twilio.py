"""``voxline serve --twilio``: one port serves the browser page and Twilio's TwiML and media,
Twilio's routes behind its request signature (computed here from Twilio's documented algorithm:
base64 HMAC-SHA1 of the URL and the sorted POST parameters, keyed with the auth token)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytestmark = pytest.mark.slow
AUTH_TOKEN = "e2e-twilio-auth-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _twilio_signature(url: str, params: dict[str, str]) -> str:
    data = url + "".join(k + params[k] for k in sorted(params))
    digest = hmac.new(AUTH_TOKEN.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _post(url: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=urllib.parse.urlencode(params).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_serve_refuses_twilio_behind_a_public_url_without_the_auth_token():
    env = {k: v for k, v in os.environ.items() if k != "TWILIO_AUTH_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli", "serve", "--port", str(_free_port()), "--twilio",
         "--public-url", "https://bot.example.test"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    # refused before any model loads, saying what to pass
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--twilio-auth-token or $TWILIO_AUTH_TOKEN" in done.stderr
    assert "models ready" not in done.stdout


def test_serve_mounts_twilio_beside_the_page():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "serve", "--port", str(port), "--twilio",
         "--public-url", "https://bot.example.test", "--tts-backend", "espeak"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", TWILIO_AUTH_TOKEN=AUTH_TOKEN),
    )
    try:
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Twilio:" in line or proc.poll() is not None:
                break
        assert any("/twilio/twiml" in x for x in lines), "".join(lines)
        base = f"http://127.0.0.1:{port}"
        page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
        assert "<html" in page.lower()
        call = {"CallSid": "CA1", "From": "+15550001111", "To": "+15550002222"}
        signature = _twilio_signature("https://bot.example.test/twilio/twiml", call)
        status, twiml = _post(base + "/twilio/twiml", call, {"X-Twilio-Signature": signature})
        assert status == 200
        assert "<Connect><Stream" in twiml and 'url="wss://bot.example.test/twilio/media"' in twiml
        status, text = _post(base + "/twilio/twiml", call, {})
        assert status == 403 and "X-Twilio-Signature" in text
        status, _ = _post(base + "/twilio/twiml", {**call, "From": "+1"},
                          {"X-Twilio-Signature": signature})
        assert status == 403
        health = json.loads(urllib.request.urlopen(base + "/healthz", timeout=10).read())
        assert health["calls"] == 0 and health["refused_by"]["signature"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sigterm_with_a_live_twilio_stream_ends_it_at_the_drain_timeout_and_exits():
    # the review's finding: a live Twilio stream kept `voxline serve` alive for over 110 s;
    # now it drains: the stream goes on until --drain-timeout, then is closed going-away
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from transports.twilio.messages import Connected, Media, Start

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "serve", "--port", str(port), "--twilio",
         "--tts-backend", "espeak", "--drain-timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "Twilio:" in line or proc.poll() is not None:
                break

        async def call() -> tuple[int | None, float]:
            async with connect(f"ws://127.0.0.1:{port}/twilio/media") as ws:
                await ws.send(Connected().to_json())
                await ws.send(Start("MZ1", "CA1", "AC" + "0" * 32, sequence=1).to_json())
                for k in range(25):  # half a second of μ-law silence: the call is live
                    await ws.send(Media("MZ1", b"\xff" * 160, k + 1, k * 20, sequence=k + 2)
                                  .to_json())
                    await asyncio.sleep(0.02)
                proc.send_signal(15)
                t0 = time.monotonic()
                try:
                    async with asyncio.timeout(30):
                        while True:
                            await ws.recv()
                except ConnectionClosed:
                    pass
                return ws.close_code, time.monotonic() - t0

        code, took = asyncio.run(call())
        assert code == 1001 and 1.5 < took < 10
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
