"""``voxline asr-serve`` as the tests start it: a real subprocess on a socket of the test's own,
read line by line, stopped or killed at the end."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAIT = 120


class Served:
    """``voxline asr-serve ARGS`` in a subprocess: its socket, its HTTP port and token.
    ``drain_s``: how long its SIGTERM lets open streams finish (0: :meth:`stop` ends them at
    once, as the tests that restart a server under their clients need)."""

    def __init__(self, tmp_path: Path, *args: str, socket_path: str | None = None,
                 token: bool = False, drain_s: float = 0.0,
                 env: dict[str, str] | None = None) -> None:
        self.path = socket_path or str(tmp_path / "asr.sock")
        self.log_path = tmp_path / f"asr-serve-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "asr-serve", "--socket", self.path,
             "--drain-timeout", str(drain_s), *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        line = self._line()
        assert "listening on" in line, (line, self._stderr())
        self.ready_line = line
        self.port = int(line.rsplit(":", 1)[1].split("/")[0]) if "http://" in line else None
        self.token = self._line().split("token ")[1].split()[0] if token else None

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _line(self) -> str:
        try:
            return self._lines.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"asr-serve said nothing in {WAIT} s: {self._stderr()}") from None

    def _stderr(self) -> str:
        return self.log_path.read_text()[-3000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/audio/transcriptions"

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        self.log.close()
        return rc
