"""A Twilio call transferred end to end over real sockets on 127.0.0.1, with a small agent that
says goodbye and transfers when the caller presses 0.

Without REST credentials: the webhook's TwiML (signed GET, as Twilio sends it) ends with a
``<Redirect>`` to the action endpoint; the transfer closes the stream once the goodbye has
played (every mark echoed), and the action request Twilio then makes (signed) gets the
``<Dial>``. With them: one "update call" request to a local stand-in for Twilio's REST API,
sent after the goodbye played; Twilio's ``stop`` then ends the call, reason "transferred"; a
refused request leaves the call going.
"""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from urllib.parse import urlencode

import numpy as np
import pytest
from twilio_fake_api import (
    ACCOUNT_SID,
    AUTH_TOKEN,
    GOODBYE_S,
    FakeTwilioApi,
    TransferOnKey,
    dial_of,
    sign,
)

from agent.control import NotSupported
from agent.pipeline import Pipeline
from agent.session import Session
from transports.twilio.caller import TwilioCaller
from transports.twilio.server import TwilioServer

PUBLIC = "https://bot.example"
CALL_SID = "CA" + "5eed" * 8
GOODBYE_CHUNKS = int(GOODBYE_S / 0.02)  # 20 ms chunks of μ-law the goodbye takes


async def _get(host: str, port: int, target: str, signature: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: bot.example\r\n"
                 f"X-Twilio-Signature: {signature}\r\n\r\n".encode())
    await writer.drain()
    data = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    head, _, body = data.partition("\r\n\r\n")
    return int(head.split()[1]), body


def _serve(agents: list[TransferOnKey], target: str, **options) -> TwilioServer:
    def make(start) -> Session:
        agents.append(TransferOnKey(target))
        return Session(Pipeline([agents[-1]]))

    return TwilioServer(make, port=0, twilio_auth_token=AUTH_TOKEN, **options)


async def _wait_for_report(server: TwilioServer, n: int) -> None:
    async with asyncio.timeout(5):
        while len(server.reports) < n:
            await asyncio.sleep(0.02)


def test_transfer_through_the_action_endpoint() -> None:
    asyncio.run(_through_the_action_endpoint())


async def _through_the_action_endpoint() -> None:
    from websockets.asyncio.client import connect

    agents: list[TransferOnKey] = []
    server = _serve(agents, "sip:desk@pbx.example.com", public_url=PUBLIC)
    host, port = await server.start()
    stream = {"X-Twilio-Signature": sign(f"wss://bot.example{server.media_path}")}
    try:
        # Twilio asks the webhook (GET: the call's parameters in the query string, signed)
        query = urlencode({"AccountSid": ACCOUNT_SID, "CallSid": CALL_SID,
                           "From": "+15550001111", "To": "+15550002222"})
        status, twiml = await _get(host, port, f"/twilio/twiml?{query}",
                                   sign(f"{PUBLIC}/twilio/twiml?{query}"))
        root = ET.fromstring(twiml)
        assert status == 200 and [c.tag for c in root] == ["Connect", "Redirect"]
        redirect = root.find("Redirect")
        assert redirect.text == f"{PUBLIC}/twilio/action" and redirect.get("method") == "GET"

        async with connect(f"ws://{host}:{port}/twilio/media", additional_headers=stream) as ws:
            log = await TwilioCaller(call_sid=CALL_SID).run(
                ws, np.zeros(1600, np.int16), dtmf={0.3: "0"}, tail_s=6.0)
        await _wait_for_report(server, 1)

        # the stream has ended: Twilio follows the <Redirect> (GET, its parameters appended)
        after = urlencode({"AccountSid": ACCOUNT_SID, "CallSid": CALL_SID,
                           "CallStatus": "in-progress"})
        action = f"/twilio/action?{after}"
        status, answer = await _get(host, port, action, sign(f"{PUBLIC}{action}"))
        forged, _ = await _get(host, port, action, sign(f"{PUBLIC}{action}", auth_token="x"))
        other = action.replace(CALL_SID, "CA" + "0" * 32)
        _, hangup = await _get(host, port, other, sign(f"{PUBLIC}{other}"))

        # a second call whose TwiML did not come from this webhook (no CallSid seen): closing
        # its stream would drop it, so the transfer is refused and the call goes on
        async with connect(f"ws://{host}:{port}/twilio/media", additional_headers=stream) as ws:
            log2 = await TwilioCaller().run(ws, np.zeros(1600, np.int16), dtmf={0.3: "0"},
                                            tail_s=2.0)
        await _wait_for_report(server, 2)
    finally:
        await server.stop()

    # the goodbye played out whole before the stream closed: every mark came back
    assert (log.close_code, log.close_reason) == (1000, "transferred")
    assert len(log.agent_chunks) >= GOODBYE_CHUNKS - 1
    assert log.marks_sent[0] == "u1:start" and log.marks_sent[-1] == "u1:end"
    assert all(":h" in m for m in log.marks_sent[1:-1])  # (the "heard" marks while it spoke)
    assert log.marks_echoed == log.marks_sent
    assert agents[0].results and not agents[0].errors
    report = server.reports[0]
    assert report.reason == "transferred" and report.call_sid == CALL_SID
    assert status == 200 and dial_of(ET.fromstring(answer)) == ("Sip", "sip:desk@pbx.example.com")
    assert forged == 403 and ET.fromstring(hangup).find("Hangup") is not None

    assert log2.close_code is None and server.reports[1].reason == "stop"
    assert isinstance(agents[1].errors[0], NotSupported) and not agents[1].results
    assert server.active == 0


