"""Caller audio off a WebRTC track: decoded Opus (48 kHz, usually stereo) to 16 kHz mono int16
in whole 20 ms frames, the pipeline's format."""

from __future__ import annotations

from collections.abc import Iterator

import av
import numpy as np

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE


class InboundAudio:
    """Resamples decoded frames with av's resampler and cuts the result into 320-sample frames
    (the resampler's output size varies by a few samples from call to call)."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        self._buf = np.zeros(FRAME_SAMPLES * 8, dtype=np.int16)
        self._n = 0
        self._aligned = False

    def feed(self, frame: av.AudioFrame) -> Iterator[np.ndarray]:
        for out in self._resampler.resample(frame):
            pcm = out.to_ndarray().reshape(-1)
            if not self._aligned and len(pcm):
                # The resampler's first output is short by its filter delay (304 of 320 samples
                # at 48 kHz); the remainder would then wait a whole packet for company, every
                # packet, for the whole call (19 ms of latency). A few samples of silence at the
                # start of the call line the frames up with the packets instead.
                self._aligned = True
                pad = -len(pcm) % FRAME_SAMPLES
                if pad:
                    pcm = np.concatenate([np.zeros(pad, np.int16), pcm])
            end = self._n + len(pcm)
            if end > len(self._buf):  # a frame far larger than 20 ms: grow once
                self._buf = np.concatenate([self._buf[: self._n], np.zeros(end, np.int16)])
            self._buf[self._n : end] = pcm
            self._n = end
        start = 0
        while self._n - start >= FRAME_SAMPLES:
            yield self._buf[start : start + FRAME_SAMPLES].copy()
            start += FRAME_SAMPLES
        if start:
            rest = self._n - start
            self._buf[:rest] = self._buf[start : self._n]
            self._n = rest
