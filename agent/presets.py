"""The composition root's registry: concrete stages and backends named by import path, loaded
lazily when a command runs, so the core never imports a model runtime at start-up."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import LLM_WEIGHTS, TURN_MODES, Config
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
    "turn_model": "stages.smart_turn:load_turn_scorer",
    "turn_words": "stages.text_turn:load_text_turn_scorer",
    "vad": "stages.vad:VADStage",
    "asr": "stages.asr.stage:StreamingASR",
    "turn": "stages.turn:TurnDetector",
    "idle": "stages.idle:IdleMonitor",
    "llm": "stages.llm.stage:LLMStage",
    "tts": "stages.tts.stage:TTSStage",
    "echo": "stages.echo:EchoGuard",
    "echo_test": "stages.echo_test:EchoTest",
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
    turn: Any = None  # the turn model's scorer shared by every call (semantic endpointing)
    # the tools every call's agent may use (agent.tools.Tools): ``[llm] tools`` by import
    # path, and whatever code adds (``models.tools.add(fn)``) before the first call
    tools: Any = None
    turn_words: Any = None  # the words' end-of-turn scorer (semantic endpointing, text_check)


def asr_stats(engine: Any) -> dict[str, int]:
    """What a server reports of the shared ASR engine (``/healthz``, the SIP stats line)."""
    return {"asr_slots": engine.pool.capacity, "asr_slots_in_use": engine.pool.in_use}


def load_models(cfg: Config, need_llm: bool = True, need_tts: bool = True) -> Models:
    """Load and warm up the configured backends (slow: seconds)."""
    from agent.runtime import limit_blas_threads

    limit_blas_threads(cfg.runtime)  # before any model runs NumPy's products
    vad = load(STAGES["vad_model"])(cfg.vad)  # one session; each call forks its own state
    if cfg.turn.mode not in TURN_MODES:  # before any model loads, not at the first call
        raise ConfigError(f"turn.mode: expected one of {', '.join(TURN_MODES)}, got {cfg.turn.mode!r}")
    if cfg.turn.mode == "semantic" and cfg.turn.text_check:
        from stages.text_turn import hesitation_words

        hesitation_words(cfg.turn.hesitations)  # a ConfigError now, not at the first call
    if cfg.llm.weights not in LLM_WEIGHTS:
        raise ConfigError(f"llm.weights: expected one of {', '.join(LLM_WEIGHTS)}, "
                          f"got {cfg.llm.weights!r}")
    semantic = cfg.turn.mode == "semantic"
    asr_cfg = cfg.asr
    if semantic and cfg.turn.text_check and cfg.turn.text_asr_end > 0:
        asr_cfg = dataclasses.replace(asr_cfg, sentence_ends=True)  # the words' check reads it
    backend = backend_class("asr", cfg.asr.backend)(asr_cfg)
    llm = backend_class("llm", cfg.llm.backend)(cfg.llm) if need_llm else None
    tts = backend_class("tts", cfg.tts.backend)(cfg.tts) if need_tts else None
    for m in (backend, llm, tts):
        if m is not None:
            m.warmup()  # declared by every backend protocol (ASRBackend, ChatLLM, TTS)
    if tts is not None:
        from stages.tts.cache import with_phrase_cache

        tts = with_phrase_cache(tts, cfg.tts)
    # one engine per model per process: every call's ASR requests share its batches
    asr = load("stages.asr.stage:make_engine")(backend, cfg.asr)
    # last: its worker thread starts only once every other backend loaded without error
    words = load(STAGES["turn_words"])(cfg.turn, cfg.llm.weights) if semantic and cfg.turn.text_check else None
    turn = load(STAGES["turn_model"])(cfg.turn) if semantic else None
    return Models(vad=vad, asr=asr, llm=llm, tts=tts, turn=turn, tools=load_tools(cfg, llm),
                  turn_words=words)


def load_tools(cfg: Config, llm: Any = None) -> Any:
    """``[llm] tools`` (import paths, comma-separated) as one :class:`agent.tools.Tools`,
    checked against what the LLM backend can do before any call."""
    from agent.tools import Tools

    paths = [p.strip() for p in cfg.llm.tools.split(",") if p.strip()]
    tools = Tools.from_config(paths)
    if len(tools) and llm is not None and not llm.capabilities.tools:
        raise ConfigError(
            f"[llm] tools: the {cfg.llm.backend} backend with this model cannot call tools "
            f"({type(llm).__name__}) — configure no tools, or a model that can")
    return tools


def new_session(cfg: Config, models: Models, telephony: bool = False, record_dir: str = "") -> Any:
    """One call: a fresh pipeline over the shared models and its trace (the LLM stage speaks
    the greeting), with its own echo guard where ``[echo]`` puts one (``telephony``: a SIP or
    Twilio call). ``record_dir``: the call is recorded there as it goes — ``<session>.wav``
    (stereo: caller left, agent right) and ``<session>.jsonl`` (its trace)."""
    return _session(cfg, build_pipeline(cfg, models), record_dir,
                    echo=new_echo_guard(cfg, telephony))


def new_echo_test_session(cfg: Config, record_dir: str = "") -> Any:
    """One echo-test call (``--echo-test``): the caller's audio played back to it, no model
    and no echo guard (the caller hears the line as it is); recorded like any call."""
    return _session(cfg, Pipeline([load(STAGES["echo_test"])()]), record_dir, echo=None)


def _session(cfg: Config, pipeline: Pipeline, record_dir: str, echo: Any) -> Any:
    from agent.session import Session, new_session_id
    from agent.trace import Trace

    sid = new_session_id()
    recorder = None
    path = cfg.trace.path or None
    if record_dir:
        from agent.recording import CallRecorder

        recorder = CallRecorder(Path(record_dir) / f"{sid}.wav")
        path = Path(record_dir) / f"{sid}.jsonl"
    trace = Trace(cfg.trace.budgets, path=path, session_id=sid)
    return Session(pipeline, trace, session_id=sid, echo=echo, recorder=recorder)


def check_record_dir(path: str) -> None:
    """``--record DIR``: a directory this process can write, checked before any model loads."""
    import os

    if path and not (Path(path).is_dir() and os.access(path, os.W_OK)):
        raise ConfigError(f"--record: {path} is not a directory this process can write "
                          "(create it first)")


def new_echo_guard(cfg: Config, telephony: bool) -> Any:
    """The call's echo guard, or None where ``[echo]`` leaves it off for this kind of call."""
    return load(STAGES["echo"])(cfg.echo) if cfg.echo.active(telephony) else None


