"""The batched engine: cross-session batching, ordering, timeouts, and parity with the real model."""

import asyncio
import threading
import time

import numpy as np
import pytest
import speech

from agent.config import ASRConfig
from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis
from stages.asr.engine import ASREngine


class Recording:
    """A backend that records the batches it gets and answers with each buffer's length
    (deterministic, to test scheduling; the real model is tested below)."""

    name = "recording"
    sample_rate = 16000
    max_batch = 8

    def __init__(self, delay=0.0, lanes=1, batch_cost=BatchCost.SUBLINEAR, prompts=False):
        self.capabilities = ASRCapabilities(
            sample_rate=16000, max_batch=8, lanes=lanes, batch_cost=batch_cost, prompts=prompts
        )
        self.batches: list[list[int]] = []
        self.prompts: list[list[str] | None] = []
        self.delay = delay
        self.threads = set()

    def transcribe_batch(self, audio, prompts=None):
        self.threads.add(threading.get_ident())
        self.batches.append([len(a) for a in audio])
        self.prompts.append(None if prompts is None else list(prompts))
        time.sleep(self.delay)
        return [Hypothesis(text=str(len(a))) for a in audio]

    def warmup(self):
        pass


def test_requests_of_many_streams_share_one_batch():
    async def main():
        be = Recording()
        eng = ASREngine(be, capacity=8, window_ms=30)
        slots = [eng.open() for _ in range(5)]
        futs = [eng.submit(s, np.zeros(100 * (i + 1), np.float32)) for i, s in enumerate(slots)]
        hyps = await asyncio.gather(*futs)
        eng.close()
        return be, hyps

    be, hyps = asyncio.run(main())
    assert be.batches == [[100, 200, 300, 400, 500]]
    assert [h.text for h in hyps] == ["100", "200", "300", "400", "500"]
    assert threading.get_ident() not in be.threads  # never on the event loop's thread


def test_batching_off_runs_one_call_per_request_in_order():
    async def main():
        be = Recording()
        eng = ASREngine(be, capacity=4, window_ms=5, batching=False)
        s = eng.open()
        futs = [eng.submit(s, np.zeros(n, np.float32)) for n in (10, 20, 30)]
        hyps = await asyncio.gather(*futs)
        eng.close()
        return be, hyps

    be, hyps = asyncio.run(main())
    assert be.batches == [[10], [20], [30]] and [h.text for h in hyps] == ["10", "20", "30"]


def test_full_batch_goes_at_once_and_oldest_first():
    async def main():
        be = Recording(delay=0.05)
        eng = ASREngine(be, capacity=20, window_ms=10_000, max_batch=4)
        slots = [eng.open() for _ in range(10)]
        t0 = time.monotonic()
        futs = [eng.submit(s, np.zeros(i + 1, np.float32)) for i, s in enumerate(slots)]
        await asyncio.gather(*futs[:4])
        first = time.monotonic() - t0
        eng.close()
        return be, first

    be, first = asyncio.run(main())
    assert be.batches[0] == [1, 2, 3, 4]  # a full batch does not wait out the 10 s window
    assert first < 5


def test_finals_go_before_older_partials_and_order_holds_within_each():
    async def main():
        be = Recording(delay=0.2)
        eng = ASREngine(be, capacity=8, window_ms=1, max_batch=2)
        slots = [eng.open() for _ in range(6)]
        busy = eng.submit(slots[0], np.zeros(1, np.float32))  # occupies the worker
        await asyncio.sleep(0.05)
        futs = [eng.submit(slots[1], np.zeros(10, np.float32)),  # partials, oldest first
                eng.submit(slots[2], np.zeros(20, np.float32)),
                eng.submit(slots[3], np.zeros(30, np.float32), final=True),
                eng.submit(slots[4], np.zeros(40, np.float32)),
                eng.submit(slots[5], np.zeros(50, np.float32), final=True)]
        await asyncio.gather(busy, *futs)
        eng.close()
        return be

    be = asyncio.run(main())
    assert be.batches == [[1], [30, 50], [10, 20], [40]]


