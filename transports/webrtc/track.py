"""The agent's voice as an aiortc audio track: one 20 ms frame from the session's playout per
``recv``, paced in real time (aiortc's sender asks as fast as it can encode)."""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE
from agent.playout import Playout

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)


class PlayoutTrack(MediaStreamTrack):
    """16 kHz mono frames; aiortc's Opus encoder resamples them to 48 kHz itself. Silence is sent
    while the agent is quiet, so the browser's jitter buffer stays primed."""

    kind = "audio"

    def __init__(self, playout: Playout) -> None:
        super().__init__()
        self.playout = playout
        self._silence = np.zeros((1, FRAME_SAMPLES), dtype=np.int16)
        self._pts = 0
        self._due = 0.0
        self.frames_out = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._due == 0.0 or now - self._due > 5 * FRAME_S:
            self._due = now  # first frame, or the loop stalled: resync instead of a burst
        elif self._due > now:
            await asyncio.sleep(self._due - now)
        self._due += FRAME_S
        pcm = self.playout.pull()
        data = self._silence if pcm is None else pcm.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(data, format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        frame.time_base = TIME_BASE
        self._pts += FRAME_SAMPLES
        if pcm is not None:
            # aiortc encodes and sends this frame as soon as recv returns
            self.playout.sent(time.monotonic_ns())
            self.frames_out += 1
        return frame
