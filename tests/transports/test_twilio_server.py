"""The Twilio media-stream shell over a real WebSocket on 127.0.0.1, with a small agent that
speaks back what it hears and stops when a key is pressed: agent media comes back, marks are
acknowledged, barge-in sends ``clear``, DTMF becomes a frame, ``stop`` frees the session, and
the TwiML endpoint answers on the same port."""

from __future__ import annotations

import asyncio

import numpy as np

from agent.frames import AudioIn, Direction, Dtmf, Interrupt, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from transports.twilio.caller import TwilioCaller
from transports.twilio.server import TwilioServer


class SpeakBackUntilKey(Stage):
    """Repeats the caller's audio; a keypress interrupts it and silences it for good."""

    name = "speak_back"

    def __init__(self) -> None:
        super().__init__()
        self.muted = False
        self.keys: list[str] = []

    def process(self, frame, direction) -> None:
        if isinstance(frame, AudioIn):
            if not self.muted:
                self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
        elif isinstance(frame, Dtmf):
            self.keys.append(frame.digit)
            self.muted = True
            self.push(Interrupt(), Direction.DOWNSTREAM)
        else:
            self.push(frame, direction)


def test_media_stream_call() -> None:
    asyncio.run(_call())


async def _http_get(host: str, port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bot.example:443\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data.decode()


async def _call() -> None:
    from websockets.asyncio.client import connect

    stages: list[SpeakBackUntilKey] = []
    sessions: list[Session] = []

    def make_session(start) -> Session:
        stages.append(SpeakBackUntilKey())
        sessions.append(Session(Pipeline([stages[-1]])))
        return sessions[-1]

    server = TwilioServer(make_session, port=0, public_url="https://bot.example")
    host, port = await server.start()
    try:
        twiml = await _http_get(host, port, "/twilio/twiml")
        assert "200 OK" in twiml and '<Stream url="wss://bot.example/twilio/media"/>' in twiml
        assert "404" in await _http_get(host, port, "/elsewhere")

        tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(12000) / 8000)).astype(np.int16)
        async with connect(f"ws://{host}:{port}/twilio/media") as ws:
            log = await TwilioCaller().run(ws, tone, dtmf={0.8: "5"}, tail_s=0.6)
        for _ in range(100):
            if server.reports:
                break
            await asyncio.sleep(0.02)
    finally:
        await server.stop()

    report = server.reports[0]
    assert report.reason == "stop" and sessions[0].closed and server.active == 0
    assert stages[0].keys == ["5"] and report.stats.dtmf == "5"
    heard = log.agent_audio
    assert len(heard) > 8000 * 0.3 and np.sqrt(np.mean(heard.astype(float) ** 2)) > 1000
    # the agent's first utterance was marked, played, echoed; the keypress cleared the rest
    assert log.marks_sent[0] == "u1:start" and "u1:start" in log.marks_echoed
    assert len(log.clears) == 1 and report.stats.clears == 1
    assert set(log.marks_echoed) == set(log.marks_sent)  # cleared marks come back too
    assert report.heard_lags_ms and report.malformed == 0
