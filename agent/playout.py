"""The agent's side of a call as a transport plays it: a queue of agent audio pulled one 20 ms
frame per tick, flushed at once on barge-in.

Every real-time transport pulls it through one :class:`~agent.pacer.Pacer`, which writes each
frame into a buffer it preallocated; the file transport pulls it per input frame. The playout
tells the pipeline when the agent starts and stops speaking (upstream
control frames) and stamps the trace's ``audio_out`` event when the first agent audio of a turn
actually leaves.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from agent.echo import EchoCanceller
from agent.frames import (
    FRAME_SAMPLES,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Frame,
    HeardText,
    Interrupt,
    PausePlayout,
    ResumePlayout,
    TextToSpeak,
    TTSAudio,
)
from agent.trace import Trace


class PlayedSink(Protocol):
    def played(self, pcm: np.ndarray | None, samples: int) -> None:
        """``samples`` of agent audio handed to the transport (None: as long a silence)."""
        ...


# How long a text takes to say, per character, before the call has measured its voice (Piper's
# voices speak 13-16 characters a second): the length of a text whose audio is still arriving.
SAMPLES_PER_CHAR = 1_100
LEDGER_MAX = 256  # texts remembered at most (a reply is a few of them)


@dataclass(slots=True)
class _Said:
    """One text the TTS spoke, and where its audio lies in the playout's timeline of samples."""

    reply: int
    text: str
    start: int
    end: int  # grows while its audio arrives
    complete: bool = False  # its last chunk came


def heard_part(text: str, played: int, total: int) -> str:
    """The words of ``text`` whose audio reached the caller when ``played`` of its ``total``
    samples did, where the TTS gives no word timing: the text is taken to be spoken at an even
    pace through its audio, and a word counts once all of it has played."""
    if played <= 0 or total <= 0:
        return ""
    if played >= total:
        return text.strip()
    upto = len(text) * played / total
    words = [m.end() for m in re.finditer(r"\S+", text) if m.end() <= upto]
    return text[: words[-1]].strip() if words else ""


