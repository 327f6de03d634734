"""Call control over Twilio: the ``<Dial>`` a transfer hands the call to (targets validated,
escaped), Twilio's REST "update call" request against a local stand-in that checks the
documented request and answers as Twilio does (success, Twilio's errors, no answer), the
action endpoint's book (bounded, expiring), send_dtmf refused, and the keypad fed by the Twilio
caller's ``dtmf`` messages through the real server."""

from __future__ import annotations

import asyncio
import socket
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from twilio_fake_api import ACCOUNT_SID, AUTH_TOKEN, FakeTwilioApi, dial_of, sign

from agent.control import CallControl, CallControlError, NotSupported
from agent.errors import ConfigError
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from transports.twilio.call import TwilioCall
from transports.twilio.caller import TwilioCaller
from transports.twilio.control import TwilioCallControl
from transports.twilio.handover import TransferBook
from transports.twilio.messages import Start
from transports.twilio.mount import add_twilio_routes
from transports.twilio.rest import TwilioRest
from transports.twilio.server import TwilioServer
from transports.twilio.twiml import connect_stream_twiml, dial_twiml

CALL_SID = "CA" + "1234abcd" * 4


# --- the <Dial> ------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "noun", "text"), [
    ("+14155550100", "Number", "+14155550100"),
    (" +1 (415) 555-0100 ", "Number", "+14155550100"),
    ("tel:+442079460000", "Number", "+442079460000"),
    ("sip:alice@pbx.example.com", "Sip", "sip:alice@pbx.example.com"),
    ("sips:desk&co@10.0.0.5:5061;transport=tls", "Sip", "sips:desk&co@10.0.0.5:5061;transport=tls"),
    ("client:front_desk", "Client", "front_desk"),
])
def test_dial_targets_become_escaped_twiml(target: str, noun: str, text: str) -> None:
    assert dial_of(ET.fromstring(dial_twiml(target))) == (noun, text)


@pytest.mark.parametrize("target", [
    "", "5550100", "+0441234", "+1234567890123456", "the front desk", "sip:nobody",
    "sip:a b@example.com", 'sip:x@y"/><Hangup/>', "client:two words", "client:",
    "</Number></Dial><Hangup/>", "+1415<Hangup/>",
])
def test_invalid_targets_are_refused_with_what_a_target_looks_like(target: str) -> None:
    with pytest.raises(ValueError, match=r"E\.164 \(\+14155550100\)"):
        dial_twiml(target)


def test_stream_twiml_redirects_to_the_action_endpoint_when_the_stream_ends() -> None:
    root = ET.fromstring(connect_stream_twiml("wss://bot.example/twilio/media",
                                              then_url="https://bot.example/a?x=1&y=2",
                                              then_method="GET"))
    assert [c.tag for c in root] == ["Connect", "Redirect"]
    assert root.find("Connect/Stream").get("url") == "wss://bot.example/twilio/media"
    redirect = root.find("Redirect")
    assert redirect.text == "https://bot.example/a?x=1&y=2" and redirect.get("method") == "GET"
    plain = ET.fromstring(connect_stream_twiml("wss://bot.example/twilio/media"))
    assert [c.tag for c in plain] == ["Connect"]


# --- the book of hand-overs ----------------------------------------------------------------------


def test_transfer_book_answers_recorded_dials_until_they_expire_and_stays_bounded() -> None:
    book = TransferBook(arm_keep_s=60, dial_keep_s=300, most=3)
    book.arm("CA1", now=0)
    assert book.claim("CA1", now=59) and not book.claim("CA1", now=59)  # used up
    book.arm("CA2", now=0)
    assert not book.claim("CA2", now=61)  # a stream that never came
    assert "<Hangup/>" in book.answer("CA1", now=1)  # nothing recorded: the call ends
    book.record("CA1", dial_twiml("+14155550100"), now=10)
    assert "<Number>+14155550100</Number>" in book.answer("CA1", now=20)
    assert "<Number>" in book.answer("CA1", now=300)  # a retried request: the same answer
    assert "<Hangup/>" in book.answer("CA1", now=311)  # expired
    for i in range(10):
        book.record(f"CA{i}", dial_twiml("+14155550100"), now=400 + i)
        book.arm(f"CB{i}", now=400 + i)
    assert len(book) == 6  # the newest three of each
    assert "<Hangup/>" in book.answer("CA6", now=420) and "<Dial>" in book.answer("CA9", now=420)
    assert "<Hangup/>" in book.answer("", now=420)


