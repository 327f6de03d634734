"""Turn detection: decides when the caller has finished a turn (a final transcript, and either
the turn model's verdict at a pause or a fixed silence) and when the caller is barging in on the
agent (the agent pauses, and an Interrupt follows once the caller's sound carries words)."""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from agent.config import TURN_MODES, TurnConfig, VADConfig
from agent.errors import ConfigError
from agent.frames import (
    SAMPLE_RATE,
    AudioIn,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    EndOfCall,
    Frame,
    Interrupt,
    PausePlayout,
    ResumePlayout,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    Transcript,
    TurnCandidate,
    UserTurnEnded,
)
from agent.stage import DOWN, Stage
from stages.text_turn import WORD, ends_in_hesitation, ends_in_loop, hesitation_words, words_key

log = logging.getLogger("voxline.turn")

# How far a final's ``end`` may fall short of the VAD's end of speech and still count as covering
# it: the ASR cuts audio on 20 ms frames, the VAD decides on 32 ms windows.
COVER_SLACK = 512

# The VAD judges audio in 512-sample windows and its verdict on the newest audio follows that
# audio, so speech is only counted up to one window before the latest AudioIn: otherwise the
# silence after a short blip would count as speech before the VAD's SpeechPaused arrives.
VAD_VERDICT_LAG = 512

MODEL_SECONDS = 8  # the turn model hears at most the last 8 s of the caller's audio

# What a transcript of a non-verbal sound looks like: nothing, punctuation, an annotation in
# brackets ("[coughs]", "(noise)", "*sigh*") that an ASR writes for what is not speech, or only
# fillers and acknowledgements ("hmm", "uh", "mm-hmm"): a caller who says "mm-hmm" over the
# agent is listening, not taking the turn.
_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")
FILLERS = frozenset({
    "hm", "hmm", "hmmm", "mm", "mmm", "mhm", "mm-hmm", "mm-hm", "uh-huh", "uh", "uhh", "um",
    "umm", "er", "erm", "ah", "ahh",
})


def has_words(text: str) -> bool:
    """Whether a transcript holds a spoken word: more than punctuation, sound annotations and
    fillers."""
    return any(t not in FILLERS for t in WORD.findall(_ANNOTATION.sub("", text).lower()))


class TurnScorer(Protocol):
    """The turn model, shared by every call: P(the turn is complete) for the caller's latest
    audio (int16, 16 kHz, at most the last 8 s), computed off the event loop."""

    async def predict(self, pcm: np.ndarray) -> float: ...


class TextTurnScorer(Protocol):
    """The words' end-of-turn model, shared by every call: P(the caller's message ends after
    this transcript), computed off the event loop; ``warm`` reads a turn's early words ahead
    (while the caller speaks) without waiting, if the model is idle."""

    async def predict(self, text: str) -> float: ...

    def warm(self, text: str) -> None: ...


class Role(Enum):
    TURN = "turn"  # part of the caller's current turn
    OVER = "over"  # began while the agent speaks; a barge-in if it lasts, else a backchannel
    BACKCHANNEL = "backchannel"  # short speech over the agent: neither an interrupt nor a turn
    DONE = "done"  # its turn has ended


@dataclass(slots=True)
class Overlap:
    """Caller speech over the agent, measured in media samples until it interrupts or ends."""

    start: int  # where speech over the agent began: the Interrupt's ``at``
    since: int  # where the current run of it began (after a pause, where it resumed)
    banked: int = 0  # speech over the agent before the latest pause
    paused_at: int | None = None


@dataclass(slots=True)
class Segment:
    """One stretch of caller speech, SpeechStarted to SpeechStopped (media samples)."""

    start: int
    role: Role
    stop: SpeechStopped | None = None
    final_end: int = 0  # largest ``end`` of the finals that arrived while it was open
    covered: bool = False  # its final transcript has arrived


@dataclass(frozen=True, slots=True)
class WordsAnswer:
    """The words model's answer on one text: P(the message ends) for its ``key``
    (``words_key``), when it came, whether the text is short (``text_short_words``), and
    whether the model judged it at all (``filled``: not asked, the words end in a filled
    pause)."""

    key: str
    p: float
    at_ns: int = 0
    short: bool = False
    judged: bool = True
    filled: bool = False


