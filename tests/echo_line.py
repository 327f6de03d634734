"""A line that brings the agent's voice back into the caller's channel, as a speakerphone in a
room does: a synthetic room impulse response (decaying noise) after a delay, a few dB under the
agent. Sans-I/O and causal: ``played`` what the agent played, ``echo`` the next caller samples'
worth of it. The echo guard's tests and ``benchmarks/echo_guard.py`` share it."""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16_000


def room_response(seed: int, seconds: float = 0.2, gain_db: float = -6.0) -> np.ndarray:
    """Decaying noise, 60 dB down after ``seconds``, scaled so speech through it comes out about
    ``gain_db`` under the original (unit energy times the gain)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    tau = seconds / np.log(1000.0)  # amplitude e-folding time of a 60 dB decay
    h = rng.standard_normal(n) * np.exp(-np.arange(n) / (tau * SAMPLE_RATE))
    return h / np.sqrt(np.sum(h * h)) * 10 ** (gain_db / 20)


class EchoLine:
    """The agent's played audio, delayed by ``delay_ms`` and through ``response``, summed into a
    ring that the caller side reads in order. The far end plays what it is given as one
    continuous stream, as a phone's jitter buffer does: a chunk starts where the last one
    ended, or now (``echo`` has been read up to there) if that has passed — the buffer ran dry
    and played silence meanwhile. Its echo starts ``delay`` after that."""

    RING = 1 << 16

    def __init__(self, delay_ms: float, response: np.ndarray) -> None:
        self.delay = int(delay_ms * SAMPLE_RATE / 1000)
        self.h = np.asarray(response, np.float64)
        self._acc = np.zeros(self.RING)
        self._next = 0  # caller sample where the next played chunk starts
        self._heard = 0
        self._spectra: dict[int, tuple[int, np.ndarray]] = {}

    def played(self, pcm: np.ndarray | None, samples: int) -> None:
        at = max(self._next, self._heard)
        if pcm is not None and np.any(pcm):
            echo = self._convolve(np.asarray(pcm, np.float64))
            start = (at + self.delay) % self.RING
            first = min(len(echo), self.RING - start)
            self._acc[start : start + first] += echo[:first]
            self._acc[: len(echo) - first] += echo[first:]
        self._next = at + (samples if pcm is None else len(pcm))

    def echo(self, samples: int) -> np.ndarray:
        """The next ``samples`` of echo in the caller's channel (float, int16 scale)."""
        start = self._heard % self.RING
        idx = (start + np.arange(samples)) % self.RING
        out = self._acc[idx]
        self._acc[idx] = 0.0
        self._heard += samples
        return out

    def _convolve(self, x: np.ndarray) -> np.ndarray:
        n = len(x) + len(self.h) - 1
        nfft, spectrum = self._spectra.get(len(x), (0, None))  # type: ignore[assignment]
        if spectrum is None:
            nfft = 1 << (n - 1).bit_length()
            spectrum = np.fft.rfft(self.h, nfft)
            self._spectra[len(x)] = (nfft, spectrum)
        return np.fft.irfft(np.fft.rfft(x, nfft) * spectrum, nfft)[:n]


def to_int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), -32768, 32767).astype(np.int16)
