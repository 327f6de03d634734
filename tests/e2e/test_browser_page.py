"""The browser page against the real server with a small agent of our own (no models): the page
loads, calls over both transports, plays the agent's audio, draws the waterfall, hangs up."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from test_browser_call import CLIP, _require_browser, browser_call, read_clip, write_mic

from agent.frames import SpeechStopped, Transcript, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from agent.trace import SPAN_ORDER, Trace

pytestmark = pytest.mark.slow


class LoudnessAgent(Stage):
    """Ends the caller's turn after 300 ms below -40 dBFS following speech, says what it heard
    (the loudest sample) and answers with half a second of 440 Hz."""

    def __init__(self) -> None:
        super().__init__("loudness-agent")
        self.peak = 0
        self.quiet = 0
        self.speaking = False

    def process(self, frame, direction):
        self.push(frame, direction)
        pcm = getattr(frame, "pcm", None)
        if pcm is None or frame.__class__.__name__ != "AudioIn":
            return
        level = int(np.abs(pcm.astype(np.int32)).max())
        if level > 330:  # -40 dBFS
            self.speaking, self.quiet = True, 0
            self.peak = max(self.peak, level)
            return
        self.quiet += 1
        if not (self.speaking and self.quiet == 15):
            return
        self.speaking = False
        now = time.monotonic_ns()
        self.push(SpeechStopped(at=frame.offset, speech_end_ns=now))
        self.ctx.trace.begin_turn(speech_end=now - 300_000_000, vad_decision=now, asr_final=now)
        self.push(Transcript(f"peak {self.peak}", final=True, end=frame.end))
        for name in ("llm_request", "llm_first_token", "tts_request", "tts_first_audio"):
            self.ctx.trace.event(name)
        t = np.arange(8000) / 16000
        self.push(TTSAudio((8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16), last=True))


@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_page_calls_plays_agent_audio_and_hangs_up(transport, tmp_path):
    _require_browser()
    sessions: list[Session] = []

    def new_session() -> Session:
        s = Session(Pipeline([LoudnessAgent()]), Trace({"voice_to_voice": 800.0}))
        sessions.append(s)
        return s

    mic = write_mic(tmp_path / "mic.wav", 0.5, read_clip(CLIP[0]), 8.0)
    until = ("v.finals.length > 0 && v.traces.length > 0 && v.agentMaxRms > 0.01"
             " && document.querySelectorAll('#waterfall .turn').length > 0")
    state, facts, server = asyncio.run(
        browser_call(new_session, mic, transport, until, f"voxline-page-{transport}.png", 30)
    )
    assert state["finals"][0].startswith("peak ") and int(state["finals"][0][5:]) > 3000
    assert state["agentMaxRms"] > 0.01
    assert facts["callerLines"] == 1 and "voice_to_voice" in facts["spans"]
    # the waterfall draws every span the trace sent, in the trace's order, llm_first_chunk too
    sent = state["traces"][0]["spans"]
    assert "llm_first_chunk" in sent and facts["spans"] == [n for n in SPAN_ORDER if n in sent]
    assert not server.calls  # hung up (browser_call waited for the page to say "ended")
    assert sessions[0].closed and not sessions[0].ctx.tasks
