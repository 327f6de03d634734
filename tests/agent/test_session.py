import asyncio

import numpy as np

from agent.frames import AudioIn, EndOfCall, TextToSpeak, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import QueuedStage, Stage
from agent.trace import Trace


class Holder(QueuedStage):
    """Holds a resource and a long-running task, like a model stage."""

    def __init__(self):
        super().__init__("holder")
        self.released = False
        self.ticker = None

    async def start(self, ctx):
        await super().start(ctx)
        self.ticker = ctx.spawn(asyncio.sleep(3600), name="ticker")

    def wants(self, frame):
        return isinstance(frame, TextToSpeak)

    async def handle(self, frame):
        self.push(TTSAudio(np.full(640, 7, np.int16), last=True, text=frame.text))
        await asyncio.sleep(3600)  # work still in flight at hang-up

    async def stop(self):
        self.released = True


class Counter(Stage):
    def __init__(self):
        super().__init__("counter")
        self.audio = 0
        self.ended = False

    def process(self, frame, direction):
        if isinstance(frame, AudioIn):
            self.audio += 1
        if isinstance(frame, EndOfCall):
            self.ended = True
        self.push(frame, direction)


def test_hangup_cancels_every_task_and_releases_resources(tmp_path):
    async def main():
        before = set(asyncio.all_tasks())
        holder, counter = Holder(), Counter()
        trace_path = tmp_path / "t.jsonl"
        s = Session(Pipeline([counter, holder]), Trace(path=trace_path), greeting="Hello there.")
        await s.start()
        for _ in range(5):
            s.send_audio(np.zeros(320, np.int16))
        await asyncio.sleep(0.05)
        assert s.offset == 1600 and counter.audio == 5
        assert len(set(asyncio.all_tasks()) - before) >= 3  # worker, ticker, work in flight
        greeting_audio = s.playout.pull()
        s.playout.sent()
        await s.close()
        await asyncio.sleep(0)
        left = set(asyncio.all_tasks()) - before
        s.send_audio(np.zeros(320, np.int16))  # after hang-up: ignored, no error
        return left, holder, counter, greeting_audio, s, trace_path

    left, holder, counter, greeting_audio, s, trace_path = asyncio.run(main())
    assert left == set()
    assert holder.released and counter.ended and counter.audio == 5
    assert greeting_audio is not None and int(greeting_audio[0]) == 7
    greeting = s.trace.turns[0]
    assert greeting["type"] == "greeting" and "greeting" in greeting["spans"]
    assert trace_path.read_text().strip().splitlines()[-1].startswith('{"type":"session"')


def test_close_is_idempotent():
    async def main():
        s = Session(Pipeline([Counter()]))
        await s.start()
        a = await s.close()
        b = await s.close()
        return a is b

    assert asyncio.run(main())