def test_a_final_batches_alone_on_a_linear_cost_backend_with_two_lanes():
    async def run(linear: bool, workers: int):
        cost = BatchCost.LINEAR if linear else BatchCost.SUBLINEAR
        be = Recording(delay=0.2, lanes=workers, batch_cost=cost)
        eng = ASREngine(be, capacity=8, window_ms=1, max_batch=4)
        assert eng.lanes == workers and eng.finals_alone == (linear and workers > 1)
        slots = [eng.open() for _ in range(5)]
        busy = [eng.submit(slots[i], np.zeros(i + 1, np.float32)) for i in range(workers)]
        await asyncio.sleep(0.05)  # the engine is busy: what follows queues up
        futs = [eng.submit(slots[2], np.zeros(10, np.float32)),
                eng.submit(slots[3], np.zeros(30, np.float32), final=True),
                eng.submit(slots[4], np.zeros(20, np.float32))]
        await asyncio.gather(*busy, *futs)
        eng.close()
        return [b for b in be.batches if min(b) >= 10]  # leave out the busy-making ones

    assert sorted(asyncio.run(run(True, 2))) == [[10, 20], [30]]
    assert asyncio.run(run(False, 2)) == [[30, 10, 20]]  # batching pays: one batch for all
    assert asyncio.run(run(True, 1)) == [[30, 10, 20]]  # no other lane for the partials


def test_stale_partials_are_dropped_finals_never():
    async def main():
        be = Recording(delay=0.3)
        eng = ASREngine(be, capacity=4, window_ms=1, max_batch=1, max_latency_ms=100)
        a, b = eng.open(), eng.open()
        f1 = eng.submit(a, np.zeros(1, np.float32))  # occupies the worker for 300 ms
        await asyncio.sleep(0.02)
        f2 = eng.submit(b, np.zeros(2, np.float32))  # partial: stale by the time the worker is free
        f3 = eng.submit(b, np.zeros(3, np.float32), final=True)  # final: always served
        r = await asyncio.gather(f1, f2, f3)
        eng.close()
        return r, eng.stats

    (h1, h2, h3), stats = asyncio.run(main())
    assert h1.text == "1" and h2 is None and h3.text == "3" and stats.dropped_stale == 1


def test_released_slot_drops_its_queued_requests():
    async def main():
        be = Recording(delay=0.2)
        eng = ASREngine(be, capacity=4, window_ms=1, max_batch=1)
        a, b = eng.open(), eng.open()
        f1 = eng.submit(a, np.zeros(1, np.float32))
        await asyncio.sleep(0.02)
        f2 = eng.submit(b, np.zeros(2, np.float32), final=True)
        eng.close_slot(b)
        r = await asyncio.gather(f1, f2)
        eng.close()
        return r, be

    (h1, h2), be = asyncio.run(main())
    assert h1.text == "1" and h2 is None and be.batches == [[1]]


def test_a_caller_whose_event_loop_closed_does_not_stop_the_engine():
    # a pipeline's asyncio.run ended with its model call still running: the answer has nowhere
    # to go, and the worker thread must live on for every other caller
    be = Recording(delay=0.2)
    eng = ASREngine(be, capacity=2, window_ms=1)

    async def gone() -> None:
        eng.submit(eng.open(), np.zeros(1, np.float32))
        await asyncio.sleep(0.05)  # the call is running when this loop closes

    async def next_caller() -> str:
        await asyncio.sleep(0.3)  # the first answer came back to a closed loop meanwhile
        h = await asyncio.wait_for(eng.submit(eng.open(), np.zeros(2, np.float32)), 5)
        return h.text

    asyncio.run(gone())
    assert asyncio.run(next_caller()) == "2"
    assert all(t.is_alive() for t in eng._threads)
    eng.close()


def test_a_cancelled_request_is_dropped_only_while_it_waits():
    async def main():
        be = Recording(delay=0.2)
        eng = ASREngine(be, capacity=4, window_ms=1, max_batch=1)
        a, b = eng.open(), eng.open()
        f1 = eng.submit(a, np.zeros(1, np.float32))
        await asyncio.sleep(0.02)  # the lane has taken it
        f2 = eng.submit(b, np.zeros(2, np.float32))
        dropped, running = eng.cancel(f2), eng.cancel(f1)
        r = await asyncio.gather(f1, f2)
        eng.close()
        return r, be, dropped, running, eng.stats

    (h1, h2), be, dropped, running, stats = asyncio.run(main())
    assert dropped and not running and stats.cancelled == 1
    # the running one ran to the end (this backend cannot stop early); nobody gets its answer
    assert h1 is None and h2 is None and be.batches == [[1]] and stats.abandoned == 1


class Staged(Recording):
    """A backend that stops a call after its first stage for the buffers nobody wants any
    more (as Whisper does after its encoder); the first stage waits for ``go``."""

    def __init__(self):
        super().__init__()
        self.capabilities = ASRCapabilities(sample_rate=16000, max_batch=8, abandonable=True)
        self.encoding = threading.Event()
        self.go = threading.Event()
        self.decoded: list[list[int]] = []

    def transcribe_batch(self, audio, prompts=None, wanted=None):
        self.batches.append([len(a) for a in audio])
        self.encoding.set()
        assert self.go.wait(5)
        keep = wanted()
        self.decoded.append([len(a) for a, k in zip(audio, keep, strict=True) if k])
        return [Hypothesis(str(len(a)) if k else "") for a, k in zip(audio, keep, strict=True)]


