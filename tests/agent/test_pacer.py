"""The pacer alone, without sockets or an event loop: a script of writes, barge-ins and ticks at
given times, and what each tick hands out. Frame k of agent audio is 20 ms of the value k, so
an expected output names the frames: ``[1, 2]`` is frames 1 and 2, ``None`` a quiet packet
time, ``[]`` a tick before its deadline."""

from __future__ import annotations

import numpy as np
import pytest

from agent.pacer import RESYNC_AFTER_NS, Pacer
from agent.playout import Playout

T0 = 10**12  # any monotonic time: the schedule is relative to the first tick
MS = 1_000_000


def audio(first: int, frames: int, samples: int = 320) -> np.ndarray:
    """``frames`` frames of agent audio, frame k filled with the value k."""
    return np.repeat(np.arange(first, first + frames, dtype=np.int16), samples)


def name(frame: np.ndarray | None) -> int | None:
    if frame is None:
        return None
    assert (frame == frame[0]).all(), "a frame mixed two frames' audio"
    return int(frame[0])


# (script, pacer options, expected counters): a script step is ("write", first, frames),
# ("flush",) or ("tick", ms, expected)
CASES = {
    "on time": ([
        ("write", 1, 3),
        ("tick", 0, [1]), ("tick", 20, [2]), ("tick", 40, [3]), ("tick", 60, [None]),
    ], {}, {"late_ticks": 0, "resyncs": 0}),
    "early ticks wait, within a millisecond they count": ([
        ("write", 1, 3),
        ("tick", 0, [1]), ("tick", 10, []), ("tick", 19.5, [2]), ("tick", 40, [3]),
    ], {}, {"late_ticks": 0}),
    "a late tick catches up on every missed deadline": ([
        ("write", 1, 6),
        ("tick", 0, [1]), ("tick", 70, [2, 3, 4]), ("tick", 80, [5]), ("tick", 100, [6]),
    ], {}, {"late_ticks": 1, "resyncs": 0, "dropped": 0}),
    "200 ms late is still caught up": ([
        ("write", 1, 12),
        ("tick", 0, [1]), ("tick", 220, list(range(2, 13))),
    ], {}, {"late_ticks": 1, "resyncs": 0}),
    "a stall drops its deadlines and restarts the clock": ([
        ("write", 1, 4),
        ("tick", 0, [1]), ("tick", 300, [2]), ("tick", 310, []), ("tick", 320, [3]),
        ("tick", 340, [4]),
    ], {}, {"late_ticks": 1, "resyncs": 1, "dropped": 14}),
    "empty queue: one None per packet time": ([
        ("tick", 0, [None]), ("tick", 60, [None, None, None]), ("tick", 70, []),
    ], {}, {"late_ticks": 1}),
    "audio arriving while idle starts at once": ([
        ("tick", 0, [None]), ("write", 1, 2), ("tick", 5, [1]), ("tick", 15, []),
        ("tick", 25, [2]),
    ], {}, {"late_ticks": 0}),
    "a stretch opens with its lead, then one frame per deadline": ([
        ("tick", 0, [None]), ("write", 1, 5), ("tick", 5, [1, 2, 3]), ("tick", 25, [4]),
        ("tick", 45, [5]), ("tick", 65, [None]), ("write", 6, 4), ("tick", 70, [6, 7, 8]),
    ], {"lead": 3}, {"late_ticks": 0}),
    "barge-in: the next packet time is quiet, the next audio starts at once": ([
        ("write", 1, 50),
        ("tick", 0, [1]), ("tick", 20, [2]), ("flush",), ("tick", 40, [None]),
        ("write", 100, 2), ("tick", 45, [100]), ("tick", 65, [101]),
    ], {}, {"resyncs": 0}),
}


@pytest.mark.parametrize("case", CASES)
def test_pacer_script(case: str) -> None:
    script, options, counters = CASES[case]
    playout = Playout(lambda frame: None)
    pacer = Pacer(playout, **options)
    for step in script:
        if step[0] == "write":
            playout.write(audio(step[1], step[2]))
        elif step[0] == "flush":
            playout.flush()
        else:
            _, at, expected = step
            got = [name(f) for f in pacer.tick(T0 + int(at * MS))]
            assert got == expected, f"{case}: tick at {at} ms"
    for counter, value in counters.items():
        assert getattr(pacer, counter) == value, counter


def test_delay_is_the_time_to_the_next_deadline() -> None:
    pacer = Pacer(Playout(lambda frame: None))
    assert pacer.delay(T0) == 0.0 and pacer.due_ns is None
    pacer.tick(T0)
    assert pacer.due_ns == T0 + 20 * MS
    assert pacer.delay(T0 + 5 * MS) == pytest.approx(0.015)
    assert pacer.delay(T0 + 25 * MS) == 0.0


def test_a_10ms_pacer_takes_10ms_of_the_playout_per_packet() -> None:
    playout = Playout(lambda frame: None)
    pacer = Pacer(playout, ptime_ms=10)
    playout.write(audio(1, 4, samples=160))
    frames = [f.copy() for at in (0, 10, 20, 30) for f in pacer.tick(T0 + at * MS)]
    assert [len(f) for f in frames] == [160] * 4 and [name(f) for f in frames] == [1, 2, 3, 4]


def test_frames_are_written_into_the_pacers_own_buffers() -> None:
    playout = Playout(lambda frame: None)
    pacer = Pacer(playout)
    playout.write(audio(1, 40))
    first = pacer.tick(T0)
    row0 = first[0].__array_interface__["data"][0]
    later = pacer.tick(T0 + 100 * MS)  # catch-up: five frames at once, each its own row
    assert [name(f) for f in later] == [2, 3, 4, 5, 6]
    assert later is first  # the list is reused too
    assert all(np.shares_memory(f, pacer._buffer) for f in later)
    assert len({f.__array_interface__["data"][0] for f in later}) == 5
    assert later[0].__array_interface__["data"][0] == row0


def test_the_buffers_hold_the_largest_catch_up_with_its_lead() -> None:
    playout = Playout(lambda frame: None)
    pacer = Pacer(playout, lead=3)
    assert pacer.tick(T0) == [None]
    playout.write(audio(1, 100))
    # the latest tick that still catches up, opening a stretch: 11 deadlines and 2 more of lead
    got = pacer.tick(T0 + 20 * MS + RESYNC_AFTER_NS)
    assert [name(f) for f in got] == list(range(1, 14)) and pacer.resyncs == 0
    assert len({f.__array_interface__["data"][0] for f in got}) == 13


def test_pull_into_a_buffer_pads_the_end_with_zeros() -> None:
    playout = Playout(lambda frame: None)
    playout.write(np.full(400, 7, np.int16), last=True)
    out = np.full(320, -1, np.int16)
    assert playout.pull(out) is out and (out == 7).all()
    assert playout.pull(out) is out and (out[:80] == 7).all() and not out[80:].any()
    assert playout.pull(out) is None


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="ptime_ms"):
        Pacer(Playout(lambda frame: None), ptime_ms=0)
    with pytest.raises(ValueError, match="lead"):
        Pacer(Playout(lambda frame: None), lead=0)
