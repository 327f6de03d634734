"""Twilio's request signature (``X-Twilio-Signature``), sans-I/O: base64 of the HMAC-SHA1, keyed
with the account's auth token, of the full URL Twilio called followed by every POST parameter's
name and value, sorted by name. Twilio signs its webhooks and the media-stream WebSocket upgrade.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

SIGNATURE_HEADER = "X-Twilio-Signature"

_DEFAULT_PORTS = {"https": 443, "wss": 443, "http": 80, "ws": 80}


def twilio_signature(auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> str:
    """The signature Twilio sends for a request to ``url`` with the form ``params``.

    Parameters are sorted by name (case-sensitive, as Twilio does) and, for a repeated name, by
    value — the order of Twilio's own helper libraries. A GET request has no parameters here:
    its query string is part of ``url``.
    """
    data = url + "".join(name + value for name, value in sorted(params))
    mac = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode()


def signature_matches(
    auth_token: str, signature: str, url: str, params: Iterable[tuple[str, str]] = ()
) -> bool:
    """Whether ``signature`` is Twilio's for ``url`` and ``params``, compared in constant time.

    Twilio is not consistent about the default port (``https://host/…`` or
    ``https://host:443/…``), so, like its helper libraries, both spellings are accepted.
    """
    if not auth_token or not signature:
        return False
    pairs = list(params)
    given = signature.strip().encode()
    ok = False
    for candidate in _port_spellings(url):
        # no early exit: every spelling costs the same, whichever matched
        ok |= hmac.compare_digest(twilio_signature(auth_token, candidate, pairs).encode(), given)
    return ok


def _port_spellings(url: str) -> list[str]:
    """``url`` as given, plus the same URL with its default port added or removed."""
    parts = urlsplit(url)
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None or not parts.hostname:
        return [url]
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: nothing to respell
        return [url]
    host = parts.netloc.rsplit("@", 1)[-1]
    userinfo = parts.netloc[: len(parts.netloc) - len(host)]
    if port is None:
        other = f"{userinfo}{host}:{default}"
    elif port == default:
        other = userinfo + host.rsplit(":", 1)[0]
    else:
        return [url]
    return [url, urlunsplit(parts._replace(netloc=other))]