def test_a_request_cancelled_in_its_call_stops_it_after_the_first_stage():
    async def main():
        be = Staged()
        eng = ASREngine(be, capacity=4, window_ms=20, max_batch=4)
        a, b, c = eng.open(), eng.open(), eng.open()
        futs = [eng.submit(s, np.zeros(n, np.float32)) for s, n in ((a, 1), (b, 2), (c, 3))]
        await asyncio.get_running_loop().run_in_executor(None, be.encoding.wait, 5)
        assert not eng.cancel(futs[0])  # running: not dropped from the queue, but given up
        eng.close_slot(c)  # a released slot's request is not wanted either
        be.go.set()
        hyps = await asyncio.gather(*futs)
        metrics = {m.name: m.value for m in eng.metric_samples()}
        eng.close()
        return be, hyps, eng.stats, metrics

    be, hyps, stats, metrics = asyncio.run(main())
    assert be.batches == [[1, 2, 3]] and be.decoded == [[2]]
    assert hyps[0] is None and hyps[1].text == "2" and hyps[2] is None
    assert stats.abandoned == 1 and stats.cancelled == 0
    assert metrics["voxline_asr_requests_abandoned"] == 1


def test_prompts_reach_only_a_backend_that_declares_them():
    async def run(prompts: bool):
        be = Recording(prompts=prompts)
        eng = ASREngine(be, capacity=4, window_ms=30)
        a, b = eng.open(), eng.open()
        await asyncio.gather(eng.submit(a, np.zeros(1, np.float32), prompt="hello there"),
                             eng.submit(b, np.zeros(2, np.float32)))
        await eng.submit(a, np.zeros(3, np.float32))  # no prompt in the batch at all
        eng.close()
        return be.prompts

    assert asyncio.run(run(True)) == [["hello there", ""], None]
    assert asyncio.run(run(False)) == [None, None]


def test_capabilities_are_checked_when_declared():
    with pytest.raises(ValueError, match="lanes >= 1"):
        ASRCapabilities(sample_rate=16000, max_batch=4, lanes=0)
    with pytest.raises(ValueError, match="max_batch >= 1"):
        ASRCapabilities(sample_rate=16000, max_batch=0)
    caps = ASRCapabilities(sample_rate=16000, max_batch=4)
    assert (caps.lanes, caps.batch_cost, caps.prompts, caps.word_times, caps.stateful) == (
        1, BatchCost.SUBLINEAR, False, False, False)


# --- stateful backends: the stream state lives in the slot ---------------------------------------


class StreamCount:
    """One stream's state in :class:`CountingStreams`: the samples of its utterance so far."""

    def __init__(self) -> None:
        self.samples = 0
        self.utterances = 0
        self.open = True


class CountingStreams:
    """A deterministic stateful backend: each stream's hypothesis is the number of samples its
    utterance has had so far, so a state shared, lost, reordered or reset shows in the text."""

    name = "counting-streams"
    sample_rate = 16000
    max_batch = 8

    def __init__(self, delay=0.0, lanes=1):
        self.capabilities = ASRCapabilities(
            sample_rate=16000, max_batch=8, lanes=lanes, stateful=True
        )
        self.delay = delay
        self.opened: list[StreamCount] = []
        self.closed: list[StreamCount] = []
        self.calls: list[list[tuple[int, int, bool]]] = []  # (stream, samples, final) per call
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self.overlapped = False  # one state in two calls at once

    def open_stream(self) -> StreamCount:
        state = StreamCount()
        self.opened.append(state)
        return state

    def close_stream(self, state: StreamCount) -> None:
        assert state.open and id(state) not in self._busy, "closed twice, or while in a call"
        state.open = False
        self.closed.append(state)

    def transcribe_streams(self, audio, states, finals, prompts=None):
        keys = {id(s) for s in states}
        assert len(keys) == len(states), "two requests of one stream in one call"
        with self._lock:
            self.overlapped |= bool(keys & self._busy)
            self._busy |= keys
            self.calls.append([(self.opened.index(s), len(a), f)
                               for a, s, f in zip(audio, states, finals, strict=True)])
        time.sleep(self.delay)
        out = []
        for a, state, final in zip(audio, states, finals, strict=True):
            assert state.open
            state.samples += len(a)
            out.append(Hypothesis(str(state.samples)))
            if final:
                state.samples = 0
                state.utterances += 1
        with self._lock:
            self._busy -= keys
        return out

    def transcribe_batch(self, audio, prompts=None):
        raise AssertionError("a stateful backend is driven through transcribe_streams")

    def warmup(self):
        pass


