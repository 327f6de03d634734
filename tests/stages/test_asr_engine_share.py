"""A client's share of the engine: its backlog waits at the share, so another client's request
goes to the engine ahead of it; waiting requests cancel, go with their slot, and go with the
client. Over the real ASREngine with a deterministic backend (the real model: the asr-serve
tests)."""

import asyncio
import threading
import time

import numpy as np

from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis
from stages.asr.engine import ASREngine
from stages.asr.engine_share import EngineShare


class Ordered:
    """Answers each buffer with its length, one call at a time, recording the order."""

    name = "ordered"
    sample_rate = 16000

    def __init__(self, delay: float = 0.02) -> None:
        self.capabilities = ASRCapabilities(sample_rate=16000, max_batch=1, lanes=1,
                                            batch_cost=BatchCost.LINEAR)
        self.order: list[int] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()

    def transcribe_batch(self, audio, prompts=None):
        self.gate.wait(10)
        self.order.extend(len(a) for a in audio)
        time.sleep(self.delay)
        return [Hypothesis(text=str(len(a))) for a in audio]

    def warmup(self):
        pass


def chunk(n: int) -> np.ndarray:
    return np.zeros(n, np.float32)


def test_a_newcomer_goes_ahead_of_anothers_backlog():
    async def main():
        be = Ordered()
        engine = ASREngine(be, capacity=4, window_ms=1)
        greedy, newcomer = EngineShare(engine, 2), EngineShare(engine, 2)
        gs, ns = engine.open(), engine.open()
        backlog = [greedy.submit(gs, chunk(100 + i), final=True) for i in range(20)]
        waiting = greedy.waiting  # two went to the engine, the rest wait at the share
        await asyncio.sleep(0.05)
        done_before = len(be.order)
        mine = await newcomer.submit(ns, chunk(7), final=True)
        position = be.order.index(7) - done_before  # requests served between its arrival and it
        await asyncio.gather(*backlog)
        engine.close()
        return waiting, mine, position, be.order

    waiting, mine, position, order = asyncio.run(main())
    assert waiting == 18
    assert mine.text == "7"
    assert position <= 2, order  # behind the greedy share's two in the engine, not its backlog
    assert sorted(order) == sorted([7, *range(100, 120)])


def test_an_unshared_engine_puts_the_newcomer_last():
    """What the share is for: straight into the engine, the newcomer waits for the whole
    backlog (the engine serves oldest first)."""
    async def main():
        be = Ordered(delay=0.005)
        engine = ASREngine(be, capacity=4, window_ms=1)
        gs, ns = engine.open(), engine.open()
        backlog = [engine.submit(gs, chunk(100 + i), final=True) for i in range(20)]
        await asyncio.sleep(0.01)
        await engine.submit(ns, chunk(7), final=True)
        await asyncio.gather(*backlog)
        engine.close()
        return be.order.index(7)

    assert asyncio.run(main()) >= 19


def test_waiting_requests_cancel_and_go_with_their_slot_and_their_client():
    async def main():
        be = Ordered()
        be.gate.clear()  # the engine holds the first request until we let it go
        engine = ASREngine(be, capacity=4, window_ms=1)
        share = EngineShare(engine, 1)
        a, b = engine.open(), engine.open()
        first = share.submit(a, chunk(1), final=True)
        cancelled = share.submit(a, chunk(2), final=True)
        of_b = share.submit(b, chunk(3), final=True)
        of_a = share.submit(a, chunk(4), final=True)
        left = share.submit(b, chunk(5), final=True)
        await asyncio.sleep(0.05)
        assert share.in_engine == 1 and share.waiting == 4
        assert share.cancel(cancelled)
        share.forget(a)  # a's slot is being released: its waiting request goes
        share.close()  # the client went: nothing else of it goes to the engine
        be.gate.set()
        results = [await f for f in (first, cancelled, of_b, of_a, left)]
        engine.close()
        return results, be.order

    results, order = asyncio.run(main())
    assert results[0].text == "1"
    assert results[1:] == [None, None, None, None]
    assert order == [1]
