"""``voxline serve --twilio``: one port serves the browser page and Twilio's TwiML and media."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_mounts_twilio_beside_the_page():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "serve", "--port", str(port), "--twilio",
         "--public-url", "https://bot.example.test", "--tts-backend", "espeak"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
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
        twiml = urllib.request.urlopen(
            urllib.request.Request(base + "/twilio/twiml", data=b"", method="POST"), timeout=10
        ).read().decode()
        assert "<Connect><Stream" in twiml and 'url="wss://bot.example.test/twilio/media"' in twiml
        health = json.loads(urllib.request.urlopen(base + "/healthz", timeout=10).read())
        assert health["calls"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