def chunk(n: int) -> np.ndarray:
    return np.zeros(n, np.float32)


def test_each_slot_holds_its_own_stream_state_opened_once_and_closed_on_release():
    async def main():
        be = CountingStreams()
        eng = ASREngine(be, capacity=2, window_ms=20)
        a, b = eng.open(), eng.open()
        states = (a.stream_state, b.stream_state)
        got = await asyncio.gather(
            eng.submit(a, chunk(100)), eng.submit(b, chunk(10)),
            eng.submit(a, chunk(200), final=True), eng.submit(b, chunk(20)),
            eng.submit(a, chunk(5)),  # the next utterance starts from nothing
        )
        opened_before_release = list(be.opened)
        eng.close_slot(a)
        released = (a.stream_state, list(be.closed))
        c = eng.open()  # the same slot, taken again: a fresh state
        again = await eng.submit(c, chunk(7))
        eng.close_slot(b)
        eng.close_slot(c)
        eng.close()
        return be, states, got, opened_before_release, released, c, again

    be, (sa, sb), got, opened, (a_state, closed), c, again = asyncio.run(main())
    assert [h.text for h in got] == ["100", "10", "300", "30", "5"]
    assert sa is not sb and opened == [sa, sb]  # one state per slot, opened on open()
    assert a_state is None and closed == [sa] and not sa.open and sa.utterances == 1
    assert c.stream_state is None and again.text == "7"
    assert len(be.opened) == 3 and be.opened[2] not in (sa, sb)
    assert be.closed == [sa, sb, be.opened[2]]  # each state closed once, on release
    # never two requests of one stream in one call, and a stream's requests in order
    assert be.calls == [[(0, 100, False), (1, 10, False)], [(0, 200, True), (1, 20, False)],
                        [(0, 5, False)], [(2, 7, False)]]


def test_a_streams_requests_run_one_at_a_time_in_order_and_are_never_stale():
    async def main():
        be = CountingStreams(delay=0.05, lanes=2)
        eng = ASREngine(be, capacity=2, window_ms=1, max_latency_ms=1)
        a, b = eng.open(), eng.open()
        futs = [eng.submit(s, chunk(n)) for n in (1, 2, 3, 4) for s in (a, b)]
        got = await asyncio.gather(*futs)
        eng.close()
        return be, got, eng.stats

    be, got, stats = asyncio.run(main())
    assert [h.text for h in got] == ["1", "1", "3", "3", "6", "6", "10", "10"]
    assert stats.dropped_stale == 0 and not be.overlapped  # other lane, never the same state


def test_a_state_released_during_its_call_is_closed_when_the_call_returns():
    async def main():
        be = CountingStreams(delay=0.2)
        eng = ASREngine(be, capacity=2, window_ms=1)
        a = eng.open()
        state = a.stream_state
        fut = eng.submit(a, chunk(3))
        await asyncio.sleep(0.05)  # the call is running
        eng.close_slot(a)
        open_during_call = state.open
        await fut
        await asyncio.sleep(0.05)
        eng.close()
        return be, state, open_during_call

    be, state, open_during_call = asyncio.run(main())
    assert open_during_call and not state.open and be.closed == [state]


def test_a_stateful_declaration_without_the_stream_methods_is_refused():
    class Liar(Recording):
        def __init__(self):
            super().__init__()
            self.capabilities = ASRCapabilities(sample_rate=16000, max_batch=8, stateful=True)

    with pytest.raises(TypeError, match="declares stateful streaming"):
        ASREngine(Liar(), capacity=1)


@pytest.fixture(scope="module")
def whisper():
    from stages.asr.whisper import WhisperBackend

    return WhisperBackend(ASRConfig())


def test_a_batch_gives_the_same_text_as_each_stream_alone(whisper):
    audio = [speech.load_float(name) for name in ("kittens", "quilter", "honest")]

    async def run(batching):
        # max_batch explicit: on its own the engine gives a linear-cost backend batches of one
        eng = ASREngine(whisper, capacity=4, window_ms=50, max_batch=16, batching=batching)
        slots = [eng.open() for _ in audio]
        hyps = await asyncio.gather(*(eng.submit(s, a, final=True) for s, a in zip(slots, audio, strict=True)))
        stats = eng.stats
        eng.close()
        return [h.text for h in hyps], stats

    batched, sb = asyncio.run(run(True))
    alone, sa = asyncio.run(run(False))
    assert batched == alone and all(t.strip() for t in batched)
    assert sb.batches == 1 and sa.batches == len(audio)
