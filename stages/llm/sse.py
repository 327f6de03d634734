"""A sans-I/O parser for Server-Sent Events (the ``text/event-stream`` wire format).

Feed it bytes as they arrive; it returns whole events. It knows nothing of sockets, so the
OpenAI-compatible client is a thin shell around it and the parser is tested on its own.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str = ""


class SSEParser:
    """The WHATWG event-stream grammar: lines end in CRLF, LF or CR; a blank line dispatches
    the event; ``:`` starts a comment (servers send them as keep-alives); multiple ``data``
    lines join with newlines; a line without a colon is a field with an empty value.

    One leniency: :meth:`close` delivers a last event whose blank line never came, because
    some servers close the connection right after their final ``data`` line.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # text not yet ended by a line break
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self.last_id = ""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        text = self._decoder.decode(chunk)
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        return self._lines(self._pending + text)

    def close(self) -> list[SSEEvent]:
        """End of stream: parse a trailing unterminated line and deliver a pending event."""
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        events = self._lines(text + "\n") if text else []
        if self._data:
            events.extend(self._lines("\n"))
        return events

    def _lines(self, text: str) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        start = 0
        n = len(text)
        while True:
            cr = text.find("\r", start)
            lf = text.find("\n", start)
            if cr < 0 and lf < 0:
                break
            end = min(x for x in (cr, lf) if x >= 0)
            if end == cr:
                if end + 1 == n:
                    break  # a lone CR at the end may be the first half of CRLF
                nxt = end + 2 if text[end + 1] == "\n" else end + 1
            else:
                nxt = end + 1
            event = self._line(text[start:end])
            if event is not None:
                events.append(event)
            start = nxt
        self._pending = text[start:]
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SSEEvent("\n".join(data), event or "message", self.last_id)
