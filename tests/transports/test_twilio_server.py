"""The Twilio media-stream shell over a real WebSocket on 127.0.0.1, with a small agent that
speaks back what it hears and stops when a key is pressed: agent media comes back, marks are
acknowledged, barge-in sends ``clear``, DTMF becomes a frame, ``stop`` frees the session, and
the TwiML endpoint answers on the same port. Both check Twilio's signature (computed here from
Twilio's documented algorithm) and the call limit."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from twilio_signing import AUTH_TOKEN, refused_upgrade, signed

from agent.errors import ConfigError
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


async def _http_get(host: str, port: int, path: str, headers: dict[str, str] | None = None) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bot.example:443\r\n{extra}\r\n".encode())
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

    server = TwilioServer(make_session, port=0, public_url="https://bot.example",
                          twilio_auth_token=AUTH_TOKEN)
    host, port = await server.start()
    try:
        twiml = await _http_get(host, port, "/twilio/twiml",
                                signed("https://bot.example/twilio/twiml"))
        assert "200 OK" in twiml and '<Stream url="wss://bot.example/twilio/media"/>' in twiml
        assert "404" in await _http_get(host, port, "/elsewhere")

        tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(12000) / 8000)).astype(np.int16)
        async with connect(f"ws://{host}:{port}/twilio/media",
                           additional_headers=signed("wss://bot.example/twilio/media")) as ws:
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


def test_twiml_and_media_stream_need_twilio_signature() -> None:
    async def main() -> None:
        server = TwilioServer(lambda start: Session(Pipeline([SpeakBackUntilKey()])), port=0,
                              public_url="https://bot.example", twilio_auth_token=AUTH_TOKEN)
        host, port = await server.start()
        try:
            # the standalone server takes the GET webhook: the call's parameters in the query
            # string, signed as part of the URL Twilio called
            query = "CallSid=CA9&From=%2B15550001111&To=%2B15550002222"
            url = f"https://bot.example/twilio/twiml?{query}"
            ok = await _http_get(host, port, f"/twilio/twiml?{query}", signed(url))
            assert "200 OK" in ok and "<Connect><Stream" in ok
            for target, headers in [
                (f"/twilio/twiml?{query}", {}),
                (f"/twilio/twiml?{query}", signed(url, auth_token="another-account")),
                (f"/twilio/twiml?{query.replace('CA9', 'CA8')}", signed(url)),  # tampered
                (f"/twilio/twiml?{query}", signed(f"http://{host}:{port}/twilio/twiml?{query}")),
            ]:
                refused = await _http_get(host, port, target, headers)
                assert "403 Forbidden" in refused and "X-Twilio-Signature" in refused

            media = f"ws://{host}:{port}/twilio/media"
            for headers in ({}, signed("wss://bot.example/twilio/twiml"),
                            signed("wss://bot.example/twilio/media", auth_token="x")):
                status, text = await refused_upgrade(media, headers)
                assert status == 403 and "--twilio-auth-token" in text
            assert {k: n for k, n in server.admission.refused.items() if n} == {"signature": 7}
            assert server.active == 0 and not server.reports
        finally:
            await server.stop()

    asyncio.run(main())


def test_media_streams_beyond_the_limit_are_refused_and_the_twiml_answers_busy() -> None:
    async def main() -> None:
        from websockets.asyncio.client import connect

        server = TwilioServer(lambda start: Session(Pipeline([SpeakBackUntilKey()])), port=0,
                              max_calls=1)
        host, port = await server.start()
        media = f"ws://{host}:{port}/twilio/media"
        try:
            async with connect(media) as first:
                assert server.active == 1  # the place is taken at the upgrade
                status, text = await refused_upgrade(media)
                assert status == 503 and "limit of 1 calls" in text
                busy = await _http_get(host, port, "/twilio/twiml")
                assert "200 OK" in busy and '<Reject reason="busy"/>' in busy
                await first.close()
            async with asyncio.timeout(5):
                while server.active:
                    await asyncio.sleep(0.01)
            # an admitted request whose upgrade then fails keeps no place: a plain GET
            assert "426 Upgrade Required" in await _http_get(host, port, "/twilio/media")
            async with asyncio.timeout(5):
                while server.active:
                    await asyncio.sleep(0.01)
            async with connect(media):
                pass
            assert server.admission.refused["limit"] == 2
        finally:
            await server.stop()
        assert server.active == 0

    asyncio.run(main())


def test_exposed_without_a_twilio_auth_token_the_server_does_not_start() -> None:
    for options in ({"host": "0.0.0.0"}, {"public_url": "https://bot.example"}):
        with pytest.raises(ConfigError, match="--twilio-auth-token or \\$TWILIO_AUTH_TOKEN"):
            TwilioServer(lambda start: Session(Pipeline([])), port=0, **options)
    # on loopback without a public URL (local tests) no signature is needed
    TwilioServer(lambda start: Session(Pipeline([])), port=0)
