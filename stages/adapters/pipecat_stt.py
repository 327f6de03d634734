"""voxline's streaming ASR engine as a pipecat STT service.

pipecat runs one STT per pipeline, and a pipeline per call; :class:`VoxlineSTTService` makes
every pipeline in a process stream into ONE shared :class:`ASREngine` — whose worker batches the
model calls of all of them — or, with ``socket_path``, into ``voxline asr-serve``'s engine,
shared by every process on the machine. Each pipeline holds one slot of that engine from its
StartFrame to its EndFrame/CancelFrame (or cleanup), and the slot is freed then.

Frames in: the pipeline's input audio (any rate; resampled to the engine's 16 kHz) and the VAD
frames of pipecat's ``VADProcessor`` (or a transport's VAD) upstream. The VAD frames drive the
same stream core as a voxline call (``stages/asr/stream.py``): partials while the user speaks,
and a final per VAD utterance once ``VADUserStoppedSpeakingFrame`` comes (finalised at the
moment speech stopped, less the VAD's ``stop_secs``). A ``UserStoppedSpeakingFrame`` (the turn
ended) or an ``STTMuteFrame`` while an utterance is open finalises it there. Interruptions do
not touch the user's audio: the utterance in progress goes on.

Pauses (``pauses``, on where onnxruntime is installed): pipecat's VAD says the user stopped only
once ``stop_secs`` of silence have passed, and a final asked then is a whole model call later
still. So the service also runs voxline's VAD (Silero, the file pipecat ships) over the audio it
transcribes, for its pauses alone — where the probability falls, 1-3 windows after the voice —
and transcribes the utterance up to there at once, as a voxline call does (a partial already
with the model that heard the voice's end stands for it). When pipecat's stop comes for the same
moment, that transcript is the final: it is there when the stop comes, or on its way. Starts and
stops stay pipecat's; a pause whose user goes on only costs the model call.

Frames out: ``InterimTranscriptionFrame`` for each partial and a finalized
``TranscriptionFrame`` per utterance (an utterance longer than ``asr.max_utterance_s`` also gets
non-finalized transcription frames for the parts cut off it). ``frame.result`` is a
:class:`VoxlineTranscript`: the audio the text covers and, for a partial, how many of its first
characters are stable — they never change in the utterance's later partials (voxline's
stable-prefix rule), so a caption may show them for good; the final, a fresh reading of the
whole utterance, replaces the partials.

With ``interim_results=False`` no partial is computed and no ``InterimTranscriptionFrame``
pushed: finals (still read at the pauses) and long utterances' parts only, as pipecat's
segmented STT services give. A pipeline that reads no interim frames saves their model calls — in
``benchmarks/vs_pipecat.py``'s pipecat pipeline, 25-30% of the worker's CPU a call.

On EndFrame the finals still owed are awaited (up to ``finish_timeout_s``) and pushed before
the EndFrame goes on; on CancelFrame nothing is awaited.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.config import ASRConfig, VADConfig
from agent.errors import CapacityError, MissingExtraError, require

require("pipecat.services.stt_service", what="voxline's pipecat STT service", extra="pipecat",
        package="pipecat-ai")

from loguru import logger  # noqa: E402  (pipecat's logger, where its users look)
from pipecat.audio.utils import create_stream_resampler  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    CancelFrame,
    EndFrame,
    Frame,
    InterimTranscriptionFrame,
    StartFrame,
    STTMuteFrame,
    TranscriptionFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection  # noqa: E402
from pipecat.services.settings import STTSettings  # noqa: E402
from pipecat.services.stt_service import STTService  # noqa: E402
from pipecat.utils.time import time_now_iso8601  # noqa: E402

from agent.frames import AudioIn, SpeechPaused, SpeechResumed, SpeechStarted  # noqa: E402
from agent.frames import Frame as AgentFrame  # noqa: E402
from agent.stage import DOWN, Direction, Stage  # noqa: E402
from stages.asr.driver import StreamDriver  # noqa: E402
from stages.asr.engine import ASREngine  # noqa: E402
from stages.asr.slots import Slot  # noqa: E402
from stages.asr.stage import make_engine, stream_config  # noqa: E402
from stages.asr.stream import ASRStream, Failure, Kind, Result  # noqa: E402
from stages.asr.stream_client import ServedStream  # noqa: E402
from stages.vad import SileroModel, VADStage, silero_model_path  # noqa: E402

RATE = 16_000  # the engine's rate: the VAD events' and results' sample offsets
# Speech end to final transcript, p99, for pipecat's turn strategies (STTMetadataFrame): a final
# of Whisper tiny.en is one model call of the utterance (tests/e2e/test_pipecat_stt.py prints
# what it measured: 0.06-0.3 s on 2 CPU cores); over the socket add the round trip.
TTFS_P99_S = 0.5
FINISH_TIMEOUT_S = 5.0
# pipecat's VAD confirms speech start_secs after it began, and a soft first word ("He began...")
# may not count towards it: the utterance starts this much earlier still (the stream core adds
# its own 200-ms pre-roll)
START_LOOKBACK_S = 0.3
# pipecat's stop is for the pause voxline's VAD heard if it puts the speech's end at most this
# much after it (its VAD's confidence, 0.7 by default, falls sooner than Silero's 0.35 pause; its
# end is stop_secs before the frame that says so, give or take its smoothing)
PAUSE_MATCH_S = 0.25

_engines: dict[tuple, ASREngine] = {}
_engines_lock = threading.Lock()


def shared_engine(cfg: ASRConfig | None = None) -> ASREngine:
    """The process's engine for ``cfg`` (default: the embedded Whisper tiny.en), made and warmed
    on first use — seconds — and shared by every service given the same configuration. Blocking:
    call it off the event loop, or before the pipelines start."""
    from agent.presets import backend_class  # the registry of ASR backends, loaded lazily

    cfg = cfg or ASRConfig()
    key = dataclasses.astuple(cfg)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            backend = backend_class("asr", cfg.backend)(cfg)
            backend.warmup()
            engine = _engines[key] = make_engine(backend, cfg)
        return engine


_pause_model_lock = threading.Lock()


def _pause_model() -> SileroModel | None:
    """The process's Silero model for the services' pauses (each service forks it: one session,
    a stream's state each), or None without onnxruntime (said once). The file is silero-vad's
    where that is installed, else the same file inside pipecat. Services starting at once on
    several threads share the one made first."""
    with _pause_model_lock:
        return _load_pause_model()


@functools.cache
def _load_pause_model() -> SileroModel | None:
    try:
        path = silero_model_path()
    except MissingExtraError:
        import pipecat.audio.vad as pipecat_vad

        path = Path(pipecat_vad.__file__).parent / "data" / "silero_vad.onnx"
    try:
        return SileroModel(VADConfig(), path)
    except MissingExtraError as exc:
        logger.info(f"voxline STT: no pauses, finals are asked at pipecat's VAD stops ({exc})")
        return None


class _Pauses(Stage):
    """voxline's VAD over a service's audio, for its speech events: each goes to ``on_event``
    as the audio that carries it is fed."""

    def __init__(self, model: SileroModel,
                 on_event: Callable[[SpeechStarted | SpeechPaused | SpeechResumed], None],
                 cfg: VADConfig | None = None) -> None:
        super().__init__("pauses")
        self.on_event = on_event
        self.vad = VADStage(cfg or VADConfig(), model.fork())
        self.vad.link(self)

    def process(self, frame: AgentFrame, direction: Direction) -> None:
        if isinstance(frame, SpeechStarted | SpeechPaused | SpeechResumed):
            self.on_event(frame)

    def feed(self, pcm: np.ndarray, offset: int, t_ns: int) -> None:
        self.vad.process(AudioIn(pcm, offset, t_ns=t_ns), DOWN)


@dataclass(slots=True, frozen=True)
class VoxlineTranscript:
    """The ``result`` of a transcription frame from :class:`VoxlineSTTService`."""

    text: str
    stable: int  # a partial's first ``stable`` characters never change in later partials
    start_s: float  # the audio the text covers, in seconds of the pipeline's input
    end_s: float
    speculative: bool = False
    final: bool = False

    @property
    def stable_text(self) -> str:
        return self.text[: self.stable]


class VoxlineSTTService(STTService):
    """A pipecat STT service over voxline's shared streaming-ASR engine (see the module).

    ``engine``: an :class:`ASREngine` to use (else the process's :func:`shared_engine` for
    ``asr_config``); ``socket_path``: stream to ``voxline asr-serve`` at that socket instead
    (``""``: its default path). ``pauses``: transcribe at voxline's VAD pauses (see the module;
    None: where onnxruntime is installed, True: required); ``pause_vad``: that VAD's settings
    (voxline's ``[vad]``: its thresholds and its noise-floor rule; default the same defaults
    as a voxline call; its ``threads`` aside: one Silero session serves every service in the
    process). ``interim_results``: False computes and pushes no partials (see the module).
    Other keyword arguments go to pipecat's ``STTService``.
    """

    def __init__(self, *, engine: ASREngine | None = None, socket_path: str | None = None,
                 asr_config: ASRConfig | None = None, pauses: bool | None = None,
                 pause_vad: VADConfig | None = None, interim_results: bool = True,
                 finish_timeout_s: float = FINISH_TIMEOUT_S, **kwargs) -> None:  # noqa: ANN003
        if engine is not None and socket_path is not None:
            raise ValueError("give an engine or an asr-serve socket_path, not both")
        if pause_vad is not None and pauses is False:
            raise ValueError("pause_vad configures the pauses' VAD: not with pauses=False")
        if pauses:
            require("onnxruntime", what="the pauses of voxline's STT service", extra="embedded")
        cfg = asr_config or ASRConfig()
        kwargs.setdefault("ttfs_p99_latency", TTFS_P99_S)
        kwargs.setdefault("settings", STTSettings(
            model="asr-serve" if socket_path is not None else f"{cfg.backend}:{cfg.model or 'embedded'}",
            language=cfg.language))
        super().__init__(**kwargs)
        self._asr_config = cfg
        self._engine = engine
        self._socket_path = socket_path
        self._finish_timeout_s = finish_timeout_s
        self._interim = interim_results
        self._resampler = create_stream_resampler()
        self._offset = 0  # samples (16 kHz) of audio given to the stream
        self._speaking_since: int | None = None  # the open utterance's start, if one is open
        self._slot: Slot | None = None
        self._driver: StreamDriver | None = None
        self._served: ServedStream | None = None
        self._out: asyncio.Queue[Frame | _Problem | None] = asyncio.Queue()
        self._pusher: asyncio.Task | None = None
        # finals of the in-process stream that were the pause's transcript (no model call after
        # pipecat's stop), and partials that stood for a pause's transcript
        self.speculative_finals = 0
        self.adopted_partials = 0
        self.pauses_transcribed = 0  # voxline's VAD pauses inside pipecat's utterances
        self.partials = 0  # partial transcripts the stream gave (each a model call)
        self._want_pauses = pauses
        self._pause_vad = pause_vad
        self._pauses: _Pauses | None = None
        self._paused_at: int | None = None  # the open utterance's pause, if not resumed since

    # --- what a test or an operator may look at ------------------------------------------------
    @property
    def engine(self) -> ASREngine | None:
        """The in-process engine this service's stream runs in (None over asr-serve)."""
        return self._engine

    @property
    def listens_for_pauses(self) -> bool:
        """Whether voxline's VAD runs beside pipecat's for the pauses (see the module)."""
        return self._pauses is not None

    @property
    def holds_slot(self) -> bool:
        return self._slot is not None or self._served is not None

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        if self._pusher is None:
            self._pusher = self.create_task(self._push_results(), name="voxline_stt_results")
        if self.holds_slot:
            return
        if self._want_pauses is not False and self._pauses is None:
            model = await asyncio.to_thread(_pause_model)
            if model is not None:
                self._pauses = _Pauses(model, self._vad_event, self._pause_vad)
        if self._socket_path is not None:
            self._served = ServedStream(self._on_result, self._on_stream_error,
                                        socket_path=self._socket_path or None,
                                        on_recovered=self._on_stream_recovered,
                                        partials=self._interim)
            await self._served.open()
            return
        if self._engine is None:
            self._engine = await asyncio.to_thread(shared_engine, self._asr_config)
        try:
            slot = self._engine.open()
        except CapacityError as exc:
            await self.push_error(f"{self}: no ASR slot free, this pipeline is not transcribed: "
                                  f"{exc}", exception=exc)
            return
        cfg = stream_config(self._asr_config, RATE, self._interim).fitting(len(slot.audio))
        core = ASRStream(slot.audio, cfg, self._engine.partial_room)
        self._slot = slot
        self._driver = StreamDriver(core, self._engine, slot, self._on_result, self._on_failure)

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._finish(graceful=True)

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._finish(graceful=False)

    async def cleanup(self) -> None:
        await self._finish(graceful=False)
        await super().cleanup()

    async def _finish(self, graceful: bool) -> None:
        """End the stream (awaiting the finals owed when ``graceful``), push what came, and give
        the slot back."""
        if self._driver is not None:
            driver, self._driver = self._driver, None
            core = driver.core
            if graceful:
                if core.in_speech:
                    core.stopped(self._offset)
                    driver.pump()
                deadline = time.monotonic() + self._finish_timeout_s
                while core.busy and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                core.end_of_stream()  # a final still owed goes out with the best text at hand
                driver.pump()
            self.speculative_finals += core.speculative_finals
            self.adopted_partials += core.adopted_partials
            driver.close()
        if self._served is not None:
            served, self._served = self._served, None
            if graceful:
                await served.finish(self._finish_timeout_s)
            served.close()
        if self._slot is not None:
            assert self._engine is not None
            self._engine.close_slot(self._slot)
            self._slot = None
        self._speaking_since = self._paused_at = None
        self._pauses = None  # its VAD state belongs to this run of the pipeline
        if self._pusher is not None:
            pusher, self._pusher = self._pusher, None
            if graceful:
                self._out.put_nowait(None)  # the pusher ends once everything before it is out
                await pusher
            else:
                await self.cancel_task(pusher)

    # --- audio and VAD -------------------------------------------------------------------------
    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        if self.sample_rate != RATE:
            audio = await self._resampler.resample(audio, self.sample_rate, RATE)
        n = len(audio) // 2
        if n:
            pcm = np.frombuffer(audio, dtype="<i2", count=n)
            now = time.monotonic_ns()
            if self._driver is not None:
                self._driver.core.audio(pcm, self._offset, now)
                self._driver.pump()
            elif self._served is not None:
                self._served.audio(audio)
            if self._pauses is not None:
                self._pauses.feed(pcm, self._offset, now)  # its events come to _vad_event
            self._offset += n
        yield None

    def _vad_event(self, event: SpeechStarted | SpeechPaused | SpeechResumed) -> None:
        """voxline's VAD paused (or went on): transcribe the open utterance up to the pause."""
        if not isinstance(event, SpeechPaused):
            self._paused_at = None
            if self._served is not None:
                self._served.resumed()
            return
        started = self._speaking_since
        if started is None or event.at < started:
            return  # no utterance of pipecat's open: nothing to transcribe
        self._paused_at = event.at
        self.pauses_transcribed += 1
        if self._driver is not None:
            self._driver.core.paused(event.at, event.voice_end)
            self._driver.pump()
        elif self._served is not None:
            self._served.paused(event.at, event.voice_end)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, VADUserStartedSpeakingFrame):
            if not self.is_muted:
                self._speech_started(self._offset - int((frame.start_secs + START_LOOKBACK_S) * RATE))
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            at = self._offset - int(frame.stop_secs * RATE)
            paused = self._paused_at
            if paused is not None and paused < at <= paused + int(PAUSE_MATCH_S * RATE):
                at = paused  # the same end: the pause's transcript stands for the final
            self._speech_stopped(at)
        elif isinstance(frame, UserStoppedSpeakingFrame) or (
                isinstance(frame, STTMuteFrame) and frame.mute):
            self._speech_stopped(self._offset)  # the turn ended (or muted): its transcript now

    def _speech_started(self, at: int) -> None:
        if self._speaking_since is not None:
            return
        at = max(at, 0)
        self._speaking_since = at
        if self._driver is not None:
            self._driver.core.started(at)
            self._driver.pump()
        elif self._served is not None:
            self._served.started(at)

    def _speech_stopped(self, at: int) -> None:
        started = self._speaking_since
        if started is None:
            return
        self._speaking_since = self._paused_at = None
        at = max(at, started)
        if self._driver is not None:
            self._driver.core.stopped(at, started)
            self._driver.pump()
        elif self._served is not None:
            self._served.stopped(at, started)

    # --- results -------------------------------------------------------------------------------
    def _on_result(self, r: Result) -> None:
        if r.kind is Kind.PARTIAL:
            self.partials += 1
        if not r.text:
            return  # an utterance with no words (a cough, noise): nothing to say
        if not (r.final or self._interim):
            return  # a pause's transcript while the caller may go on: an interim result too
        final = r.kind is Kind.FINAL
        result = VoxlineTranscript(r.text, len(r.text) if r.final else min(r.stable, len(r.text)),
                                   r.start / RATE, r.end / RATE,
                                   speculative=r.kind is Kind.SPECULATIVE, final=final)
        language = self._settings.language if isinstance(self._settings.language, str) else None
        if r.final:
            frame: Frame = TranscriptionFrame(r.text, self._user_id, time_now_iso8601(),
                                              language=language, result=result, finalized=final)
        else:
            frame = InterimTranscriptionFrame(r.text, self._user_id, time_now_iso8601(),
                                              language=language, result=result)
        self._out.put_nowait(frame)

    def _on_failure(self, f: Failure) -> None:
        if f.kind in (Kind.FINAL, Kind.SEGMENT, Kind.SPECULATIVE):
            self._out.put_nowait(_Problem(f"{self}: transcription failed: {f.message}"))

    def _on_stream_error(self, message: str) -> None:
        self._out.put_nowait(_Problem(f"{self}: {message}"))

    def _on_stream_recovered(self) -> None:
        self._out.put_nowait(_Problem(f"{self}: asr-serve is back; the audio kept meanwhile is "
                                      "being transcribed", recovered=True))

    async def _push_results(self) -> None:
        """Push results in the order they came (the engine's callbacks cannot await)."""
        while True:
            frame = await self._out.get()
            if frame is None:
                return
            if isinstance(frame, _Problem):
                if frame.recovered:
                    logger.info(frame.message)
                else:
                    await self.push_error(frame.message)
                continue
            await self.push_frame(frame)


@dataclass(slots=True, frozen=True)
class _Problem:
    """An error (or a recovery) to report in order with the results."""

    message: str
    recovered: bool = False
