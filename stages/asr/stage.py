"""Streaming speech recognition for one call: partial transcripts while the caller speaks and one
final transcript per VAD utterance, with every model call on a worker thread off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from functools import partial

import numpy as np

from agent.audio import FROM_INT16
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
from stages.asr.agreement import LocalAgreement
from stages.asr.backend import ASRBackend, Hypothesis
from stages.asr.engine import ASREngine
from stages.asr.slots import Slot

PRE_ROLL_MS = 200  # audio kept before SpeechStarted.at: the VAD decides a little late
END_PAD_MS = 100  # audio kept after the end of speech, so the last word is not clipped
# The ring holds the longest utterance plus this much: a transcription waiting behind another
# call still finds its audio. If it waited longer, it reports an error instead of garbage.
RING_MARGIN_S = 10.0
CUT_SEARCH_MS = 3000  # a too-long utterance is cut at the quietest place in its last 3 s
CUT_WINDOW_MS = 100  # ... judged over 100 ms of audio, in 20 ms steps


class _Kind(IntEnum):
    PARTIAL = 0
    SPECULATIVE = 1  # the utterance up to a SpeechPaused, before the end is confirmed
    FINAL = 2
    SEGMENT = 3  # the first part of a too-long utterance, emitted as a final


@dataclass(slots=True, eq=False)
class _Utterance:
    """One VAD utterance: SpeechStarted to its final transcript (media samples)."""

    start: int  # first sample transcribed; moves forward when a too-long utterance is cut
    started_at: int  # SpeechStarted.at
    partial_end: int  # end of the audio the last partial was requested for
    stop: SpeechStopped | None = None
    finalised: bool = False
    segmented: bool = False
    prompt: str = ""  # text of the segments cut off before ``start``: the model's context
    committed: str = ""  # stable prefix of the latest partial: the final's fallback on errors
    target: int = 0  # end of the audio the final must cover (set by SpeechStopped)
    spec_wanted: int = 0  # a speculative transcription waits for audio up to here
    spec_start: int = -1  # the speculative result: audio it covers and its text
    spec_end: int = -1
    spec_text: str = ""


@dataclass(slots=True, eq=False)
class _Job:
    kind: _Kind
    utt: _Utterance
    start: int
    end: int
    epoch: int
    t_ns: int = 0  # arrival of the newest AudioIn in [start, end)
    fallback: str = ""  # a SEGMENT's text if the model call fails: the stable prefix at the cut


def ring_seconds(cfg: ASRConfig) -> float:
    """How much audio one stream's ring must hold: the longest utterance, the pre-roll, and a
    margin so a request that waited behind others still finds its audio."""
    return cfg.max_utterance_s + PRE_ROLL_MS / 1000 + RING_MARGIN_S


def make_engine(backend: ASRBackend, cfg: ASRConfig, capacity: int | None = None) -> ASREngine:
    """The engine one process shares between its calls, sized from the configuration."""
    return ASREngine(
        backend,
        capacity=capacity or cfg.slots,
        window_ms=cfg.window_ms,
        max_batch=cfg.max_batch,
        max_latency_ms=cfg.max_latency_ms,
        max_seconds=ring_seconds(cfg),
        batching=cfg.batching,
    )



class StreamingASR(Stage):
    """Partials and finals for one call's caller audio, from the VAD's speech frames.

    The stage holds one slot of the process's shared :class:`ASREngine` for the whole call (the
    engine batches the requests of every call into one model call per tick); given a bare
    backend instead, it makes an engine of its own with one slot.

    Every frame is forwarded at once and unchanged; transcripts follow the frame that triggered
    them. Audio goes into the slot's preallocated ring indexed by media sample; only utterance audio
    (SpeechStarted, less a short pre-roll, to SpeechStopped) ever reaches the backend, and at most
    one model call per stream is outstanding. While the caller speaks, the utterance is
    re-transcribed every ``partial_interval_ms`` of new audio; a word prefix two consecutive
    hypotheses agree on becomes stable (:class:`LocalAgreement`). On ``SpeechPaused`` the
    utterance is transcribed at once; if ``SpeechStopped`` confirms that end, that result is the
    final with no further model call. Each ``SpeechStopped`` gets exactly one final transcript,
    possibly empty; no partial of an utterance follows its final.
    """

    name = "asr"

    def __init__(self, asr: ASREngine | ASRBackend, cfg: ASRConfig) -> None:
        super().__init__()
        self.engine: ASREngine | None = asr if isinstance(asr, ASREngine) else None
        self._own_backend = None if isinstance(asr, ASREngine) else asr
        self.backend: ASRBackend = asr.backend if isinstance(asr, ASREngine) else asr
        self.cfg = cfg
        sr = self.backend.sample_rate
        self._pre_roll = PRE_ROLL_MS * sr // 1000
        self._end_pad = END_PAD_MS * sr // 1000
        self._interval = max(1, cfg.partial_interval_ms * sr // 1000)
        self._max_utt = int(cfg.max_utterance_s * sr)
        self._need = self._max_utt + self._pre_roll + int(RING_MARGIN_S * sr)
        self._slot: Slot | None = None
        self._ring = np.zeros(0, np.float32)  # the slot's buffer, used as a ring, once started
        self._end = 0  # media sample after the newest audio in the ring
        self._valid_from = 0  # oldest media sample still in the ring
        self._last_t_ns = 0
        self._utt: _Utterance | None = None
        self._last_utt_end = 0
        self._agreement = LocalAgreement()
        self._queue: deque[_Job] = deque()  # speculative/final/segment jobs, in order
        self._running: _Job | None = None
        self._future: asyncio.Future[Hypothesis | None] | None = None
        self._epoch = 0  # bumped by EndOfCall/stop: results of older jobs are dropped
        self._closed = False
        # counters
        self.backend_calls = 0
        self.bypassed_chunks = 0
        self.partials = 0
        self.finals = 0
        self.discarded = 0  # results that arrived too late to be used
        self.speculative_finals = 0  # finals that needed no model call after SpeechStopped
        self.flushed = 0  # finals emitted without their model call because the call ended
        self.errors = 0

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        self._closed = False
        if self.engine is None:
            assert self._own_backend is not None
            self.engine = make_engine(self._own_backend, self.cfg, capacity=1)
        if self._slot is None:
            slot = self.engine.open()  # CapacityError: the call is refused, others go on
            if slot.capacity < self._need:
                self.engine.close_slot(slot)
                raise ConfigError(
                    f"ASR engine slots hold {slot.capacity / self.backend.sample_rate:.1f} s; "
                    f"this stream needs {self._need / self.backend.sample_rate:.1f} s "
                    "(asr.max_utterance_s + 10 s)"
                )
            self._slot = slot
            self._ring = slot.audio
            self._end = self._valid_from = 0

    async def stop(self) -> None:
        self._closed = True
        self._drop_work()
        if self._future is not None:
            self._future.cancel()
        if self._slot is not None and self.engine is not None:
            self.engine.close_slot(self._slot)  # zeroed and back in the pool
            self._slot = None
            self._ring = np.zeros(0, np.float32)
        if self._own_backend is not None and self.engine is not None:
            self.engine.close()
            self.engine = None

    @property
    def in_speech(self) -> bool:
        return self._utt is not None

    @property
    def busy(self) -> bool:
        """A model call is running or waiting (a final may be on its way)."""
        return self._running is not None or bool(self._queue)

    # --- frames ------------------------------------------------------------------------------
    def process(self, frame: Frame, direction: Direction) -> None:
        if isinstance(frame, EndOfCall) and direction is DOWN and not self._closed:
            self._flush_finals()  # they belong before the end of the call
            self._drop_work()
        self.push(frame, direction)
        if direction is not DOWN or self._closed:
            return
        if isinstance(frame, AudioIn):
            self._on_audio(frame)
        elif isinstance(frame, SpeechStarted):
            self._on_started(frame)
        elif isinstance(frame, SpeechPaused):
            self._on_paused(frame)
        elif isinstance(frame, SpeechStopped):
            self._on_stopped(frame)

    def _on_audio(self, frame: AudioIn) -> None:
        self._write(frame.pcm, frame.offset)
        self._last_t_ns = frame.t_ns
        u = self._utt
        if u is None:
            self.bypassed_chunks += 1
            if self._slot is not None:
                self._slot.stats.chunks_bypassed += 1
            return
        if self._slot is not None:
            self._slot.stats.chunks_in += 1
        if u.spec_wanted and self._end >= u.spec_wanted:
            self._queue_speculative(u, u.spec_wanted)
        elif self._end - u.start >= self._max_utt:
            self._cut(u)
        self._kick()

    def _on_started(self, frame: SpeechStarted) -> None:
        if self._utt is not None:
            return  # a repeated start: the utterance is already open
        start = max(frame.at - self._pre_roll, self._valid_from, self._last_utt_end)
        start = min(start, max(frame.at, self._valid_from))
        self._utt = _Utterance(start=start, started_at=frame.at, partial_end=start)
        self._agreement.reset()

    def _on_paused(self, frame: SpeechPaused) -> None:
        u = self._utt
        if u is None:
            return
        want = max(frame.at + self._end_pad, u.start)
        if (u.spec_start == u.start and u.spec_end >= want) or self._covering_spec(u, want):
            return  # already transcribed up to there
        # Speech resumed since an earlier pause: its speculative result is out of date.
        self._drop_speculative(u)
        if self._end >= want:
            self._queue_speculative(u, want)
        else:
            u.spec_wanted = want  # queued once that audio has arrived
        self._kick()

    def _on_stopped(self, frame: SpeechStopped) -> None:
        u = self._utt
        if u is None:  # a stop without a start we saw: transcribe what the VAD says it was
            start = max(frame.started_at - self._pre_roll, self._valid_from, self._last_utt_end)
            u = _Utterance(start=min(start, frame.at), started_at=frame.started_at,
                           partial_end=start)
        self._utt = None
        u.stop = frame
        u.spec_wanted = 0
        target = max(min(frame.at + self._end_pad, self._end), u.start)
        u.target = self._last_utt_end = target
        if u.spec_start == u.start and u.spec_end >= target:
            self.speculative_finals += 1
            self._emit_final(u, u.spec_text)
            return
        if self._covering_spec(u, target):
            self.speculative_finals += 1
            return  # the speculative call in flight or queued becomes the final
        self._drop_speculative(u)
        self._queue.append(_Job(_Kind.FINAL, u, u.start, target, self._epoch))
        self._kick()

    # --- scheduling ----------------------------------------------------------------------------
    def _covering_spec(self, u: _Utterance, target: int) -> bool:
        jobs = [self._running] if self._running is not None else []
        jobs += self._queue
        return any(
            j.utt is u and j.kind is _Kind.SPECULATIVE and j.start == u.start and j.end >= target
            and j.epoch == self._epoch
            for j in jobs
        )

    def _queue_speculative(self, u: _Utterance, end: int) -> None:
        u.spec_wanted = 0
        self._queue.append(_Job(_Kind.SPECULATIVE, u, u.start, end, self._epoch, self._last_t_ns))

    def _drop_speculative(self, u: _Utterance) -> None:
        if any(j.utt is u and j.kind is _Kind.SPECULATIVE for j in self._queue):
            self._queue = deque(
                j for j in self._queue if not (j.utt is u and j.kind is _Kind.SPECULATIVE)
            )

    def _kick(self) -> None:
        """Start the next model call if none is running: queued work first, then a partial."""
        if self._running is not None or self._closed:
            return
        if self._queue:
            self._launch(self._queue.popleft())
            return
        u = self._utt
        # A speculative call waiting for its last audio goes first: a partial started now would
        # delay it, and with it the final, by a whole model call.
        if u is None or u.spec_wanted or self._end - u.partial_end < self._interval:
            return
        u.partial_end = self._end
        self._launch(_Job(_Kind.PARTIAL, u, u.start, self._end, self._epoch, self._last_t_ns))

    def _launch(self, job: _Job) -> None:
        assert self.engine is not None and self._slot is not None
        self._running = job
        self.backend_calls += 1
        # Jobs run in order, so the utterance's prompt already holds every earlier segment.
        try:
            audio = self._audio(job.start, job.end)
        except RuntimeError as exc:
            fut: asyncio.Future[Hypothesis | None] = asyncio.get_running_loop().create_future()
            fut.set_exception(exc)
        else:
            fut = self.engine.submit(self._slot, audio, final=job.kind is not _Kind.PARTIAL,
                                     prompt=job.utt.prompt)
        self._future = fut
        fut.add_done_callback(partial(self._on_done, job))

    def _on_done(self, job: _Job, fut: asyncio.Future[Hypothesis | None]) -> None:
        self._running = None
        self._future = None
        if fut.cancelled() or self._closed:
            return
        exc = fut.exception()
        text: str | None = None
        if exc is not None:
            self.errors += 1
            self.push_error(f"{self.name}: transcription failed: {type(exc).__name__}: {exc}")
        else:
            hyp = fut.result()
            if hyp is None:  # the engine shed a stale partial: a newer one follows
                self.discarded += 1
                self._kick()
                return
            text = hyp.text
        try:
            if job.epoch == self._epoch:
                self._deliver(job, text)
            else:
                self.discarded += 1
        finally:
            self._kick()

    def _deliver(self, job: _Job, text: str | None) -> None:
        u = job.utt
        if job.kind is _Kind.PARTIAL:
            if u.stop is not None or u is not self._utt or job.start != u.start or text is None:
                self.discarded += 1
                return
            shown, stable = self._agreement.update(text)
            u.committed = self._agreement.committed_text
            self.partials += 1
            start = u.start if u.segmented else u.started_at
            self.push(Transcript(shown, final=False, start=start, end=job.end, stable=stable))
            trace = self.ctx.trace
            if trace is not None:
                trace.partial_lag((time.monotonic_ns() - job.t_ns) / 1e6)
        elif job.kind is _Kind.SPECULATIVE:
            if text is not None and job.start == u.start:
                u.spec_start, u.spec_end, u.spec_text = job.start, job.end, text
                if u.stop is None and u is self._utt:
                    # The utterance up to the pause, while the VAD still waits to confirm the
                    # end: a partial like any other, and the LLM's cue to prefill its prompt.
                    shown, stable = self._agreement.update(text)
                    u.committed = self._agreement.committed_text
                    self.partials += 1
                    start = u.start if u.segmented else u.started_at
                    self.push(Transcript(shown, final=False, start=start, end=job.end,
                                         stable=stable))
                    if self.ctx.trace is not None and job.t_ns:
                        self.ctx.trace.partial_lag((time.monotonic_ns() - job.t_ns) / 1e6)
            covers = job.start == u.start and job.end >= u.target
            if u.stop is not None and not u.finalised and covers:  # the final waited for this
                if text is not None:
                    self._emit_final(u, text)
                else:
                    self._queue.appendleft(_Job(_Kind.FINAL, u, u.start, u.target, self._epoch))
        elif job.kind is _Kind.FINAL:
            self._emit_final(u, text if text is not None else u.committed)
        else:  # SEGMENT
            seg = text if text is not None else job.fallback
            u.prompt = f"{u.prompt} {seg}".strip()
            self.finals += 1
            self.push(Transcript(seg, final=True, start=job.start, end=job.end, stable=len(seg)))

    def _emit_final(self, u: _Utterance, text: str) -> None:
        if u.finalised or u.stop is None:
            return
        u.finalised = True
        stop = u.stop
        start = u.start if u.segmented else (stop.started_at or u.started_at)
        self.finals += 1
        self.push(Transcript(text, final=True, start=start, end=stop.at, stable=len(text)))

    def _cut(self, u: _Utterance) -> None:
        """End a too-long utterance's current segment at its quietest recent point."""
        search = CUT_SEARCH_MS * self.backend.sample_rate // 1000
        cut = self._quietest_point(max(u.start, self._end - search), self._end)
        self._queue.append(_Job(_Kind.SEGMENT, u, u.start, cut, self._epoch, fallback=u.committed))
        u.segmented = True
        u.start = u.partial_end = cut
        u.spec_start = u.spec_end = -1
        self._drop_speculative(u)
        self._agreement.reset()

    def _quietest_point(self, lo: int, hi: int) -> int:
        step = 20 * self.backend.sample_rate // 1000
        n = (hi - lo) // step
        if n < 2:
            return hi
        audio = self._span_copy(lo, lo + n * step).astype(np.float32).reshape(n, step)
        energy = np.einsum("ij,ij->i", audio, audio)
        width = max(1, min(n, CUT_WINDOW_MS // 20))
        window = np.convolve(energy, np.ones(width, np.float32), mode="valid")
        best = int(np.argmin(window))
        return lo + (best + width // 2) * step

    def _flush_finals(self) -> None:
        """Emit every final still owed, at once, with the best text at hand: the covering
        speculative result, else the stable prefix. The call is ending; nobody waits for more."""
        jobs = ([self._running] if self._running is not None else []) + list(self._queue)
        for job in jobs:
            if job.epoch != self._epoch:
                continue
            u = job.utt
            if job.kind is _Kind.SEGMENT and job is not self._running:
                self.flushed += 1
                self.push(Transcript(job.fallback, final=True, start=job.start, end=job.end))
            elif u.stop is not None and not u.finalised:
                covered = u.spec_start == u.start and u.spec_end >= u.target
                self.flushed += 1
                self._emit_final(u, u.spec_text if covered else u.committed)

    def _drop_work(self) -> None:
        """Forget every utterance and queued call; a result still in flight is discarded."""
        self._epoch += 1
        self._queue.clear()
        self._utt = None
        self._agreement.reset()

    # --- the ring ------------------------------------------------------------------------------
    def _write(self, pcm: np.ndarray, offset: int) -> None:
        if pcm.dtype == np.int16:
            pcm = pcm * FROM_INT16
        else:
            pcm = np.clip(np.nan_to_num(pcm.astype(np.float32)), -1.0, 1.0)
        cap = len(self._ring)
        if cap == 0:
            return  # not started
        n = len(pcm)
        if self._end == self._valid_from or offset < self._valid_from or offset > self._end + cap:
            self._valid_from = self._end = offset  # first audio, or a jump in the timeline
        elif offset > self._end:
            self._fill(self._end, offset, None)  # a gap: silence
        self._fill(offset, offset + n, pcm)
        self._end = max(self._end, offset + n)
        self._valid_from = max(self._valid_from, self._end - cap)

    def _fill(self, start: int, end: int, pcm: np.ndarray | None) -> None:
        cap = len(self._ring)
        if end - start > cap:
            if pcm is not None:
                pcm = pcm[end - start - cap :]
            start = end - cap
        i = start % cap
        first = min(end - start, cap - i)
        if pcm is None:
            self._ring[i : i + first] = 0
            self._ring[: end - start - first] = 0
        else:
            self._ring[i : i + first] = pcm[:first]
            self._ring[: end - start - first] = pcm[first:]

    def _span_copy(self, start: int, end: int) -> np.ndarray:
        cap = len(self._ring)
        i = start % cap
        first = min(end - start, cap - i)
        return np.concatenate((self._ring[i : i + first], self._ring[: end - start - first]))

    def _audio(self, start: int, end: int) -> np.ndarray:
        """A float32 copy of media samples [start, end) for the engine (it reads it later, on
        its worker thread, while this ring keeps filling)."""
        if start < self._valid_from:
            raise RuntimeError("utterance audio was overwritten before it was transcribed "
                               "(the ASR engine fell behind)")
        return self._span_copy(start, end)
