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
