"""Real-time pacing of a call's playout, sans-I/O: ``tick(now)`` hands back the frames due by
``now`` on an absolute packet-time schedule. Every transport's shell only sleeps, encodes and
sends; the schedule, its catch-up and its one resync rule live here.
"""

from __future__ import annotations

import numpy as np

from agent.frames import SAMPLE_RATE
from agent.playout import Playout

# A tick this much past its oldest deadline gives the missed deadlines up (see ``Pacer``).
RESYNC_AFTER_NS = 200_000_000
# Timers may wake a little early (uvloop's run on whole milliseconds): a deadline this close
# counts as due, so an early wake-up sends its packet instead of spinning until the deadline.
EARLY_NS = 1_000_000


class Pacer:
    """One frame of ``playout`` per packet time of ``ptime_ms``, on an absolute schedule (the
    deadlines never drift with the shell's wake-ups).

    ``tick(now_ns)`` returns one entry per deadline that has come due since the last tick: the
    playout's next ``ptime_ms`` of 16 kHz audio, or None where it had none (the transport sends
    silence there, or nothing). A late tick catches up: every deadline it missed is served at
    once, so the stream stays on its timeline.

    Resync, the one rule for every transport: a tick more than ``RESYNC_AFTER_NS`` (200 ms,
    ten 20-ms packets) past its oldest deadline drops the missed deadlines (``dropped``),
    serves one frame and restarts the clock at ``now``, counting one ``resyncs``. The audio is
    not lost, only later; a listener gets no 200-ms burst after a stall.

    A stretch of agent audio starts the moment it arrives: a tick before its deadline returns
    nothing, unless the last packet time was empty and audio is now waiting — then the
    schedule restarts at ``now``. The first ``lead`` frames of each stretch go out at once
    (a listener's buffer then holds that much ahead of its playhead).

    The frames are views into buffers preallocated here and the list is reused: both are
    valid until the next tick, and a tick allocates nothing.
    """

    def __init__(self, playout: Playout, ptime_ms: int = 20, lead: int = 1) -> None:
        if ptime_ms <= 0 or lead < 1:
            raise ValueError(f"a pacer needs ptime_ms > 0 and lead >= 1, not {ptime_ms}, {lead}")
        self.playout = playout
        self.ptime_ns = ptime_ms * 1_000_000
        self.frame_samples = SAMPLE_RATE * ptime_ms // 1000
        self.lead = lead
        most = (RESYNC_AFTER_NS + EARLY_NS) // self.ptime_ns + lead
        self._buffer = np.zeros((most, self.frame_samples), dtype=np.int16)
        self._rows = list(self._buffer)  # one view per row, made once
        self._out: list[np.ndarray | None] = []
        self._due: int | None = None
        self._talking = False
        self.ticks = 0
        self.late_ticks = 0  # ticks whose oldest deadline was more than one packet time ago
        self.resyncs = 0
        self.dropped = 0  # deadlines given up by resyncs

    @property
    def due_ns(self) -> int | None:
        """The next deadline (None before the first tick)."""
        return self._due

    def delay(self, now_ns: int) -> float:
        """Seconds from ``now_ns`` until the next deadline; 0 when one is due."""
        due = self._due
        return 0.0 if due is None or due <= now_ns else (due - now_ns) / 1e9

    def tick(self, now_ns: int) -> list[np.ndarray | None]:
        out = self._out
        out.clear()
        due = self._due
        if due is None:
            due = now_ns
        elif now_ns < due - EARLY_NS:
            if self._talking or self.playout.queued_samples == 0:
                return out
            due = now_ns  # audio arrived while the pacer was idle: its schedule starts now
        self.ticks += 1
        late = now_ns - due
        if late > self.ptime_ns:
            self.late_ticks += 1
            if late > RESYNC_AFTER_NS:
                self.resyncs += 1
                self.dropped += late // self.ptime_ns
                due = now_ns
        rows, used = self._rows, 0
        pull = self.playout.pull
        while due <= now_ns + EARLY_NS:
            due += self.ptime_ns
            frame = pull(rows[used])
            if frame is None:
                self._talking = False
                out.append(None)
                continue
            used += 1
            out.append(frame)
            if not self._talking:
                self._talking = True
                for _ in range(self.lead - 1):
                    more = pull(rows[used])
                    if more is None:
                        break
                    used += 1
                    out.append(more)
        self._due = due
        return out
