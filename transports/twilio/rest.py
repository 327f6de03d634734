"""Twilio's REST "update call" request, which replaces a live call's TwiML (a transfer's
``<Dial>``): ``POST {api_base}/2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` with the
form field ``Twiml``, HTTP basic auth with the account SID and auth token. Twilio answers the
call resource (JSON) on success and ``{"code", "message", "more_info", "status"}`` on failure.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agent.control import CallControlError
from agent.errors import ConfigError, require
from agent.netaddr import is_loopback_name

DEFAULT_API_BASE = "https://api.twilio.com"
ACCOUNT_SID = re.compile(r"AC[0-9a-fA-F]{32}")
CALL_SID = re.compile(r"CA[0-9a-fA-F]{32}")
ACCOUNT_SID_HELP = "--twilio-account-sid or $TWILIO_ACCOUNT_SID"


@dataclass(slots=True, frozen=True)
class TwilioRest:
    """The account's REST credentials. ``api_base`` must be https (the auth token travels in
    every request), except on loopback, where a test's stand-in for Twilio listens."""

    account_sid: str
    auth_token: str = field(repr=False)
    api_base: str = DEFAULT_API_BASE
    # with the control's wait for the agent's audio to play (3 s), within a tool's default
    # time limit (10 s); Twilio answers an update in well under a second
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not ACCOUNT_SID.fullmatch(self.account_sid):
            raise ConfigError(f"{ACCOUNT_SID_HELP} must be the account's SID (AC and 32 hex "
                              f"digits, as the Twilio console shows it), got "
                              f"{self.account_sid[:40]!r}")
        if not self.auth_token:
            raise ConfigError(f"transfers through Twilio's REST API ({ACCOUNT_SID_HELP}) need "
                              "the account's auth token too: --twilio-auth-token or "
                              "$TWILIO_AUTH_TOKEN")
        parts = urlsplit(self.api_base)
        secure = parts.scheme == "https" or (
            parts.scheme == "http" and is_loopback_name(parts.hostname or ""))
        if not secure or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"--twilio-api-base must be an https:// address such as "
                              f"{DEFAULT_API_BASE} (http:// only on loopback), got "
                              f"{self.api_base!r}")
        object.__setattr__(self, "api_base", self.api_base.rstrip("/"))
        require("aiohttp", what="transfers through Twilio's REST API", extra="telephony")

    def update_call_url(self, call_sid: str) -> str:
        if not CALL_SID.fullmatch(call_sid):
            raise CallControlError(f"this stream's CallSid {call_sid[:40]!r} is not a Twilio "
                                   "call SID (CA and 32 hex digits): Twilio cannot update it")
        return f"{self.api_base}/2010-04-01/Accounts/{self.account_sid}/Calls/{call_sid}.json"

    async def update_call(self, call_sid: str, twiml: str) -> dict[str, Any]:
        """Replace the live call's TwiML with ``twiml``; returns Twilio's call resource. Raises
        CallControlError with Twilio's reason when it refuses, or when it cannot be reached."""
        import aiohttp

        url = self.update_call_url(call_sid)
        basic = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        headers = {"Accept": "application/json", "Authorization": f"Basic {basic}"}
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as http, http.post(url, data={"Twiml": twiml}, headers=headers,
                                 allow_redirects=False) as response:
                status, body = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                reason = f"no answer within {self.timeout_s:g} s"
            raise CallControlError(f"could not reach Twilio's API at {self.api_base}: "
                                   f"{reason}") from None
        if 200 <= status < 300:
            try:
                resource = json.loads(body)
            except ValueError:
                resource = {}
            return resource if isinstance(resource, dict) else {}
        raise CallControlError(twilio_refusal(status, body))


def twilio_refusal(status: int, body: bytes) -> str:
    """What Twilio's error answer says: its ``message`` and ``code`` (and where it explains
    them), or the start of the body when it is not Twilio's JSON."""
    try:
        error = json.loads(body)
    except ValueError:
        error = None
    if isinstance(error, dict) and error.get("message"):
        code = error.get("code")
        text = f"Twilio refused the request (HTTP {status}, error {code}): {error['message']}"
        if error.get("more_info"):
            text += f" — {error['more_info']}"
    else:
        snippet = body[:200].decode("utf-8", "replace").strip()
        text = f"Twilio refused the request (HTTP {status}): {snippet or 'no reason given'}"
    if status in (401, 403):
        text += f"; check {ACCOUNT_SID_HELP} and the auth token"
    return text
