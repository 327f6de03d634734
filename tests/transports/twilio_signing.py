"""Twilio's request signing for the tests, written from Twilio's documentation independently of
the product's code: base64(HMAC-SHA1(auth token, URL + each POST parameter's name and value,
sorted by name)). Tests sign requests the way Twilio would, then see what the server does, and
read a refused WebSocket upgrade's answer."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

AUTH_TOKEN = "test-auth-token-0123456789abcdef"


def sign(url: str, params: dict[str, str] | None = None, auth_token: str = AUTH_TOKEN) -> str:
    data = url
    for name in sorted(params or {}):
        data += name + (params or {})[name]
    digest = hmac.new(auth_token.encode("utf-8"), data.encode("utf-8"), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signed(url: str, params: dict[str, str] | None = None,
           auth_token: str = AUTH_TOKEN) -> dict[str, str]:
    """The header Twilio would send with a request to ``url`` carrying ``params``."""
    return {"X-Twilio-Signature": sign(url, params, auth_token)}


async def refused_upgrade(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The status and body with which the server refuses a WebSocket upgrade to ``url``."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as exc:
        async with connect(url, additional_headers=headers or {}):
            pass
    return exc.value.response.status_code, exc.value.response.body.decode()