def build_pipeline(cfg: Config, models: Models) -> Pipeline:
    """VAD → streaming ASR → turn detection → idle monitor → LLM → TTS, one per call.

    With semantic endpointing the VAD stops at the turn's short ``pause_ms``: each such pause
    is a point where the turn model decides, and the ASR's final for it is ready sooner."""
    vad_cfg = cfg.vad
    scorer = models.turn
    if cfg.turn.mode == "semantic" and scorer is not None:
        vad_cfg = dataclasses.replace(vad_cfg, stop_ms=min(vad_cfg.stop_ms, cfg.turn.pause_ms))
    stages = [
        load(STAGES["vad"])(vad_cfg, model=models.vad.fork()),
        load(STAGES["asr"])(models.asr, cfg.asr),
        load(STAGES["turn"])(cfg.turn, vad_stop_ms=vad_cfg.stop_ms, scorer=scorer,
                             text_scorer=models.turn_words),
        load(STAGES["idle"])(cfg.agent),  # re-prompts an idle caller, then hangs up (if configured)
        load(STAGES["llm"])(models.llm, cfg.llm, cfg.agent, apology=cfg.agent.apology,
                            tools=models.tools),
        load(STAGES["tts"])(models.tts, cfg.tts, apology=cfg.agent.apology),
    ]
    return Pipeline(stages)
