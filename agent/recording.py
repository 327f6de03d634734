"""A live call recorded as it goes: one stereo WAV per call, left the caller (the audio that
reached voxline), right the agent (the audio the playout handed the transport), both on the
caller's media clock, as ``voxline run --output`` writes them.

The file is written every ``flush_s`` and its header rewritten each time, so a process killed
mid-call leaves a playable file up to the last flush. Nothing is written per frame: frames are
copied into a buffer, and the buffer goes to disk at a flush.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np

from agent.frames import SAMPLE_RATE

FLUSH_S = 1.0  # how much a killed process may lose
# Within a stretch of agent audio the agent's channel follows its own pulls; when it drifts from
# the caller's media clock by more than this (a transport that stopped pulling, a caller whose
# audio stalled), it is put back in line with the caller's.
RESYNC_S = 0.25
HEADER_BYTES = 44


class CallRecorder:
    def __init__(self, path: str | Path, rate: int = SAMPLE_RATE, flush_s: float = FLUSH_S) -> None:
        self.path = Path(path)
        self.rate = rate
        self.flush_s = flush_s
        self.resync = int(RESYNC_S * rate)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._base = 0  # samples on disk (per channel)
        self._buf = np.zeros((rate * 4, 2), np.int16)  # from _base on
        self.caller_pos = 0
        self.agent_pos = 0
        self.resyncs = 0
        self._talking = False
        self._last_flush = time.monotonic()
        self._write_header()
        self.closed = False

    # --- frames in ------------------------------------------------------------------------------
    def caller(self, pcm: np.ndarray) -> None:
        """Caller audio, in arrival order (the session's media clock)."""
        self._put(0, self.caller_pos, pcm)
        self.caller_pos += len(pcm)
        self._maybe_flush()

    def played(self, pcm: np.ndarray | None, samples: int) -> None:
        """What the playout handed the transport: ``samples`` of agent audio, or None for as
        long a silence (the signature of the echo guard's, so the playout feeds both alike).

        Each stretch of agent audio starts beside the caller's packet that had arrived last when
        it was handed over (the transport's ticks and the caller's packets run on two clocks;
        ``voxline run --output`` puts them side by side the same way); within a stretch, its
        frames follow each other."""
        if pcm is None:
            self._talking = False
        elif not self._talking:
            self._talking = True
            self.agent_pos = max(0, self.caller_pos - samples)
        if abs(self.agent_pos - self.caller_pos) > self.resync:
            self.agent_pos = self.caller_pos
            self.resyncs += 1
        if pcm is not None:
            self._put(1, self.agent_pos, pcm[:samples])
        self.agent_pos += samples

    def _put(self, channel: int, at: int, pcm: np.ndarray) -> None:
        start = at - self._base
        if start < 0:  # already on disk (a channel that lagged past a flush): cut
            pcm = pcm[-start:]
            start = 0
        end = start + len(pcm)
        if end > len(self._buf):
            grown = np.zeros((max(end, 2 * len(self._buf)), 2), np.int16)
            grown[: len(self._buf)] = self._buf
            self._buf = grown
        self._buf[start:end, channel] = pcm

    # --- disk -----------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= self.flush_s:
            self._last_flush = now
            # up to where both channels are (the agent's may trail the caller's a little)
            self.flush(min(self.caller_pos, self.agent_pos) if self.agent_pos else self.caller_pos)

    def flush(self, upto: int | None = None) -> None:
        """Write the buffered samples up to ``upto`` (default: all), then the header."""
        if self.closed:
            return
        end = max(self.caller_pos, self.agent_pos) if upto is None else upto
        # a channel far behind the other is not waited for beyond the resync bound
        end = max(end, max(self.caller_pos, self.agent_pos) - self.resync)
        n = end - self._base
        if n <= 0:
            return
        self._file.seek(0, 2)
        self._file.write(np.ascontiguousarray(self._buf[:n]).astype("<i2", copy=False).tobytes())
        self._buf[: len(self._buf) - n] = self._buf[n:]
        self._buf[len(self._buf) - n:] = 0
        self._base = end
        self._write_header()
        self._file.flush()

    def _write_header(self) -> None:
        data = self._base * 4  # 2 channels x 2 bytes
        header = b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE"
        header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 2, self.rate, self.rate * 4, 4, 16)
        header += b"data" + struct.pack("<I", data)
        self._file.seek(0)
        self._file.write(header)

    def close(self) -> Path:
        """Write what is left and close the file; returns its path."""
        if not self.closed:
            self.flush()
            self.closed = True
            self._file.close()
        return self.path

    @property
    def seconds(self) -> float:
        return max(self.caller_pos, self.agent_pos) / self.rate
