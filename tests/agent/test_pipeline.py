import asyncio

from agent.frames import (
    Direction,
    EndOfCall,
    Frame,
    Interrupt,
    LLMTextDelta,
    TextToSpeak,
    Transcript,
)
from agent.pipeline import Pipeline
from agent.stage import DOWN, UP, QueuedStage, Stage, StageContext


class Recorder(Stage):
    def __init__(self, name):
        super().__init__(name)
        self.seen: list[tuple[Frame, Direction]] = []

    def process(self, frame, direction):
        self.seen.append((frame, direction))
        self.push(frame, direction)


class Upper(Stage):
    """Turns transcripts into upper-case agent text."""

    def process(self, frame, direction):
        if direction is DOWN and isinstance(frame, Transcript):
            self.push(LLMTextDelta(frame.text.upper()))
        else:
            self.push(frame, direction)


class Slow(QueuedStage):
    """Speaks each delta after a delay, like a TTS."""

    def __init__(self, delay=0.05):
        super().__init__("slow", queue_size=4)
        self.delay = delay
        self.started: list[str] = []
        self.finished: list[str] = []
        self.interrupts = 0

    def wants(self, frame):
        return isinstance(frame, LLMTextDelta)

    async def handle(self, frame):
        self.started.append(frame.text)
        await asyncio.sleep(self.delay)
        self.finished.append(frame.text)
        self.push(TextToSpeak(frame.text))

    def on_interrupt(self, frame):
        self.interrupts += 1


def test_chain_order_and_output():
    out = []
    a, b = Recorder("a"), Upper("upper")
    p = Pipeline([a, b], on_output=out.append)
    for i in range(100):
        p.push(Transcript(f"t{i}", final=True), DOWN)
    assert [f.text for f in out] == [f"T{i}" for i in range(100)]
    assert [f.text for f, _ in a.seen] == [f"t{i}" for i in range(100)]


def test_branch_sees_everything_the_branch_point_emits():
    main_out, side = [], Recorder("recorder")
    up = Upper("upper")
    p = Pipeline([Recorder("a"), up, Recorder("c")], branches={up: [side]}, on_output=main_out.append)
    p.push(Transcript("hi", final=True), DOWN)
    assert [f.text for f in main_out] == ["HI"]
    assert [f.text for f, _ in side.seen] == ["HI"]


def test_upstream_frames_reach_the_head():
    ups = []
    a, b = Recorder("a"), Recorder("b")
    p = Pipeline([a, b], on_upstream=ups.append)
    p.inject_upstream(EndOfCall("x"))
    assert [d for _, d in b.seen] == [UP] and [d for _, d in a.seen] == [UP]
    assert isinstance(ups[0], EndOfCall)


def test_queued_stage_keeps_order_and_does_not_block_the_caller():
    async def main():
        out = []
        slow = Slow(delay=0.01)
        p = Pipeline([Upper("u"), slow], on_output=out.append)
        ctx = StageContext()
        await p.start(ctx)
        for w in ["a", "b", "c"]:
            p.push(Transcript(w, final=True), DOWN)  # returns at once
        assert out == [] and slow.pending == 3
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(out) == 3:
                break
        await p.stop()
        await ctx.cancel_all()
        return [f.text for f in out]

    assert asyncio.run(main()) == ["A", "B", "C"]


def test_interrupt_overtakes_queued_work_and_cancels_work_in_flight():
    async def main():
        out = []
        slow = Slow(delay=0.2)
        p = Pipeline([Upper("u"), slow], on_output=out.append)
        ctx = StageContext()
        await p.start(ctx)
        for w in ["a", "b", "c"]:
            p.push(Transcript(w, final=True), DOWN)
        await asyncio.sleep(0.05)  # "A" is in flight, "B" and "C" queued
        p.push(Interrupt(), DOWN)
        # the interrupt reached the output immediately, ahead of all queued work
        assert isinstance(out[0], Interrupt) and len(out) == 1
        await asyncio.sleep(0.3)
        assert slow.started == ["A"] and slow.finished == [] and slow.interrupts == 1
        # the worker survived the interrupt and serves new work
        p.push(Transcript("d", final=True), DOWN)
        await asyncio.sleep(0.3)
        await p.stop()
        await ctx.cancel_all()
        return [type(f).__name__ + getattr(f, "text", "") for f in out]

    assert asyncio.run(main()) == ["Interrupt", "TextToSpeakD"]


def test_full_queue_drops_oldest_and_counts():
    async def main():
        slow = Slow(delay=10)
        p = Pipeline([slow])
        ctx = StageContext()
        await p.start(ctx)
        for i in range(10):
            p.push(LLMTextDelta(str(i)), DOWN)
        pending, dropped = slow.pending, slow.dropped
        await ctx.cancel_all()
        return pending, dropped

    pending, dropped = asyncio.run(main())
    assert pending == 4 and dropped == 6


def test_cancellation_leaves_no_task_behind():
    async def main():
        before = set(asyncio.all_tasks())
        ctx = StageContext()
        stages = [Slow(delay=5), Slow(delay=5)]
        p = Pipeline(stages)
        await p.start(ctx)
        p.push(LLMTextDelta("x"), DOWN)
        await asyncio.sleep(0.01)
        assert len(set(asyncio.all_tasks()) - before) >= 2
        await p.stop()
        await ctx.cancel_all()
        await asyncio.sleep(0)
        return set(asyncio.all_tasks()) - before

    assert asyncio.run(main()) == set()


def test_a_failing_frame_becomes_an_error_frame_and_the_stage_goes_on():
    class Flaky(QueuedStage):
        def wants(self, frame):
            return isinstance(frame, LLMTextDelta)

        async def handle(self, frame):
            if frame.text == "bad":
                raise RuntimeError("boom")
            self.push(TextToSpeak(frame.text))

    async def main():
        out = []
        p = Pipeline([Flaky("flaky")], on_output=out.append)
        ctx = StageContext()
        await p.start(ctx)
        p.push(LLMTextDelta("bad"), DOWN)
        p.push(LLMTextDelta("good"), DOWN)
        await asyncio.sleep(0.05)
        await ctx.cancel_all()
        return out

    out = asyncio.run(main())
    assert type(out[0]).__name__ == "ErrorFrame" and "boom" in out[0].message
    assert out[1].text == "good"
