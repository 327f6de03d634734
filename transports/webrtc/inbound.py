"""Audio between WebRTC's Opus (48 kHz) and the pipeline's 16 kHz mono int16 in whole 20 ms
frames, resampled with av's resampler and cut into fixed frames that never wait for the next
packet."""

from __future__ import annotations

from collections.abc import Iterator

import av
import numpy as np

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE


class AlignedResampler:
    """av's resampler, its output cut into frames of ``frame_samples`` per channel (packed s16,
    interleaved when stereo).

    The resampler's first output is short by its filter delay (304 of 320 samples going down
    to 16 kHz, likewise going up); cut naively, the remainder would wait a whole packet for
    company, every packet, for the whole call — 20 ms of latency. A few samples of silence before
    the first output line the frames up with the packets instead."""

    def __init__(self, layout: str, rate: int, frame_samples: int) -> None:
        self._resampler = av.AudioResampler(format="s16", layout=layout, rate=rate)
        self.channels = 2 if layout == "stereo" else 1
        self.frame_values = frame_samples * self.channels
        self._buf = np.zeros(self.frame_values * 8, dtype=np.int16)
        self._n = 0
        self._aligned = False

    @property
    def held(self) -> int:
        """Samples (per channel) waiting for a frame to fill."""
        return self._n // self.channels

    def feed(self, frame: av.AudioFrame) -> Iterator[np.ndarray]:
        for out in self._resampler.resample(frame):
            pcm = out.to_ndarray().reshape(-1)
            if not self._aligned and len(pcm):
                self._aligned = True
                pad = -len(pcm) % self.frame_values
                if pad:
                    pcm = np.concatenate([np.zeros(pad, np.int16), pcm])
            end = self._n + len(pcm)
            if end > len(self._buf):  # a frame far larger than 20 ms: grow once
                self._buf = np.concatenate([self._buf[: self._n], np.zeros(end, np.int16)])
            self._buf[self._n : end] = pcm
            self._n = end
        start = 0
        while self._n - start >= self.frame_values:
            yield self._buf[start : start + self.frame_values].copy()
            start += self.frame_values
        if start:
            rest = self._n - start
            self._buf[:rest] = self._buf[start : self._n]
            self._n = rest


class InboundAudio(AlignedResampler):
    """Caller audio off a WebRTC track: decoded Opus (48 kHz, usually stereo) to the pipeline's
    16 kHz mono int16 in whole 20 ms frames."""

    def __init__(self) -> None:
        super().__init__("mono", SAMPLE_RATE, FRAME_SAMPLES)
