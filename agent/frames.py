"""The frames that flow between stages: small, immutable, slotted, stamped with a monotonic ns time.

Audio inside a pipeline is 16-bit mono PCM at 16 kHz held in numpy arrays; transports convert.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 320  # 20 ms at 16 kHz


class Direction(IntEnum):
    DOWNSTREAM = 0
    UPSTREAM = 1


@dataclass(slots=True, frozen=True)
class Frame:
    """Base of every frame. ``t_ns`` is ``time.monotonic_ns()`` when the frame was made."""

    t_ns: int = field(default_factory=time.monotonic_ns, kw_only=True)


# --- audio -----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class AudioIn(Frame):
    """Caller audio. ``offset`` is the index of the first sample in the call's media timeline."""

    pcm: np.ndarray  # int16, mono
    offset: int = 0
    sample_rate: int = SAMPLE_RATE

    @property
    def end(self) -> int:
        return self.offset + len(self.pcm)


@dataclass(slots=True, frozen=True)
class TTSAudio(Frame):
    """Agent audio from the TTS; ``last`` marks the final chunk of one utterance."""

    pcm: np.ndarray  # int16, mono
    sample_rate: int = SAMPLE_RATE
    last: bool = False
    text: str = ""


# --- voice activity --------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class SpeechStarted(Frame):
    """VAD: the caller started speaking at media sample ``at``."""

    at: int


@dataclass(slots=True, frozen=True)
class SpeechPaused(Frame):
    """VAD: speech probability fell below the stop threshold at media sample ``at``.

    A hint that ``SpeechStopped`` follows unless speech resumes within the hysteresis; the ASR
    uses it to start transcribing the utterance before the end of speech is confirmed.
    ``voice_end``: where the voice itself stopped (the end of the utterance's last frame within
    35 dB of its loudest, a window or three before ``at``), or -1 where the VAD cannot tell.
    """

    at: int
    voice_end: int = -1


@dataclass(slots=True, frozen=True)
class SpeechResumed(Frame):
    """VAD: speech came back at media sample ``at`` after a ``SpeechPaused`` that did not
    become a ``SpeechStopped``: the pause was mid-utterance."""

    at: int


@dataclass(slots=True, frozen=True)
class SpeechStopped(Frame):
    """VAD: the caller stopped speaking. ``at`` is the media sample where speech ended;
    ``speech_end_ns`` is when that audio reached us (the origin of the voice-to-voice span)."""

    at: int
    started_at: int = 0
    speech_end_ns: int = 0


# --- transcripts and turns -------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Transcript(Frame):
    """A transcript of the audio between media samples ``start`` and ``end``.

    Partials may change, except for their first ``stable`` characters; a final never changes.
    A ``speculative`` partial is the whole utterance up to a pause the VAD has not yet
    confirmed: the final it becomes if the caller does not go on. ``end_p``, where the ASR
    tells it (Whisper's speculative and final transcripts), is its model's P(a sentence ends
    after the last word), having heard the audio: low for "...that he's in" or a voice that
    trails off; semantic endpointing reads it.
    """

    text: str
    final: bool
    start: int = 0
    end: int = 0
    stable: int = 0
    speculative: bool = False
    end_p: float | None = None

    def stable_words(self) -> str:
        """The words the ASR will not take back: the stable prefix up to its last whole word
        (a word the prefix ends inside may still change), stripped."""
        text = self.text
        stable = text[: self.stable]
        if len(stable) < len(text) and not text[len(stable)].isspace():
            stable = stable[: stable.rfind(" ") + 1]
        return stable.strip()


def first_capital(text: str) -> str:
    """``text`` with a capital first letter. A transcript's case at its start is not stable —
    Whisper writes a partial "yet these thoughts ..." and the final "Yet these thoughts ..." —
    so a model that reads the caller's words ahead into its cache while they speak (the local
    LLM, the words' end-of-turn model) reads every version of them this way, and what it read
    ahead still counts at the turn's end."""
    return text[:1].upper() + text[1:]


@dataclass(slots=True, frozen=True)
class UserTurnEnded(Frame):
    """Turn detection: the caller finished a turn; ``text`` is what they said."""

    text: str


