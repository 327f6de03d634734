"""Call authorisation for the browser routes: a shared token, required unless the server is
bound to loopback with no public URL (where only this host can reach it)."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping

from agent.netaddr import is_loopback

TOKEN_PARAM = "token"
TOKEN_HEADER = "X-Voxline-Token"


class TokenAuth:
    """``token`` empty means no check. A request passes with ``?token=…``, the ``X-Voxline-Token``
    header or ``Authorization: Bearer …`` (browsers cannot set headers on a WebSocket, hence the
    query parameter)."""

    def __init__(self, token: str = "") -> None:
        self.token = token

    @classmethod
    def for_host(cls, host: str, token: str = "", public: bool = False) -> TokenAuth:
        """No token on loopback unless one is given; elsewhere the given one or a fresh one.
        ``public``: the server has a public URL (a tunnel, a reverse proxy), so it is reachable
        from anywhere whatever it is bound to."""
        if token or (is_loopback(host) and not public):
            return cls(token)
        return cls(secrets.token_urlsafe(18))

    @property
    def required(self) -> bool:
        return bool(self.token)

    def allows(self, query: Mapping[str, str], headers: Mapping[str, str]) -> bool:
        if not self.token:
            return True
        given = query.get(TOKEN_PARAM) or headers.get(TOKEN_HEADER) or ""
        if not given:
            scheme, _, value = headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer":
                given = value.strip()
        try:
            presented = given.encode()
        except UnicodeEncodeError:  # header bytes that were not UTF-8 (aiohttp escapes them)
            return False
        return hmac.compare_digest(presented, self.token.encode())