@pytest.mark.parametrize("late_answer_s", [0.0, 0.5])
def test_transfer_through_twilios_rest_api(late_answer_s: float) -> None:
    """(0.5: Twilio's stop overtakes its answer to the update; the call is still transferred.)"""
    asyncio.run(_through_the_rest_api(late_answer_s))


async def _through_the_rest_api(late_answer_s: float) -> None:
    from websockets.asyncio.client import connect

    caller = TwilioCaller(call_sid=CALL_SID)
    api = FakeTwilioApi(live={CALL_SID}, heard=lambda: len(caller.log.agent_chunks),
                        late_answer_s=late_answer_s)
    base = await api.start()
    agents: list[TransferOnKey] = []
    server = _serve(agents, "+14155550100", twilio_account_sid=ACCOUNT_SID,
                    twilio_api_base=base)
    host, port = await server.start()
    media = f"ws://{host}:{port}{server.media_path}"
    stream = {"X-Twilio-Signature": sign(media)}  # on loopback Twilio's URL is this one
    try:
        status, twiml = await _get(host, port, f"/twilio/twiml?CallSid={CALL_SID}",
                                   sign(f"http://bot.example/twilio/twiml?CallSid={CALL_SID}"))
        assert status == 200 and [c.tag for c in ET.fromstring(twiml)] == ["Connect"]
        async with connect(media, additional_headers=stream) as ws:
            # Twilio ends the stream (stop) once it has the call's new TwiML
            log = await caller.run(ws, np.zeros(1600, np.int16), dtmf={0.3: "0"}, tail_s=6.0,
                                   until=api.updated.is_set)
        await _wait_for_report(server, 1)

        # Twilio refuses the second call's update (it is not live there): the call goes on
        api.live.clear()
        async with connect(media, additional_headers=stream) as ws:
            log2 = await TwilioCaller(call_sid=CALL_SID).run(
                ws, np.zeros(1600, np.int16), dtmf={0.3: "0"}, tail_s=2.5)
        await _wait_for_report(server, 2)
    finally:
        await server.stop()
        await api.stop()

    first, second = api.requests
    assert first.method == "POST" and first.account_sid == ACCOUNT_SID
    assert first.call_sid == f"{CALL_SID}.json" and first.basic_auth == (ACCOUNT_SID, AUTH_TOKEN)
    assert dial_of(first.twiml) == ("Number", "+14155550100")
    # sent once the goodbye had played at the caller's end, not while it was still queued
    assert first.caller_heard >= GOODBYE_CHUNKS - 1
    assert log.close_code is None and "u1:end" in log.marks_echoed
    assert agents[0].results and server.reports[0].reason == "transferred"

    assert "HTTP 404, error 20404" in str(agents[1].errors[0]) and not agents[1].results
    assert log2.close_code is None and server.reports[1].reason == "stop"
    assert second.call_sid == f"{CALL_SID}.json"
