"""The interface every TTS backend implements."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np


class TTS(Protocol):
    """A speech synthesizer. Blocking: the TTS stage calls it on a worker thread."""

    @property
    def sample_rate(self) -> int:
        """The rate of the audio ``synthesize`` yields (the stage resamples it to 16 kHz)."""
        ...

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield int16 mono chunks of ``text`` spoken, as soon as each is ready. The caller may
        stop iterating (and close the iterator) at any chunk to abandon the utterance."""
        ...

    def warmup(self) -> None:
        """Run one short synthesis so the first real one pays no start-up cost."""
        ...