# --- REST transfers against a local Twilio ------------------------------------------------------


def _rest(base: str, **kw) -> TwilioRest:
    return TwilioRest(kw.pop("account_sid", ACCOUNT_SID), kw.pop("auth_token", AUTH_TOKEN),
                      base, **kw)


async def _control(rest: TwilioRest | None = None, book: TransferBook | None = None,
                   armed: bool = False, call_sid: str = CALL_SID) -> TwilioCallControl:
    session = Session(Pipeline([Stage()]))
    await session.start()
    call = TwilioCall(session, Start("MZ1", call_sid, ACCOUNT_SID))
    control = TwilioCallControl(call, session, rest, book, armed)
    session.control = control
    return control


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rest_transfer_sends_the_documented_update_call_request(monkeypatch) -> None:
    # Twilio ends the stream itself after the update; should its stop not come, we do
    monkeypatch.setattr("transports.twilio.control.STOP_WAIT_S", 0.3)

    async def main() -> None:
        api = FakeTwilioApi(live={CALL_SID})
        base = await api.start()
        try:
            control = await _control(_rest(base))
            typed: CallControl = control  # (mypy checks it meets the protocol)
            assert typed.transport == "twilio"
            said = await control.transfer("sip:agent@pbx.example.com")
            assert "sip:agent@pbx.example.com" in said
            assert control.transferred == "sip:agent@pbx.example.com"
            with pytest.raises(CallControlError, match="already being transferred"):
                await control.transfer("+14155550100")
            assert not control.session.hangup_reason  # Twilio's stop is awaited first
            async with asyncio.timeout(3):
                while control.session.hangup_reason != "transferred":
                    await asyncio.sleep(0.02)
            await control.session.close()
        finally:
            await api.stop()
        [req] = api.requests
        assert req.method == "POST" and (req.account_sid, req.call_sid) == (
            ACCOUNT_SID, CALL_SID + ".json")
        assert req.content_type == "application/x-www-form-urlencoded"
        assert req.basic_auth == (ACCOUNT_SID, AUTH_TOKEN) and list(req.form) == ["Twiml"]
        assert dial_of(req.twiml) == ("Sip", "sip:agent@pbx.example.com")

    asyncio.run(main())


@pytest.mark.parametrize(("setup", "expected"), [
    # the call is not live at Twilio (already ended): Twilio's 404 and its message
    ({}, r"HTTP 404, error 20404\): The requested resource .*Calls/CA1234abcd.*\.json was not "
         r"found — https://www.twilio.com/docs/errors/20404"),
    ({"auth_token": "not-the-token"}, r"HTTP 401, error 20003\): Authenticate.*"
                                      r"--twilio-account-sid"),
    ({"answer": (500, "<html>upstream exploded</html>")},
     r"HTTP 500\): <html>upstream exploded</html>"),
    ({"answer": (503, {"code": 20503, "message": "Service unavailable"})},
     r"HTTP 503, error 20503\): Service unavailable"),
    ({"delay_s": 2.0}, r"could not reach Twilio's API at http://127\.0\.0\.1:\d+: no answer "
                       r"within 0\.3 s"),
])
def test_rest_transfer_failures_raise_with_twilios_reason(setup: dict, expected: str) -> None:
    async def main() -> None:
        token = setup.pop("auth_token", AUTH_TOKEN)
        api = FakeTwilioApi(live={CALL_SID} if "answer" in setup or "delay_s" in setup
                            else set(), **setup)
        base = await api.start()
        try:
            # a short limit only where the test is the limit: a loaded 2-core machine can take
            # longer than 0.3 s to answer a first request on loopback
            timeout_s = 0.3 if "delay_s" in setup else 10.0
            control = await _control(_rest(base, auth_token=token, timeout_s=timeout_s))
            with pytest.raises(CallControlError, match=expected) as raised:
                await control.transfer("+14155550100")
            assert not isinstance(raised.value, NotSupported) and not control.transferred
            assert token not in str(raised.value)  # the credentials never reach a message
            assert not control.session.hangup_reason  # the call goes on
            await control.session.close()
        finally:
            await api.stop()
        assert len(api.requests) == 1

    asyncio.run(main())


