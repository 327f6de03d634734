"""Turn detection: decides when the caller has finished a turn (VAD silence plus a final
transcript) and when the caller is barging in on the agent (an Interrupt sent downstream)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from agent.config import TurnConfig, VADConfig
from agent.frames import (
    SAMPLE_RATE,
    AudioIn,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    EndOfCall,
    Frame,
    Interrupt,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    Transcript,
    UserTurnEnded,
)
from agent.stage import DOWN, Stage

# How far a final's ``end`` may fall short of the VAD's end of speech and still count as covering
# it: the ASR cuts audio on 20 ms frames, the VAD decides on 32 ms windows.
COVER_SLACK = 512

# The VAD judges audio in 512-sample windows and its verdict on the newest audio follows that
# audio, so speech is only counted up to one window before the latest AudioIn: otherwise the
# silence after a short blip would count as speech before the VAD's SpeechPaused arrives.
VAD_VERDICT_LAG = 512


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


class TurnDetector(Stage):
    """VAD-based endpointing with a configurable silence, and barge-in.

    A turn is one or more speech segments (SpeechStarted … SpeechStopped). It ends when its last
    segment has a final transcript and ``silence_ms`` of caller audio has passed since that
    segment's end, counted in media samples of the ``AudioIn`` frames that keep arriving (if no
    audio reaches this stage, the VAD's own stop silence is all it can count). Speech that
    resumes earlier joins the same turn, whose text is its finals joined in order. A final
    belongs to the latest segment that started before the final's ``end`` (any segment, when
    the ASR leaves ``end`` at 0). A turn whose text is empty ends silently.

    While the agent speaks (``BotStartedSpeaking`` … ``BotStoppedSpeaking``, which arrive
    upstream from the output transport), caller speech lasting ``barge_in_min_speech_ms`` sends
    an ``Interrupt`` downstream at once and becomes the next turn. Shorter speech over the
    agent (a cough, "mm-hm") is a backchannel: it neither interrupts nor becomes a turn. Speech
    is counted from ``SpeechStarted.at`` in media time of the AudioIn frames, up to one VAD
    window behind the newest one, and stops counting at ``SpeechPaused``. The frames have no
    "speech resumed" event, so a pause that has outlasted ``vad_stop_ms`` without a
    ``SpeechStopped`` is taken as resumed speech and counting starts again from there.
    """

    name = "turn"
    # AudioIn is its clock (silence and barge-in are counted in media samples); the Bot* frames
    # arrive upstream. Nothing after this stage reads caller audio, so it stops here.
    consumes = frozenset({
        AudioIn, Transcript, SpeechStarted, SpeechPaused, SpeechStopped,
        BotStartedSpeaking, BotStoppedSpeaking,
    })

    def __init__(self, cfg: TurnConfig, vad_stop_ms: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        stop_ms = VADConfig().stop_ms if vad_stop_ms is None else vad_stop_ms
        self._vad_stop = stop_ms * SAMPLE_RATE // 1000
        self._silence = max(0, cfg.silence_ms) * SAMPLE_RATE // 1000
        self._barge_min = max(0, cfg.barge_in_min_speech_ms) * SAMPLE_RATE // 1000
        self.turns = 0
        self.interrupts = 0
        self.backchannels = 0
        self.late_finals = 0  # finals that arrived after their segment's turn had ended
        self.bot_speaking = False
        # A few recent segments are enough to place a late final; older ones fall off.
        self._segments: deque[Segment] = deque(maxlen=8)
        self._parts: list[str] = []
        self._last_final_ns = 0
        self._heard = 0  # media sample where the latest AudioIn ended
        self._audio_seen = False
        self._ending = False  # a segment of the turn has stopped: AudioIn may end the turn
        self._overlap: Overlap | None = None

    # --- frames ----------------------------------------------------------------------------
    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)
        if isinstance(frame, AudioIn):
            if direction is DOWN:
                self._heard = frame.end
                self._audio_seen = True
                if self._overlap is not None:
                    self._check_barge_in()
                if self._ending:
                    self._check_turn_end()
        elif isinstance(frame, Transcript):
            if frame.final and direction is DOWN:
                self._on_final(frame)
        elif isinstance(frame, SpeechStarted):
            self._on_speech_started(frame)
        elif isinstance(frame, SpeechStopped):
            self._on_speech_stopped(frame)
        elif isinstance(frame, SpeechPaused):
            self._on_speech_paused(frame)
        elif isinstance(frame, BotStartedSpeaking):
            self._on_bot_started()
        elif isinstance(frame, BotStoppedSpeaking):
            self._on_bot_stopped()
        elif isinstance(frame, EndOfCall):
            self._segments.clear()
            self._parts.clear()
            self._overlap = None
            self._ending = False

    @property
    def _open(self) -> Segment | None:
        seg = self._segments[-1] if self._segments else None
        return seg if seg is not None and seg.stop is None else None

    def _on_speech_started(self, frame: SpeechStarted) -> None:
        if self._open is not None:
            return  # a repeated start; the segment is already open
        over = self.bot_speaking and self.cfg.barge_in
        self._segments.append(Segment(frame.at, Role.OVER if over else Role.TURN))
        if over:
            self._overlap = Overlap(frame.at, frame.at)
            self._check_barge_in()

    def _on_speech_paused(self, frame: SpeechPaused) -> None:
        ov = self._overlap
        if ov is None or ov.paused_at is not None or self._open is None:
            return
        ov.banked += max(0, frame.at - ov.since)
        ov.paused_at = frame.at
        self._check_barge_in()

    def _on_speech_stopped(self, frame: SpeechStopped) -> None:
        seg = self._open
        if seg is None:
            return
        seg.stop = frame
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
        if self.cfg.barge_in and self._open is not None:
            # The caller was already talking: only what they say over the agent counts.
            self._overlap = Overlap(self._heard, self._heard)

    def _on_bot_stopped(self) -> None:
        self.bot_speaking = False
        self._overlap = None
        seg = self._open
        if seg is not None and seg.role is Role.OVER:
            seg.role = Role.TURN  # the caller keeps talking after the agent finished

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
        self._last_final_ns = frame.t_ns
        self._check_turn_end()

    def _segment_of(self, end: int) -> Segment | None:
        if end == 0:
            return self._segments[-1] if self._segments else None
        for seg in reversed(self._segments):
            if seg.start < end:
                return seg
        return None

    # --- decisions ---------------------------------------------------------------------------
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
        self.bot_speaking = False  # the Interrupt silences it; a new reply sends BotStarted again
        self.interrupts += 1
        trace = self.ctx.trace
        if trace is not None:
            trace.abandon()
        self.push(Interrupt(ov.start), DOWN)

    def _check_turn_end(self) -> None:
        if self._open is not None:
            return
        last = next((s for s in reversed(self._segments) if s.role is Role.TURN), None)
        if last is None or not last.covered or last.stop is None:
            return
        stop = last.stop
        if self._audio_seen and self._heard - stop.at < self._silence:
            return
        self._ending = False
        for seg in self._segments:
            if seg.role is Role.TURN:
                seg.role = Role.DONE
        text = " ".join(self._parts)
        self._parts.clear()
        if not text:
            return
        self.turns += 1
        trace = self.ctx.trace
        if trace is not None:
            trace.begin_turn(
                speech_end=stop.speech_end_ns, vad_decision=stop.t_ns, asr_final=self._last_final_ns
            )
            trace.note(text=text)
        self.push(UserTurnEnded(text), DOWN)
