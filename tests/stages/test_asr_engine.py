"""The batched engine: cross-session batching, ordering, timeouts, and parity with the real model."""

import asyncio
import threading
import time

import numpy as np
import pytest
import speech

from agent.config import ASRConfig
from stages.asr.backend import Hypothesis
from stages.asr.engine import ASREngine


class Recording:
    """A backend that records the batches it gets and answers with each buffer's length
    (deterministic, to test scheduling; the real model is tested below)."""

    name = "recording"
    sample_rate = 16000
    max_batch = 8

    def __init__(self, delay=0.0):
        self.batches: list[list[int]] = []
        self.delay = delay
        self.threads = set()

    def transcribe_batch(self, audio, prompts=None):
        self.threads.add(threading.get_ident())
        self.batches.append([len(a) for a in audio])
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
        be = Recording(delay=0.2)
        be.linear_batch_cost, be.workers = linear, workers
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


@pytest.fixture(scope="module")
def whisper():
    from stages.asr.whisper import WhisperBackend

    return WhisperBackend(ASRConfig())


def test_a_batch_gives_the_same_text_as_each_stream_alone(whisper):
    audio = [speech.load_float(name) for name in ("kittens", "quilter", "honest")]

    async def run(batching):
        eng = ASREngine(whisper, capacity=4, window_ms=50, batching=batching)
        slots = [eng.open() for _ in audio]
        hyps = await asyncio.gather(*(eng.submit(s, a, final=True) for s, a in zip(slots, audio, strict=True)))
        stats = eng.stats
        eng.close()
        return [h.text for h in hyps], stats

    batched, sb = asyncio.run(run(True))
    alone, sa = asyncio.run(run(False))
    assert batched == alone and all(t.strip() for t in batched)
    assert sb.batches == 1 and sa.batches == len(audio)
