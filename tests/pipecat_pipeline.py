"""A real pipecat pipeline around an STT service, as the pipecat tests run it: pipecat's own
VADProcessor with its Silero model, the service, and a sink that keeps every transcription and
error frame; the caller's audio is played into it in 20 ms frames at real-time pace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    TranscriptionFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.task import PipelineParams
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

FRAME_MS = 20
VAD_STOP_S = 0.3  # pipecat's VAD: silence that ends an utterance


class Sink(FrameProcessor):
    """The end of the pipeline: what came out of the STT, in order, with arrival times."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame | InterimTranscriptionFrame | ErrorFrame):
            self.frames.append((time.monotonic(), frame))
        await self.push_frame(frame, direction)


@dataclass
class Played:
    """What a played pipeline gave back."""

    frames: list[tuple[float, Frame]]
    errors: list[ErrorFrame] = field(default_factory=list)
    fed_at: float = 0.0  # when the first audio frame went in

    @property
    def finals(self) -> list[TranscriptionFrame]:
        return [f for _, f in self.frames if isinstance(f, TranscriptionFrame)]

    @property
    def interims(self) -> list[InterimTranscriptionFrame]:
        return [f for _, f in self.frames if isinstance(f, InterimTranscriptionFrame)]

    @property
    def text(self) -> str:
        return " ".join(f.text for f in self.finals if f.finalized)


def frames_of(pcm: np.ndarray, rate: int = 16_000) -> list[InputAudioRawFrame]:
    n = rate * FRAME_MS // 1000
    return [InputAudioRawFrame(audio=pcm[i:i + n].tobytes(), sample_rate=rate, num_channels=1)
            for i in range(0, len(pcm) - n + 1, n)]


async def play(stt: FrameProcessor, pcm: np.ndarray, *, rate: int = 16_000,
               inject: dict[int, Frame] | None = None, end: str = "end",
               after_audio: Callable[[], Awaitable[None]] | None = None,
               vad_stop_secs: float = VAD_STOP_S) -> Played:
    """Play ``pcm`` (int16 at ``rate``) through VAD → ``stt`` → sink in real time; ``inject``
    puts a frame in after the audio frame of that index; then ``after_audio`` runs and the
    pipeline ends with an EndFrame (``end="end"``) or a CancelFrame (``"cancel"``)."""
    sink = Sink()
    vad = VADProcessor(vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=vad_stop_secs)))
    worker = PipelineWorker(Pipeline([vad, stt, sink]),
                            params=PipelineParams(audio_in_sample_rate=rate),
                            enable_rtvi=False, idle_timeout_secs=None)
    played = Played(sink.frames)

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker: PipelineWorker, frame: ErrorFrame) -> None:
        played.errors.append(frame)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(_worker: PipelineWorker, _frame: Frame) -> None:
        started.set()

    await asyncio.wait_for(started.wait(), 120)
    t0 = played.fed_at = time.monotonic()
    for i, frame in enumerate(frames_of(pcm, rate)):
        await worker.queue_frame(frame)
        if inject and i in inject:
            await worker.queue_frame(inject[i])
        await asyncio.sleep(max(0.0, t0 + (i + 1) * FRAME_MS / 1000 - time.monotonic()))
    if after_audio is not None:
        await after_audio()
    await worker.queue_frame(EndFrame() if end == "end" else CancelFrame())
    await asyncio.wait_for(run, 60)
    return played
