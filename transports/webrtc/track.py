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
from transports.webrtc.inbound import AlignedResampler

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
OPUS_RATE = 48_000
OPUS_FRAME = FRAME_SAMPLES * OPUS_RATE // SAMPLE_RATE  # 960: one 20-ms Opus frame
TIME_BASE = fractions.Fraction(1, OPUS_RATE)


class PlayoutTrack(MediaStreamTrack):
    """The playout's 16 kHz frames, sent as 48 kHz stereo 20-ms frames: exactly what aiortc's
    Opus encoder wants, so each frame is encoded and sent at once. Given 16 kHz mono, aiortc's
    own resampler falls one frame short and every packet leaves 20 ms late. Silence is sent
    while the agent is quiet, so the browser's jitter buffer stays primed."""

    kind = "audio"

    def __init__(self, playout: Playout) -> None:
        super().__init__()
        self.playout = playout
        self._silence = np.zeros((1, FRAME_SAMPLES), dtype=np.int16)
        self._up = AlignedResampler("stereo", OPUS_RATE, OPUS_FRAME)
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
        mono = av.AudioFrame.from_ndarray(data, format="s16", layout="mono")
        mono.sample_rate = SAMPLE_RATE
        up = list(self._up.feed(mono))
        stereo = up[-1] if up else np.zeros(OPUS_FRAME * 2, np.int16)  # never after the first
        frame = av.AudioFrame.from_ndarray(stereo.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = TIME_BASE
        self._pts += OPUS_FRAME
        if pcm is not None:
            # aiortc encodes and sends this frame as soon as recv returns
            self.playout.sent(time.monotonic_ns())
            self.frames_out += 1
        return frame
