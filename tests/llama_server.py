"""A real ``python -m llama_cpp.server`` on a free loopback port serving the embedded SmolLM2,
for the tests of the OpenAI-compatible path."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stages.llm.local import smollm2_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(log_dir: Path, *options: str, api_key: str = "") -> Iterator[str]:
    """Start the server (``options`` are its flags, e.g. ``--chat_format ...``), wait until it
    answers, yield its /v1 base URL, and stop it."""
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] not installed")
    httpx = pytest.importorskip("httpx")
    port = free_port()
    # The server logs hundreds of kB at start-up: to a file, since a full pipe would stall it.
    log_path = log_dir / "server.log"
    keyed = ["--api_key", api_key] if api_key else []
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_path()),
             "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1", "--n_ctx", "1024",
             *keyed, *options],
            stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    raise RuntimeError("llama_cpp.server exited: "
                                       f"{log_path.read_text(errors='replace')[-2000:]}")
                try:
                    if httpx.get(f"{base}/models", headers=headers, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("llama_cpp.server did not become ready in 120 s")
                time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
