"""A reordering jitter buffer for one inbound RTP stream, keyed by sequence number.

In-order packets leave at once (no added delay on a clean link). A gap holds later packets back
until the missing one arrives or ``depth`` packets are waiting; then the gap is declared lost and
``None`` stands in for each missing packet, so the receiver can conceal it and keep its media
clock. Packets older than what already left are late; repeats of what already left are duplicates; both are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class JitterStats:
    received: int = 0
    released: int = 0
    lost: int = 0
    late: int = 0
    duplicate: int = 0
    reordered: int = 0


class JitterBuffer:
    """``push(sequence, payload)`` returns the payloads now ready, in order (``None`` = lost)."""

    def __init__(self, depth: int = 4, max_gap: int = 50) -> None:
        self.depth = depth
        self.max_gap = max_gap  # a jump this large is a new stream, not loss
        self.stats = JitterStats()
        self._next: int | None = None  # extended sequence number expected next
        self._held: dict[int, bytes] = {}
        self._given_up: set[int] = set()  # recent numbers declared lost (late if they show up)

    def _extend(self, seq: int) -> int:
        """16-bit sequence → extended (wrap-aware) number nearest the one expected."""
        assert self._next is not None
        base = self._next
        ext = (base & ~0xFFFF) | seq
        if ext - base > 0x8000:
            ext -= 0x10000
        elif base - ext > 0x8000:
            ext += 0x10000
        return ext

    def push(self, seq: int, payload: bytes) -> list[bytes | None]:
        st = self.stats
        st.received += 1
        if self._next is None:
            self._next = seq
        ext = self._extend(seq)
        if ext < self._next:
            if ext in self._given_up:
                st.late += 1
            else:
                st.duplicate += 1  # it already left once
            return []
        if ext in self._held:
            st.duplicate += 1
            return []
        if ext - self._next > self.max_gap:
            # the sender restarted its numbering: flush what we hold and follow it
            out: list[bytes | None] = [self._held[k] for k in sorted(self._held)]
            st.released += len(out)
            self._held.clear()
            self._next = ext
        else:
            out = []
        if ext == self._next and self._held:
            st.reordered += 1  # it fills a hole that later packets already sat behind
        self._held[ext] = payload
        out.extend(self._release())
        return out

    def _release(self) -> list[bytes | None]:
        st = self.stats
        out: list[bytes | None] = []
        assert self._next is not None
        while self._held:
            if self._next in self._held:
                out.append(self._held.pop(self._next))
                st.released += 1
                self._next += 1
            elif len(self._held) >= self.depth:
                first = min(self._held)
                self._declare_lost(first)
                out.extend([None] * (first - self._next))
                self._next = first
            else:
                break
        return out

    def _declare_lost(self, upto: int) -> None:
        assert self._next is not None
        self.stats.lost += upto - self._next
        if len(self._given_up) > 256:  # only recent losses can still turn up late
            self._given_up.clear()
        self._given_up.update(range(self._next, upto))

    def flush(self) -> list[bytes | None]:
        """End of stream: everything held, gaps as ``None``."""
        out: list[bytes | None] = []
        while self._held:
            assert self._next is not None
            first = min(self._held)
            self._declare_lost(first)
            out.extend([None] * (first - self._next))
            out.append(self._held.pop(first))
            self.stats.released += 1
            self._next = first + 1
        return out
