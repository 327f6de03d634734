import asyncio

from transports.websocket.outbox import Outbox


def test_a_slow_client_loses_audio_not_memory_and_keeps_order():
    async def main():
        box = Outbox(max_audio=3, max_events=2)
        sent = [box.put_audio(bytes([i])) for i in range(5)]
        assert sent == [True, True, True, False, False]
        assert box.put_event("a") and box.put_event("b") and not box.put_event("c")
        assert (box.dropped_audio, box.dropped_events, len(box)) == (2, 1, 5)
        got = [await box.get() for _ in range(5)]
        assert got == [b"\0", b"\1", b"\2", "a", "b"]
        assert box.put_audio(b"x")  # room again once drained
        return await box.get()

    assert asyncio.run(main()) == b"x"


def test_get_waits_for_the_next_message():
    async def main():
        box = Outbox()
        waiter = asyncio.create_task(box.get())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        box.put_event("hello")
        return await asyncio.wait_for(waiter, 1)

    assert asyncio.run(main()) == "hello"


def test_agent_audio_starts_at_once_with_a_lead_then_goes_in_real_time():
    import numpy as np

    from agent.pacer import Pacer
    from agent.playout import Playout
    from transports.websocket.call import LEAD_FRAMES, pace_playout

    async def main():
        playout = Playout(lambda frame: None)
        box = Outbox(max_audio=100)
        pacer = asyncio.create_task(pace_playout(Pacer(playout, lead=LEAD_FRAMES), box))
        await asyncio.sleep(0.035)  # quiet: nothing is sent, the pacer waits between ticks
        assert len(box) == 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        playout.write(np.ones(320 * 20, np.int16), last=True)  # 400 ms, between two ticks
        for _ in range(5):
            await asyncio.sleep(0)
        lead, lead_s = len(box), loop.time() - t0
        await asyncio.sleep(0.2)
        later, later_s = len(box), loop.time() - t0
        pacer.cancel()
        await asyncio.gather(pacer, return_exceptions=True)
        return lead, lead_s, later, later_s, playout.on_ready

    lead, lead_s, later, later_s, hook = asyncio.run(main())
    # at once, not at the next 20-ms tick (five loop turns: under 1 ms with four busy loops)
    assert lead == LEAD_FRAMES and lead_s < 0.015
    # then one frame per 20 ms on a schedule that starts with the audio: about 10 more in 200 ms,
    # not the whole 400 ms at once, and never ahead of the clock. The clock is the time that
    # really passed: on a loaded machine the sleep wakes late and the pacer has caught up.
    assert LEAD_FRAMES + 6 <= later <= LEAD_FRAMES + 1 + later_s / 0.02
    assert hook is None  # the pacer unhooks itself when it stops
