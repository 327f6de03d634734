"""Twilio's side of a transfer, for the tests, written from Twilio's documentation independently
of the product's code: its REST "update call" request as a local aiohttp server (it checks what
the docs say the request is and answers as Twilio does), request signing, and a small agent
that says goodbye and transfers the call when the caller presses a key."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.control import CallControlError
from agent.frames import Direction, Dtmf, TTSAudio
from agent.stage import Stage

ACCOUNT_SID = "AC" + "0" * 32  # what TwilioCaller's start message names
AUTH_TOKEN = "fake-auth-token-0123456789abcdef"


def sign(url: str, params: dict[str, str] | None = None, auth_token: str = AUTH_TOKEN) -> str:
    """X-Twilio-Signature: base64(HMAC-SHA1(token, URL + each POST name and value, by name))."""
    data = url + "".join(k + v for k, v in sorted((params or {}).items()))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1)
                            .digest()).decode()


def twilio_error(status: int, code: int, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"code": code, "message": message, "status": status,
                    "more_info": f"https://www.twilio.com/docs/errors/{code}"}


@dataclass
class UpdateRequest:
    """One request as the fake saw it."""

    method: str
    account_sid: str
    call_sid: str
    content_type: str
    basic_auth: tuple[str, str] | None
    form: dict[str, str]
    twiml: ET.Element | None
    caller_heard: int = 0  # agent chunks the caller had played when the request came


@dataclass
class FakeTwilioApi:
    """``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` on 127.0.0.1.

    It answers 401 to the wrong basic auth, 400 to a body that is not form-encoded or whose
    ``Twiml`` is not a ``<Response>`` document, 404 to a call not in ``live``, and otherwise
    ``answer`` (default: 200 and the call resource) after ``delay_s``.
    """

    account_sid: str = ACCOUNT_SID
    auth_token: str = AUTH_TOKEN
    live: set[str] = field(default_factory=set)
    answer: tuple[int, Any] | None = None  # (status, JSON object or raw text)
    delay_s: float = 0.0
    late_answer_s: float = 0.0  # after acting on an update, before answering it
    heard: Any = None  # () -> chunks the caller has played, stamped on each request
    requests: list[UpdateRequest] = field(default_factory=list)
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: Any = None
    base: str = ""

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/2010-04-01/Accounts/{account}/Calls/{call}", self._update)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}"
        return self.base

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _update(self, request: Any) -> Any:
        from aiohttp import web

        account, call = request.match_info["account"], request.match_info["call"]
        auth = None
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            auth = (user, password)
        form: dict[str, str] = {}
        content_type = request.content_type
        if content_type == "application/x-www-form-urlencoded":
            form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        twiml = None
        with contextlib.suppress(ET.ParseError):
            twiml = ET.fromstring(form["Twiml"]) if "Twiml" in form else None
        self.requests.append(UpdateRequest(request.method, account, call, content_type, auth,
                                           form, twiml, self.heard() if self.heard else 0))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not call.endswith(".json") or request.method != "POST":
            status, body = twilio_error(405, 20004, "Method not allowed")
        elif auth != (self.account_sid, self.auth_token) or account != self.account_sid:
            status, body = twilio_error(401, 20003, "Authenticate")
        elif content_type != "application/x-www-form-urlencoded":
            status, body = twilio_error(400, 21218, "Invalid content type")
        elif twiml is None or twiml.tag != "Response":
            status, body = twilio_error(400, 12100, "Document parse failure")
        elif call[:-5] not in self.live:
            status, body = twilio_error(
                404, 20404, f"The requested resource {request.path} was not found")
        elif self.answer is not None:
            status, body = self.answer
        else:
            status, body = 200, {"sid": call[:-5], "account_sid": account,
                                 "status": "in-progress", "api_version": "2010-04-01"}
        if 200 <= status < 300:
            self.updated.set()
            if self.late_answer_s:  # Twilio acts (ends the stream) before its answer arrives
                await asyncio.sleep(self.late_answer_s)
        if isinstance(body, str):
            return web.Response(status=status, text=body, content_type="text/html")
        return web.Response(status=status, text=json.dumps(body),
                            content_type="application/json")


def dial_of(root: ET.Element | None) -> tuple[str, str]:
    """(noun, text) of a ``<Response><Dial>`` document: ("Number", "+1415…"), ("Sip", "sip:…"),
    ("", bare text) for a number written straight into ``<Dial>``."""
    assert root is not None and root.tag == "Response", root
    dial = root.find("Dial")
    assert dial is not None and len(root) == 1, ET.tostring(root)
    nouns = list(dial)
    if not nouns:
        return "", (dial.text or "").strip()
    assert len(nouns) == 1
    return nouns[0].tag, (nouns[0].text or "").strip()


GOODBYE_S = 0.6


class TransferOnKey(Stage):
    """Pressing ``key``: the agent says a goodbye (``GOODBYE_S`` of tone) and transfers the call
    to ``target`` through the call's control; what the transfer answered (or raised) is kept."""

    name = "transfer_on_key"

    def __init__(self, target: str, key: str = "0") -> None:
        super().__init__()
        self.target, self.key = target, key
        self.results: list[str] = []
        self.errors: list[CallControlError] = []

    def process(self, frame, direction) -> None:
        if isinstance(frame, Dtmf) and frame.digit == self.key:
            n = int(GOODBYE_S * 16000)
            tone = (6000 * np.sin(2 * np.pi * 523 * np.arange(n) / 16000)).astype(np.int16)
            self.push(TTSAudio(tone, last=True, text="Transferring you now."),
                      Direction.DOWNSTREAM)
            self.ctx.spawn(self._transfer(), name="transfer")
        else:
            self.push(frame, direction)

    async def _transfer(self) -> None:
        call = self.ctx.call
        assert call is not None and call.control is not None
        try:
            self.results.append(await call.control.transfer(self.target))
        except CallControlError as exc:
            self.errors.append(exc)
