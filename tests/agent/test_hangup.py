"""The agent hanging up, at the session: a stage's HangUp ends the call only once the agent audio
queued before it has played out, the first reason stands, the trace and the summary record it,
and a fast file call with an idle caller stops right after the goodbye, on the media clock."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
from idle_agent import IDLE, ToneTTS, idle_session, tone_seconds

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE, Dtmf, HangUp, TextToSpeak
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from agent.trace import Trace
from transports.file import FileCall

FAREWELL = "Thanks for calling, goodbye."


class HangsUpOnKey(Stage):
    """A keypress: the agent says goodbye and hangs up (twice, to show the first one stands)."""

    name = "hangs_up"

    def process(self, frame, direction) -> None:
        if isinstance(frame, Dtmf):
            self.push(TextToSpeak(FAREWELL))
            self.push(HangUp())
            self.push(HangUp("again"))
        else:
            self.push(frame, direction)


def test_hangup_ends_the_call_only_after_the_audio_queued_before_it_has_played() -> None:
    sink = io.StringIO()

    async def main() -> tuple[Session, int, int]:
        session = Session(Pipeline([HangsUpOnKey(), ToneTTS()]), Trace(sink=sink))
        async with session:
            session.push(Dtmf("9"))
            # the HangUp overtook the goodbye in the TTS's queue: nothing is due yet
            assert session.hangup_reason == "agent" and not session.hangup_due
            waiter = asyncio.create_task(session.wait_hangup())
            pulled = left = 0
            while not waiter.done():  # a sound card, faster than real time
                await asyncio.sleep(0.002)
                if session.playout.pull() is not None:
                    pulled += 1
            left = session.playout.queued_samples
            assert waiter.result() == "agent"
        return session, pulled, left

    session, pulled, left = asyncio.run(main())
    spoken = round(tone_seconds(FAREWELL) * SAMPLE_RATE)
    assert pulled == -(-spoken // FRAME_SAMPLES) and left == 0  # every frame of it played
    assert session.summary["reason"] == "agent"
    lines = [json.loads(x) for x in sink.getvalue().splitlines()]
    assert [x["type"] for x in lines] == ["event", "session"]
    assert lines[0]["event"] == "hangup" and lines[0]["reason"] == "agent"
    assert lines[1]["reason"] == "agent" and lines[1]["events"][0]["event"] == "hangup"


def test_a_hangup_with_nothing_queued_is_due_at_once_and_a_call_without_one_never_is() -> None:
    class HangsUpNow(Stage):
        def process(self, frame, direction) -> None:
            self.push(HangUp("agent") if isinstance(frame, Dtmf) else frame, direction)

    async def main() -> None:
        quiet = Session(Pipeline([HangsUpNow()]))
        async with quiet:
            waiter = asyncio.create_task(quiet.wait_hangup())
            await asyncio.sleep(0.05)
            assert not waiter.done() and not quiet.hangup_due  # nobody asked
            quiet.push(Dtmf("1"))
            assert quiet.hangup_due
            assert await asyncio.wait_for(waiter, 1) == "agent"

    asyncio.run(main())


def _bursts(agent: np.ndarray) -> list[tuple[float, float]]:
    """(start, end) in seconds of each stretch of agent audio in a recording's agent channel."""
    loud = np.abs(agent.reshape(-1, FRAME_SAMPLES)).max(axis=1) > 1000
    out, start = [], None
    for i, on in enumerate([*loud, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            out.append((start * FRAME_SAMPLES / SAMPLE_RATE, i * FRAME_SAMPLES / SAMPLE_RATE))
            start = None
    return out


def test_a_fast_file_call_with_an_idle_caller_stops_right_after_the_goodbye() -> None:
    async def main():
        session = idle_session()
        async with session:
            rec = await FileCall(np.zeros(30 * SAMPLE_RATE, np.int16), fast=True).run(session)
        return session, rec

    session, rec = asyncio.run(main())
    assert rec.hung_up == "idle" and session.summary["reason"] == "idle"
    (r0, r1), (g0, g1) = _bursts(rec.agent)
    frame_s = FRAME_SAMPLES / SAMPLE_RATE
    # counted in media time: the re-prompt after 0.5 s of silence, the goodbye 0.5 s after the
    # re-prompt played (plus the fake TTS's synthesis time, a frame or two)
    assert IDLE.idle_reprompt_s <= r0 <= IDLE.idle_reprompt_s + 4 * frame_s
    assert abs((r1 - r0) - tone_seconds(IDLE.idle_reprompt)) <= frame_s
    assert IDLE.idle_hangup_s <= g0 - r1 <= IDLE.idle_hangup_s + 4 * frame_s
    assert abs((g1 - g0) - tone_seconds(IDLE.idle_goodbye)) <= frame_s
    assert len(rec.agent) / SAMPLE_RATE - g1 <= 2 * frame_s  # the call ended as the goodbye did
    events = [e["event"] for e in session.summary["events"]]
    assert events == ["idle_reprompt", "idle_hangup", "hangup"]
