"""A token bucket, sans-I/O: the caller passes the time. Used to hold a caller's audio to real
time (a client that pushes an hour of audio in seconds would take the event loop's VAD time from
every other call) and anything else a client may do at most so often — such as a SIP source's
new INVITEs (:class:`InviteRateLimit`)."""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; it starts full."""

    __slots__ = ("rate", "burst", "_tokens", "_last")

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a token bucket needs rate > 0 and burst > 0, got {rate}, {burst}")
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._last: float | None = None

    def take(self, now_s: float, amount: float = 1.0) -> bool:
        """Spend ``amount`` tokens at ``now_s`` (seconds, monotonic) if there are that many."""
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now_s - self._last) * self.rate)
        self._last = now_s
        if self._tokens < amount - 1e-9:  # (sums of 0.02 s fall a hair short)
            return False
        self._tokens -= amount
        return True


# A live caller sends audio in real time; jitter and a network stall that is then caught up
# send bursts. Allowed: 2 s of audio at once, then real time with 25% slack. Beyond, frames are
# dropped (and counted), never queued.
AUDIO_BURST_S = 2.0
AUDIO_SLACK = 1.25


def audio_bucket(frame_s: float, burst_s: float = AUDIO_BURST_S) -> TokenBucket:
    """A bucket that counts frames of ``frame_s`` seconds of caller audio each."""
    return TokenBucket(AUDIO_SLACK / frame_s, burst_s / frame_s)


# --- per source: SIP's INVITEs ------------------------------------------------------------------
# Per-source token buckets for new INVITEs, sans-I/O: ``allow(source, now)`` spends a token
# of that source's bucket or says how long until one is back.
#
# A bucket holds ``burst`` tokens and refills at ``rate`` per second, so a source may open
# ``burst`` calls at once and ``rate`` a second after that. Sources are IP addresses (an IPv6
# caller by its /64, which one host or one home network usually holds whole); the table keeps
# at most ``max_sources`` of them, forgetting the least recently seen first, so a flood from
# spoofed addresses costs a bounded ~200 bytes a source (4,096 sources: under 1 MB).


def source_key(host: str) -> str:
    """What a rate limit counts a packet's source host as (see above)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class InviteRateLimit:
    """``rate`` tokens a second, ``burst`` at most, per source; ``rate <= 0`` allows all."""

    def __init__(self, rate: float = 10.0, burst: int = 20, max_sources: int = 4096) -> None:
        if rate > 0 and burst < 1:
            raise ValueError("an INVITE rate limit needs a burst of at least 1")
        self.rate = rate
        self.burst = burst
        self.max_sources = max_sources
        self.refused = 0
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, t)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def allow(self, source: str, now: float) -> float:
        """0.0 when ``source`` may send this INVITE (a token is spent); else the seconds until
        its next token, for a Retry-After."""
        if self.rate <= 0:
            return 0.0
        key = source_key(source)
        tokens, then = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - then) * self.rate)
        if tokens >= 1.0:
            tokens -= 1.0
            wait = 0.0
        else:
            self.refused += 1
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)  # most recently seen last
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return wait

    @staticmethod
    def retry_after(wait: float) -> int:
        """A Retry-After header's whole seconds for ``wait`` (at least 1)."""
        return max(1, math.ceil(wait))
