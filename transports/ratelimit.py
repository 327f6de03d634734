"""A token bucket, sans-I/O: the caller passes the time. Used to hold a caller's audio to real
time (a client that pushes an hour of audio in seconds would take the event loop's VAD time from
every other call) and anything else a client may do at most so often."""

from __future__ import annotations


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
