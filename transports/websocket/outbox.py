"""The bounded send queue of one WebSocket client.

A client that reads slower than real time must not make the server buffer without bound.
Audio beyond ``max_audio`` queued frames is dropped and counted (at 640 bytes a frame the
default 25 frames hold 16 KB and 500 ms); events beyond ``max_events`` are dropped and counted
too (256 events of at most a few KB each). Message order is kept.
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

    def __len__(self) -> int:
        return len(self._items)

    def put_audio(self, data: bytes) -> bool:
        if self._audio >= self.max_audio:
            self.dropped_audio += 1
            return False
        self._audio += 1
        self._items.append(data)
        self._ready.set()
        return True

    def put_event(self, text: str) -> bool:
        if self._events >= self.max_events:
            self.dropped_events += 1
            return False
        self._events += 1
        self._items.append(text)
        self._ready.set()
        return True

    async def get(self) -> bytes | str:
        """The oldest queued message; waits while there is none."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, bytes):
            self._audio -= 1
        else:
            self._events -= 1
        return item
