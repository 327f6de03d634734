"""The echo test's stage: the caller's audio back, sample for sample, behind its jitter buffer;
never ahead of real time by more than its backlog; the utterance closed at the end of the call.
And the whole call through a real Session and its playout."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.frames import AudioIn, Direction, EndOfCall, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.trace import Trace
from stages.echo_test import EchoTest

FRAME = 320  # 20 ms
NS = 20_000_000


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(FRAME) * 3000).astype(np.int16) for _ in range(n)]


def run(stage: EchoTest, pcms: list[np.ndarray], step_ns: int = NS,
        t: int = 1_000_000_000) -> list[TTSAudio]:
    out: list = []
    stage._send_down = lambda f, d: out.append(f)  # noqa: SLF001 - the stage alone, no graph
    for i, pcm in enumerate(pcms):
        stage.process(AudioIn(pcm, offset=i * FRAME, t_ns=t), Direction.DOWNSTREAM)
        t += step_ns
    return out


def test_the_audio_comes_back_whole_after_the_jitter_buffer() -> None:
    stage = EchoTest(delay_ms=200)
    sent = frames(50)
    out = run(stage, sent[:9])
    assert out == []  # 180 ms held
    out = run(stage, sent)  # (a fresh list: the tenth frame fills the buffer)
    assert all(isinstance(f, TTSAudio) and not f.last for f in out)
    back = np.concatenate([f.pcm for f in out])
    assert np.array_equal(back, np.concatenate(sent[:9] + sent))
    assert stage.dropped_samples == 0 and stage.echoed_samples == len(back)


def test_no_delay_echoes_each_frame_at_once() -> None:
    stage = EchoTest(delay_ms=0)
    sent = frames(3)
    out = run(stage, sent)
    assert [f.pcm is p for f, p in zip(out, sent, strict=True)] == [True] * 3


def test_faster_than_real_time_is_dropped_past_the_backlog() -> None:
    stage = EchoTest(delay_ms=200, max_backlog_ms=1000)
    sent = frames(200)  # 4 s of audio arriving in 0.4 s (ten times real time)
    out = run(stage, sent, step_ns=NS // 10)
    echoed = sum(len(f.pcm) for f in out)
    # what real time allows (0.4 s) and the backlog (1 s): never more
    assert 1.3 * 16000 <= echoed <= 1.41 * 16000
    assert stage.dropped_samples == 200 * FRAME - echoed - stage._held_samples  # noqa: SLF001
    # real time again, on the same clock: every frame passes, the backlog stays full
    before = stage.dropped_samples
    more = run(stage, frames(10, seed=1), t=1_000_000_000 + 200 * NS // 10)
    assert stage.dropped_samples == before and len(more) == 10


def test_the_backlog_must_hold_the_delay() -> None:
    with pytest.raises(ValueError, match="delay_ms <= max_backlog_ms"):
        EchoTest(delay_ms=500, max_backlog_ms=100)


def test_a_real_session_plays_the_caller_back_and_ends_cleanly() -> None:
    async def main() -> tuple[np.ndarray, dict, bool]:
        session = Session(Pipeline([EchoTest()]), Trace({}))
        events: list = []
        session.listen(events.append)
        await session.start()
        sent = frames(40)
        played = []
        for pcm in sent:
            session.send_audio(pcm)
            await asyncio.sleep(0)
            got = session.playout.pull()
            if got is not None:
                played.append(got)
        while (got := session.playout.pull()) is not None:
            played.append(got)
        summary = await session.close()
        assert session.playout.pull() is None  # (the pull that notices the end)
        return np.concatenate(played), summary, session.playout.idle

    back, summary, idle = asyncio.run(main())
    assert np.array_equal(back, np.concatenate(frames(40)))
    (ev,) = [e for e in summary["events"] if e["event"] == "echo_test"]
    assert ev["echoed_samples"] == 40 * FRAME and ev["dropped_samples"] == 0
    assert idle  # the end of the call closed the echo's utterance


def test_end_of_call_closes_the_utterance_once_audio_went_out() -> None:
    stage = EchoTest(delay_ms=0)
    out = run(stage, frames(1))
    stage.process(EndOfCall(), Direction.DOWNSTREAM)
    assert isinstance(out[-1], EndOfCall)
    assert isinstance(out[-2], TTSAudio) and out[-2].last and len(out[-2].pcm) == 0
    quiet = EchoTest()
    got = run(quiet, [])
    quiet._send_down = lambda f, d: got.append(f)  # noqa: SLF001
    quiet.process(EndOfCall(), Direction.DOWNSTREAM)
    assert [type(f) for f in got] == [EndOfCall]  # nothing was said: nothing to close
