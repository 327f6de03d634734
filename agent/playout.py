"""The agent's side of a call as a transport plays it: a queue of agent audio pulled one 20 ms
frame per tick, flushed at once on barge-in.

Every real-time transport pulls it through one :class:`~agent.pacer.Pacer`, which writes each
frame into a buffer it preallocated; the file transport pulls it per input frame. The playout
tells the pipeline when the agent starts and stops speaking (upstream
control frames) and stamps the trace's ``audio_out`` event when the first agent audio of a turn
actually leaves.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from agent.echo import EchoCanceller
from agent.frames import (
    FRAME_SAMPLES,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Frame,
    Interrupt,
    PausePlayout,
    ResumePlayout,
    TTSAudio,
)
from agent.trace import Trace


class PlayedSink(Protocol):
    def played(self, pcm: np.ndarray | None, samples: int) -> None:
        """``samples`` of agent audio handed to the transport (None: as long a silence)."""
        ...


class Playout:
    """Agent audio waiting to be sent, in 16 kHz int16; ``pull`` hands out fixed-size frames.

    ``max_seconds`` bounds the queue: agent audio beyond it is dropped and counted (a TTS that
    runs far ahead of real time must not grow memory without bound).

    ``echo``, a server-side echo canceller, hears every pull as the caller's line played it:
    the frame, or as long a silence when there was none (quiet, paused or flushed); so does
    ``recorder`` (:class:`agent.recording.CallRecorder`), for the agent's side of the recording.
    """

    def __init__(
        self,
        upstream: Callable[[Frame], None],
        trace: Trace | None = None,
        frame_samples: int = FRAME_SAMPLES,
        max_seconds: float = 120.0,
        echo: EchoCanceller | None = None,
        recorder: PlayedSink | None = None,
    ) -> None:
        self._upstream = upstream
        self.echo = echo
        # who hears each pull (the echo guard's reference, the recording's agent channel)
        self._played = tuple(x for x in (echo, recorder) if x is not None)
        self.trace = trace
        self.frame_samples = frame_samples
        self._chunks: deque[np.ndarray] = deque()
        self._head = 0  # read position inside _chunks[0]
        self._queued = 0
        self._max = int(max_seconds * 16_000)
        self._utterance_open = False  # a TTS utterance still has chunks to come
        self.speaking = False
        self.dropped_samples = 0
        self.frames_out = 0
        self.interruptions = 0
        self.pauses = 0
        self.paused = False  # a tentative barge-in: nothing is sent, nothing is dropped
        # Called when audio arrives while nothing is queued, so a paced transport can send it
        # at once instead of at its next tick.
        self.on_ready: Callable[[], None] | None = None

    @property
    def queued_samples(self) -> int:
        return self._queued

    @property
    def idle(self) -> bool:
        return not self.speaking and self._queued == 0 and not self._utterance_open

    def on_frame(self, frame: Frame) -> None:
        """Feed the frames leaving the pipeline; returns nothing, ignores what isn't audio."""
        if isinstance(frame, TTSAudio):
            self.write(frame.pcm, last=frame.last)
        elif isinstance(frame, Interrupt):
            self.flush()
        elif isinstance(frame, PausePlayout):
            self.pause()
        elif isinstance(frame, ResumePlayout):
            self.resume()

    def pause(self) -> None:
        """Tentative barge-in: stop sending within one frame, but keep the queue and its place."""
        if self.paused:
            return
        self.paused = True
        self.pauses += 1
        if self.speaking:
            self.speaking = False
            self._upstream(BotStoppedSpeaking(interrupted=True))

    def resume(self) -> None:
        """A false barge-in: go on from where :meth:`pause` stopped (the next pull sends)."""
        if not self.paused:
            return
        self.paused = False
        if self._queued and self.on_ready is not None:
            self.on_ready()

    def write(self, pcm: np.ndarray, last: bool = False) -> None:
        self._utterance_open = not last
        n = len(pcm)
        if n == 0:
            return
        room = self._max - self._queued
        if n > room:
            self.dropped_samples += n - max(room, 0)
            pcm = pcm[: max(room, 0)]
            n = len(pcm)
            if n == 0:
                return
        was_empty = self._queued == 0
        self._chunks.append(pcm)
        self._queued += n
        if was_empty and self.on_ready is not None:
            self.on_ready()

    def flush(self) -> None:
        """Barge-in: drop every queued sample now; the agent stops within one frame."""
        self.paused = False
        self._chunks.clear()
        self._head = 0
        self._queued = 0
        self._utterance_open = False
        if self.speaking:
            self.interruptions += 1
            self.speaking = False
            self._upstream(BotStoppedSpeaking(interrupted=True))

    def pull(self, out: np.ndarray | None = None) -> np.ndarray | None:
        """The next frame of agent audio (zero-padded at the end), or None when there is none.

        With ``out`` the frame is ``len(out)`` samples written into ``out`` (nothing allocated);
        without, a new array of ``frame_samples``. Nothing while paused."""
        if self.paused:
            self._nothing(out)
            return None
        if self._queued == 0:
            if self.speaking and not self._utterance_open:
                self.speaking = False
                self._upstream(BotStoppedSpeaking())
            self._nothing(out)
            return None
        if out is None:
            out = np.empty(self.frame_samples, dtype=np.int16)
        n = len(out)
        filled = 0
        while filled < n and self._chunks:
            chunk = self._chunks[0]
            take = min(n - filled, len(chunk) - self._head)
            out[filled : filled + take] = chunk[self._head : self._head + take]
            filled += take
            self._head += take
            if self._head >= len(chunk):
                self._chunks.popleft()
                self._head = 0
        if filled < n:
            out[filled:] = 0
        self._queued -= filled
        if not self.speaking:
            self.speaking = True
            self._upstream(BotStartedSpeaking())
        self.frames_out += 1
        for sink in self._played:
            sink.played(out, n)
        return out

    def _nothing(self, out: np.ndarray | None) -> None:
        """No agent audio for this pull: the echo reference gets as long a silence."""
        for sink in self._played:
            sink.played(None, self.frame_samples if out is None else len(out))

    def sent(self, t_ns: int | None = None) -> None:
        """The transport has put the last pulled frame on the wire."""
        if self.trace is not None:
            self.trace.event("audio_out", t_ns if t_ns is not None else time.monotonic_ns())
