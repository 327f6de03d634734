"""Twilio mounted on an aiohttp application (how ``voxline serve`` carries it): TwiML on POST,
a media stream over the mounted WebSocket, ``stop`` ends the call and its session. Both Twilio
routes pass the server's one admission: Twilio's signature (computed here from Twilio's
documented algorithm, over the public URL Twilio would call), the call limit shared with the
browser's ``/ws``, and the token rule off loopback."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from test_twilio_server import SpeakBackUntilKey
from twilio_signing import AUTH_TOKEN, refused_upgrade, signed

from agent.errors import ConfigError
from agent.pipeline import Pipeline
from agent.session import Session
from transports.admission import Admission
from transports.server import VoiceServer
from transports.twilio.caller import TwilioCaller
from transports.twilio.mount import add_twilio_routes

PUBLIC = "https://bot.example.test"
CALL = {"AccountSid": "AC" + "0" * 32, "CallSid": "CA1", "From": "+15550001111",
        "To": "+15550002222", "CallStatus": "ringing"}


def _tone(n: int = 8000) -> np.ndarray:
    return (8000 * np.sin(2 * np.pi * 440 * np.arange(n) / 8000)).astype(np.int16)


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
    add_twilio_routes(app, make_session, Admission("127.0.0.1"), on_end=reports.append)
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

        async with connect(f"ws://127.0.0.1:{port}/twilio/media") as ws:
            log = await TwilioCaller().run(ws, _tone(), tail_s=0.4)
        for _ in range(100):
            if reports:
                break
            await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()
    assert reports and reports[0].reason == "stop" and sessions[0].closed
    assert len(log.agent_audio) > 4000 and "u1:start" in log.marks_echoed


class _Served:
    """A ``voxline serve``-style server (the browser's VoiceServer) with Twilio mounted."""

    def __init__(self, **options) -> None:
        self.sessions: list[Session] = []
        self.reports: list = []
        self.server = VoiceServer(self._browser_session, port=0, **options)
        add_twilio_routes(self.server.app, self._twilio_session, self.server.admission,
                          on_end=self.reports.append)

    def _browser_session(self) -> Session:
        return self._twilio_session(None)

    def _twilio_session(self, start) -> Session:
        self.sessions.append(Session(Pipeline([SpeakBackUntilKey()])))
        return self.sessions[-1]

    async def __aenter__(self) -> _Served:
        await self.server.start()
        self.base = f"http://127.0.0.1:{self.server.port}"
        self.ws_base = f"ws://127.0.0.1:{self.server.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop()


def test_the_twiml_webhook_needs_twilio_signature() -> None:
    async def main() -> None:
        async with _Served(public_url=PUBLIC, twilio_auth_token=AUTH_TOKEN) as s, \
                httpx.AsyncClient(base_url=s.base) as http:
            url = f"{PUBLIC}/twilio/twiml"  # what Twilio calls, not the 127.0.0.1 we reach
            ok = await http.post("/twilio/twiml", data=CALL, headers=signed(url, CALL))
            assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/xml")
            assert '<Stream url="wss://bot.example.test/twilio/media"/>' in ok.text

            # Twilio's default: POST with the call's parameters; the GET webhook puts them in
            # the query string, which is signed as part of the URL
            query = "CallSid=CA2&From=%2B15550001111&To=%2B15550002222"
            ok = await http.get(f"/twilio/twiml?{query}",
                                headers=signed(f"{url}?{query}"))
            assert ok.status_code == 200 and "<Connect><Stream" in ok.text

            refused = [
                await http.post("/twilio/twiml", data=CALL),  # no signature
                await http.post("/twilio/twiml", data=CALL, headers={"X-Twilio-Signature": ""}),
                await http.post("/twilio/twiml", data=CALL,  # another account's token
                                headers=signed(url, CALL, auth_token="not-the-account-token")),
                await http.post("/twilio/twiml", data={**CALL, "From": "+15559999999"},
                                headers=signed(url, CALL)),  # a tampered parameter
                await http.post("/twilio/twiml", data={**CALL, "Digits": "1"},
                                headers=signed(url, CALL)),  # an added one
                await http.post("/twilio/twiml", data=CALL,  # signed for the address we reach
                                headers=signed(f"{s.base}/twilio/twiml", CALL)),
                await http.get(f"/twilio/twiml?{query.replace('CA2', 'CA3')}",
                               headers=signed(f"{url}?{query}")),
            ]
            for resp in refused:
                assert resp.status_code == 403, resp.text
                assert "X-Twilio-Signature" in resp.text and "--twilio-auth-token" in resp.text
            stats = s.server.stats()
            assert stats["refused_by"]["signature"] == len(refused)
            assert stats["refused"] == len(refused) and not s.sessions

    asyncio.run(main())


def test_the_media_stream_upgrade_needs_twilio_signature() -> None:
    async def main() -> None:
        from websockets.asyncio.client import connect

        async with _Served(public_url=PUBLIC, twilio_auth_token=AUTH_TOKEN) as s:
            media = f"{s.ws_base}/twilio/media"
            for headers in ({}, signed("wss://bot.example.test/twilio/other"),
                            signed("wss://bot.example.test/twilio/media", auth_token="wrong")):
                status, text = await refused_upgrade(media, headers)
                assert status == 403 and "X-Twilio-Signature" in text
            assert not s.sessions and s.server.stats()["refused_by"]["signature"] == 3

            headers = signed("wss://bot.example.test/twilio/media")
            async with connect(media, additional_headers=headers) as ws:
                log = await TwilioCaller().run(ws, _tone(), tail_s=0.4)
            async with asyncio.timeout(5):
                while not s.reports:
                    await asyncio.sleep(0.02)
            assert s.reports[0].reason == "stop" and s.sessions[0].closed
            assert len(log.agent_audio) > 4000
            assert s.server.admission.active == 0  # the call gave its place back

    asyncio.run(main())


def test_twilio_calls_share_the_call_limit_with_browser_calls() -> None:
    async def main() -> None:
        import aiohttp
        from websockets.asyncio.client import connect

        async with _Served(max_calls=1) as s, aiohttp.ClientSession() as http:
            browser = await http.ws_connect(f"{s.base}/ws")  # holds the one place
            status, text = await refused_upgrade(f"{s.ws_base}/twilio/media")
            assert status == 503 and "limit of 1 calls" in text
            # the webhook answers busy at the limit: the caller hears a busy tone rather than
            # Twilio's "application error" for a failed webhook
            busy = await http.post(f"{s.base}/twilio/twiml", data=CALL)
            assert busy.status == 200 and '<Reject reason="busy"/>' in await busy.text()
            await browser.close()
            async with asyncio.timeout(5):
                while s.server.admission.active:
                    await asyncio.sleep(0.01)

            # now a Twilio call holds the place (from its upgrade on), and /ws is refused
            async with connect(f"{s.ws_base}/twilio/media") as ws:
                with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                    await http.ws_connect(f"{s.base}/ws")
                assert exc.value.status == 503
                await TwilioCaller().run(ws, _tone(1600), tail_s=0.1)
            assert s.server.stats()["refused_by"] == {"token": 0, "signature": 0, "origin": 0,
                                                      "host": 0, "limit": 3, "client_limit": 0,
                                                      "draining": 0}

    asyncio.run(main())


def test_off_loopback_browser_routes_want_the_token_and_twilio_routes_the_signature() -> None:
    async def main() -> None:
        import aiohttp
        from websockets.asyncio.client import connect

        # bound to all interfaces, no public URL: Twilio signs the address it calls
        async with _Served(host="0.0.0.0", token="s3cret", twilio_auth_token=AUTH_TOKEN) as s, \
                aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                await http.ws_connect(f"{s.base}/ws")
            assert exc.value.status == 401
            # the browser's token opens no Twilio route: Twilio cannot send it on a stream
            status, _ = await refused_upgrade(f"{s.ws_base}/twilio/media?token=s3cret")
            assert status == 403
            # Twilio's signature needs no token beside it
            resp = await http.post(f"{s.base}/twilio/twiml", data=CALL,
                                   headers=signed(f"{s.base}/twilio/twiml", CALL))
            assert resp.status == 200
            async with connect(f"{s.ws_base}/twilio/media",
                               additional_headers=signed(f"{s.ws_base}/twilio/media")) as ws:
                await TwilioCaller().run(ws, _tone(1600), tail_s=0.1)
            ws = await http.ws_connect(f"{s.base}/ws?token=s3cret")
            await ws.close()
            refused = s.server.stats()["refused_by"]
            assert {k: n for k, n in refused.items() if n} == {"token": 1, "signature": 1}

    asyncio.run(main())


def test_exposed_without_a_twilio_auth_token_twilio_is_not_mounted() -> None:
    def nobody(*_: object) -> Session:
        raise AssertionError("no call may start")

    for options in ({"host": "0.0.0.0"}, {"public_url": PUBLIC}):
        server = VoiceServer(nobody, port=0, **options)
        with pytest.raises(ConfigError, match="--twilio-auth-token or \\$TWILIO_AUTH_TOKEN"):
            add_twilio_routes(server.app, nobody, server.admission)
        paths = {r.resource.canonical for r in server.app.router.routes() if r.resource}
        assert "/ws" in paths and not any(p.startswith("/twilio") for p in paths)
