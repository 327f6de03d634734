"""The composition root's registry: concrete stages and backends named by import path, loaded
lazily when a command runs, so the core never imports a model runtime at start-up."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

from agent.config import Config
from agent.errors import ConfigError
from agent.pipeline import Pipeline

log = logging.getLogger("voxline.presets")

REGISTRY: dict[str, dict[str, str]] = {
    "asr": {
        "whisper": "stages.asr.whisper:WhisperBackend",
        "parakeet": "stages.asr.parakeet.backend:ParakeetBackend",
        "remote": "stages.asr.remote:RemoteASRBackend",  # a shared `voxline asr-serve`
    },
    "llm": {
        "local": "stages.llm.local:LocalLLM",
        "openai": "stages.llm.openai:OpenAILLM",
    },
    "tts": {
        "piper": "stages.tts.piper:PiperTTS",
        "espeak": "stages.tts.espeak:EspeakTTS",
    },
}

STAGES: dict[str, str] = {
    "vad_model": "stages.vad:SileroModel",
    "vad": "stages.vad:VADStage",
    "asr": "stages.asr.stage:StreamingASR",
    "turn": "stages.turn:TurnDetector",
    "llm": "stages.llm.stage:LLMStage",
    "tts": "stages.tts.stage:TTSStage",
}


def load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def backend_class(kind: str, name: str) -> Any:
    try:
        path = REGISTRY[kind][name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY.get(kind, {})))
        raise ConfigError(f"unknown {kind} backend {name!r} (known: {known})") from None
    return load(path)


@dataclass(slots=True)
class Models:
    """The models one process loads once and every session shares."""

    vad: Any
    asr: Any  # the ASREngine shared by every call (its .backend is the model)
    llm: Any
    tts: Any


def load_models(cfg: Config, need_llm: bool = True, need_tts: bool = True) -> Models:
    """Load and warm up the configured backends (slow: seconds)."""
    vad = load(STAGES["vad_model"])(cfg.vad)  # one session; each call forks its own state
    backend = backend_class("asr", cfg.asr.backend)(cfg.asr)
    llm = backend_class("llm", cfg.llm.backend)(cfg.llm) if need_llm else None
    tts = backend_class("tts", cfg.tts.backend)(cfg.tts) if need_tts else None
    for m in (backend, llm, tts):
        if m is not None:
            m.warmup()  # declared by every backend protocol (ASRBackend, ChatLLM, TTS)
    # one engine per model per process: every call's ASR requests share its batches
    asr = load("stages.asr.stage:make_engine")(backend, cfg.asr)
    return Models(vad=vad, asr=asr, llm=llm, tts=tts)


def new_session(cfg: Config, models: Models) -> Any:
    """One call: a fresh pipeline over the shared models and its trace (the LLM stage speaks
    the greeting)."""
    from agent.session import Session
    from agent.trace import Trace

    trace = Trace(cfg.trace.budgets, path=cfg.trace.path or None)
    return Session(build_pipeline(cfg, models), trace)


def build_pipeline(cfg: Config, models: Models) -> Pipeline:
    """VAD → streaming ASR → turn detection → LLM → TTS, one per call."""
    stages = [
        load(STAGES["vad"])(cfg.vad, model=models.vad.fork()),
        load(STAGES["asr"])(models.asr, cfg.asr),
        load(STAGES["turn"])(cfg.turn, vad_stop_ms=cfg.vad.stop_ms),
        load(STAGES["llm"])(models.llm, cfg.llm, cfg.agent),
        load(STAGES["tts"])(models.tts, cfg.tts),
    ]
    return Pipeline(stages)
