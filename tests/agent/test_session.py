import asyncio
import subprocess
import sys

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
        s = Session(Pipeline([counter, holder]), Trace(path=trace_path))
        await s.start()
        s.push(TextToSpeak("Hello there."))
        for _ in range(5):
            s.send_audio(np.zeros(320, np.int16))
        await asyncio.sleep(0.05)
        assert s.offset == 1600 and counter.audio == 5
        assert len(set(asyncio.all_tasks()) - before) >= 3  # worker, ticker, work in flight
        audio = s.playout.pull()
        s.playout.sent()
        await s.close()
        await asyncio.sleep(0)
        left = set(asyncio.all_tasks()) - before
        s.send_audio(np.zeros(320, np.int16))  # after hang-up: ignored, no error
        return left, holder, counter, audio, trace_path

    left, holder, counter, audio, trace_path = asyncio.run(main())
    assert left == set()
    assert holder.released and counter.ended and counter.audio == 5
    assert audio is not None and int(audio[0]) == 7
    assert trace_path.read_text().strip().splitlines()[-1].startswith('{"type":"session"')


def test_a_session_speaks_nothing_by_itself():
    """The greeting belongs to the LLM stage (one owner); a session adds no frame of its own."""
    async def main():
        counter = Counter()
        seen = []
        s = Session(Pipeline([counter]))
        s.listen(seen.append)
        await s.start()
        await asyncio.sleep(0.01)
        await s.close()
        return seen, s

    seen, s = asyncio.run(main())
    assert [type(f).__name__ for f in seen] == ["EndOfCall"]
    assert s.ctx.started_ns == s.started_ns > 0


def test_session_ids_are_unique_across_processes():
    code = ("from agent.session import Session; from agent.pipeline import Pipeline; "
            "from agent.stage import Stage; "
            "print(' '.join(Session(Pipeline([Stage()])).id for _ in range(3)))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            .stdout.split() for _ in range(2)]
    ids = runs[0] + runs[1]
    assert len(set(ids)) == 6, ids  # "call-1" in every process was the old scheme
    assert all(i.startswith("call-") and len(i) == 21 for i in ids)


def test_close_is_idempotent():
    async def main():
        s = Session(Pipeline([Counter()]))
        await s.start()
        a = await s.close()
        b = await s.close()
        return a is b

    assert asyncio.run(main())


class Seen(Stage):
    def __init__(self, name, consumes):
        super().__init__(name)
        self.consumes = frozenset(consumes)
        self.kinds: list[str] = []

    def process(self, frame, direction):
        self.kinds.append(type(frame).__name__)
        self.push(frame, direction)


def test_audio_reaches_listeners_only_when_one_reads_every_kind():
    async def main():
        vad, tts = Seen("vad", {AudioIn}), Seen("tts", {TextToSpeak})
        s = Session(Pipeline([vad, tts]))
        captions: list[str] = []
        s.listen(lambda f: captions.append(type(f).__name__), consumes=frozenset({TextToSpeak}))
        await s.start()
        s.send_audio(np.zeros(320, np.int16))
        s.push(TextToSpeak("hi"))
        # Neither the TTS, nor the playout, nor the listener reads caller audio: it stops
        # after the VAD.
        assert vad.kinds == ["AudioIn", "TextToSpeak"] and tts.kinds == ["TextToSpeak"]
        assert captions == ["TextToSpeak"]
        everything: list[str] = []
        s.listen(lambda f: everything.append(type(f).__name__))  # declares nothing: every kind
        s.send_audio(np.zeros(320, np.int16))
        await s.close()
        return tts.kinds, captions, everything

    tts, captions, everything = asyncio.run(main())
    assert tts == ["TextToSpeak", "AudioIn", "EndOfCall"]
    assert everything == ["AudioIn", "EndOfCall"]
    assert captions == ["TextToSpeak", "AudioIn", "EndOfCall"]  # it is called with what arrives


class Busy(Stage):
    def __init__(self):
        super().__init__("busy")
        self.working = False
        self.speaking = False

    @property
    def busy(self):
        return self.working

    @property
    def in_speech(self):
        return self.speaking


def test_quiet_asks_every_stage_through_the_stage_contract():
    s = Session(Pipeline([Stage(), Busy()]))
    busy = s.pipeline.stages[1]
    assert not s.pipeline.stages[0].busy and not s.pipeline.stages[0].in_speech
    assert s.quiet
    busy.working = True
    assert not s.quiet
    busy.working, busy.speaking = False, True
    assert not s.quiet
    busy.speaking = False
    assert s.quiet
