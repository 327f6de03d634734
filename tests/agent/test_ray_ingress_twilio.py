"""The scale-out ingress's Twilio webhook, without a cluster: Starlette requests through an
ASGI transport, a stand-in for the replicas' handle that answers reservations. Twilio's
signature (computed here from Twilio's documented algorithm: base64 HMAC-SHA1 of the URL and
the sorted POST parameters) is checked against the public URL; a placed call's TwiML streams to
the replica over wss behind https; a full application answers busy; an exposed ingress without
the auth token does not start."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac

import httpx
import pytest

pytest.importorskip("starlette")

from agent.commands.ray_serve import ScaleOptions, VoiceIngress  # noqa: E402
from agent.errors import ConfigError  # noqa: E402

PUBLIC = "https://bot.example.test"
TOKEN = "twilio-auth-token"
CALL = {"CallSid": "CA" + "2" * 32, "From": "+15550001111", "To": "+15550002222"}


def signature(url: str, params: dict[str, str]) -> str:
    data = url + "".join(k + params[k] for k in sorted(params))
    return base64.b64encode(hmac.new(TOKEN.encode(), data.encode(), hashlib.sha1).digest()).decode()


class Replicas:
    """What the ingress asks of the replicas' handle: ``reserve.remote(tried=...)``."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.reserve = self  # (handle.reserve.remote)

    async def _answer(self, tried: list[str]) -> dict:
        if "r1" in tried:
            return {"ok": False, "replica": "r1", "exhausted": True, "why": "asked twice"}
        if self.free < 1:
            return {"ok": False, "replica": "r1", "exhausted": False, "why": "full"}
        self.free -= 1
        return {"ok": True, "replica": "r1", "twilio": "ws://10.0.0.5:9000/twilio/media",
                "ws": "ws://10.0.0.5:9000/ws", "offer": "http://10.0.0.5:9000/offer"}

    def remote(self, tried: list[str] = ()) -> object:  # noqa: B006
        return self._answer(list(tried))


def post(ingress: VoiceIngress, headers: dict[str, str]) -> httpx.Response:
    from starlette.requests import Request

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        response = await ingress(Request(scope, receive))
        await response(scope, receive, send)

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=PUBLIC) as http:
            return await http.post("/twilio/twiml", data=CALL, headers=headers)

    return asyncio.run(main())


def ingress(free: int) -> VoiceIngress:
    return VoiceIngress(Replicas(free), ScaleOptions(twilio=True, twilio_auth_token=TOKEN,
                                                     public_url=PUBLIC))


def test_a_signed_webhook_gets_a_stream_to_a_replica_over_wss():
    r = post(ingress(1), {"X-Twilio-Signature": signature(f"{PUBLIC}/twilio/twiml", CALL)})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/xml")
    assert '<Stream url="wss://10.0.0.5:9000/twilio/media"' in r.text


def test_an_unsigned_or_forged_webhook_is_refused():
    assert post(ingress(1), {}).status_code == 403
    forged = signature(f"{PUBLIC}/twilio/twiml", {**CALL, "From": "+1"})
    r = post(ingress(1), {"X-Twilio-Signature": forged})
    assert r.status_code == 403 and "X-Twilio-Signature" in r.text


def test_no_room_anywhere_answers_busy():
    r = post(ingress(0), {"X-Twilio-Signature": signature(f"{PUBLIC}/twilio/twiml", CALL)})
    assert r.status_code == 200 and '<Reject reason="busy"' in r.text


def test_an_exposed_ingress_needs_the_auth_token():
    with pytest.raises(ConfigError, match="auth token"):
        VoiceIngress(Replicas(1), ScaleOptions(twilio=True, public_url=PUBLIC))
