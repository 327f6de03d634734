"""The TwiML that connects a Twilio call to our media-stream WebSocket (a bidirectional
``<Connect><Stream>``; ``<Start><Stream>`` would be listen-only), or turns it away busy."""

from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import quoteattr


def connect_stream_twiml(stream_url: str, parameters: Mapping[str, str] | None = None) -> str:
    """``<Response><Connect><Stream url=…/></Connect></Response>`` for ``wss://…`` ``stream_url``;
    ``parameters`` reach the bot as the start message's ``customParameters``."""
    if not stream_url.startswith(("wss://", "ws://")):
        raise ValueError(f"stream URL must be ws:// or wss:// (Twilio needs wss://), got {stream_url!r}")
    params = "".join(
        f"<Parameter name={quoteattr(k)} value={quoteattr(v)}/>"
        for k, v in (parameters or {}).items()
    )
    stream = f"<Stream url={quoteattr(stream_url)}/>" if not params else (
        f"<Stream url={quoteattr(stream_url)}>{params}</Stream>"
    )
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect>{stream}</Connect></Response>'


def reject_twiml(reason: str = "busy") -> str:
    """``<Response><Reject reason=…/></Response>``: the caller hears a busy tone (``busy``) or a
    not-in-service message (``rejected``), and the call is never answered nor billed."""
    if reason not in ("busy", "rejected"):
        raise ValueError(f"Twilio's <Reject> reason is 'busy' or 'rejected', got {reason!r}")
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Reject reason="{reason}"/></Response>'
