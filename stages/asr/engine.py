"""The streaming ASR engine: one per model per process, shared by every session.

Sessions submit transcription requests for their slot's utterance audio; a dedicated worker
thread gathers the requests of all sessions for a short window (or until the batch is full) and
runs ONE batched backend call for them — one such thread (a lane) per backend call the backend
runs at once (``capabilities.lanes``; one per CPU thread for Whisper). Two guards: ``window_ms``
bounds how long the first request of a batch waits for company, and ``max_latency_ms`` bounds a
partial's total age — a partial older than that is dropped (a newer one supersedes it) so an
overloaded engine sheds stale work instead of falling further behind. Finals are never dropped
and go first; within finals and within partials, requests are served oldest first, so nobody
starves. The engine schedules from the backend's declared :class:`ASRCapabilities` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from agent.ops import Sample, histogram_value
from stages.asr.backend import (
    ASRBackend,
    BatchCost,
    Hypothesis,
    StatefulASRBackend,
    StreamState,
)
from stages.asr.slots import Slot, SlotPool

log = logging.getLogger("voxline.asr.engine")


@dataclass(slots=True, eq=False)
class Request:
    slot: Slot
    generation: int
    audio: np.ndarray
    final: bool
    prompt: str
    enqueued_ns: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Hypothesis | None]
    state: StreamState | None = None  # the slot's stream state (stateful backends)
    dropped: bool = False  # cancelled while in a model call: its answer goes nowhere


# upper bounds (seconds) of the batch-wait histogram: from enqueue to the batch's model call
WAIT_BOUNDS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    requests: int = 0
    dropped_stale: int = 0  # partials shed: too old to be worth a model call
    cancelled: int = 0  # dropped before they ran because their stream no longer wanted them
    abandoned: int = 0  # cancelled while in a model call (a backend that can stop one early)
    batch_sizes: dict[int, int] = field(default_factory=dict)
    busy_s: float = 0.0
    # how long each request run waited for its batch: counts per WAIT_BOUNDS_S bucket (the
    # last counts those over every bound), and their sum
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BOUNDS_S) + 1))
    wait_sum_s: float = 0.0

    def waited(self, seconds: float) -> None:
        self.wait_sum_s += seconds
        self.wait_counts[bisect_left(WAIT_BOUNDS_S, seconds)] += 1

    @property
    def mean_batch(self) -> float:
        n = sum(self.batch_sizes.values())
        return sum(k * v for k, v in self.batch_sizes.items()) / n if n else 0.0


class ASREngine:
    """Cross-session micro-batching over one backend.

    ``batching=False`` runs each request alone (one backend call per request) through the same
    worker — the baseline the capacity benchmark compares against.

    With a stateful backend (``capabilities.stateful``) the engine opens the backend's state for
    a stream in :meth:`open`, keeps it in the slot, passes it with each request of that stream
    and closes it in :meth:`close_slot`. Each request then carries the stream's audio since
    its previous request, so none may be lost or reordered: a stream's requests run one at a
    time and in order, and stale partials are not dropped.
    """

    def __init__(
        self,
        backend: ASRBackend,
        capacity: int = 64,
        window_ms: float = 10.0,
        max_batch: int | None = None,
        max_latency_ms: float = 1000.0,
        max_seconds: float = 30.0,
        batching: bool = True,
    ) -> None:
        caps = backend.capabilities
        self.backend = backend
        self.capabilities = caps
        self._streams: StatefulASRBackend | None = None
        if caps.stateful:
            if not isinstance(backend, StatefulASRBackend):
                raise TypeError(
                    f"ASR backend {backend.name!r} declares stateful streaming but lacks "
                    "open_stream/close_stream/transcribe_streams — implement them or declare "
                    "stateful=False"
                )
            self._streams = cast(StatefulASRBackend, backend)
        self.pool = SlotPool(capacity, max_seconds=max_seconds, rate=caps.sample_rate)
        self.window_ns = int(window_ms * 1e6)
        # No max_batch given: the backend's largest, except on a linear-cost backend, where a
        # batch costs what its parts cost and only delays every request in it until the last is
        # done — one request per call there (Whisper on 2 CPU cores, capacity benchmark: max
        # batch 1 / 2 / 4 served 40 / 32 / 24 callers).
        auto = 1 if caps.batch_cost is BatchCost.LINEAR else caps.max_batch
        self.max_batch = max(1, min(max_batch or auto, caps.max_batch))
        if not batching:
            self.max_batch = 1
        self.max_latency_ns = int(max_latency_ms * 1e6)
        self.stats = EngineStats()
        self._queue: deque[Request] = deque()
        self._cv = threading.Condition()
        self._closed = False
        # Stateful backends: the states in a running call (by id), and those whose slot was
        # released meanwhile, closed when that call returns.
        self._running: set[int] = set()
        # The batches in model calls now, so that a cancel can reach a running request.
        self._in_calls: list[list[Request]] = []
        self._closing: dict[int, StreamState] = {}
        # One worker thread per backend call the backend runs at once: each gathers and runs
        # its own batch, so a final need not wait for a batch of partials.
        self.lanes = caps.lanes
        # On a backend whose batch costs what its parts cost (Whisper on CPU), a final shares
        # its batch with no partial when another lane can take the partials: they would only
        # make it wait. (With one lane this measured worse: the partials then wait instead.)
        self.finals_alone = caps.batch_cost is BatchCost.LINEAR and self.lanes > 1
        self._threads = [
            threading.Thread(target=self._work, name=f"asr-engine-{i}", daemon=True)
            for i in range(self.lanes)
        ]
        for t in self._threads:
            t.start()

    # --- slots -------------------------------------------------------------------------------
    def open(self) -> Slot:
        """Take a slot for a new stream (raises CapacityError when the pool is full); with a
        stateful backend, the slot gets a fresh stream state."""
        slot = self.pool.acquire()
        if self._streams is not None:
            try:
                slot.stream_state = self._streams.open_stream()
            except BaseException:
                self.pool.release(slot)
                raise
        return slot

    def close_slot(self, slot: Slot) -> None:
        """Give a slot back, zeroed; its requests still queued are dropped, and its stream state
        (stateful backends) is closed — once the call using it, if any, has returned."""
        state, slot.stream_state = slot.stream_state, None
        with self._cv:
            kept = deque(r for r in self._queue if r.slot is not slot)
            for r in self._queue:
                if r.slot is slot:
                    _answer(r, _resolve, None)
            self._queue = kept
            if state is not None and id(state) in self._running:
                self._closing[id(state)] = state
                state = None
        self.pool.release(slot)
        if state is not None and self._streams is not None:
            self._streams.close_stream(state)

    # --- requests ----------------------------------------------------------------------------
    def submit(
        self, slot: Slot, audio: np.ndarray, final: bool = False, prompt: str = ""
    ) -> asyncio.Future[Hypothesis | None]:
        """Queue ``audio`` (float32, a copy the caller won't touch) of ``slot`` for transcription;
        ``prompt`` is the text that came before it (the model's context; left out for a
        backend that declares it takes no prompts). With a stateful backend ``audio`` is the
        stream's audio since its previous request and ``final`` ends the utterance.

        The future resolves to a Hypothesis, or None when the request was dropped (stale
        partial, slot released, engine closed)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Hypothesis | None] = loop.create_future()
        now = time.monotonic_ns()
        req = Request(
            slot, slot.generation, audio, final, prompt, now, loop, fut, slot.stream_state
        )
        slot.stats.requests += 1
        with self._cv:
            if self._closed:
                fut.set_result(None)
                return fut
            self._queue.append(req)
            self._cv.notify()
        return fut

    def partial_room(self) -> bool:
        """Whether a partial submitted now would go in the lanes' next batches: fewer partials
        wait than the lanes take at once. A stream that finds no room keeps its partial for
        later, so that it reads the newest audio when it goes instead of aging in the queue."""
        room = self.lanes * self.max_batch
        with self._cv:
            return sum(not r.final for r in self._queue) < room

    def cancel(self, future: asyncio.Future[Hypothesis | None]) -> bool:
        """Drop the request behind ``future`` if no lane has taken it yet (it resolves to None);
        False when it is running or done. A running one resolves to None when its call
        returns, and a backend that can stop a call early (``capabilities.abandonable``; Whisper
        after its encoder) skips the rest of its work. A stateful backend's requests are never
        dropped: the stream's state needs their audio."""
        if self._streams is not None:
            return False
        with self._cv:
            for r in self._queue:
                if r.future is future:
                    self._queue.remove(r)
                    break
            else:
                for batch in self._in_calls:
                    for r in batch:
                        if r.future is future and not r.dropped:
                            r.dropped = True
                            self.stats.abandoned += 1
                return False
        self.stats.cancelled += 1
        _resolve(future, None)
        return True

    def metric_samples(self) -> list[Sample]:
        """What ``/metrics`` shows of the engine: slots, batches, waits, shed work."""
        with self._cv:
            st = self.stats
            sizes = dict(st.batch_sizes)
            waits, wait_sum = list(st.wait_counts), st.wait_sum_s
            counters = (st.batches, st.requests, st.dropped_stale, st.cancelled, st.busy_s,
                        st.abandoned)
        bounds = tuple(float(b) for b in range(1, self.max_batch + 1))
        by_size = [sizes.get(int(b), 0) for b in bounds]
        by_size.append(sum(n for k, n in sizes.items() if k > self.max_batch))
        batches, requests, shed, cancelled, busy, abandoned = counters
        in_use = self.pool.in_use
        return [
            Sample("voxline_asr_slots", "gauge", "ASR stream slots, by state.",
                   in_use, (("state", "in_use"),)),
            Sample("voxline_asr_slots", "gauge", "ASR stream slots, by state.",
                   self.pool.capacity - in_use, (("state", "free"),)),
            Sample("voxline_asr_batch_size", "histogram", "Requests per batched model call.",
                   histogram_value(bounds, by_size, float(sum(k * n for k, n in sizes.items())))),
            Sample("voxline_asr_batch_wait_seconds", "histogram", "How long a request waited "
                   "for its batch's model call.", histogram_value(WAIT_BOUNDS_S, waits, wait_sum)),
            Sample("voxline_asr_batches", "counter", "Batched model calls run.", batches),
            Sample("voxline_asr_requests", "counter", "Requests run in batches.", requests),
            Sample("voxline_asr_partials_shed", "counter", "Partial-transcript requests shed "
                   "unrun, too old to be worth a model call (an overloaded engine).", shed),
            Sample("voxline_asr_requests_cancelled", "counter", "Requests dropped unrun because "
                   "their stream no longer wanted them.", cancelled),
            Sample("voxline_asr_requests_abandoned", "counter", "Requests their stream gave up "
                   "while in a model call (the backend stops such a call early where it can).",
                   abandoned),
            Sample("voxline_asr_busy_seconds", "counter", "Seconds the engine's model calls ran.",
                   busy),
        ]

    def close(self) -> None:
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for r in pending:
            _answer(r, _resolve, None)
        for t in self._threads:
            t.join(timeout=5)

    # --- worker thread -----------------------------------------------------------------------
    def _gather(self) -> list[Request] | None:
        with self._cv:
            while True:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return None
                # wait for company: until the window after the oldest request ends or the batch
                # is full
                deadline = self._queue[0].enqueued_ns + self.window_ns
                while len(self._queue) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic_ns()
                    if left <= 0:
                        break
                    self._cv.wait(left / 1e9)
                now = time.monotonic_ns()
                # A stateful stream's request carries audio its state has not seen: never stale.
                stale_ns = self.max_latency_ns if self._streams is None else None
                live: list[Request] = []
                for r in self._queue:
                    if r.slot.generation != r.generation or (
                        stale_ns is not None and not r.final and now - r.enqueued_ns > stale_ns
                    ):
                        self.stats.dropped_stale += 1
                        _answer(r, _resolve, None)
                    else:
                        live.append(r)
                batch = self._pick(live)
                for r in batch:
                    self.stats.waited((now - r.enqueued_ns) / 1e9)
                taken = set(batch)
                self._queue = deque(r for r in live if r not in taken)
                if batch or not self._queue:
                    self._running.update(id(r.state) for r in batch if r.state is not None)
                    if batch:  # in a call from here on, under this lock: a cancel finds it
                        self._in_calls.append(batch)
                    return batch
                # Every stream queued is in a running call: wait until one returns.
                self._cv.wait()

    def _pick(self, live: list[Request]) -> list[Request]:
        """The next batch from the live requests (in arrival order); called with the lock."""
        if self._streams is not None:
            # One request per stream and call, the oldest, and none of a stream in a call.
            seen = set(self._running)
            first: list[Request] = []
            for r in live:
                key = id(r.state)
                if key not in seen:
                    seen.add(key)
                    first.append(r)
            live = first
        # Finals first (a caller waits for the answer), then partials; oldest first within
        # each (the queue is in arrival order). A stream has one request outstanding at
        # most, so partials wait behind at most one final per stream.
        batch = [r for r in live if r.final][: self.max_batch]
        if not (batch and self.finals_alone):
            batch += [r for r in live if not r.final][: self.max_batch - len(batch)]
        return batch

    def _work(self) -> None:
        while True:
            batch = self._gather()
            if batch is None:
                return
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                hyps = self._call(batch)
            except Exception as exc:  # a failing batch fails its requests, not the engine
                log.exception("ASR backend failed on a batch of %d", len(batch))
                for r in batch:
                    _answer(r, _fail, exc)
                hyps = None
            finally:
                busy = time.perf_counter() - t0
                with self._cv:
                    self._in_calls.remove(batch)
                if self._streams is not None:
                    self._returned(batch)
            if hyps is None:
                continue
            with self._cv:
                st = self.stats
                st.busy_s += busy
                st.batches += 1
                st.requests += len(batch)
                st.batch_sizes[len(batch)] = st.batch_sizes.get(len(batch), 0) + 1
            for r, h in zip(batch, hyps, strict=True):
                gone = r.dropped or r.slot.generation != r.generation  # nobody waits for h
                _answer(r, _resolve, None if gone else h)

    def _call(self, batch: list[Request]) -> list[Hypothesis]:
        prompts: list[str] | None = None
        if self.capabilities.prompts:
            prompts = [r.prompt for r in batch]
            if not any(prompts):
                prompts = None
        audio = [r.audio for r in batch]
        if self._streams is None:
            if self.capabilities.abandonable:
                def wanted() -> list[bool]:  # on this worker thread; a bool read needs no lock
                    return [not r.dropped and r.slot.generation == r.generation for r in batch]

                return self.backend.transcribe_batch(audio, prompts, wanted=wanted)
            return self.backend.transcribe_batch(audio, prompts)
        return self._streams.transcribe_streams(
            audio, [r.state for r in batch], [r.final for r in batch], prompts
        )

    def _returned(self, batch: list[Request]) -> None:
        """A stateful call returned: its streams may run again, and the states of the slots
        released meanwhile are closed now."""
        assert self._streams is not None
        with self._cv:
            done = []
            for r in batch:
                key = id(r.state)
                self._running.discard(key)
                if key in self._closing:
                    done.append(self._closing.pop(key))
            self._cv.notify_all()
        for state in done:
            try:
                self._streams.close_stream(state)
            except Exception:
                log.exception("ASR backend failed to close a stream state")


def _answer(r: Request, how: Callable[[asyncio.Future, Any], None], value: object) -> None:
    """Hand ``value`` to the request's event loop; a loop already closed (its caller is gone,
    e.g. an ``asyncio.run`` that ended) takes nothing, and the worker goes on."""
    with contextlib.suppress(RuntimeError):
        r.loop.call_soon_threadsafe(how, r.future, value)


def _resolve(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