@dataclass(slots=True, frozen=True)
class TurnCandidate(Frame):
    """Turn detection: the caller has paused, and if the turn ends now ``text`` is what they
    said. Not a decision: a ``UserTurnEnded`` confirms it (with the same text) or speech
    resumes. The LLM may prepare a reply to it, and must neither speak it nor act on it."""

    text: str


# --- agent output ----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class LLMTextDelta(Frame):
    text: str


@dataclass(slots=True, frozen=True)
class LLMEnd(Frame):
    """The LLM finished its reply (``text`` is all of it) or was cancelled."""

    text: str = ""
    cancelled: bool = False


@dataclass(slots=True, frozen=True)
class TextToSpeak(Frame):
    """One sentence (or clause) for the TTS. ``greeting`` marks the call's opening line."""

    text: str
    greeting: bool = False
    held: int = 0  # a speculative reply's id: the TTS keeps its audio until it is resolved
    # the agent message this text belongs to (the LLM's key for it; 0: none), so the playout
    # can say how much of that message the caller heard (:class:`HeardText`)
    reply: int = 0


@dataclass(slots=True, frozen=True)
class HeardText(Frame):
    """Upstream from the playout after a barge-in cut the agent off: how much of each agent
    message it held reached the caller. ``heard`` pairs a message's key (``TextToSpeak.reply``)
    with the text whose audio left the transport (or, where the transport confirms playback,
    was confirmed played), in the order spoken; ``newest`` is the highest key whose audio ever
    reached the playout, so a message with a higher key was never heard at all, and one with
    a lower key that is not listed was heard whole."""

    heard: tuple[tuple[int, str], ...]
    newest: int = 0


@dataclass(slots=True, frozen=True)
class BotStartedSpeaking(Frame):
    pass


@dataclass(slots=True, frozen=True)
class BotStoppedSpeaking(Frame):
    interrupted: bool = False


# --- control ---------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Interrupt(Frame):
    """Barge-in: the caller spoke over the agent. Bypasses every queue; cancels LLM/TTS work
    in flight and flushes queued agent audio."""

    at: int = 0


@dataclass(slots=True, frozen=True)
class SpeculationResolved(Frame):
    """The speculative reply ``id`` (prepared for a ``TurnCandidate``) is confirmed — its held
    text and audio go on at once — or discarded unheard."""

    id: int
    confirmed: bool


@dataclass(slots=True, frozen=True)
class PausePlayout(Frame):
    """Tentative barge-in: the caller made a sound over the agent. The agent stops speaking at
    once but keeps its place; an ``Interrupt`` follows if the sound carries words, a
    ``ResumePlayout`` if it turns out to carry none (a cough, noise)."""

    at: int = 0


@dataclass(slots=True, frozen=True)
class ResumePlayout(Frame):
    """A false barge-in: the agent goes on from where its playout paused."""


@dataclass(slots=True, frozen=True)
class EndOfCall(Frame):
    reason: str = "hangup"


@dataclass(slots=True, frozen=True)
class ErrorFrame(Frame):
    message: str
    stage: str = ""
    fatal: bool = False
    code: str = ""  # a stable fault code clients can switch on (stages/faults.py)


@dataclass(slots=True, frozen=True)
class Dtmf(Frame):
    """A telephone keypad digit."""

    digit: str
    duration_ms: int = 0


@dataclass(slots=True, frozen=True)
class HangUp(Frame):
    """A stage ends the call: pushed downstream after the agent's last words (a goodbye's
    ``TextToSpeak``). The session ends the call once the agent audio queued before it has
    played out; ``reason`` is the call's end reason (``"idle"``, ``"agent"``)."""

    reason: str = "agent"


CONTROL_FRAMES = (Interrupt, PausePlayout, ResumePlayout, EndOfCall, ErrorFrame)
"""Kinds that reach every stage, whatever the stages declare they consume."""

ANY_FRAME: frozenset[type[Frame]] = frozenset({Frame})
"""What a stage or listener that declares nothing consumes: every kind (a kind covers its
subclasses, and every kind is a ``Frame``)."""
