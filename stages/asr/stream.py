"""One ASR stream as a sans-I/O state machine: the core both streaming shells drive.

An :class:`ASRStream` owns a stream's ring of audio (an engine slot's preallocated buffer) and
its utterances. It is fed media audio at sample offsets, VAD events and the results of the model
calls it asked for; it answers with :class:`Request` (a model call to make, with its audio) and
:class:`Result` (a transcript) values, taken with :meth:`ASRStream.take`. It never touches an
event loop, a thread, a socket or the engine: :class:`stages.asr.stage.StreamingASR` (in a call's
pipeline) and ``asr-serve`` (over a socket) are thin shells around it, so both give the same
partials, stable prefixes, speculative finals and finals.

Scheduling rules (all samples are media samples at the backend's rate):

* Only utterance audio (SpeechStarted less a short pre-roll, to SpeechStopped plus a short pad)
  is ever transcribed; at most one model call per stream is outstanding. Queued calls
  (speculative, final, segment) go before partials and commits; one that comes while a partial
  is out does not wait for it: the partial is cancelled (:class:`Cancel`: dropped if the engine
  has not started it, ignored if it has). A partial waits (at the stream, reading newer audio
  when it goes) while ``room()`` says the model has more partials queued than it takes at once.
* While the caller speaks, the *uncommitted tail* is re-transcribed every ``partial_interval``
  samples, with the committed text as the model's prompt. Once the tail is longer than
  ``commit_after`` samples, its older part up to the quietest point is transcribed once and
  committed: a partial then costs what the tail costs, not what the utterance costs, so an
  utterance's partials cost grows linearly with its length instead of with its square. A
  partial shows committed text plus tail; :class:`LocalAgreement` keeps the stable prefix from
  ever moving back. Finals re-read the whole utterance (``whole_finals``) for accuracy.
* ``SpeechPaused`` asks for the utterance up to the pause at once (a *speculative* result, shown
  as a partial); if ``SpeechStopped`` confirms that end, it becomes the final with no further
  model call. A partial already with the model that was asked after the voice's end
  (``SpeechPaused.voice_end``) reads the same words: it becomes the speculative call itself.
* An utterance longer than ``max_utterance`` samples is cut at the quietest point of its last
  3 s: that part is a final of its own (a *segment*), and its text is the prompt of the rest.
* Each ``SpeechStopped`` gets exactly one final, possibly empty; no partial of an utterance
  follows its final. On a model error the final falls back to the best text at hand.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum, IntEnum
from typing import Any, NamedTuple

import numpy as np

from agent.audio import FROM_INT16
from stages.asr.agreement import LocalAgreement
from stages.asr.cutting import quietest_point

PRE_ROLL_MS = 200  # audio kept before SpeechStarted.at: the VAD decides a little late
END_PAD_MS = 40  # audio read after Silero's pause (the end of speech): no last word clipped
# A partial asked this long after the voice's end (SpeechPaused.voice_end) heard all of it: at
# the pause it stands for the speculative transcript instead of a new model call.
VOICE_MARGIN_MS = 20
# The ring holds the longest utterance plus this much: a transcription waiting behind another
# call still finds its audio. If it waited longer, it reports an error instead of garbage.
RING_MARGIN_S = 10.0
CUT_SEARCH_MS = 3000  # a too-long utterance is cut at the quietest place in its last 3 s
CUT_WINDOW_MS = 100  # quietness is judged over 100 ms of audio, in 20 ms steps
CUT_STEP_MS = 20
# A tail is committed once it is longer than ``commit_after``, at its quietest point between
# half of that after the last commit and a sixth of it before the newest audio (6 s: between
# 3 s in and 1 s from the end), so a commit is never a fragment and the tail left is short.
COMMIT_FROM = 1 / 2
COMMIT_KEEP = 1 / 6
PROMPT_CHARS = 600  # the committed text given to the model as context (Whisper keeps ~220 tokens)


class Kind(IntEnum):
    """What a model call or a transcript is for."""

    PARTIAL = 0  # the tail while the caller speaks
    SPECULATIVE = 1  # the utterance up to a SpeechPaused, before its end is confirmed
    FINAL = 2  # the utterance up to SpeechStopped
    SEGMENT = 3  # the first part of a too-long utterance, delivered as a final
    COMMIT = 4  # the older part of a long tail, transcribed once (internal, never delivered)


class Phase(Enum):
    """Where an utterance is, from SpeechStarted to its final."""

    SPEAKING = "speaking"  # partials flow; long tails are committed
    PAUSED = "paused"  # a SpeechPaused wants a speculative result: it goes before anything else
    STOPPED = "stopped"  # SpeechStopped seen: the final is owed
    DONE = "done"  # the final was delivered


class Event(Enum):
    PAUSE = "pause"
    SPECULATED = "speculated"  # the speculative result (or its failure) is in
    STOP = "stop"
    FINAL = "final"


# Every transition an utterance may make; anything else is a bug (KeyError).
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.SPEAKING, Event.PAUSE): Phase.PAUSED,
    (Phase.PAUSED, Event.PAUSE): Phase.PAUSED,
    (Phase.PAUSED, Event.SPECULATED): Phase.SPEAKING,
    (Phase.SPEAKING, Event.SPECULATED): Phase.SPEAKING,  # a result for a pause already passed
    (Phase.SPEAKING, Event.STOP): Phase.STOPPED,
    (Phase.PAUSED, Event.STOP): Phase.STOPPED,
    (Phase.STOPPED, Event.SPECULATED): Phase.STOPPED,
    (Phase.STOPPED, Event.FINAL): Phase.DONE,
    (Phase.DONE, Event.SPECULATED): Phase.DONE,
}


@dataclass(slots=True, frozen=True)
class StreamConfig:
    """A stream's limits, in samples at the backend's rate."""

    rate: int = 16_000
    partial_interval: int = 6_400  # 400 ms
    # A partial's model call took ``busy`` samples of arriving audio (queueing included): the
    # next one is due no sooner than busy / partial_share after it, so partials take at most
    # this share of the stream's real time on a CPU too slow for the interval (0: off).
    partial_share: float = 0.0
    end_pad: int = END_PAD_MS * 16  # after the end of speech, what a final reads (40 ms)
    max_utterance: int = 400_000  # 25 s
    commit_after: int = 96_000  # 6 s of uncommitted tail; 0: partials re-read the utterance
    partials: bool = True
    # Finals (and speculative results, and segments) re-read the whole utterance: their cost
    # grows with it only linearly (one call each), and on the speech set a final made of
    # committed parts lost words at the cuts (Whisper tiny.en, lockstep: WER 10.8% against
    # 8.1% re-reading the whole utterance). False: a final reads only the uncommitted tail.
    whole_finals: bool = True
    # A partial with the model at a pause, asked after the voice's end, stands for the pause's
    # transcript (SpeechPaused.voice_end; False: the pause always asks anew)
    adopt_partials: bool = True

    @classmethod
    def from_ms(cls, rate: int, partial_interval_ms: int, max_utterance_s: float,
                commit_after_s: float, partials: bool = True, partial_share: float = 0.0,
                end_pad_ms: int = END_PAD_MS, adopt_partials: bool = True) -> StreamConfig:
        return cls(rate=rate, partial_interval=max(1, partial_interval_ms * rate // 1000),
                   max_utterance=int(max_utterance_s * rate),
                   commit_after=int(commit_after_s * rate), partials=partials,
                   partial_share=partial_share, end_pad=max(0, end_pad_ms) * rate // 1000,
                   adopt_partials=adopt_partials)

    @property
    def ring(self) -> int:
        """Samples the ring must hold: the longest utterance, its pre-roll and a margin."""
        return self.max_utterance + self._spare

    @property
    def _spare(self) -> int:
        return PRE_ROLL_MS * self.rate // 1000 + int(RING_MARGIN_S * self.rate)

    def fitting(self, ring: int) -> StreamConfig:
        """This configuration with the longest utterance shortened to fit a ring of ``ring``
        samples (unchanged if it fits)."""
        if ring >= self.ring:
            return self
        longest = ring - self._spare
        if longest < self.rate:
            raise ValueError(f"a ring of {ring / self.rate:.1f} s leaves no room for speech "
                             f"(it needs {self._spare / self.rate:.1f} s besides)")
        return replace(self, max_utterance=longest)


@dataclass(slots=True, frozen=True)
class Request:
    """A model call for the shell to make: ``audio`` (a float32 copy) of media samples
    ``[start, end)``, with ``prompt`` as context. Answer it with :meth:`ASRStream.done`."""

    id: int
    kind: Kind
    start: int
    end: int
    audio: np.ndarray
    prompt: str
    utterance: int = 0  # where the utterance began (``end - utterance``: its length so far)

    @property
    def final(self) -> bool:
        """Whether a caller waits on it (the engine serves these first and never sheds them)."""
        return self.kind is not Kind.PARTIAL


@dataclass(slots=True, frozen=True)
class Result:
    """A transcript of media samples ``[start, end)``: its first ``stable`` characters never
    change. ``audio_ns`` is when the newest audio it covers arrived (0 if unknown)."""

    kind: Kind  # PARTIAL, SPECULATIVE, FINAL or SEGMENT
    text: str
    start: int
    end: int
    stable: int
    audio_ns: int = 0
    end_p: float | None = None  # the model's P(a sentence ends after the last word), if told

    @property
    def final(self) -> bool:
        return self.kind in (Kind.FINAL, Kind.SEGMENT)


@dataclass(slots=True, frozen=True)
class Cancel:
    """The request ``id`` (a partial) is no longer wanted: drop it if it has not started (its
    answer, if one still comes, is ignored)."""

    id: int


@dataclass(slots=True, frozen=True)
class Failure:
    """A model call failed (the stream goes on; a final falls back to the best text at hand)."""

    kind: Kind
    message: str


Output = Request | Result | Cancel | Failure
_NONE: tuple[Output, ...] = ()  # what take() hands back when there is nothing


class _Spec(NamedTuple):
    """A speculative result: the audio ``[start, end)`` it read, its text (composed) and the
    model's P(a sentence ends) after it, if told."""

    start: int
    end: int
    text: str
    end_p: float | None