class Playout:
    """Agent audio waiting to be sent, in 16 kHz int16; ``pull`` hands out fixed-size frames.

    ``max_seconds`` bounds the queue: agent audio beyond it is dropped and counted (a TTS that
    runs far ahead of real time must not grow memory without bound).

    ``echo``, a server-side echo canceller, hears every pull as the caller's line played it:
    the frame, or as long a silence when there was none (quiet, paused or flushed); so does
    ``recorder`` (:class:`agent.recording.CallRecorder`), for the agent's side of the recording.

    **What the caller heard.** The playout keeps a ledger of the texts it plays (each
    ``TextToSpeak`` the TTS passes on before its audio, with that text's audio as it arrives), on
    one timeline of samples. When a barge-in flushes the queue it reports upstream, as a
    :class:`~agent.frames.HeardText`, how much of each agent message (``TextToSpeak.reply``) was
    heard: whole texts, then the words of the cut one in proportion to its played audio
    (:func:`heard_part`). By default a sample is heard once pulled (the transport sends what it
    pulls, paced in real time). A transport whose far end confirms playback (Twilio's marks)
    sets ``confirmed_heard``: then it reports the confirmed position (``confirm``, from
    :attr:`pulled_samples` at the time of the mark) and, after a flush, :meth:`settle` once
    the far end has said what it dropped.
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
        # the texts being played and where their audio lies (see "What the caller heard")
        self._said: deque[_Said] = deque()
        self._written = 0  # samples queued so far, on the ledger's timeline
        self._pulled = 0  # samples pulled so far
        self._heard = 0  # samples known to have reached the caller
        self._newest = 0  # the highest message key that reached the playout
        self._voice_samples = 0  # of complete texts: their audio and their characters,
        self._voice_chars = 0  # the call's voice's pace
        self.confirmed_heard = False
        # Gaps: a reply's audio ran out before its next text's audio came (the LLM or the TTS
        # fell behind the voice); counted when the reply's audio resumes.
        self.gaps = 0
        self.gap_samples = 0
        self._dry_reply = 0  # the reply whose audio ran out, while more of it may come
        self._dry_samples = 0
        self._cut: tuple[list[_Said], int] | None = None  # a flush waiting for settle()
        # Called when audio arrives while nothing is queued, so a paced transport can send it
        # at once instead of at its next tick.
        self.on_ready: Callable[[], None] | None = None

    @property
    def queued_samples(self) -> int:
        return self._queued

    def lead_samples(self, reply: int) -> int:
        """Agent samples queued ahead of the caller now; where message ``reply``'s audio ran out
        and more of it is awaited, minus the silence heard since (the gap its next audio ends)."""
        if reply and self._queued == 0 and self._dry_reply == reply:
            return -self._dry_samples
        return self._queued

    @property
    def idle(self) -> bool:
        return not self.speaking and self._queued == 0 and not self._utterance_open

    def on_frame(self, frame: Frame) -> None:
        """Feed the frames leaving the pipeline; returns nothing, ignores what isn't audio."""
        if isinstance(frame, TTSAudio):
            self.write(frame.pcm, last=frame.last)
        elif isinstance(frame, TextToSpeak):
            self.begin_text(frame.text, frame.reply)
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
        self._dry_reply = 0
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

    # --- the ledger ----------------------------------------------------------------------------
    @property
    def pulled_samples(self) -> int:
        """Agent samples pulled so far: a position on the ledger's timeline (for ``confirm``)."""
        return self._pulled

    def begin_text(self, text: str, reply: int = 0) -> None:
        """The TTS starts speaking ``text`` (of agent message ``reply``): its audio follows."""
        said = self._said
        if said and not said[-1].complete:
            said[-1].complete = True  # (an utterance closed without its last chunk)
        if reply:
            self._newest = max(self._newest, reply)
        if reply != self._dry_reply:
            self._dry_reply = 0  # another message follows: a pause between replies, no gap
        said.append(_Said(reply, text, self._written, self._written))
        # Forget texts heard whole that belong to an earlier message than the newest one.
        while len(said) > 1 and (
            len(said) > LEDGER_MAX
            or (said[0].complete and said[0].end <= self._heard and said[0].reply != said[-1].reply)
        ):
            said.popleft()

    def confirm(self, position: int) -> None:
        """``confirmed_heard``: the caller has heard the agent's audio up to ``position``."""
        self._heard = max(self._heard, min(position, self._pulled))

    def settle(self) -> None:
        """``confirmed_heard``: after a flush, the far end has reported what it played (or the
        wait for it ran out): say what was heard."""
        if self._cut is not None:
            said, _ = self._cut
            self._cut = None
            self._report(said, self._heard)

    def _report(self, said: list[_Said], heard: int) -> None:
        parts: dict[int, list[str]] = {}
        for s in said:
            if not s.reply:
                continue
            length = s.end - s.start
            total = length if s.complete else max(length, self._pace(s.text))
            part = heard_part(s.text, min(heard, s.end) - s.start, total)
            words = parts.setdefault(s.reply, [])
            if part:
                words.append(part)
        self._upstream(HeardText(tuple((k, " ".join(v)) for k, v in parts.items()), self._newest))

    def _pace(self, text: str) -> int:
        """Samples ``text`` takes to say, at the pace this call's voice has kept so far."""
        if self._voice_chars:  # (the pace of every text complete so far)
            return round(len(text) * self._voice_samples / self._voice_chars)
        return len(text) * SAMPLES_PER_CHAR

    def write(self, pcm: np.ndarray, last: bool = False) -> None:
        self._utterance_open = not last
        n = len(pcm)
        if n == 0:
            if last:
                self._close_text()
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
        self._written += n
        if self._said:
            self._said[-1].end = self._written
        if last:
            self._close_text()
        if was_empty and self.on_ready is not None:
            self.on_ready()

    def _close_text(self) -> None:
        if self._said and not self._said[-1].complete:
            s = self._said[-1]
            s.complete = True
            self._voice_samples += s.end - s.start
            self._voice_chars += len(s.text)

    def flush(self) -> None:
        """Barge-in: drop every queued sample now; the agent stops within one frame."""
        self.paused = False
        self._dry_reply = 0
        self._chunks.clear()
        self._head = 0
        self._queued = 0
        self._utterance_open = False
        if self.speaking:
            self.interruptions += 1
            self.speaking = False
            self._upstream(BotStoppedSpeaking(interrupted=True))
        said = list(self._said)
        self._said.clear()
        self._written = self._pulled  # the queued audio is gone from the timeline
        if self._cut is not None:  # (a second flush before the first was settled)
            said = self._cut[0] + said
            self._cut = None
        if self.confirmed_heard:
            self._cut = (said, self._pulled)
        else:
            self._report(said, self._heard)

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
                self._dry_reply = self._said[-1].reply if self._said else 0
                self._dry_samples = 0
                self._upstream(BotStoppedSpeaking())
            if self._dry_reply:
                self._dry_samples += self.frame_samples if out is None else len(out)
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
        self._pulled += filled
        if not self.confirmed_heard:
            self._heard = self._pulled
        if not self.speaking:
            self.speaking = True
            if self._dry_reply:
                self.gaps += 1
                self.gap_samples += self._dry_samples
                self._dry_reply = 0
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
