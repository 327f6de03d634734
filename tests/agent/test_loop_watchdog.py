"""The event loop's watchdog: lag measured from a timer's lateness, and a stall logged while it
lasts with what the loop is running (the blocking function's name is in the stack)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from agent.observe import LoopWatchdog


def a_blocking_handler_that_sleeps(seconds: float) -> None:
    time.sleep(seconds)  # what a model call run on the loop by mistake does


def test_a_stall_is_logged_with_the_blocking_call_and_its_length(caplog):
    lags: list[float] = []
    stalls: list[float] = []

    async def main():
        dog = LoopWatchdog(on_lag=lags.append, on_stall=stalls.append, interval_s=0.02,
                           stall_s=0.2).start()
        await asyncio.sleep(0.2)  # quiet: small lags only
        quiet = max(lags)

        async def offender():
            a_blocking_handler_that_sleeps(0.8)

        await asyncio.get_running_loop().create_task(offender(), name="offender")
        await asyncio.sleep(0.3)  # the loop back: the stall's end is seen
        await dog.stop()
        return quiet, dog

    with caplog.at_level(logging.WARNING, "voxline.loop"):
        quiet, dog = asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records if r.name == "voxline.loop"]
    assert quiet < 0.15
    assert max(lags) > 0.5  # the timer ran ~0.8 s late once
    assert dog.stalls == 1 and len(stalls) == 1
    assert 0.5 < stalls[0] < 1.5
    during = [m for m in messages if "stalled" in m]
    assert len(during) == 1
    assert "a_blocking_handler_that_sleeps" in during[0] and "'offender'" in during[0]
    assert any("stall over after" in m for m in messages)


def test_a_busy_but_responsive_loop_logs_no_stall(caplog):
    async def main():
        dog = LoopWatchdog(interval_s=0.02, stall_s=0.25).start()
        t_end = time.monotonic() + 0.6
        while time.monotonic() < t_end:  # busy in short slices, as a loaded server is
            time.sleep(0.01)
            await asyncio.sleep(0)
        await dog.stop()
        return dog

    with caplog.at_level(logging.WARNING, "voxline.loop"):
        dog = asyncio.run(main())
    assert dog.stalls == 0 and not [r for r in caplog.records if r.name == "voxline.loop"]
    assert dog.max_lag_s < 0.25


def test_the_thresholds_must_be_positive():
    with pytest.raises(ValueError):
        LoopWatchdog(interval_s=0)
    with pytest.raises(ValueError):
        LoopWatchdog(stall_s=-1)