# No words model, a failed one, an empty turn: the words have no say, and never hold a turn.
NO_SAY = WordsAnswer("", 1.0, judged=False)


@dataclass(slots=True)
class Tentative:
    """A barge-in not yet confirmed: the agent paused for ``segment``; words confirm it."""

    segment: Segment
    at: int


class TurnDetector(Stage):
    """Endpointing — semantic or by a fixed silence — and barge-in.

    A turn is one or more speech segments (SpeechStarted … SpeechStopped). It ends once its
    last segment has a final transcript and the caller has been silent long enough since that
    segment's end, counted in media samples of the ``AudioIn`` frames that keep arriving (if no
    audio reaches this stage, the VAD's own stop silence is all it can count). How long is long
    enough depends on the mode:

    * ``semantic`` (with a turn model): at each stop of the VAD (its stop silence is the short
      ``pause_ms``) the model scores the last 8 s of the caller's audio (with
      ``ask_at_pause``, already at the VAD's ``SpeechPaused`` before it, the stop using that
      verdict; a pause the caller ends drops it). At or above ``complete_threshold`` the turn
      ends at once; below, it waits — the model looks again every ``rescore_ms`` of silence —
      and ends after ``max_wait_ms`` of silence at the latest.
      With ``text_check`` (and a words model) the turn's text must read finished as well:
      the words model's P(the message ends here) at or above ``text_threshold``. It is asked
      as soon as the pause's text is known (a speculative or a final transcript), beside the
      turn model. When the sound says finished and the words do not, the turn waits for
      ``text_wait_ms`` of silence — or only ``text_near_wait_ms`` when the sound is sure
      (``text_near_sound``) and the words fall short by little (at least ``text_near_share``
      of their threshold). A turn of at most ``text_short_words`` words needs only
      ``text_short_threshold``: the LM, reading a message with no context, finds short
      answers ("ten of clubs", "six") barely finished, and short cuts ("my name is", "why
      should one") a hundred times less so. When the sound says unfinished and the words
      score ``text_sure`` or more, the turn ends after ``text_sure_wait_ms`` of silence
      rather than ``max_wait_ms`` (read speech whose sentence is plainly whole). The words'
      answer is kept per text as the model reads it (trailing punctuation and case aside),
      so a final that only adds a full stop or a capital is not asked about again. Words
      ending in a filled pause (``hesitations``: "um", "uh") are unfinished without asking.
      Where the ASR gives its own P(a sentence ends after the last word) (``Transcript.end_p``,
      Whisper's, conditioned on the audio), the words of a turn longer than
      ``text_short_words`` read finished — for an end at once, after ``text_near_wait_ms`` or
      after ``text_sure_wait_ms`` — only at or above ``text_asr_end``: text that reads whole
      but was said with more to come. The other way round, an end the ASR is sure of (at or
      above ``text_asr_sure``) ends a turn the sound called finished and the words did not
      after ``text_near_wait_ms``: a question whose last word is a preposition ("What's the
      weather like?") reads unfinished without its voice.
    * ``vad`` (or no model): ``silence_ms`` of silence ends the turn.

    Speech that resumes earlier joins the same turn, whose text is its finals joined in order.
    A final belongs to the latest segment that started before the final's ``end`` (any
    segment, when the ASR leaves ``end`` at 0). A turn whose text is empty ends silently.
    While the caller is silent and the turn's text is known but the turn is not yet over, a
    ``TurnCandidate`` carries that text (once per distinct text), so the LLM can prepare the
    reply; ``UserTurnEnded`` is the decision.

    While the agent speaks (``BotStartedSpeaking`` … ``BotStoppedSpeaking``, which arrive
    upstream from the output transport), caller speech lasting ``barge_in_min_speech_ms`` is a
    barge-in and becomes the next turn. With ``resume_false_interrupts`` the agent first only
    pauses (``PausePlayout``); the first transcript of that speech with a word in it sends the
    ``Interrupt`` that cuts the reply off, and a final with none (a cough, noise) sends
    ``ResumePlayout``: the agent goes on where it stopped. Without it, the ``Interrupt`` goes at
    once. Shorter speech over the agent (a cough, "mm-hm") is a backchannel: it neither
    interrupts nor becomes a turn. Speech is counted from ``SpeechStarted.at`` in media time of
    the AudioIn frames, up to one VAD window behind the newest one, and stops counting at
    ``SpeechPaused``; ``SpeechResumed`` (or a pause that has outlasted ``vad_stop_ms`` without a
    ``SpeechStopped``) starts it again.
    """

    name = "turn"
    # AudioIn is its clock (silence and barge-in are counted in media samples) and the turn
    # model's input; the Bot* frames arrive upstream. Nothing after this stage reads caller
    # audio, so it stops here.
    consumes = frozenset({
        AudioIn, Transcript, SpeechStarted, SpeechPaused, SpeechResumed, SpeechStopped,
        BotStartedSpeaking, BotStoppedSpeaking,
    })

    def __init__(
        self, cfg: TurnConfig, vad_stop_ms: int | None = None, scorer: TurnScorer | None = None,
        text_scorer: TextTurnScorer | None = None,
    ) -> None:
        super().__init__()
        if cfg.mode not in TURN_MODES:
            raise ConfigError(f"turn.mode: expected one of {', '.join(TURN_MODES)}, got {cfg.mode!r}")
        self.cfg = cfg
        stop_ms = VADConfig().stop_ms if vad_stop_ms is None else vad_stop_ms
        self._vad_stop = stop_ms * SAMPLE_RATE // 1000
        self._silence = max(0, cfg.silence_ms) * SAMPLE_RATE // 1000
        self._max_wait = max(0, cfg.max_wait_ms) * SAMPLE_RATE // 1000
        self._rescore = max(0, cfg.rescore_ms) * SAMPLE_RATE // 1000
        self._barge_min = max(0, cfg.barge_in_min_speech_ms) * SAMPLE_RATE // 1000
        self.scorer = scorer if cfg.mode == "semantic" else None
        self.text_scorer = text_scorer if self.scorer is not None and cfg.text_check else None
        self._text_wait = max(0, cfg.text_wait_ms) * SAMPLE_RATE // 1000
        self._sure_wait = max(0, cfg.text_sure_wait_ms) * SAMPLE_RATE // 1000
        self._near_wait = max(0, cfg.text_near_wait_ms) * SAMPLE_RATE // 1000
        self._hesitations = hesitation_words(cfg.hesitations)
        self.turns = 0
        self.interrupts = 0
        self.false_interrupts = 0  # barge-ins whose sound carried no words: the agent resumed
        self.backchannels = 0
        self.late_finals = 0  # finals that arrived after their segment's turn had ended
        self.model_calls = 0
        self.model_failures = 0
        self.text_calls = 0
        self.text_failures = 0
        self.text_holds = 0  # turns the sound called finished and the words kept open
        self.text_sure_ends = 0  # turns the sound heard as unfinished and the words ended
        self.text_near_ends = 0  # turns the words held only just, ended after text_near_wait_ms
        self.asr_end_holds = 0  # pauses whose words read finished and the ASR heard no end
        self.asr_sure_ends = 0  # turns the words held and the ASR's sure end ended
        self.bot_speaking = False
        # A few recent segments are enough to place a late final; older ones fall off.
        self._segments: deque[Segment] = deque(maxlen=8)
        self._parts: list[str] = []
        self._last_final_ns = 0
        self._heard = 0  # media sample where the latest AudioIn ended
        self._audio_seen = False
        self._ending = False  # a segment of the turn has stopped: AudioIn may end the turn
        self._paused = False  # the VAD paused inside the open segment
        self._overlap: Overlap | None = None
        self._tentative: Tentative | None = None
        self._candidate = ""  # the text of the latest TurnCandidate of the open turn
        # the ASR's P(a sentence ends) after the candidate's text, and after the turn's last
        # final with words (None: not told)
        self._candidate_end: float | None = None
        self._final_end: float | None = None
        # The turn model: its input ring (the latest 8 s of caller audio) and its verdict on
        # the current silence (None: not asked yet, or speech came back since).
        self._ring = np.zeros(MODEL_SECONDS * SAMPLE_RATE if self.scorer else 0, dtype=np.int16)
        self._ring_at = 0  # where the next sample goes
        self._verdict: float | None = None
        self._asked_at = -1  # media sample the model's pending or latest verdict heard up to
        self._asking = False
        self._generation = 0  # bumped when speech resumes: a verdict for older audio is stale
        self._model_ns = (0, 0)  # when the latest verdict was asked for and came back
        self._clock_ns = 0  # arrival time of the latest frame (or verdict) that moved a decision
        self._decided_ns = 0  # when the silence or the model ended the turn (its text may lag)
        # The words model's latest answer and the key of the text it is asked about
        self._words: WordsAnswer | None = None
        self._words_asking = ""
        self._held = False  # the current pause: sound said finished, the words did not
        self._asr_held = False  # the current pause: the words read finished, the ASR did not

    # --- frames ----------------------------------------------------------------------------
    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)
        if isinstance(frame, AudioIn):
            if direction is DOWN:
                self._heard = frame.end
                self._audio_seen = True
                self._clock_ns = frame.t_ns
                if len(self._ring):
                    self._record(frame.pcm)
                if self._overlap is not None:
                    self._check_barge_in()
                if self._ending:
                    self._check_turn_end()
        elif isinstance(frame, Transcript):
            if direction is DOWN:
                self._on_transcript(frame)
        elif isinstance(frame, SpeechStarted):
            self._on_speech_started(frame)
        elif isinstance(frame, SpeechStopped):
            self._on_speech_stopped(frame)
        elif isinstance(frame, SpeechPaused):
            self._on_speech_paused(frame)
        elif isinstance(frame, SpeechResumed):
            self._on_speech_resumed(frame)
        elif isinstance(frame, BotStartedSpeaking):
            self._on_bot_started()
        elif isinstance(frame, BotStoppedSpeaking):
            self._on_bot_stopped()
        elif isinstance(frame, EndOfCall):
            self._segments.clear()
            self._parts.clear()
            self._final_end = self._candidate_end = None
            self._overlap = None
            self._tentative = None
            self._ending = False
            self._generation += 1

    def _record(self, pcm: np.ndarray) -> None:
        """Keep the latest 8 s of caller audio in a ring (written in place: no allocation)."""
        if pcm.dtype != np.int16 or pcm.ndim != 1:
            return  # the VAD has already reported it
        ring = self._ring
        cap = len(ring)
        if len(pcm) >= cap:
            ring[:] = pcm[-cap:]
            self._ring_at = 0
            return
        at = self._ring_at
        first = min(len(pcm), cap - at)
        ring[at:at + first] = pcm[:first]
        ring[:len(pcm) - first] = pcm[first:]
        self._ring_at = (at + len(pcm)) % cap

    def _latest(self) -> np.ndarray:
        """The ring's audio, oldest first, up to the newest sample heard (a copy)."""
        ring, at = self._ring, self._ring_at
        filled = min(self._heard, len(ring))
        audio = np.concatenate((ring[at:], ring[:at]))
        return audio[len(audio) - filled:]

    @property
    def _open(self) -> Segment | None:
        seg = self._segments[-1] if self._segments else None
        return seg if seg is not None and seg.stop is None else None

    def _on_speech_started(self, frame: SpeechStarted) -> None:
        if self._open is not None:
            return  # a repeated start; the segment is already open
        self._speech_came_back()
        over = self.bot_speaking and self.cfg.barge_in
        self._segments.append(Segment(frame.at, Role.OVER if over else Role.TURN))
        if over:
            self._overlap = Overlap(frame.at, frame.at)
            self._check_barge_in()

    def _on_speech_paused(self, frame: SpeechPaused) -> None:
        seg = self._open
        if seg is not None:
            self._paused = True
            if (self.cfg.ask_at_pause and self.scorer is not None and seg.role is Role.TURN
                    and not self._asking and not self.model_failures):
                self._ask()  # the verdict for the stop that may follow, asked before it
        ov = self._overlap
        if ov is None or ov.paused_at is not None or seg is None:
            return
        ov.banked += max(0, frame.at - ov.since)
        ov.paused_at = frame.at
        self._check_barge_in()

    def _on_speech_resumed(self, frame: SpeechResumed) -> None:
        self._speech_came_back()
        ov = self._overlap
        if ov is not None and ov.paused_at is not None:
            ov.since, ov.paused_at = frame.at, None

    def _speech_came_back(self) -> None:
        """The caller goes on: whatever was judged or prepared for the silence is stale."""
        self._paused = False
        self._candidate = ""
        self._candidate_end = None
        self._verdict = None
        self._asked_at = -1
        self._decided_ns = 0
        self._held = self._asr_held = False
        self._generation += 1

    def _on_speech_stopped(self, frame: SpeechStopped) -> None:
        seg = self._open
        if seg is None:
            return
        seg.stop = frame
        self._clock_ns = frame.t_ns
        self._paused = False
        self._overlap = None
        if seg.role is Role.OVER:
            seg.role = Role.BACKCHANNEL
            self.backchannels += 1
            return
        seg.covered = seg.covered or seg.final_end >= frame.at - COVER_SLACK
        self._ending = True
        self._check_turn_end()

    def _on_bot_started(self) -> None:
        self.bot_speaking = True
        if self.cfg.barge_in and self._open is not None and self._tentative is None:
            # The caller was already talking: only what they say over the agent counts.
            self._overlap = Overlap(self._heard, self._heard)

    def _on_bot_stopped(self) -> None:
        self.bot_speaking = False
        self._overlap = None
        seg = self._open
        if seg is not None and seg.role is Role.OVER:
            seg.role = Role.TURN  # the caller keeps talking after the agent finished

    def _on_transcript(self, frame: Transcript) -> None:
        tent = self._tentative
        if tent is not None and self._segment_of(frame.end) is tent.segment:
            if has_words(frame.text):
                self._confirm_barge_in(tent)
            elif frame.final:
                self._resume(tent)
                return
        if frame.final:
            self._on_final(frame)
        elif frame.speculative:
            seg = self._open
            if seg is not None and seg.role is Role.TURN and self._paused:
                self._candidate_end = frame.end_p
                self._offer(" ".join([*self._parts, frame.text.strip()]).strip())
        elif self.text_scorer is not None and not self.text_failures and not self._paused:
            self._warm_words(frame)

    def _warm_words(self, frame: Transcript) -> None:
        """While the caller speaks, the words model reads the turn's words the ASR will not
        take back (the partial's stable prefix, up to its last whole word), so the question at
        the pause evaluates only the few after them."""
        seg = self._open
        if seg is None or seg.role is not Role.TURN:
            return
        stable = " ".join([*self._parts, frame.stable_words()]).strip()
        if stable:
            assert self.text_scorer is not None
            self.text_scorer.warm(stable)

    def _on_final(self, frame: Transcript) -> None:
        seg = self._segment_of(frame.end)
        if seg is None or seg.role is not Role.TURN:
            if seg is not None and seg.role is Role.DONE:
                self.late_finals += 1
            return
        if seg.stop is None:
            seg.final_end = max(seg.final_end, frame.end)
        else:
            seg.covered = True
        text = frame.text.strip()
        if text:
            self._parts.append(text)
            self._final_end = frame.end_p
        self._last_final_ns = frame.t_ns
        self._check_turn_end()

    def _segment_of(self, end: int) -> Segment | None:
        if end == 0:
            return self._segments[-1] if self._segments else None
        for seg in reversed(self._segments):
            if seg.start < end:
                return seg
        return None

    def _offer(self, text: str) -> None:
        """A TurnCandidate for ``text``, unless it is empty or already on offer."""
        if text and text != self._candidate:
            self._candidate = text
            self.push(TurnCandidate(text), DOWN)

    # --- barge-in ----------------------------------------------------------------------------
    def _check_barge_in(self) -> None:
        ov = self._overlap
        if ov is None:
            return
        if ov.paused_at is None:
            spoken = ov.banked + max(0, self._heard - VAD_VERDICT_LAG - ov.since)
        elif self._heard - ov.paused_at > self._vad_stop + VAD_VERDICT_LAG:
            ov.since, ov.paused_at = self._heard, None  # the VAD would have stopped: resumed
            spoken = ov.banked
        else:
            spoken = ov.banked
        if spoken < self._barge_min:
            return
        self._overlap = None
        seg = self._open
        if seg is not None:
            seg.role = Role.TURN
        self.bot_speaking = False  # paused or cut off; speaking again sends BotStarted again
        if self.cfg.resume_false_interrupts and seg is not None:
            self._tentative = Tentative(seg, ov.start)
            self.push(PausePlayout(ov.start), DOWN)
            return
        self._interrupt(ov.start)

    def _confirm_barge_in(self, tent: Tentative) -> None:
        self._tentative = None
        self._interrupt(tent.at)

    def _interrupt(self, at: int) -> None:
        self.interrupts += 1
        trace = self.ctx.trace
        if trace is not None:
            trace.abandon()
        self.push(Interrupt(at), DOWN)

    def _resume(self, tent: Tentative) -> None:
        """The barge-in carried no words: the agent goes on, and the sound is no turn."""
        self._tentative = None
        self.false_interrupts += 1
        seg = tent.segment
        if seg.role is Role.TURN:
            seg.role = Role.BACKCHANNEL
        self.push(ResumePlayout(), DOWN)

    # --- end of turn ---------------------------------------------------------------------------
    def _check_turn_end(self) -> None:
        if self._open is not None:
            return
        last = next((s for s in reversed(self._segments) if s.role is Role.TURN), None)
        if last is None or last.stop is None:
            return
        stop = last.stop
        silence = self._heard - stop.at if self._audio_seen else None
        text = " ".join(self._parts) if last.covered else (self._candidate or None)
        end_p = self._final_end if last.covered else self._candidate_end
        if self.scorer is not None and not self._decided(silence, text, end_p):
            if last.covered:
                self._offer(" ".join(self._parts))
            return
        if self.scorer is None and silence is not None and silence < self._silence:
            if last.covered:
                self._offer(" ".join(self._parts))
            return
        if not self._decided_ns:
            self._decided_ns = self._clock_ns or time.monotonic_ns()
        if not last.covered:
            return
        self._end_turn(stop)

    def _decided(self, silence: int | None, text: str | None, end_p: float | None = None) -> bool:
        """Semantic mode: whether the silence so far ends the turn, asking the models when due.
        ``text`` is the turn's text as far as it is known (None: not yet); ``end_p`` the ASR's
        P(a sentence ends) after it (None: not told)."""
        if silence is None or silence >= self._max_wait:
            return True
        words = self._words_say(text)
        verdict = self._verdict
        # the ASR heard the sentence end (or does not say): the words may read finished. Not
        # asked of a short turn: Whisper is as unsure of short answers ("6." 0.38, "7 of clubs"
        # 0.39) as of short cuts ("why should" 0.40)
        heard = (end_p is None or words is None or not words.judged or words.short
                 or end_p >= self.cfg.text_asr_end)
        if verdict is not None and verdict >= self.cfg.complete_threshold:
            if words is None:
                return False  # the words model's answer (or the text to ask about) is coming
            threshold = self._words_threshold(words)
            if silence >= self._text_wait:
                return True
            near = (verdict >= self.cfg.text_near_sound and silence >= self._near_wait
                    and words.p >= self.cfg.text_near_share * threshold)
            if words.p >= threshold or near:
                if not heard:
                    self._hold_for_asr()
                    return False
                if words.p < threshold:
                    self.text_near_ends += 1
                return True
            if (end_p is not None and end_p >= self.cfg.text_asr_sure and heard and words.judged
                    and not words.filled and silence >= self._near_wait):
                self.asr_sure_ends += 1  # two readers of three hear the end
                return True
            if not self._held:
                self._held = True
                self.text_holds += 1
            return False
        if (silence >= self._sure_wait and words is not None and words.judged
                and words.p >= self.cfg.text_sure):
            if heard:
                self.text_sure_ends += 1
                return True
            self._hold_for_asr()
        if self.model_failures and verdict is None:
            return silence >= self._silence  # no model for this pause: the fixed silence
        due = self._asked_at < 0 or (
            self._rescore > 0 and verdict is not None and self._heard - self._asked_at >= self._rescore
        )
        if due and not self._asking:
            self._ask()
        return False

    def _hold_for_asr(self) -> None:
        """The words read finished, the ASR heard no sentence end: the turn waits on."""
        if not self._asr_held:
            self._asr_held = True
            self.asr_end_holds += 1

    def _words_threshold(self, words: WordsAnswer) -> float:
        """The words' P(the message ends) that lets a turn the sound called finished end."""
        if words.short:
            return min(self.cfg.text_threshold, self.cfg.text_short_threshold)
        return self.cfg.text_threshold

    def _words_say(self, text: str | None) -> WordsAnswer | None:
        """The words model's answer on ``text``: ``NO_SAY`` where it has none (no words model,
        it failed, an empty turn), None while it is asked (asking it if need be)."""
        if self.text_scorer is None or self.text_failures or text == "":
            return NO_SAY
        if text is None:
            return None
        key = words_key(text)
        if not key:
            return NO_SAY  # punctuation alone: nothing for the words to judge
        words = self._words
        if words is not None and words.key == key:
            return words
        if ends_in_hesitation(key, self._hesitations):
            # "...for, um": the caller is finding the next words. Unfinished, the model not
            # asked; kept as its answer would be, so the next frames of the pause read it back.
            self._words = WordsAnswer(key, 0.0, time.monotonic_ns(), filled=True)
            return self._words
        if ends_in_loop(key):
            return NO_SAY  # the ASR's decoding loop: the sound alone judges
        if self._words_asking != key:
            self._words_asking = key
            self.text_calls += 1
            self.ctx.spawn(self._score_words(text, key), name="turn-words")
        return None

    async def _score_words(self, text: str, key: str) -> None:
        assert self.text_scorer is not None
        try:
            p = await self.text_scorer.predict(text)
        except Exception as exc:
            self.text_failures += 1
            if self.text_failures == 1:
                log.exception("end-of-turn words model failed; judging turns by sound alone")
                self.push_error(f"end-of-turn words model failed ({exc}); judging turns by "
                                "sound alone")
        else:
            short = len(WORD.findall(key)) <= self.cfg.text_short_words
            self._words = WordsAnswer(key, float(p), time.monotonic_ns(), short)
        if self._words_asking == key:
            self._words_asking = ""
        if self._ending:
            self._clock_ns = time.monotonic_ns()
            self._check_turn_end()

    def _ask(self) -> None:
        assert self.scorer is not None
        self._asking = True
        self._asked_at = self._heard
        self.model_calls += 1
        self.ctx.spawn(self._score(self._latest(), self._generation), name="turn-model")

    async def _score(self, audio: np.ndarray, generation: int) -> None:
        assert self.scorer is not None
        asked_ns = time.monotonic_ns()
        try:
            p = await self.scorer.predict(audio)
        except Exception as exc:
            self._asking = False
            self.model_failures += 1
            if self.model_failures == 1:
                log.exception("turn model failed; ending turns on a fixed silence instead")
                self.push_error(f"turn model failed ({exc}); ending turns on a fixed silence")
            if generation == self._generation:
                self._check_turn_end()
            return
        self._asking = False
        if generation != self._generation:
            return  # the caller went on meanwhile
        self._verdict = float(p)
        self._model_ns = (asked_ns, time.monotonic_ns())
        self._clock_ns = self._model_ns[1]
        if self._ending:
            self._check_turn_end()

    def _end_turn(self, stop: SpeechStopped) -> None:
        self._ending = False
        for seg in self._segments:
            if seg.role is Role.TURN:
                seg.role = Role.DONE
        text = " ".join(self._parts)
        self._parts.clear()
        end_p, self._final_end, self._candidate_end = self._final_end, None, None
        verdict, (asked_ns, scored_ns) = self._verdict, self._model_ns
        words = self._words if self._words is not None and self._words.key == words_key(text) else None
        decided_ns = self._decided_ns
        if words is not None and scored_ns:
            # the decision waited for both models: the later answer, unless the words' came
            # only after the decision (max_wait_ms or text_wait_ms ended the turn first)
            scored_ns = max(scored_ns, min(words.at_ns, decided_ns) if decided_ns else words.at_ns)
        self._candidate = ""
        self._verdict = None
        self._asked_at = -1
        self._decided_ns = 0
        self._model_ns = (0, 0)
        self._held = self._asr_held = False
        self._generation += 1
        if not text:
            return
        self.turns += 1
        trace = self.ctx.trace
        if trace is not None:
            trace.begin_turn(
                # the ASR's wait is what the final added after the decision (none if it was in)
                speech_end=stop.speech_end_ns, vad_decision=decided_ns,
                asr_final=max(self._last_final_ns, decided_ns), turn_model_request=asked_ns,
                turn_model_result=scored_ns,
            )
            trace.note(text=text)
            if verdict is not None:
                trace.info(p_complete=round(verdict, 3))
            if words is not None:
                trace.info(p_words=round(words.p, 3))
            if end_p is not None:
                trace.info(p_asr_end=round(end_p, 3))
        self.push(UserTurnEnded(text), DOWN)