def test_rest_transfer_to_nobody_listening_raises_and_invalid_targets_send_nothing() -> None:
    async def main() -> None:
        control = await _control(_rest(f"http://127.0.0.1:{_free_port()}"))
        with pytest.raises(CallControlError, match="could not reach Twilio's API at http://"):
            await control.transfer("+14155550100")
        api = FakeTwilioApi(live={CALL_SID})
        base = await api.start()
        try:
            control = await _control(_rest(base))
            with pytest.raises(CallControlError, match="not a transfer target"):
                await control.transfer("reception")
            odd = await _control(_rest(base), call_sid="CA-not-a-sid/../../x")
            with pytest.raises(CallControlError, match="not a Twilio call SID"):
                await odd.transfer("+14155550100")
        finally:
            await api.stop()
        assert api.requests == []

    asyncio.run(main())


def test_rest_credentials_are_checked_at_start_up() -> None:
    with pytest.raises(ConfigError, match="AC and 32 hex digits"):
        TwilioRest("SK123", AUTH_TOKEN)
    with pytest.raises(ConfigError, match="need the account's auth token"):
        TwilioRest(ACCOUNT_SID, "")
    for base in ("http://api.example.com", "ftp://127.0.0.1", "https://api.twilio.com/v1"):
        with pytest.raises(ConfigError, match="--twilio-api-base must be an https://"):
            TwilioRest(ACCOUNT_SID, AUTH_TOKEN, base)
    assert TwilioRest(ACCOUNT_SID, AUTH_TOKEN, "https://api.twilio.com/").api_base == (
        "https://api.twilio.com")
    assert AUTH_TOKEN not in repr(TwilioRest(ACCOUNT_SID, AUTH_TOKEN))
    with pytest.raises(ConfigError, match="AC and 32 hex"):
        TwilioServer(lambda start: Session(Pipeline([])), port=0, twilio_account_sid="AC1",
                     twilio_auth_token=AUTH_TOKEN)


def test_without_a_way_to_hand_over_transfer_and_dtmf_are_not_supported() -> None:
    async def main() -> None:
        for control in (await _control(), await _control(book=TransferBook(), armed=False)):
            with pytest.raises(NotSupported, match="did not come from that webhook"):
                await control.transfer("+14155550100")
            assert not control.session.hangup_reason  # nothing happened to the call
            with pytest.raises(NotSupported, match="only media, mark and clear"):
                await control.send_dtmf("1234#")
            await control.session.close()

    asyncio.run(main())


def test_a_transfer_through_the_book_records_the_dial_and_ends_the_call_like_a_hangup() -> None:
    async def main() -> None:
        book = TransferBook()
        control = await _control(book=book, armed=True)
        said = await control.transfer("client:front_desk")
        assert "client:front_desk" in said and control.session.hangup_reason == "transferred"
        assert dial_of(ET.fromstring(book.answer(CALL_SID, time.monotonic()))) == (
            "Client", "front_desk")
        with pytest.raises(CallControlError, match="already ending"):
            await control.transfer("+14155550100")
        await control.session.close()
        ended = await _control(book=book, armed=True)
        await ended.session.close()
        with pytest.raises(CallControlError, match="has ended"):
            await ended.transfer("+14155550100")

    asyncio.run(main())


# --- the keypad, from the Twilio caller --------------------------------------------------------


