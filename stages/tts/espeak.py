"""eSpeak NG: a tiny rule-based synthesizer, robotic but intelligible and nearly free to run."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from agent.config import TTSConfig
from stages.tts.libespeak import espeak_library


class EspeakTTS:
    """eSpeak NG through its C library. A sentence is synthesized in about a millisecond, so
    ``synthesize`` renders it whole and then yields the library's 50 ms buffers."""

    def __init__(self, cfg: TTSConfig) -> None:
        self.cfg = cfg
        self.voice = cfg.voice or "en-us"
        self.speed = cfg.speed if cfg.speed > 0 else 1.0
        self._lib = espeak_library()

    @property
    def sample_rate(self) -> int:
        return self._lib.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        chunks: list[np.ndarray] = []

        def collect(pcm: np.ndarray) -> bool:
            chunks.append(pcm)
            return True

        self._lib.synthesize(text, self.voice, self.speed, collect)
        yield from chunks

    def warmup(self) -> None:
        for _ in self.synthesize("Hello."):
            pass
