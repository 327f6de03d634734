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
    s.audio[:800] = 0.25
    s.stats.chunks_in = 3
    gen = s.generation
    pool.release(s)
    assert not s.audio.any()
    assert s.generation == gen + 1 and s.stats.chunks_in == 0
    pool.release(s)  # twice is harmless
    assert pool.in_use == 0


def test_no_leak_after_a_thousand_cycles():
    pool = SlotPool(capacity=4, max_seconds=0.5)
    ids = set()
    for _ in range(1000):
        s = pool.acquire()
        ids.add(id(s.audio))
        s.audio[:320] = 0.5
        pool.release(s)
    assert pool.in_use == 0 and len(ids) <= 4  # the same preallocated buffers, nothing new
    held = [pool.acquire() for _ in range(4)]
    assert all(not s.audio.any() for s in held)