def test_keypad_gathers_the_twilio_callers_digits() -> None:
    async def main() -> None:
        from websockets.asyncio.client import connect

        sessions: list[Session] = []

        def make(start) -> Session:
            sessions.append(Session(Pipeline([Stage()])))
            return sessions[-1]

        server = TwilioServer(make, port=0)
        host, port = await server.start()
        silence = np.zeros(800, np.int16)
        try:
            async with connect(f"ws://{host}:{port}/twilio/media") as ws:
                caller = asyncio.ensure_future(TwilioCaller().run(
                    ws, silence, dtmf={0.2: "4", 0.3: "2", 0.4: "7", 0.5: "9", 0.6: "#",
                                       0.7: "1"}, tail_s=1.5))
                async with asyncio.timeout(5):
                    while not sessions:
                        await asyncio.sleep(0.01)
                keypad = sessions[0].keypad
                first = await keypad.gather(count=3, timeout_s=3)
                second = await keypad.gather(terminator="#", timeout_s=3)
                third = await keypad.gather(count=4, timeout_s=0.5)
                await caller
        finally:
            await server.stop()
        assert (first.digits, first.reason) == ("427", "count")
        assert (second.digits, second.reason) == ("9", "terminator")
        assert (third.digits, third.reason) == ("1", "timeout")
        assert server.reports[0].stats.dtmf == "4279#1"
        ended = await sessions[0].keypad.gather(count=1, timeout_s=3)
        assert ended.reason == "ended"  # the call is over: a gather returns at once

    asyncio.run(main())


# --- the action endpoint on the aiohttp mount (POST, as Twilio's default) ---------------------


def test_mounted_action_endpoint_is_signed_and_answers_a_transferred_calls_dial() -> None:
    async def main() -> None:
        import aiohttp
        from aiohttp import web
        from websockets.asyncio.client import connect

        from transports.admission import Admission

        public = "https://bot.example.test"
        agents: list = []

        def make(start) -> Session:
            from twilio_fake_api import TransferOnKey

            agents.append(TransferOnKey("+14155550100"))
            return Session(Pipeline([agents[-1]]))

        app = web.Application()
        reports: list = []
        book = add_twilio_routes(app, make, Admission("127.0.0.1", public_url=public,
                                                      twilio_auth_token=AUTH_TOKEN),
                                 on_end=reports.append)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        call = {"AccountSid": ACCOUNT_SID, "CallSid": CALL_SID, "From": "+15550001111",
                "To": "+15550002222"}
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                async def post(path: str, form: dict, signature: str) -> tuple[int, str]:
                    async with http.post(base + path, data=form,
                                         headers={"X-Twilio-Signature": signature}) as r:
                        return r.status, await r.text()

                status, twiml = await post("/twilio/twiml", call,
                                           sign(f"{public}/twilio/twiml", call))
                root = ET.fromstring(twiml)
                assert status == 200 and root.find("Redirect").text == f"{public}/twilio/action"
                assert root.find("Redirect").get("method") == "POST"
                caller = TwilioCaller(call_sid=CALL_SID)
                media = f"ws://127.0.0.1:{port}/twilio/media"
                async with connect(media, additional_headers={
                        "X-Twilio-Signature": sign("wss://bot.example.test/twilio/media")}) as ws:
                    log = await caller.run(ws, np.zeros(800, np.int16), dtmf={0.2: "0"},
                                           tail_s=5.0)
                after = {**call, "CallStatus": "in-progress"}
                forged = await post("/twilio/action", after, sign(f"{public}/twilio/action",
                                                                   {**after, "To": "+1"}))
                assert forged[0] == 403 and "X-Twilio-Signature" in forged[1]
                status, answer = await post("/twilio/action", after,
                                            sign(f"{public}/twilio/action", after))
                other = {**after, "CallSid": "CA" + "9" * 32}
                _, hangup = await post("/twilio/action", other,
                                       sign(f"{public}/twilio/action", other))
        finally:
            await runner.cleanup()
        assert (log.close_code, log.close_reason) == (1000, "transferred")
        assert status == 200 and dial_of(ET.fromstring(answer)) == ("Number", "+14155550100")
        assert ET.fromstring(hangup).find("Hangup") is not None
        assert agents[0].results and not agents[0].errors and book.answered_dials == 1
        assert reports and reports[0].reason == "transferred"

    asyncio.run(main())
