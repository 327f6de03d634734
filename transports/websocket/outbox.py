"""The bounded send queue of one WebSocket client.

A client that reads slower than real time must not make the server buffer without bound.
Audio beyond ``max_audio`` queued frames is dropped and counted (at 640 bytes a frame the
default 25 frames hold 16 KB and 500 ms); events beyond ``max_events`` are dropped and counted
too (256 events of at most a few KB each). Message order is kept. A closed outbox takes nothing
more and hands out what it holds, then None: the writer knows it has sent the last message.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Outbox:
    def __init__(self, max_audio: int = 25, max_events: int = 256) -> None:
        self.max_audio = max_audio
        self.max_events = max_events
        self._items: deque[bytes | str] = deque()
        self._audio = 0
        self._events = 0
        self._ready = asyncio.Event()
        self.dropped_audio = 0
        self.dropped_events = 0
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_audio(self, data: bytes) -> bool:
        if self.closed:
            return False
        if self._audio >= self.max_audio:
            self.dropped_audio += 1
            return False
        self._audio += 1
        self._items.append(data)
        self._ready.set()
        return True

    def put_event(self, text: str) -> bool:
        if self.closed:
            return False
        if self._events >= self.max_events:
            self.dropped_events += 1
            return False
        self._events += 1
        self._items.append(text)
        self._ready.set()
        return True

    def close(self) -> None:
        """Take no more messages; ``get`` returns None once the queued ones are out."""
        self.closed = True
        self._ready.set()

    async def get(self) -> bytes | str | None:
        """The oldest queued message; waits while there is none (None: closed and empty)."""
        while not self._items:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, bytes):
            self._audio -= 1
        else:
            self._events -= 1
        return item
