import numpy as np
import pytest

from agent.errors import CapacityError
from stages.asr.slots import SlotPool


def test_exhaustion_refuses_with_a_clear_error():
    pool = SlotPool(capacity=3, max_seconds=1)
    slots = [pool.acquire() for _ in range(3)]
    with pytest.raises(CapacityError, match="all 3 ASR slots are in use"):
        pool.acquire()
    pool.release(slots[1])
    assert pool.acquire() is slots[1]


def test_release_zeroes_the_slot():
    pool = SlotPool(capacity=1, max_seconds=1)
    s = pool.acquire()
    s.begin_utterance(1000)
    s.append(np.full(800, 12000, np.int16))
    s.committed = "hello"
    gen = s.generation
    pool.release(s)
    assert s.length == 0 and s.start == 0 and s.committed == "" and not s.audio.any()
    assert s.generation == gen + 1 and s.stats.chunks_in == 0
    pool.release(s)  # twice is harmless
    assert pool.in_use == 0


def test_append_view_trim_and_overflow():
    pool = SlotPool(capacity=1, max_seconds=0.1)  # 1600 samples
    s = pool.acquire()
    s.begin_utterance(5000)
    assert s.append(np.arange(1000, dtype=np.int16)) == 0
    assert np.allclose(s.view()[:3] * 32768, [0, 1, 2])
    assert len(s.view(upto=5500)) == 500
    s.trim(5400)
    assert s.start == 5400 and s.length == 600 and round(s.audio[0] * 32768) == 400
    assert s.append(np.ones(1200, np.int16)) == 200  # 200 did not fit
    assert s.end == 5400 + 1600


def test_no_leak_after_a_thousand_cycles():
    pool = SlotPool(capacity=4, max_seconds=0.5)
    ids = set()
    for _ in range(1000):
        s = pool.acquire()
        ids.add(id(s.audio))
        s.append(np.ones(320, np.int16))
        pool.release(s)
    assert pool.in_use == 0 and len(ids) <= 4  # the same preallocated buffers, nothing new
    held = [pool.acquire() for _ in range(4)]
    assert all(not s.audio.any() and s.length == 0 for s in held)