@dataclass(slots=True, eq=False)
class _Utterance:
    start: int  # first sample of the current segment (moves on when a long utterance is cut)
    started_at: int  # SpeechStarted.at
    commit: int  # first sample of the uncommitted tail
    partial_end: int  # end of the audio the last partial was requested for
    partial_busy: int = 0  # samples that arrived while the last partial was with the model
    phase: Phase = Phase.SPEAKING
    segmented: bool = False
    prompt: str = ""  # text of earlier segments (already delivered as finals)
    head: str = ""  # committed text of [start, commit)
    shown: str = ""  # stable prefix of the latest partial: a final's fallback on errors
    stopped_at: int = 0  # SpeechStopped.at
    target: int = 0  # end of the audio the final must cover
    spec_wanted: int = 0  # a speculative transcription waits for audio up to here
    spec: _Spec | None = None  # the latest speculative result

    def step(self, event: Event) -> None:
        self.phase = TRANSITIONS[(self.phase, event)]

    def context(self) -> str:
        return f"{self.prompt} {self.head}".strip()[-PROMPT_CHARS:]

    def text(self, tail: str) -> str:
        return f"{self.head} {tail}".strip()


@dataclass(slots=True, eq=False)
class _Job:
    kind: Kind
    utt: _Utterance
    end: int
    epoch: int
    audio_ns: int = 0
    start: int = 0  # set at launch (jobs run in order: earlier commits are in by then)
    id: int = 0


