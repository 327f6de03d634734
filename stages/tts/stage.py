"""The TTS stage: text to speak in, 16 kHz agent audio out in fixed-size chunks."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from agent.config import TTSConfig
from agent.errors import require
from agent.frames import (
    SAMPLE_RATE,
    Direction,
    Frame,
    Interrupt,
    SpeculationResolved,
    TextToSpeak,
    TTSAudio,
)
from agent.stage import DOWN, QueuedStage, StageContext
from stages.faults import APOLOGY, TTS_FAILED, fault_frame
from stages.tts.base import TTS

log = logging.getLogger("voxline.tts")

_DONE = object()


class TTSStage(QueuedStage):
    """Speaks each :class:`TextToSpeak`: the frame itself goes on first (the moment its
    synthesis starts: clients show what the agent is saying, ``agent_say``), then ``TTSAudio``
    chunks of ``cfg.chunk_ms`` as synthesis produces them, then one
    ``TTSAudio(last=True, text=...)`` holding the remainder (maybe empty). Text flushed by a
    barge-in before its turn never goes on: it was never said.

    Synthesis, resampling and chunking run on one worker thread; the event loop only pushes
    frames. On a barge-in the worker stops at its next chunk and nothing more is pushed.

    A ``TextToSpeak`` marked ``held`` belongs to a speculative reply: it is synthesized as
    usual, but what it would push (the frame itself, its audio, its trace events) is kept until
    a ``SpeculationResolved`` for its id arrives — confirmed: all of it goes on at once, and
    later chunks of that reply pass straight through; discarded: it is dropped, its queued
    chunks with it and its synthesis stopped, and nothing of it is ever heard.

    When synthesis fails, the utterance is closed (its ``last`` frame), clients get an
    :class:`~agent.frames.ErrorFrame` with the code ``tts_failed`` (the detail goes to the
    log), ``errors`` counts it, and the stage tries to say ``apology`` in its place (held
    like the text it replaces), so the caller hears why the agent stopped; the queue goes on
    with the next text. The apology is tried once until a synthesis succeeds again (a voice
    that fails on everything is not asked for an apology per sentence), never for the
    apology's own text; if it fails too, the error event is what remains.
    """

    name = "tts"
    consumes = frozenset({TextToSpeak, SpeculationResolved})

    def __init__(self, tts: TTS, cfg: TTSConfig, apology: str = APOLOGY) -> None:
        super().__init__()
        self.tts = tts
        self.cfg = cfg
        self.apology = apology.strip()  # empty: a failed text is followed by silence
        self.errors = 0  # texts whose synthesis failed
        self._apologized = False  # since the last synthesis that worked
        self.chunk_samples = max(1, SAMPLE_RATE * cfg.chunk_ms // 1000)
        self._soxr = (
            require("soxr", what="the TTS resampler", extra="embedded")
            if tts.sample_rate != SAMPLE_RATE
            else None
        )
        self._synth_worker: ThreadPoolExecutor | None = None
        # speculative replies: what each would have pushed, and which ones were confirmed
        self._held: dict[int, list[Frame | tuple[str, int]]] = {}
        self._confirmed: deque[int] = deque(maxlen=8)
        self._speaking: TextToSpeak | None = None
        self.held_discarded = 0  # audio chunks synthesized for replies that were never confirmed

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

    def process(self, frame: Frame, direction: Direction) -> None:
        if isinstance(frame, SpeculationResolved) and direction is DOWN:
            self._resolve(frame)
        super().process(frame, direction)

    def on_interrupt(self, frame: Interrupt) -> None:
        self._held.clear()

    def _resolve(self, frame: SpeculationResolved) -> None:
        held = self._held.pop(frame.id, [])
        if frame.confirmed:
            self._confirmed.append(frame.id)
            trace = self.ctx.trace
            for item in held:
                if isinstance(item, tuple):
                    if trace is not None:
                        trace.event(*item)
                else:
                    self.push(_heard(item))
            return
        self.held_discarded += sum(_is_audio(f) for f in held)
        self._queue = deque(
            f for f in self._queue if not (isinstance(f, TextToSpeak) and f.held == frame.id)
        )
        cur = self._speaking
        if cur is not None and cur.held == frame.id and self._current is not None:
            self._current.cancel()

    def _out(self, frame: TextToSpeak, item: Frame | str) -> None:
        """Push ``item`` (a frame, or a trace event's name) for ``frame``: held while its
        speculative reply is unconfirmed."""
        if frame.held and frame.held not in self._confirmed:
            held = self._held.setdefault(frame.held, [])
            held.append((item, time.monotonic_ns()) if isinstance(item, str) else item)
        elif isinstance(item, str):
            if self.ctx.trace is not None:
                self.ctx.trace.event(item)
        else:
            self.push(_heard(item))

    async def handle(self, frame: Frame) -> None:
        assert isinstance(frame, TextToSpeak)
        self._speaking = frame
        try:
            try:
                await self._say(frame)
            except Exception as exc:
                await self._fail(frame, exc)
            else:
                if frame.text.strip() and frame.text.strip() != self.apology:
                    self._apologized = False
        finally:
            self._speaking = None

    async def _fail(self, frame: TextToSpeak, exc: Exception) -> None:
        log.error("%s: synthesizing %r failed (%s)", self.name, frame.text[:80], TTS_FAILED,
                  exc_info=exc)
        self.errors += 1
        self._out(frame, fault_frame(TTS_FAILED, self.name))
        if self.ctx.trace is not None:
            self.ctx.trace.call_event("error", stage=self.name, code=TTS_FAILED)
        if not self.apology or self._apologized or frame.text.strip() == self.apology:
            return
        self._apologized = True
        try:
            await self._say(TextToSpeak(self.apology, held=frame.held))
        except Exception as again:
            log.error("%s: the apology failed too", self.name, exc_info=again)

    async def _say(self, frame: TextToSpeak) -> None:
        self._out(frame, frame)
        text = frame.text.strip()
        if not text:
            self._out(frame, TTSAudio(np.zeros(0, np.int16), last=True, text=frame.text))
            return
        self._out(frame, "tts_request")
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
                if first:
                    self._out(frame, "tts_first_audio")
                first = False
                if last:
                    self._out(frame, TTSAudio(pcm, last=True, text=frame.text))
                    return
                self._out(frame, TTSAudio(pcm))
        except Exception:
            # The utterance is over either way: close it for the output, then report.
            self._out(frame, TTSAudio(np.zeros(0, np.int16), last=True, text=frame.text))
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


def _is_audio(item: object) -> bool:
    """What the stage itself made (it never reads TTSAudio from upstream)."""
    return type(item) is TTSAudio


def _heard(frame: Frame) -> Frame:
    """A confirmed speculative chunk goes on as an ordinary one."""
    if isinstance(frame, TextToSpeak) and frame.held:
        return dataclasses.replace(frame, held=0)
    return frame


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

