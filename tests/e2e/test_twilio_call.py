"""A Twilio call end to end over a real WebSocket on 127.0.0.1: a client speaking the Media
Streams protocol plays a real 8 kHz recording into ``voxline twilio``'s server, hears the agent's
answer, acknowledges its marks, talks over it (barge-in → ``clear``), then hangs up (``stop``)."""

from __future__ import annotations

import asyncio
import time

import pytest
from telephony_checks import loud_frames, read_clip_8k, recall

from agent.commands.telephony import session_factory
from agent.config import Config
from agent.frames import SAMPLE_RATE, Frame, Interrupt, SpeechStarted, Transcript, UserTurnEnded
from agent.presets import load_models
from transports.twilio.call import TwilioCall
from transports.twilio.caller import TwilioCaller
from transports.twilio.server import TwilioServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models():
    return load_models(Config())


def test_twilio_call(models) -> None:
    log, report, frames, session_closed = asyncio.run(_call(models))

    finals = [f.text for f in frames if isinstance(f, Transcript) and f.final]
    # the caller's prompt: the turns that ended before the barge-in began (the recording
    # pauses ~0.3 s after its first sentence, and the turn may end there: the agent's answer
    # then starts, the caller goes on over it, and the rest is the next turn)
    turn_texts = [f.text for f in frames if isinstance(f, UserTurnEnded)]
    prompt = " ".join(_turns_before_barge_in(frames, len(read_clip_8k()) / 8000))
    assert recall(prompt) >= 0.6, f"turns {turn_texts!r}, finals {finals!r}"
    # the agent's answer reached the caller as audible μ-law media
    assert log.first_agent_audio_s is not None and loud_frames(log.agent_audio) >= 25
    # marks: the first utterance's mark came back once it played; every mark was answered
    assert "u1:start" in log.marks_echoed
    # (but those of a reply still in the handset buffer when the caller hung up)
    assert sorted(log.marks_echoed + log.marks_unplayed) == sorted(log.marks_sent)
    assert len(log.marks_echoed) > len(log.marks_unplayed) and log.malformed == 0
    # the caller talked over the agent: the pipeline interrupted and Twilio got a clear
    assert log.barge_in_s is not None
    assert any(isinstance(f, Interrupt) for f in frames)
    # (a clear before it is the caller going on after a pause the agent took for the turn's end)
    after = [t for t in log.clears if t > log.barge_in_s]
    assert after and report.stats.clears >= len(log.clears)
    # stop ended the call and freed the session
    assert report.reason == "stop" and session_closed
    turns = [t for t in report.turns if t["type"] == "turn" and t["complete"]]
    assert turns and "voice_to_voice" in turns[0]["spans"]
    v2v = turns[0]["spans"]["voice_to_voice"]["ms"]
    print(f"\nTwilio call: {prompt!r}; voice-to-voice (to the mark echo) {v2v:.0f} ms; "
          f"mark lag {report.heard_lags_ms} ms; clear {after[0] - log.barge_in_s:.2f} s "
          f"after the caller barged in; {log.dropped_by_clear} buffered chunks dropped")


def _turns_before_barge_in(frames: list[Frame], clip_s: float) -> list[str]:
    """The texts of the turns that ended before speech of the barge-in (which starts once
    the recording has played) was heard."""
    texts = []
    for f in frames:
        if isinstance(f, SpeechStarted) and f.at >= (clip_s - 0.3) * SAMPLE_RATE:
            break
        if isinstance(f, UserTurnEnded):
            texts.append(f.text)
    return texts


async def _call(models):
    from websockets.asyncio.client import connect

    cfg = Config()
    frames: list[Frame] = []
    calls: list[TwilioCall] = []

    def on_call(call: TwilioCall) -> None:
        call.session.listen(frames.append)
        calls.append(call)

    server = TwilioServer(session_factory(cfg, models), port=0, on_call=on_call)
    host, port = await server.start()
    clip = read_clip_8k()
    caller = TwilioCaller()
    t_clear: list[float] = []

    def done() -> bool:  # hang up 3 s after the barge-in's clear, or give up on the tail
        barged = caller.log.barge_in_s
        if barged is not None and not t_clear and any(t > barged for t in caller.log.clears):
            t_clear.append(time.monotonic())
        return bool(t_clear) and time.monotonic() - t_clear[0] > 3.0

    try:
        async with connect(f"ws://{host}:{port}/twilio/media") as ws:
            log = await caller.run(ws, clip, tail_s=25.0, until=done, barge_in=clip,
                                   barge_in_after_s=0.8)
        for _ in range(200):
            if server.reports:
                break
            await asyncio.sleep(0.05)
    finally:
        await server.stop()
    return log, server.reports[0], frames, calls[0].session.closed
