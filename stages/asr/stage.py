"""Streaming speech recognition for one call: partial transcripts while the caller speaks and one
final transcript per VAD utterance, with every model call on a worker thread off the event loop.

The stage is a thin shell over :class:`stages.asr.stream.ASRStream` (which decides what to
transcribe and when) and the process's shared :class:`ASREngine` (which runs the model calls),
joined by a :class:`stages.asr.driver.StreamDriver`.
"""

from __future__ import annotations

import time

from agent.config import ASRConfig
from agent.errors import ConfigError
from agent.frames import (
    AudioIn,
    EndOfCall,
    Frame,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    Transcript,
)
from agent.stage import DOWN, Direction, Stage, StageContext
from stages.asr.backend import ASRBackend
from stages.asr.driver import StreamDriver
from stages.asr.engine import ASREngine
from stages.asr.slots import Slot
from stages.asr.stream import ASRStream, Failure, Kind, Result, StreamConfig


def stream_config(cfg: ASRConfig, rate: int, partials: bool = True) -> StreamConfig:
    return StreamConfig.from_ms(rate, cfg.partial_interval_ms, cfg.max_utterance_s,
                                cfg.commit_after_s, partials, cfg.partial_share, cfg.end_pad_ms,
                                cfg.adopt_partials)


def ring_seconds(cfg: ASRConfig, rate: int = 16_000) -> float:
    """How much audio one stream's ring must hold: the longest utterance, the pre-roll, and a
    margin so a request that waited behind others still finds its audio."""
    return stream_config(cfg, rate).ring / rate


def make_engine(backend: ASRBackend, cfg: ASRConfig, capacity: int | None = None) -> ASREngine:
    """The engine one process shares between its calls, sized from the configuration."""
    return ASREngine(
        backend,
        capacity=capacity or cfg.slots,
        window_ms=cfg.window_ms,
        max_batch=cfg.max_batch,
        max_latency_ms=cfg.max_latency_ms,
        max_seconds=ring_seconds(cfg, backend.sample_rate),
        batching=cfg.batching,
    )


class StreamingASR(Stage):
    """Partials and finals for one call's caller audio, from the VAD's speech frames.

    The stage holds one slot of the process's shared :class:`ASREngine` for the whole call (the
    engine batches the requests of every call into one model call per tick); given a bare
    backend instead, it makes an engine of its own with one slot. Every frame is forwarded at
    once and unchanged; transcripts follow the frame that triggered them. What is transcribed
    and when is :class:`ASRStream`'s business (see there).
    """

    name = "asr"
    consumes = frozenset({AudioIn, SpeechStarted, SpeechPaused, SpeechStopped})

    def __init__(self, asr: ASREngine | ASRBackend, cfg: ASRConfig) -> None:
        super().__init__()
        self.engine: ASREngine | None = asr if isinstance(asr, ASREngine) else None
        self._own_backend = None if isinstance(asr, ASREngine) else asr
        self.backend: ASRBackend = asr.backend if isinstance(asr, ASREngine) else asr
        self.cfg = cfg
        self._stream_cfg = stream_config(cfg, self.backend.sample_rate)
        self._slot: Slot | None = None
        self._stream: ASRStream | None = None
        self._driver: StreamDriver | None = None
        self.bypassed_chunks = 0

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        if self.engine is None:
            assert self._own_backend is not None
            self.engine = make_engine(self._own_backend, self.cfg, capacity=1)
        if self._slot is None:
            slot = self.engine.open()  # CapacityError: the call is refused, others go on
            try:
                self._stream = ASRStream(slot.audio, self._stream_cfg, self.engine.partial_room)
            except ValueError as exc:
                self.engine.close_slot(slot)
                raise ConfigError(f"ASR engine slots are too small: {exc} "
                                  "(asr.max_utterance_s + 10 s)") from None
            self._slot = slot
            self._driver = StreamDriver(self._stream, self.engine, slot, self._deliver, self._failed)

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
        if self._slot is not None and self.engine is not None:
            self.engine.close_slot(self._slot)  # zeroed and back in the pool
            self._slot = None
        if self._own_backend is not None and self.engine is not None:
            self.engine.close()
            self.engine = None

    @property
    def in_speech(self) -> bool:
        return self._stream is not None and self._stream.in_speech

    @property
    def busy(self) -> bool:
        """A model call is running or waiting (a final may be on its way)."""
        return self._stream is not None and self._stream.busy

    # counters, from the stream core
    @property
    def backend_calls(self) -> int:
        return self._stream.requests if self._stream is not None else 0

    @property
    def partials(self) -> int:
        return self._stream.partials if self._stream is not None else 0

    @property
    def speculative_finals(self) -> int:
        return self._stream.speculative_finals if self._stream is not None else 0

    @property
    def adopted_partials(self) -> int:
        return self._stream.adopted_partials if self._stream is not None else 0

    @property
    def stream(self) -> ASRStream | None:
        return self._stream

    # --- frames ------------------------------------------------------------------------------
    def process(self, frame: Frame, direction: Direction) -> None:
        core = self._stream
        if core is None or core.closed or direction is not DOWN:
            self.push(frame, direction)
            if isinstance(frame, AudioIn) and direction is DOWN:
                self.bypassed_chunks += 1  # not started (or stopped): nothing is transcribed
            return
        if isinstance(frame, EndOfCall):
            core.end_of_stream()  # the finals owed belong before the end of the call
            self._pump(core)
        self.push(frame, direction)
        if isinstance(frame, AudioIn):
            if not core.in_speech:
                self.bypassed_chunks += 1
                if self._slot is not None:
                    self._slot.stats.chunks_bypassed += 1
            elif self._slot is not None:
                self._slot.stats.chunks_in += 1
            core.audio(frame.pcm, frame.offset, frame.t_ns)
        elif isinstance(frame, SpeechStarted):
            core.started(frame.at)
        elif isinstance(frame, SpeechPaused):
            core.paused(frame.at, frame.voice_end)
        elif isinstance(frame, SpeechStopped):
            core.stopped(frame.at, frame.started_at)
        else:
            return
        self._pump(core)

    def _pump(self, core: ASRStream) -> None:
        assert self._driver is not None and self._driver.core is core
        self._driver.pump()

    def _deliver(self, out: Result) -> None:
        self.push(Transcript(out.text, final=out.final, start=out.start, end=out.end,
                             stable=out.stable, speculative=out.kind is Kind.SPECULATIVE,
                             end_p=out.end_p))
        trace = self.ctx.trace
        if not out.final and out.audio_ns and trace is not None:
            trace.partial_lag((time.monotonic_ns() - out.audio_ns) / 1e6)

    def _failed(self, out: Failure) -> None:
        self.push_error(f"{self.name}: transcription failed: {out.message}")
