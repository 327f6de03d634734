"""The TTS stage: text to speak in, 16 kHz agent audio out in fixed-size chunks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from agent.config import TTSConfig
from agent.errors import require
from agent.frames import SAMPLE_RATE, Frame, TextToSpeak, TTSAudio
from agent.stage import QueuedStage, StageContext
from stages.tts.base import TTS

_DONE = object()


class TTSStage(QueuedStage):
    """Speaks each :class:`TextToSpeak`: the frame itself goes on first (the moment its
    synthesis starts: clients show what the agent is saying, ``agent_say``), then ``TTSAudio``
    chunks of ``cfg.chunk_ms`` as synthesis produces them, then one
    ``TTSAudio(last=True, text=...)`` holding the remainder (maybe empty). Text flushed by a
    barge-in before its turn never goes on: it was never said.

    Synthesis, resampling and chunking run on one worker thread; the event loop only pushes
    frames. On a barge-in the worker stops at its next chunk and nothing more is pushed.
    """

    name = "tts"
    consumes = frozenset({TextToSpeak})

    def __init__(self, tts: TTS, cfg: TTSConfig) -> None:
        super().__init__()
        self.tts = tts
        self.cfg = cfg
        self.chunk_samples = max(1, SAMPLE_RATE * cfg.chunk_ms // 1000)
        self._soxr = (
            require("soxr", what="the TTS resampler", extra="embedded")
            if tts.sample_rate != SAMPLE_RATE
            else None
        )
        self._synth_worker: ThreadPoolExecutor | None = None

    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        if self._synth_worker is None:
            self._synth_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts")

    async def stop(self) -> None:
        if self._synth_worker is not None:
            self._synth_worker.shutdown(wait=False, cancel_futures=True)
            self._synth_worker = None

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, TextToSpeak)

    async def handle(self, frame: Frame) -> None:
        assert isinstance(frame, TextToSpeak)
        self.push(frame)
        text = frame.text.strip()
        trace = self.ctx.trace
        if not text:
            self.push(TTSAudio(np.zeros(0, np.int16), last=True, text=frame.text))
            return
        if trace is not None:
            trace.event("tts_request")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()

        def emit(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> None:
            try:
                self._speak(text, emit, stop)
            except BaseException as exc:  # handed to the loop, which re-raises it
                emit(exc)

        first = True
        try:
            loop.run_in_executor(self._synth_worker, run)
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                pcm, last = item
                if first and trace is not None:
                    trace.event("tts_first_audio")
                first = False
                if last:
                    self.push(TTSAudio(pcm, last=True, text=frame.text))
                    return
                self.push(TTSAudio(pcm))
        except Exception:
            # The utterance is over either way: close it for the output, then report.
            self.push(TTSAudio(np.zeros(0, np.int16), last=True, text=frame.text))
            raise
        finally:
            stop.set()

    def _speak(self, text: str, emit: Callable[[object], None], stop: threading.Event) -> None:
        """Worker thread: synthesize, resample to 16 kHz, cut into chunks of ``chunk_samples``."""
        resampler = (
            self._soxr.ResampleStream(self.tts.sample_rate, SAMPLE_RATE, 1, dtype="int16")
            if self._soxr is not None
            else None
        )
        pending = np.zeros(0, np.int16)
        n = self.chunk_samples
        audio = self.tts.synthesize(text)
        lead = 0  # leading near-silence dropped so far; -1 once the voice has started
        try:
            for pcm in audio:
                if stop.is_set():
                    return
                if resampler is not None:
                    pcm = resampler.resample_chunk(pcm)
                if lead >= 0:
                    pcm, lead = _trim_lead(pcm, lead)
                pending = np.concatenate((pending, pcm)) if len(pending) else pcm
                while len(pending) >= n:
                    emit((pending[:n].copy(), False))
                    pending = pending[n:]
        finally:
            close = getattr(audio, "close", None)
            if close is not None:
                close()
        if stop.is_set():
            return
        if resampler is not None:
            tail = resampler.resample_chunk(np.zeros(0, np.int16), last=True)
            pending = np.concatenate((pending, tail))
        # The final chunk may hold up to one chunk of audio; empty only if nothing was left.
        while len(pending) > n:
            emit((pending[:n].copy(), False))
            pending = pending[n:]
        emit((np.ascontiguousarray(pending, dtype=np.int16), True))


LEAD_PEAK = 100  # int16 peak of near-silence (-50 dBFS)
LEAD_KEEP = 160  # samples kept before the first audible one (10 ms at 16 kHz)
LEAD_MAX = 4_800  # never drop more than 300 ms


def _trim_lead(pcm: np.ndarray, dropped: int) -> tuple[np.ndarray, int]:
    """Drop the near-silence a synthesizer puts before the first word (Piper: 0-50 ms), so the
    caller hears the voice that much sooner. Returns the rest and the samples dropped so far,
    or -1 once the voice has started (nothing more is trimmed)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LEAD_PEAK)
    if len(loud) == 0:
        if dropped + len(pcm) <= LEAD_MAX:
            return pcm[:0], dropped + len(pcm)
        return pcm, -1
    cut = min(max(0, int(loud[0]) - LEAD_KEEP), LEAD_MAX - dropped)
    return pcm[max(cut, 0):], -1

