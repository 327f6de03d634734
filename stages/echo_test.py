"""The echo test: a call that plays the caller's own audio back, as a telephone system's echo-test
number does. An operator dials it to hear a line as the agent hears it (level, noise, codec,
dropouts) and to measure the round trip, with no model involved; a load test uses it to load the
transports, sessions and playout without the models' cost (``benchmarks/soak.py``).

The caller's audio goes back as it came, sample for sample, behind a short jitter buffer
(``delay_ms``): the first ``delay_ms`` are held, then each frame is queued for playout as it
arrives, so the playout always has about ``delay_ms`` in hand and plays one steady stream. The
echo never runs ahead of real time: a caller who sends faster than real time (a burst after a
stall, a client that does not pace) gets at most ``max_backlog_ms`` more than the time elapsed
played back, and what is over is dropped and counted (``dropped_samples``), so the playout
queue stays bounded whatever the caller sends.

No turns, no trace spans: the call's trace holds its start, its end and an ``echo_test``
event with the samples echoed and dropped."""

from __future__ import annotations

import numpy as np

from agent.frames import SAMPLE_RATE, AudioIn, Direction, EndOfCall, Frame, TTSAudio
from agent.stage import DOWN, Stage

DELAY_MS = 200
MAX_BACKLOG_MS = 1000


class EchoTest(Stage):
    name = "echo_test"
    consumes = frozenset({AudioIn, EndOfCall})

    def __init__(self, delay_ms: int = DELAY_MS, max_backlog_ms: int = MAX_BACKLOG_MS) -> None:
        super().__init__()
        if delay_ms < 0 or max_backlog_ms < delay_ms:
            raise ValueError(f"echo test: need 0 <= delay_ms <= max_backlog_ms, got "
                             f"{delay_ms} and {max_backlog_ms}")
        self.delay = delay_ms * SAMPLE_RATE // 1000
        self.max_backlog = max_backlog_ms * SAMPLE_RATE // 1000
        self._held: list[np.ndarray] = []  # the jitter buffer while it fills
        self._held_samples = 0
        self._filling = self.delay > 0
        self._start_ns = 0  # when the first audio began (its arrival less its length)
        self.echoed_samples = 0
        self.dropped_samples = 0
        self._open = False  # agent audio has gone out and its utterance is not closed

    def process(self, frame: Frame, direction: Direction) -> None:
        if direction is DOWN and isinstance(frame, AudioIn):
            self._echo(frame.pcm, frame.t_ns)
            return
        if direction is DOWN and isinstance(frame, EndOfCall):
            if self.ctx.trace is not None:
                self.ctx.trace.call_event("echo_test", echoed_samples=self.echoed_samples,
                                          dropped_samples=self.dropped_samples)
            if self._open:
                self._open = False
                self.push(TTSAudio(np.zeros(0, np.int16), last=True))
        self.push(frame, direction)

    def _echo(self, pcm: np.ndarray, t_ns: int) -> None:
        n = len(pcm)
        if n == 0:
            return
        if not self._start_ns:
            self._start_ns = t_ns - n * 1_000_000_000 // SAMPLE_RATE
        elapsed = (t_ns - self._start_ns) * SAMPLE_RATE // 1_000_000_000
        if self.echoed_samples + self._held_samples + n > elapsed + self.max_backlog:
            self.dropped_samples += n  # faster than real time: the backlog is full
            return
        self._open = True
        if not self._filling:
            self.echoed_samples += n
            self.push(TTSAudio(pcm))
            return
        self._held.append(pcm)
        self._held_samples += n
        if self._held_samples < self.delay:
            return
        self._filling = False
        held, self._held = self._held, []
        self.echoed_samples += self._held_samples
        self._held_samples = 0
        for chunk in held:
            self.push(TTSAudio(chunk))
