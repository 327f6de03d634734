"""What the core asks of a server-side echo canceller: the playout reports the agent's audio as
it is played out, the session cleans the caller's audio before any stage hears it. The one
implementation is ``stages.echo.EchoGuard``; the composition root picks it, the core never
imports it."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class EchoCanceller(Protocol):
    def played(self, pcm: np.ndarray | None, samples: int) -> None:
        """``samples`` of agent audio left for the caller: ``pcm`` (int16 16 kHz, ``samples``
        long), or None where nothing played (silence, after a barge-in cut too)."""
        ...

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """The caller's audio (int16 16 kHz) with the agent's echo removed, as many samples."""
        ...

    def close(self) -> None:
        """The call ended: release the canceller's state now (a session is freed only when the
        cyclic garbage collector gets to it); ``process`` passes audio through after."""
        ...