class ASRStream:
    """The streaming-ASR state of one stream, over the ring ``ring`` (float32, preallocated)."""

    def __init__(self, ring: np.ndarray, cfg: StreamConfig,
                 room: Callable[[], bool] | None = None) -> None:
        if len(ring) < cfg.ring:
            raise ValueError(f"the ring holds {len(ring) / cfg.rate:.1f} s; this stream needs "
                             f"{cfg.ring / cfg.rate:.1f} s (max utterance + 10 s)")
        self.cfg = cfg
        self._room = room  # may a partial (or a commit) go to the model now? (engine load)
        self._ring = ring
        self._pre_roll = PRE_ROLL_MS * cfg.rate // 1000
        self._end_pad = cfg.end_pad
        self._voice_margin = VOICE_MARGIN_MS * cfg.rate // 1000
        self._end = 0  # media sample after the newest audio in the ring
        self._valid_from = 0  # oldest media sample still in the ring
        self._audio_ns = 0
        self._utt: _Utterance | None = None
        self._last_utt_end = 0
        self._agreement = LocalAgreement()
        self._queue: deque[_Job] = deque()
        self._running: _Job | None = None
        self._abandoned = 0  # a partial given up for a final: its answer is ignored
        self._epoch = 0
        self._ids = 0
        self._out: list[Output] = []
        self.closed = False
        # counters
        self.requests = 0
        self.partials = 0
        self.finals = 0
        self.commits = 0
        self.discarded = 0  # results that arrived too late to be used
        self.speculative_finals = 0  # finals that needed no model call after SpeechStopped
        self.adopted_partials = 0  # partials that stood for a pause's transcript
        self.flushed = 0  # finals delivered without their model call because the stream ended
        self.errors = 0

    # --- state ---------------------------------------------------------------------------------
    @property
    def in_speech(self) -> bool:
        return self._utt is not None

    @property
    def busy(self) -> bool:
        """A model call is outstanding or queued (a final may be on its way)."""
        return self._running is not None or bool(self._queue)

    @property
    def end(self) -> int:
        return self._end

    def take(self) -> Sequence[Output]:
        """The requests and results produced since the last call, in order (most frames
        produce none: then nothing is allocated)."""
        out = self._out
        if not out:
            return _NONE
        self._out = []
        return out

    # --- inputs --------------------------------------------------------------------------------
    def audio(self, pcm: np.ndarray, offset: int, audio_ns: int = 0) -> None:
        """Media samples ``[offset, offset + len(pcm))``: int16, or float in [-1, 1]."""
        if self.closed:
            return
        self._write(pcm, offset)
        self._audio_ns = audio_ns
        u = self._utt
        if u is None:
            return
        if u.spec_wanted and self._end >= u.spec_wanted:
            self._queue_speculative(u, u.spec_wanted)
        elif self._end - u.start >= self.cfg.max_utterance and not self._segment_queued(u):
            self._cut(u)
        self._kick()

    def started(self, at: int) -> None:
        """The VAD heard speech start at ``at``."""
        if self.closed or self._utt is not None:
            return  # a repeated start: the utterance is already open
        start = max(at - self._pre_roll, self._valid_from, self._last_utt_end)
        start = min(start, max(at, self._valid_from))
        self._utt = _Utterance(start=start, started_at=at, commit=start, partial_end=start)
        self._agreement.reset()

    def paused(self, at: int, voice_end: int = -1) -> None:
        """The VAD's speech probability fell at ``at``: SpeechStopped may follow. ``voice_end``
        (-1: unknown) is where the voice itself stopped, before ``at``."""
        u = self._utt
        if self.closed or u is None:
            return
        want = max(at + self._end_pad, u.commit)
        if self._spec_covers(u, want) or self._spec_job(u, want) is not None:
            return  # already transcribed, or on its way, up to there
        self._drop_speculative(u)  # speech resumed since an earlier pause: out of date
        u.step(Event.PAUSE)
        if self._adopt_partial(u, want, voice_end):
            return
        if self._end >= want:
            self._queue_speculative(u, want)
        else:
            u.spec_wanted = want  # queued once that audio has arrived
        self._kick()

    def stopped(self, at: int, started_at: int = 0) -> None:
        """The VAD says speech ended at ``at`` (it started at ``started_at``)."""
        if self.closed:
            return
        u = self._utt
        if u is None:  # a stop without a start we saw: transcribe what the VAD says it was
            start = max(started_at - self._pre_roll, self._valid_from, self._last_utt_end)
            start = min(start, at)
            u = _Utterance(start=start, started_at=started_at, commit=start, partial_end=start)
        self._utt = None
        u.step(Event.STOP)
        u.spec_wanted = 0
        u.stopped_at = at
        u.target = self._last_utt_end = max(min(at + self._end_pad, self._end), u.start)
        # (a commit still to come moves a tail final's start: its speculative result is stale)
        if self._spec_covers(u, u.target) and (self._whole(Kind.FINAL)
                                               or not self._commit_pending(u)):
            self.speculative_finals += 1
            assert u.spec is not None
            self._final(u, u.spec.text, u.spec.end_p)
            return
        job = self._spec_job(u, u.target)
        if job is not None and job is self._queue_last(u):
            self.speculative_finals += 1
            return  # the speculative call in flight or queued becomes the final
        self._drop_speculative(u)
        self._queue.append(_Job(Kind.FINAL, u, u.target, self._epoch))
        self._kick()

    def done(self, request_id: int, text: str | None, error: str | None = None,
             end_p: float | None = None) -> None:
        """The model call ``request_id`` returned ``text`` (None: the engine shed it, or the call
        failed with ``error``), and the model's P(a sentence ends after it), if it told."""
        job = self._running
        if request_id == self._abandoned:
            self._abandoned = 0
            self.discarded += 1
            return
        if job is None or job.id != request_id:
            return  # a request of a stream that was reset or closed
        self._running = None
        if self.closed:
            return
        if error is not None:
            self.errors += 1
            self._out.append(Failure(job.kind, error))
            text = None
        if job.kind is Kind.PARTIAL:
            job.utt.partial_busy = max(0, self._end - job.end)
        if error is None and text is None and job.kind is Kind.PARTIAL:
            self.discarded += 1  # shed as stale by the engine: a newer partial follows
            self._kick()
            return
        if job.epoch == self._epoch:
            self._deliver(job, text, end_p)
        else:
            self.discarded += 1
        self._kick()

    def settle(self, request_id: int, future: Any) -> None:
        """Answer ``request_id`` with a finished future of the engine's (a Hypothesis, None when
        the engine shed the request, or an exception); a cancelled one is dropped."""
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self.done(request_id, None, f"{type(exc).__name__}: {exc}")
        else:
            hyp = future.result()
            if hyp is None:
                self.done(request_id, None)
            else:
                self.done(request_id, hyp.text, end_p=hyp.end_p)

    def end_of_stream(self) -> None:
        """The call is ending: deliver every final still owed at once, with the best text at
        hand, and forget the rest. Nobody waits for more."""
        jobs = ([self._running] if self._running is not None else []) + list(self._queue)
        for job in jobs:
            if job.epoch != self._epoch:
                continue
            u = job.utt
            if job.kind is Kind.SEGMENT and job is not self._running:
                self.flushed += 1
                self._out.append(Result(Kind.SEGMENT, u.text(""), u.start, job.end, len(u.head)))
            elif u.phase is Phase.STOPPED:
                self.flushed += 1
                if self._spec_covers(u, u.target) and u.spec:
                    self._final(u, u.spec.text, u.spec.end_p)
                else:
                    self._final(u, u.shown or u.head)
        self.reset()

    def reset(self) -> None:
        """Forget every utterance and queued call; a result still in flight is discarded."""
        self._epoch += 1
        self._queue.clear()
        self._utt = None
        self._agreement.reset()

    def close(self) -> None:
        self.reset()
        self._running = None
        self.closed = True

    # --- scheduling ----------------------------------------------------------------------------
    def _adopt_partial(self, u: _Utterance, want: int, voice_end: int) -> bool:
        """Let the partial with the model stand for the pause's transcript if it reads what that
        transcript would: the same start and context, and the audio past the voice's end
        (Silero's pause comes 1-3 windows after it, so a partial asked in between heard every
        word). Its answer then comes a whole model call sooner than a new request's would."""
        job = self._running
        if (voice_end < 0 or not self.cfg.adopt_partials or job is None
                or job.kind is not Kind.PARTIAL or job.utt is not u
                or job.epoch != self._epoch or job.start != u.commit
                or job.start != self._from(u, Kind.SPECULATIVE)
                or job.end < voice_end + self._voice_margin):
            return False
        job.kind = Kind.SPECULATIVE
        job.end = max(job.end, want)  # what it did not read is quieter than the voice
        self.adopted_partials += 1
        return True

    def _commit_pending(self, u: _Utterance) -> bool:
        jobs = [self._running] if self._running is not None else []
        return any(j.utt is u and j.kind is Kind.COMMIT for j in (*jobs, *self._queue))

    def _spec_covers(self, u: _Utterance, end: int) -> bool:
        return u.spec is not None and u.spec.start == self._from(u, Kind.SPECULATIVE) \
            and u.spec.end >= end

    def _spec_job(self, u: _Utterance, end: int) -> _Job | None:
        jobs = [self._running] if self._running is not None else []
        for j in (*jobs, *self._queue):
            if (j.utt is u and j.kind is Kind.SPECULATIVE and j.end >= end
                    and j.epoch == self._epoch
                    and (j is not self._running or j.start == self._from(u, j.kind))):
                return j
        return None

    def _queue_last(self, u: _Utterance) -> _Job | None:
        """The utterance's last job (the running one included): a speculative job can become
        the final only if nothing of the same utterance runs after it."""
        last = self._running if self._running is not None and self._running.utt is u else None
        for j in self._queue:
            if j.utt is u:
                last = j
        return last

    def _segment_queued(self, u: _Utterance) -> bool:
        jobs = [self._running] if self._running is not None else []
        return any(j.utt is u and j.kind is Kind.SEGMENT for j in (*jobs, *self._queue))

    def _queue_speculative(self, u: _Utterance, end: int) -> None:
        u.spec_wanted = 0
        self._queue.append(_Job(Kind.SPECULATIVE, u, end, self._epoch, self._audio_ns))

    def _drop_speculative(self, u: _Utterance) -> None:
        if any(j.utt is u and j.kind is Kind.SPECULATIVE for j in self._queue):
            self._queue = deque(j for j in self._queue
                                if not (j.utt is u and j.kind is Kind.SPECULATIVE))

    def _kick(self) -> None:
        """Start the next model call if none is outstanding: queued work first, then a commit of
        a long tail, then a partial."""
        if self.closed:
            return
        running = self._running
        if running is not None and running.kind is Kind.PARTIAL and self._queue \
                and not self._abandoned:
            # A final (or speculative result) goes now instead of after the partial: the
            # partial is dropped if the engine has not started it, and ignored if it has.
            self._abandoned = running.id
            self._running = None
            self._out.append(Cancel(running.id))
        elif running is not None:
            return
        if self._queue:
            self._launch(self._queue.popleft())
            return
        u = self._utt
        # A speculative call waiting for its last audio goes first: a partial started now would
        # delay it, and with it the final, by a whole model call.
        if u is None or u.phase is Phase.PAUSED or not self.cfg.partials:
            return
        commit = self.cfg.commit_after and self._end - u.commit > self.cfg.commit_after
        gap = self._partial_gap(u)
        if not commit and self._end - u.partial_end < gap:
            return  # nothing due (the common case, every frame: asks the engine nothing)
        if self._room is not None and not self._room():
            return  # the engine is full: the next audio frame tries again, with newer audio
        if commit:
            lo = u.commit + int(self.cfg.commit_after * COMMIT_FROM)
            hi = self._end - int(self.cfg.commit_after * COMMIT_KEEP)
            if hi > lo:
                self._launch(_Job(Kind.COMMIT, u, self._quietest(lo, hi), self._epoch))
                return
        if self._end - u.partial_end < gap:
            return
        u.partial_end = self._end
        self._launch(_Job(Kind.PARTIAL, u, self._end, self._epoch, self._audio_ns))

    def _partial_gap(self, u: _Utterance) -> int:
        """Samples from one partial's request to the next: the interval, or longer where the
        last one's model call kept the stream more than ``partial_share`` of its time."""
        share = self.cfg.partial_share
        if share <= 0 or not u.partial_busy:
            return self.cfg.partial_interval
        return max(self.cfg.partial_interval, int(u.partial_busy / share))

    def _whole(self, kind: Kind) -> bool:
        return self.cfg.whole_finals and kind in (Kind.FINAL, Kind.SPECULATIVE, Kind.SEGMENT)

    def _from(self, u: _Utterance, kind: Kind) -> int:
        """Where a model call of this kind starts reading the utterance."""
        return u.start if self._whole(kind) else u.commit

    def _compose(self, u: _Utterance, kind: Kind, text: str) -> str:
        """The utterance's text, given what a model call of this kind heard."""
        return text if self._whole(kind) else u.text(text)

    def _launch(self, job: _Job) -> None:
        u = job.utt
        whole = self._whole(job.kind)
        job.start = self._from(u, job.kind)
        if job.kind is Kind.SEGMENT:
            job.end = max(job.end, u.commit)  # a commit made since the cut was chosen
        self._ids += 1
        job.id = self._ids
        self._running = job
        self.requests += 1
        if job.start < self._valid_from:
            self._running = None
            self.errors += 1
            self._out.append(Failure(job.kind, "utterance audio was overwritten before it was "
                                     "transcribed (the ASR engine fell behind)"))
            u.start = max(u.start, self._valid_from)  # what is left is still transcribed
            u.commit = max(u.commit, u.start)
            if job.kind is not Kind.PARTIAL and job.kind is not Kind.COMMIT:
                self._deliver(job, None)
            self._kick()
            return
        audio = self._span_copy(job.start, max(job.start, job.end))
        prompt = u.prompt[-PROMPT_CHARS:] if whole else u.context()
        self._out.append(Request(job.id, job.kind, job.start, job.end, audio, prompt,
                                 u.started_at))

    def _deliver(self, job: _Job, text: str | None, end_p: float | None = None) -> None:
        u = job.utt
        kind = job.kind
        if kind is Kind.PARTIAL:
            if u.phase is not Phase.SPEAKING or u is not self._utt or job.start != u.commit \
                    or text is None:
                self.discarded += 1
                return
            self._partial(u, Kind.PARTIAL, u.text(text), job)
        elif kind is Kind.COMMIT:
            if text is not None and job.start == u.commit:
                u.head = u.text(text)
                u.commit = job.end
                self.commits += 1
        elif kind is Kind.SPECULATIVE:
            if not u.spec_wanted and self._spec_job(u, 0) is None:
                u.step(Event.SPECULATED)  # no later pause waits for its own result
            fresh = job.start == self._from(u, kind)
            if text is not None and fresh:
                text = self._compose(u, kind, text)
                u.spec = _Spec(job.start, job.end, text, end_p)
                if u.phase is Phase.SPEAKING and u is self._utt:
                    # The utterance up to the pause, while the VAD still waits to confirm the
                    # end: a partial like any other, and the LLM's cue to prefill its prompt.
                    self._partial(u, Kind.SPECULATIVE, text, job, end_p)
            if u.phase is Phase.STOPPED and fresh and job.end >= u.target \
                    and self._queue_last(u) is None:  # the final waited for this
                if text is not None:
                    self._final(u, text, end_p)
                else:
                    self._queue.appendleft(_Job(Kind.FINAL, u, u.target, self._epoch))
        elif kind is Kind.FINAL:
            if text is not None:
                self._final(u, self._compose(u, kind, text), end_p)
            else:
                self._final(u, u.shown or u.head)
        else:  # SEGMENT
            seg = self._compose(u, kind, text) if text is not None else u.shown or u.head
            self.finals += 1
            self._out.append(Result(Kind.SEGMENT, seg, u.start, job.end, len(seg)))
            u.prompt = f"{u.prompt} {seg}".strip()
            u.segmented = True
            u.start = u.commit = u.partial_end = job.end
            u.head = u.shown = ""
            u.spec = None
            self._agreement.reset()

    def _partial(self, u: _Utterance, kind: Kind, text: str, job: _Job,
                 end_p: float | None = None) -> None:
        shown, stable = self._agreement.update(text)
        u.shown = self._agreement.committed_text
        self.partials += 1
        start = u.start if u.segmented else u.started_at
        # the model's P(a sentence ends) holds for what is shown if it ends on the same word
        # (only a pause's transcript has one: a partial's every 400 ms is not split)
        if end_p is not None and shown.split()[-1:] != text.split()[-1:]:
            end_p = None
        self._out.append(Result(kind, shown, start, job.end, stable, job.audio_ns, end_p))

    def _final(self, u: _Utterance, text: str, end_p: float | None = None) -> None:
        """The utterance's final: ``end_p`` is the model's P(a sentence ends) after ``text``
        (None when the text is a fallback the model did not end on)."""
        if u.phase is not Phase.STOPPED:
            return
        u.step(Event.FINAL)
        start = u.start if u.segmented else (u.started_at or u.start)
        self.finals += 1
        self._out.append(Result(Kind.FINAL, text, start, u.stopped_at, len(text), end_p=end_p))

    def _cut(self, u: _Utterance) -> None:
        """End a too-long utterance's current segment at its quietest recent point."""
        search = CUT_SEARCH_MS * self.cfg.rate // 1000
        cut = self._quietest(max(u.commit, self._end - search), self._end)
        self._drop_speculative(u)
        u.spec = None
        self._queue.append(_Job(Kind.SEGMENT, u, cut, self._epoch))

    def _quietest(self, lo: int, hi: int) -> int:
        rate = self.cfg.rate
        span = self._span_copy(lo, hi)
        return lo + quietest_point(span, 0, len(span), window=CUT_WINDOW_MS * rate // 1000,
                                   step=CUT_STEP_MS * rate // 1000)

    # --- the ring ------------------------------------------------------------------------------
    def _write(self, pcm: np.ndarray, offset: int) -> None:
        cap = len(self._ring)
        n = len(pcm)
        if self._end == self._valid_from or offset < self._valid_from or offset > self._end + cap:
            self._valid_from = self._end = offset  # first audio, or a jump in the timeline
        elif offset > self._end:
            self._fill(self._end, offset, None)  # a gap: silence
        self._fill(offset, offset + n, pcm)
        self._end = max(self._end, offset + n)
        self._valid_from = max(self._valid_from, self._end - cap)

    def _fill(self, start: int, end: int, pcm: np.ndarray | None) -> None:
        """Write ``pcm`` (or silence) to media samples [start, end), in place."""
        cap = len(self._ring)
        if end - start > cap:
            if pcm is not None:
                pcm = pcm[end - start - cap :]
            start = end - cap
        i = start % cap
        first = min(end - start, cap - i)
        rest = end - start - first
        for dst, src in ((self._ring[i : i + first], slice(0, first)),
                         (self._ring[:rest], slice(first, first + rest))):
            if not len(dst):
                continue
            if pcm is None:
                dst.fill(0.0)
            elif pcm.dtype == np.int16:
                # a cast into the ring, then scaled there: multiply(int16, out=float32) would
                # buffer a converted copy of the input on every call
                np.copyto(dst, pcm[src], casting="unsafe")
                dst *= FROM_INT16
            else:
                dst[:] = pcm[src]
                np.nan_to_num(dst, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
                np.clip(dst, -1.0, 1.0, out=dst)

    def _span_copy(self, start: int, end: int) -> np.ndarray:
        """A float32 copy of media samples [start, end) (the model reads it later, on a worker
        thread, while the ring keeps filling)."""
        cap = len(self._ring)
        out = np.empty(end - start, np.float32)
        i = start % cap
        first = min(end - start, cap - i)
        out[:first] = self._ring[i : i + first]
        out[first:] = self._ring[: end - start - first]
        return out
