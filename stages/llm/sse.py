"""A sans-I/O parser for Server-Sent Events (the ``text/event-stream`` wire format).

Feed it bytes as they arrive; it returns whole events. It knows nothing of sockets, so the
OpenAI-compatible client is a thin shell around it and the parser is tested on its own.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from agent.errors import VoxlineError

MAX_SIZE = 1 << 20
"""The default bound on one line and on one event's data, in characters (1 Mi)."""

_BREAK = re.compile(r"[\r\n]")


class SSEProtocolError(VoxlineError):
    """The stream broke the parser's bounds (a line or an event's data over ``max_size``):
    the only exception :meth:`SSEParser.feed` and :meth:`SSEParser.close` raise. The stream
    is over; the parser must not be fed again."""


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

    **Cost and memory.** Each character is scanned once: the text after the last line break
    waits in a list of pieces that is joined only when its line ends, so a long line fed in
    small chunks costs what it would in one chunk. ``max_size`` bounds both the unfinished
    line and the data of the event being built (characters, so up to 4 bytes each for UTF-8
    text; with the default 1 Mi that is at most ~8 MiB held per stream at the worst, ~2 MiB
    for ASCII). A stream that passes it raises :class:`SSEProtocolError`: an OpenAI-compatible
    delta is a few hundred bytes, and a server that sends megabytes without a line break is
    broken or hostile, never slow.
    """

    def __init__(self, max_size: int = MAX_SIZE) -> None:
        self.max_size = max_size
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: list[str] = []  # pieces of the line not yet ended by a line break
        self._pending_len = 0
        self._after_cr = False  # the last text ended in CR: a LF starting the next is its CRLF
        self._started = False
        self._data: list[str] = []
        self._data_len = 0
        self._event = ""
        self.last_id = ""
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events that ``chunk`` completes (raises :class:`SSEProtocolError` only)."""
        text = self._decoder.decode(chunk)
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        return self._lines(text)

    def close(self) -> list[SSEEvent]:
        """End of stream: parse a trailing unterminated line and deliver a pending event."""
        self._after_cr = False  # what follows is no CRLF's second half
        events = self._lines(self._decoder.decode(b"", final=True))
        if self._pending:
            events.extend(self._lines("\n"))
        if self._data:
            events.extend(self._lines("\n"))
        return events

    def _lines(self, text: str) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if self._after_cr and text:
            self._after_cr = False
            if text[0] == "\n":
                text = text[1:]  # the second half of a CRLF split between chunks
        start, n = 0, len(text)
        while start < n:
            found = _BREAK.search(text, start)
            if found is None:
                break
            end = found.start()
            line = text[start:end]
            if self._pending:
                self._pending.append(line)
                line = "".join(self._pending)
                self._pending.clear()
                self._pending_len = 0
            if len(line) > self.max_size:
                raise SSEProtocolError(f"an event-stream line of {len(line)} characters is over "
                                       f"the limit of {self.max_size}")
            if text[end] == "\r":
                if end + 1 == n:
                    self._after_cr = True
                    start = n
                else:
                    start = end + 2 if text[end + 1] == "\n" else end + 1
            else:
                start = end + 1
            event = self._line(line)
            if event is not None:
                events.append(event)
        if start < n:
            rest = text[start:]
            self._pending_len += len(rest)
            if self._pending_len > self.max_size:
                raise SSEProtocolError(f"an event-stream line passed the limit of "
                                       f"{self.max_size} characters without a line break")
            self._pending.append(rest)
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
            self._data_len += len(value) + 1
            if self._data_len > self.max_size:
                raise SSEProtocolError(f"an event's data passed the limit of {self.max_size} "
                                       "characters")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():  # not "²"
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._event, self._data_len = [], "", 0
        if not data:
            return None
        return SSEEvent("\n".join(data), event or "message", self.last_id)
