"""The TwiML voxline answers Twilio with: the ``<Connect><Stream>`` that connects a call to our
media-stream WebSocket (a bidirectional stream; ``<Start><Stream>`` would be listen-only), the
busy ``<Reject>``, and the ``<Dial>`` that hands a call to someone else."""

from __future__ import annotations

import re
from collections.abc import Mapping
from xml.sax.saxutils import escape, quoteattr

XML_HEAD = '<?xml version="1.0" encoding="UTF-8"?>'

# E.164: a plus, a country code that does not start with 0, at most 15 digits in all
_E164 = re.compile(r"\+[1-9][0-9]{1,14}")
# what people and models write inside a number: "+1 (415) 555-0100", "+44.20.7946.0000"
_NUMBER_PUNCTUATION = re.compile(r"[\s().\-]")
# sip:user@host[:port][;params]: nothing that needs quoting in a URI, and one @
_SIP_URI = re.compile(r"sips?:[^\s@<>\"'{}|\\^`]+@[^\s@<>\"'{}|\\^`]+", re.IGNORECASE)
# Twilio: a client identifier of up to 256 characters, no space, delimiter or unwise character
_CLIENT = re.compile(r"[A-Za-z0-9_.@\-]{1,256}")
TARGET_HELP = ("a phone number in E.164 (+14155550100), a SIP URI (sip:alice@pbx.example.com) "
               "or a Twilio client (client:alice)")


def connect_stream_twiml(
    stream_url: str,
    parameters: Mapping[str, str] | None = None,
    then_url: str = "",
    then_method: str = "POST",
) -> str:
    """``<Response><Connect><Stream url=…/></Connect></Response>`` for ``wss://…`` ``stream_url``;
    ``parameters`` reach the bot as the start message's ``customParameters``.

    ``then_url``: a ``<Redirect>`` after the ``<Connect>``, which Twilio follows when the stream
    ends (we closed it): its answer decides what the call does next (a transfer's ``<Dial>``,
    else ``<Hangup/>``). The caller hanging up ends the call and never gets there.
    """
    if not stream_url.startswith(("wss://", "ws://")):
        raise ValueError(f"stream URL must be ws:// or wss:// (Twilio needs wss://), got {stream_url!r}")
    if then_method not in ("GET", "POST"):
        raise ValueError(f"a <Redirect> method is GET or POST, got {then_method!r}")
    params = "".join(
        f"<Parameter name={quoteattr(k)} value={quoteattr(v)}/>"
        for k, v in (parameters or {}).items()
    )
    stream = f"<Stream url={quoteattr(stream_url)}/>" if not params else (
        f"<Stream url={quoteattr(stream_url)}>{params}</Stream>"
    )
    then = (f'<Redirect method="{then_method}">{escape(then_url)}</Redirect>'
            if then_url else "")
    return f"{XML_HEAD}<Response><Connect>{stream}</Connect>{then}</Response>"


def reject_twiml(reason: str = "busy") -> str:
    """``<Response><Reject reason=…/></Response>``: the caller hears a busy tone (``busy``) or a
    not-in-service message (``rejected``), and the call is never answered nor billed."""
    if reason not in ("busy", "rejected"):
        raise ValueError(f"Twilio's <Reject> reason is 'busy' or 'rejected', got {reason!r}")
    return f'{XML_HEAD}<Response><Reject reason="{reason}"/></Response>'


def hangup_twiml() -> str:
    return f"{XML_HEAD}<Response><Hangup/></Response>"


def dial_noun(target: str) -> str:
    """The ``<Dial>`` noun that reaches ``target`` (see :data:`TARGET_HELP`), escaped; raises
    ValueError, saying what a target looks like, for anything else.

    A number may carry spaces, dots, dashes and brackets (they are dropped) and a ``tel:``
    prefix; a SIP URI goes in ``<Sip>``; ``client:NAME`` in ``<Client>``.
    """
    text = target.strip()
    lower = text.lower()
    if lower.startswith(("sip:", "sips:")):
        if len(text) > 255 or not _SIP_URI.fullmatch(text):
            raise ValueError(f"not a SIP URI Twilio can dial: {target[:80]!r}; use {TARGET_HELP}")
        return f"<Sip>{escape(text)}</Sip>"
    if lower.startswith("client:"):
        name = text[len("client:"):].strip()
        if not _CLIENT.fullmatch(name):
            raise ValueError(f"not a Twilio client name: {target[:80]!r} (letters, digits, "
                             f"_ . @ - only); use {TARGET_HELP}")
        return f"<Client>{escape(name)}</Client>"
    if lower.startswith("tel:"):
        text = text[len("tel:"):]
    number = _NUMBER_PUNCTUATION.sub("", text)
    if not _E164.fullmatch(number):
        raise ValueError(f"not a transfer target: {target[:80]!r}; use {TARGET_HELP}")
    return f"<Number>{number}</Number>"


def dial_twiml(target: str) -> str:
    """``<Response><Dial>…</Dial></Response>``: the call goes to ``target`` (:func:`dial_noun`)
    and ends when that leg does."""
    return f"{XML_HEAD}<Response><Dial>{dial_noun(target)}</Dial></Response>"
