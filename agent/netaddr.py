"""Addresses and Host names as every listener judges them (the browser server, Twilio's routes,
asr-serve's HTTP endpoint): one rule for what counts as loopback and for reading a Host header,
so no two servers disagree on which requests only this machine can make."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_name(name: str) -> bool:
    """A Host name only this machine resolves to itself: ``localhost``, ``*.localhost``
    (RFC 6761) or a loopback address."""
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def host_name(authority: str) -> str:
    """The host of a Host header or URL authority (``host:port``, ``[v6]:port``), lower case,
    without a trailing dot; "" when it cannot be read."""
    try:
        return (urlsplit("//" + authority.strip()).hostname or "").rstrip(".")
    except ValueError:  # a malformed bracket or port
        return ""
