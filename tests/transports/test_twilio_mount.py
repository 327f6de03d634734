"""Twilio mounted on an aiohttp application (how ``voxline serve`` carries it): TwiML on POST,
a media stream over the mounted WebSocket, ``stop`` ends the call and its session."""

from __future__ import annotations

import asyncio

import numpy as np
from test_twilio_server import SpeakBackUntilKey

from agent.pipeline import Pipeline
from agent.session import Session
from transports.twilio.caller import TwilioCaller
from transports.twilio.mount import add_twilio_routes


def test_mounted_on_aiohttp() -> None:
    asyncio.run(_call())


async def _call() -> None:
    import aiohttp
    from aiohttp import web
    from websockets.asyncio.client import connect

    sessions: list[Session] = []
    reports: list = []

    def make_session(start) -> Session:
        sessions.append(Session(Pipeline([SpeakBackUntilKey()])))
        return sessions[-1]

    app = web.Application()
    add_twilio_routes(app, make_session, on_end=reports.append)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"http://127.0.0.1:{port}/twilio/twiml", data={"CallSid": "CA1"})
            text = await resp.text()
        assert resp.status == 200 and resp.content_type == "text/xml"
        assert f'url="ws://127.0.0.1:{port}/twilio/media"' in text

        tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)).astype(np.int16)
        async with connect(f"ws://127.0.0.1:{port}/twilio/media") as ws:
            log = await TwilioCaller().run(ws, tone, tail_s=0.4)
        for _ in range(100):
            if reports:
                break
            await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()
    assert reports and reports[0].reason == "stop" and sessions[0].closed
    assert len(log.agent_audio) > 4000 and "u1:start" in log.marks_echoed
