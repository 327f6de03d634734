"""Tests for stages/turn.py: endpointing, multi-segment turns, barge-in and the trace calls.

Most tests play the VAD and the ASR by hand at the frame level, with a media clock that advances
320 samples per AudioIn and a fake arrival clock, so every decision point is exact; the last few
put the real Silero VAD in front on recorded speech.
"""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
import pytest
from speech import STEP_IDS, STEPS, perturb

from agent.config import Config, TurnConfig, VADConfig
from agent.errors import ConfigError
from agent.frames import (
    ANY_FRAME,
    AudioIn,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    Direction,
    EndOfCall,
    ErrorFrame,
    Frame,
    Interrupt,
    LLMTextDelta,
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
from agent.pipeline import Pipeline
from agent.presets import load_models
from agent.stage import Stage, StageContext
from agent.trace import Trace
from stages.turn import VAD_VERDICT_LAG, TurnDetector, has_words
from stages.vad import SileroModel, VADStage

SR = 16_000
FRAME = 320
MS = SR // 1000
VAD_START_MS = 60
VAD_STOP_MS = 300
DOWN = Direction.DOWNSTREAM


class Call:
    """A TurnDetector in a pipeline, with a hand-played VAD and ASR in front of it."""

    def __init__(self, cfg: TurnConfig | None = None, trace: Trace | None = None) -> None:
        self.cfg = cfg or TurnConfig()
        self.turn = TurnDetector(self.cfg)
        self.out: list[Frame] = []
        self.up: list[Frame] = []
        self.pipe = Pipeline([self.turn], on_output=self.out.append, on_upstream=self.up.append)
        asyncio.run(self.pipe.start(StageContext(trace=trace)))
        self.pos = 0  # media samples sent so far
        self.clock = 1_000_000_000  # fake monotonic ns of the next frame
        self.audio_frames: list[AudioIn] = []

    def tick(self) -> int:
        self.clock += 20_000_000
        return self.clock

    def send(self, frame: Frame) -> Frame:
        self.pipe.push(frame, DOWN)
        return frame

    def audio(self, ms: int) -> None:
        assert ms % 20 == 0, "whole 20 ms frames only"
        for _ in range(ms * MS // FRAME):
            frame = AudioIn(np.zeros(FRAME, dtype=np.int16), offset=self.pos, t_ns=self.tick())
            self.pos = frame.end
            self.audio_frames.append(frame)
            self.send(frame)

    def speech_start(self) -> int:
        """Speech begins now; the VAD says so once it has heard VAD_START_MS of it."""
        at = self.pos
        self.audio(VAD_START_MS)
        self.send(SpeechStarted(at, t_ns=self.tick()))
        return at

    def pause(self) -> int:
        """Speech ended now; the VAD pauses 40 ms later. Where the speech ended."""
        end = self.pos
        self.audio(40)
        self.send(SpeechPaused(end, t_ns=self.tick()))
        return end

    def speech_stop(self, started_at: int) -> SpeechStopped:
        """Speech ended now; the VAD pauses at once and stops after VAD_STOP_MS of silence."""
        held = self.audio_frames[-1].t_ns
        end = self.pause()
        self.audio(VAD_STOP_MS - 40)
        return self.send(
            SpeechStopped(end, started_at=started_at, speech_end_ns=held, t_ns=self.tick())
        )  # type: ignore[return-value]

    def say(self, ms: int) -> SpeechStopped:
        at = self.speech_start()
        self.audio(ms - VAD_START_MS)
        return self.speech_stop(at)

    def final(self, text: str, start: int, end: int) -> Transcript:
        return self.send(Transcript(text, final=True, start=start, end=end, t_ns=self.tick()))  # type: ignore[return-value]

    def bot(self, frame: Frame) -> None:
        self.pipe.inject_upstream(frame)

    def ends(self) -> list[str]:
        return [f.text for f in self.out if isinstance(f, UserTurnEnded)]


# --- endpointing ---


@pytest.mark.parametrize("silence_ms", [0, 300, 800, 1500])
def test_the_turn_ends_once_the_final_is_in_and_the_silence_has_passed(silence_ms: int) -> None:
    call = Call(TurnConfig(silence_ms=silence_ms))
    stop = call.say(900)
    final = call.final("book a table for two", stop.started_at, stop.at)
    call.audio(2000)
    assert call.ends() == ["book a table for two"]
    i = next(i for i, f in enumerate(call.out) if isinstance(f, UserTurnEnded))
    if silence_ms <= VAD_STOP_MS:
        assert call.out[i - 1] is final  # SpeechStopped already implied enough silence
    else:
        before = call.out[i - 1]
        assert isinstance(before, AudioIn)
        # Exactly when silence_ms of audio had passed since the end of speech, not a frame later.
        assert before.end - stop.at >= silence_ms * MS > before.end - FRAME - stop.at
    assert call.turn.turns == 1


def test_no_final_no_turn_however_long_the_silence() -> None:
    call = Call(TurnConfig(silence_ms=500))
    stop = call.say(700)
    call.audio(3000)
    assert call.ends() == []
    final = call.final("hello", stop.started_at, stop.at)
    assert call.ends() == ["hello"] and call.out[-2] is final


def test_speech_that_resumes_within_the_silence_joins_the_turn() -> None:
    call = Call(TurnConfig(silence_ms=1000))
    first = call.say(800)
    call.final("I would like", first.started_at, first.at)
    call.audio(400)  # 700 ms of silence in all: not yet a turn
    assert call.ends() == []
    second = call.say(900)
    call.final("a table for two", second.started_at, second.at)
    call.audio(600)
    assert call.ends() == []
    call.audio(200)
    assert call.ends() == ["I would like a table for two"]
    call.audio(2000)
    assert call.turn.turns == 1


def test_a_late_final_for_the_first_segment_does_not_end_the_turn_early() -> None:
    call = Call(TurnConfig(silence_ms=300))
    first = call.say(800)
    call.audio(100)
    at = call.speech_start()  # the caller goes on before the ASR is done with the first part
    call.final("first part", first.started_at, first.at)
    call.audio(600)
    second = call.speech_stop(at)
    call.audio(500)
    assert call.ends() == []  # the second segment has no final yet
    call.final("second part", second.started_at, second.at)
    assert call.ends() == ["first part second part"]


def test_a_final_for_an_earlier_segment_does_not_cover_the_last_one() -> None:
    call = Call(TurnConfig(silence_ms=300))
    first = call.say(800)
    call.audio(100)
    second = call.say(600)  # both segments are over before the ASR delivers anything
    call.final("first part", first.started_at, first.at)
    call.audio(500)
    assert call.ends() == []
    call.final("second part", second.started_at, second.at)
    assert call.ends() == ["first part second part"]


def test_a_final_before_the_stop_counts_when_it_covers_the_end_of_speech() -> None:
    # An ASR that transcribes on SpeechPaused delivers the final before SpeechStopped.
    call = Call(TurnConfig(silence_ms=300))
    at = call.speech_start()
    call.audio(800)
    end = call.pos
    call.audio(40)
    call.send(SpeechPaused(end))
    call.final("early bird", at, end)
    call.audio(VAD_STOP_MS - 40)
    assert call.ends() == []
    stop = call.send(SpeechStopped(end, started_at=at))
    assert call.ends() == ["early bird"] and call.out[-1] == UserTurnEnded(
        "early bird", t_ns=call.out[-1].t_ns
    )
    assert call.out.index(stop) == len(call.out) - 2


def test_a_commit_in_the_middle_of_speech_does_not_end_the_turn() -> None:
    call = Call(TurnConfig(silence_ms=300))
    at = call.speech_start()
    call.audio(2000)
    call.final("a long story", at, call.pos)  # the ASR committed part of a long utterance
    call.audio(1000)
    stop = call.speech_stop(at)
    call.audio(1000)
    assert call.ends() == []
    call.final("with an ending", stop.started_at + 2000 * MS, stop.at)
    assert call.ends() == ["a long story with an ending"]


def test_empty_finals_end_nothing() -> None:
    trace = Trace()
    call = Call(TurnConfig(silence_ms=300), trace=trace)
    cough = call.say(300)
    call.final("  ", cough.started_at, cough.at)
    call.audio(1000)
    assert call.ends() == [] and trace.current is None and call.turn.turns == 0
    words = call.say(600)
    call.final("", words.started_at, words.at)
    call.audio(100)
    more = call.say(600)
    call.final("yes please", more.started_at, more.at)
    assert call.ends() == ["yes please"]


def test_a_final_after_the_turn_ended_is_late_not_a_new_turn() -> None:
    call = Call(TurnConfig(silence_ms=300))
    stop = call.say(700)
    call.final("hello", stop.started_at, stop.at)
    call.final("hello again", stop.started_at, stop.at + 100)
    call.audio(1000)
    nxt = call.say(500)
    call.final("bye", nxt.started_at, nxt.at)
    assert call.ends() == ["hello", "bye"]
    assert call.turn.late_finals == 1


def test_transcripts_are_forwarded() -> None:
    call = Call()
    partial = call.send(Transcript("hel", final=False))
    final = call.send(Transcript("hello", final=True))
    assert partial in call.out and final in call.out


# --- trace ---


def test_a_turn_opens_a_trace_turn_with_the_vad_and_asr_times() -> None:
    trace = Trace()
    call = Call(TurnConfig(silence_ms=300), trace=trace)
    stop = call.say(800)
    final = call.final("what time is it", stop.started_at, stop.at)
    turn = trace.current
    assert turn is not None and turn.text == "what time is it"
    assert turn.events == {
        "speech_end": stop.speech_end_ns,
        "vad_decision": stop.t_ns,
        "asr_final": final.t_ns,
    }
    assert stop.speech_end_ns == next(a.t_ns for a in call.audio_frames if a.end == stop.at)
    trace.event("audio_out", stop.speech_end_ns + 900_000_000)
    (record,) = trace.turns
    assert record["complete"] and record["text"] == "what time is it"
    assert record["spans"]["voice_to_voice"]["ms"] == 900.0


# --- barge-in ---


def bot_speaking(call: Call) -> None:
    call.bot(BotStartedSpeaking())
    call.audio(200)


def test_bot_frames_go_upstream_and_are_tracked() -> None:
    call = Call()
    call.bot(BotStartedSpeaking())
    assert call.turn.bot_speaking and isinstance(call.up[-1], BotStartedSpeaking)
    call.bot(BotStoppedSpeaking())
    assert not call.turn.bot_speaking and isinstance(call.up[-1], BotStoppedSpeaking)


def test_a_short_blip_over_the_agent_neither_interrupts_nor_becomes_a_turn() -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=160, resume_false_interrupts=False))
    bot_speaking(call)
    blip = call.say(140)  # 140 ms < 160 ms
    call.final("mm-hmm", blip.started_at, blip.at)
    call.audio(1000)
    assert not any(isinstance(f, Interrupt) for f in call.out)
    assert call.ends() == [] and call.turn.interrupts == 0 and call.turn.backchannels == 1


@pytest.mark.parametrize("min_ms", [100, 160, 400])
def test_speech_over_the_agent_interrupts_after_the_minimum(min_ms: int) -> None:
    trace = Trace()
    call = Call(TurnConfig(barge_in_min_speech_ms=min_ms, resume_false_interrupts=False), trace=trace)
    trace.begin_turn(speech_end=1)  # the agent's reply to the previous turn is in flight
    bot_speaking(call)
    at = call.speech_start()
    call.audio(700)
    stop = call.speech_stop(at)
    interrupts = [f for f in call.out if isinstance(f, Interrupt)]
    assert len(interrupts) == 1 and interrupts[0].at == at and call.turn.interrupts == 1
    i = call.out.index(interrupts[0])
    trigger = call.out[i - 1]
    assert isinstance(trigger, AudioIn)
    # Sent right after the frame that completed min_ms of speech (as far as the VAD has judged
    # it), before any later frame.
    heard = trigger.end - VAD_VERDICT_LAG - at
    assert heard >= min_ms * MS > heard - FRAME
    assert isinstance(call.out[i + 1], AudioIn) and call.out[i + 1].offset == trigger.end
    assert trace.turns[-1]["complete"] is False and trace.current is None
    # The caller's speech is the next turn.
    call.final("stop, wait", stop.started_at, stop.at)
    assert call.ends() == ["stop, wait"]


def test_a_blip_below_the_minimum_then_real_speech() -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=300, resume_false_interrupts=False))
    bot_speaking(call)
    call.say(240)
    call.audio(500)
    assert call.turn.interrupts == 0
    at = call.speech_start()
    call.audio(400)
    assert call.turn.interrupts == 1
    call.speech_stop(at)
    call.bot(BotStoppedSpeaking(interrupted=True))
    assert call.turn.interrupts == 1


def test_barge_in_off_never_interrupts_and_the_speech_is_a_turn() -> None:
    call = Call(TurnConfig(barge_in=False))
    bot_speaking(call)
    stop = call.say(1500)
    call.final("are you still there", stop.started_at, stop.at)
    assert not any(isinstance(f, Interrupt) for f in call.out)
    assert call.ends() == ["are you still there"]


def test_speech_after_the_agent_stopped_does_not_interrupt() -> None:
    call = Call()
    bot_speaking(call)
    call.bot(BotStoppedSpeaking())
    stop = call.say(1000)
    call.final("thanks", stop.started_at, stop.at)
    assert call.turn.interrupts == 0 and call.ends() == ["thanks"]


def test_speech_already_under_way_counts_from_when_the_agent_starts() -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=160, resume_false_interrupts=False))
    at = call.speech_start()
    call.audio(500)
    call.bot(BotStartedSpeaking())
    started = call.pos
    call.audio(180)  # 160 ms plus the VAD's verdict lag of 32 ms is not reached yet
    assert call.turn.interrupts == 0
    call.audio(20)
    (interrupt,) = [f for f in call.out if isinstance(f, Interrupt)]
    assert interrupt.at == started
    call.speech_stop(at)


def test_an_agent_that_stops_mid_blip_makes_the_speech_a_turn() -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=400, resume_false_interrupts=False))
    bot_speaking(call)
    at = call.speech_start()
    call.audio(100)
    call.bot(BotStoppedSpeaking())
    call.audio(500)
    stop = call.speech_stop(at)
    call.final("so anyway", stop.started_at, stop.at)
    assert call.turn.interrupts == 0 and call.ends() == ["so anyway"]


# --- everything else ---


def test_other_frames_pass_through_both_ways() -> None:
    call = Call()
    delta, err = LLMTextDelta("hi"), ErrorFrame("boom")
    call.send(delta)
    call.bot(err)
    call.bot(Interrupt(5))
    assert call.out == [delta]
    assert call.up[:1] == [err] and isinstance(call.up[1], Interrupt)


def test_end_of_call_drops_the_unfinished_turn() -> None:
    call = Call(TurnConfig(silence_ms=2000))
    stop = call.say(600)
    call.final("half a thought", stop.started_at, stop.at)
    eoc = call.send(EndOfCall())
    assert call.out[-1] is eoc
    call.audio(3000)
    assert call.ends() == []


def test_speech_that_resumes_after_a_pause_over_the_agent_still_interrupts() -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=160, resume_false_interrupts=False))
    bot_speaking(call)
    at = call.speech_start()
    call.audio(40)  # 100 ms of speech, then the VAD pauses ...
    call.audio(40)
    call.send(SpeechPaused(at + 100 * MS))
    call.audio(300)  # ... and the caller resumes without a SpeechStopped: the VAD took it back
    assert call.turn.interrupts == 0
    call.audio(200)
    (interrupt,) = [f for f in call.out if isinstance(f, Interrupt)]
    assert interrupt.at == at and call.turn.interrupts == 1


# --- with the real VAD ---

DATA = Path(__file__).resolve().parents[1] / "data"
CLIPS = {  # clip -> (speech start s, speech end s, what is said); see tests/stages/test_vad.py
    "ls-test-clean-4507-16021-0012": (0.58, 2.54, "why should one halt on the way"),
    "ls-dev-clean-1988-24833-0000": (
        0.48,
        3.06,
        "the two stray kittens gradually make themselves at home",
    ),
    "ls-dev-clean-1272-128104-0000": (
        0.55,
        5.41,
        "mister quilter is the apostle of the middle classes",
    ),
}


def read_clip(name: str) -> np.ndarray:
    with wave.open(str(DATA / f"{name}.wav")) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


class ScriptedASR(Stage):
    """Plays the ASR: a final with the known text of each segment once the VAD stops it."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__("scripted-asr")
        self.texts = iter(texts)

    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)
        if isinstance(frame, SpeechStopped):
            self.push(
                Transcript(next(self.texts), final=True, start=frame.started_at, end=frame.at)
            )


@pytest.fixture(scope="module")
def vad_model() -> SileroModel:
    return SileroModel(VADConfig())


# The tests on real speech also run with each sample one step off (speech.STEPS: +1, -1, a
# seeded random ±1): the proof that the VAD's decisions they count on are not on the model's edge.
@pytest.fixture(scope="module", params=STEPS, ids=STEP_IDS)
def conversation(request: pytest.FixtureRequest) -> tuple[np.ndarray, list[int]]:
    """The three utterances, 1 s of low noise after each; and where each utterance's speech ends."""
    rng = np.random.default_rng(0)
    parts, ends, pos = [], [], 0
    for name, (_, end, _) in CLIPS.items():
        clip = read_clip(name)
        ends.append(pos + int(end * SR))
        gap = (rng.standard_normal(SR) * 33).astype(np.int16)  # about -60 dBFS
        parts += [clip, gap]
        pos += len(clip) + len(gap)
    return perturb(np.concatenate(parts), request.param), ends


def run_call(
    vad_model: SileroModel,
    turn: TurnDetector,
    pcm: np.ndarray,
    trace: Trace | None = None,
    bot_at: int | None = None,
) -> list[Frame]:
    out: list[Frame] = []
    texts = [t for _, _, t in CLIPS.values()]
    pipe = Pipeline(
        [VADStage(VADConfig(), model=vad_model.fork()), ScriptedASR(texts), turn],
        on_output=out.append,
    )
    asyncio.run(pipe.start(StageContext(trace=trace)))
    for i in range(0, len(pcm), FRAME):
        if bot_at is not None and i == bot_at:
            pipe.inject_upstream(BotStartedSpeaking())
        pipe.push(AudioIn(pcm[i : i + FRAME], offset=i), DOWN)
    return out


def test_real_speech_short_silence_gives_a_turn_per_utterance(vad_model, conversation) -> None:
    pcm, ends = conversation
    trace = Trace()
    turn = TurnDetector(TurnConfig(silence_ms=500))
    out = run_call(vad_model, turn, pcm, trace=trace)
    assert [f.text for f in out if isinstance(f, UserTurnEnded)] == [t for *_, t in CLIPS.values()]
    # Each turn ended 500 ms (plus at most one frame) after its speech ended, ±250 ms of VAD.
    audio_end = 0
    decided = []
    for f in out:
        if isinstance(f, AudioIn):
            audio_end = f.end
        elif isinstance(f, UserTurnEnded):
            decided.append(audio_end)
    for at, end in zip(decided, ends, strict=True):
        assert abs(at - (end + 500 * MS)) <= 250 * MS + FRAME
    assert len(trace.turns) == 2 and trace.current is not None  # each new turn closes the last


def test_real_speech_long_silence_joins_the_utterances(vad_model, conversation) -> None:
    pcm, _ = conversation
    # The pauses between the utterances are 1.7-1.8 s; 2.5 s of silence is needed to end a turn.
    turn = TurnDetector(TurnConfig(silence_ms=2500))
    out = run_call(vad_model, turn, np.concatenate([pcm, np.zeros(2 * SR, dtype=np.int16)]))
    assert [f.text for f in out if isinstance(f, UserTurnEnded)] == [
        " ".join(t for *_, t in CLIPS.values())
    ]


@pytest.mark.parametrize("how", STEPS, ids=STEP_IDS)
def test_real_speech_over_the_agent_interrupts_it(vad_model, how: str) -> None:
    pcm = perturb(read_clip("ls-dev-clean-1988-24833-0000"), how)
    turn = TurnDetector(TurnConfig(barge_in_min_speech_ms=160, resume_false_interrupts=False))
    out = run_call(vad_model, turn, pcm, bot_at=0)
    (interrupt,) = [f for f in out if isinstance(f, Interrupt)]
    assert abs(interrupt.at - int(0.48 * SR)) <= 250 * MS
    audio_before = [f for f in out[: out.index(interrupt)] if isinstance(f, AudioIn)]
    # Decided 160 ms into the speech plus the VAD's verdict lag (32 ms), on the frame (20 ms) that
    # completes it: 200 ms here, by arithmetic, as long as the VAD does not pause in those 192 ms
    # (its probabilities there are 0.68-1.0, the pause threshold is 0.35).
    assert audio_before[-1].end - interrupt.at <= (160 + 32 + 20) * MS


class AfterTurn(Stage):
    """What follows turn detection in a call (the LLM): reads turns only."""

    consumes = frozenset({UserTurnEnded})

    def __init__(self, vad: VADStage) -> None:
        super().__init__("after-turn")
        self.vad = vad
        self.seen: list[Frame] = []
        self.ended_at: list[int] = []  # how much audio the VAD had judged when each turn ended

    def process(self, frame: Frame, direction: Direction) -> None:
        self.seen.append(frame)
        if isinstance(frame, UserTurnEnded):
            self.ended_at.append(self.vad.windows)
        self.push(frame, direction)


def test_real_speech_caller_audio_stops_at_turn_detection(vad_model) -> None:
    """VAD → ASR → turn detection as they declare what they consume: the audio reaches the
    turn detector (its clock) and nothing after it, and the turns come out as with every stage
    reading everything."""
    pcm = np.concatenate([read_clip("ls-dev-clean-1988-24833-0000"), np.zeros(SR, np.int16)])
    texts = [t for _, _, t in CLIPS.values()]

    def call(declared: bool) -> tuple[list[Frame], list[Frame], AfterTurn]:
        vad = VADStage(VADConfig(), model=vad_model.fork())
        asr = ScriptedASR(texts)
        turn = TurnDetector(TurnConfig(silence_ms=500))
        after = AfterTurn(vad)
        if not declared:
            asr.consumes = turn.consumes = after.consumes = ANY_FRAME
        else:  # what stages.asr.stage.StreamingASR reads
            asr.consumes = frozenset({AudioIn, SpeechStarted, SpeechPaused, SpeechStopped})
        out: list[Frame] = []
        pipe = Pipeline([vad, asr, turn, after],
                        on_output=out.append,
                        output_consumes=frozenset({UserTurnEnded}) if declared else ANY_FRAME)
        asyncio.run(pipe.start(StageContext()))
        for i in range(0, len(pcm), FRAME):
            pipe.push(AudioIn(pcm[i : i + FRAME], offset=i), DOWN)
        pipe.push(EndOfCall(), DOWN)
        return out, after.seen, after

    out, seen, after = call(declared=True)
    ref_out, ref_seen, ref_after = call(declared=False)
    assert not any(isinstance(f, AudioIn) for f in seen + out)
    assert sum(isinstance(f, AudioIn) for f in ref_seen) == -(-len(pcm) // FRAME)
    turns = [f.text for f in out if isinstance(f, UserTurnEnded)]
    assert turns == [f.text for f in ref_out if isinstance(f, UserTurnEnded)] == texts[:1]
    assert [type(f) for f in seen] == [UserTurnEnded, EndOfCall]
    assert isinstance(out[-1], EndOfCall)
    # The turn ended 500 ms of caller audio after the speech, as counted on the AudioIn frames:
    # at the same frame as with every stage reading everything.
    assert after.ended_at == ref_after.ended_at and after.ended_at[0] > 0


# --- semantic endpointing (a scripted turn model: the decisions around its verdicts) ---


class ScriptedScorer:
    """Answers P(complete) from a script, one value per call; records what it was asked."""

    def __init__(self, *verdicts: float, fail: bool = False) -> None:
        self.verdicts = list(verdicts)
        self.asked: list[int] = []  # samples of audio per call
        self.heard: list[np.ndarray] = []
        self.fail = fail

    async def predict(self, pcm: np.ndarray) -> float:
        self.asked.append(len(pcm))
        self.heard.append(pcm.copy())
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("model exploded")
        return self.verdicts.pop(0) if len(self.verdicts) > 1 else self.verdicts[0]


class SemanticCall(Call):
    """A Call whose TurnDetector has a turn model; drive it inside a running loop."""

    def __init__(self, scorer: ScriptedScorer, cfg: TurnConfig | None = None,
                 trace: Trace | None = None) -> None:
        self.cfg = cfg or TurnConfig(pause_ms=VAD_STOP_MS)
        self.turn = TurnDetector(self.cfg, vad_stop_ms=VAD_STOP_MS, scorer=scorer)
        self.out: list[Frame] = []
        self.up: list[Frame] = []
        self.pipe = Pipeline([self.turn], on_output=self.out.append, on_upstream=self.up.append)
        self.trace = trace
        self.pos = 0
        self.clock = 1_000_000_000
        self.audio_frames: list[AudioIn] = []

    async def begin(self) -> None:
        await self.pipe.start(StageContext(trace=self.trace))

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    def candidates(self) -> list[str]:
        return [f.text for f in self.out if isinstance(f, TurnCandidate)]


def test_a_confident_model_ends_the_turn_as_soon_as_the_final_is_in() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.93)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, silence_ms=1500))
        await call.begin()
        stop = call.say(900)
        await call.settle()
        assert call.ends() == [] and len(scorer.asked) == 1  # asked at the stop; no text yet
        call.final("book a table for two", stop.started_at, stop.at)
        assert call.ends() == ["book a table for two"]  # no silence_ms wait: the model said so
        # it heard the whole call so far (up to 8 s): the speech and the silence after it
        assert scorer.asked[0] == stop.at + 40 * MS + (VAD_STOP_MS - 40) * MS
    asyncio.run(main())


def test_the_model_hears_the_latest_8_s_exactly() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.9)
        call = SemanticCall(scorer)
        await call.begin()
        sent = []
        at = 0
        rng = np.random.default_rng(3)
        for _ in range(11 * SR // 320):  # 11 s of distinct samples, in frames of odd sizes
            n = int(rng.integers(100, 700))
            pcm = rng.integers(-3000, 3000, n).astype(np.int16)
            call.send(AudioIn(pcm, offset=at))
            at += n
            sent.append(pcm)
        call.pos = at
        call.send(SpeechStarted(at - 2 * SR))
        call.send(SpeechStopped(at - SR // 2, started_at=at - 2 * SR))
        await call.settle()
        (heard,) = scorer.heard
        assert np.array_equal(heard, np.concatenate(sent)[-8 * SR:])
    asyncio.run(main())


def test_an_incomplete_verdict_waits_rescoring_and_ends_at_max_wait() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.05)
        cfg = TurnConfig(pause_ms=VAD_STOP_MS, max_wait_ms=1500, rescore_ms=300)
        call = SemanticCall(scorer, cfg)
        await call.begin()
        stop = call.say(900)
        call.final("I would like to", stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == [] and call.candidates() == ["I would like to"]
        for _ in range(55):  # 1.1 s more: 1.4 s of silence since the stop, < 1.5 s
            call.audio(20)
            await call.settle()
        assert call.ends() == []
        assert 3 <= len(scorer.asked) <= 5  # at the stop, then every 300 ms of silence
        for _ in range(10):
            call.audio(20)
            await call.settle()
        assert call.ends() == ["I would like to"]
        i = next(i for i, f in enumerate(call.out) if isinstance(f, UserTurnEnded))
        before = call.out[i - 1]
        assert isinstance(before, AudioIn) and before.end - stop.at >= 1500 * MS > before.end - FRAME - stop.at
        assert call.candidates() == ["I would like to"]  # offered once
    asyncio.run(main())


def test_a_rescore_that_turns_confident_ends_the_turn_then() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.1, 0.1, 0.8)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, max_wait_ms=3000, rescore_ms=300))
        await call.begin()
        stop = call.say(900)
        call.final("that is all", stop.started_at, stop.at)
        while not call.ends():
            call.audio(20)
            await call.settle()
        assert len(scorer.asked) == 3
        assert call.pos - stop.at < (VAD_STOP_MS + 2 * 300 + 100) * MS
    asyncio.run(main())


def test_speech_that_resumes_mid_thought_joins_the_turn_and_cancels_the_candidate() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.05, 0.97)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, max_wait_ms=1500, rescore_ms=0))
        await call.begin()
        first = call.say(900)
        call.final("I would like", first.started_at, first.at)
        await call.settle()
        call.audio(400)  # 700 ms of silence in all: a long mid-sentence pause
        await call.settle()
        assert call.ends() == [] and call.candidates() == ["I would like"]
        second = call.say(700)
        await call.settle()
        call.final("a table for two", second.started_at, second.at)
        await call.settle()
        assert call.ends() == ["I would like a table for two"]
        assert call.turn.turns == 1
    asyncio.run(main())


def test_asked_at_the_pause_the_verdict_is_in_by_the_stop() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.93)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, ask_at_pause=True))
        await call.begin()
        at = call.speech_start()
        call.audio(840)
        end = call.pause()
        await call.settle()
        # asked at Silero's pause, on the audio heard up to it
        assert scorer.asked == [end + 40 * MS]
        call.audio(VAD_STOP_MS - 40)
        stop = call.send(SpeechStopped(end, started_at=at, t_ns=call.tick()))
        await call.settle()
        assert call.ends() == []  # the verdict is in; the text is not
        call.final("book a table for two", at, stop.at)  # type: ignore[attr-defined]
        assert call.ends() == ["book a table for two"]
        assert len(scorer.asked) == 1  # the stop used the pause's verdict: no second look
    asyncio.run(main())


def test_a_verdict_asked_at_a_pause_the_caller_ended_is_not_used() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.97, 0.05)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, ask_at_pause=True,
                                               max_wait_ms=1500, rescore_ms=0))
        await call.begin()
        at = call.speech_start()
        call.audio(500)
        call.send(SpeechPaused(call.pos, t_ns=call.tick()))
        await call.settle()
        call.audio(100)
        call.send(SpeechResumed(call.pos, t_ns=call.tick()))  # the caller goes on
        call.audio(400)
        stop = call.speech_stop(at)  # paused (asked again), then stopped
        await call.settle()
        call.final("I would like a", stop.started_at, stop.at)
        await call.settle()
        assert len(scorer.asked) == 2
        assert call.ends() == []  # 0.97 was for the first pause; this one's verdict is 0.05
        for _ in range(30):
            call.audio(20)
            await call.settle()
        assert call.ends() == []
    asyncio.run(main())


def test_no_look_at_a_pause_in_speech_over_the_agent() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.9)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, ask_at_pause=True,
                                               barge_in_min_speech_ms=2000))
        await call.begin()
        call.bot(BotStartedSpeaking())
        call.say(300)  # a short sound over the agent: a backchannel, not a turn
        await call.settle()
        assert scorer.asked == []
    asyncio.run(main())


def test_a_speculative_transcript_during_the_pause_is_offered_as_a_candidate() -> None:
    async def main() -> None:
        call = SemanticCall(ScriptedScorer(0.9))
        await call.begin()
        at = call.speech_start()
        call.audio(800)
        end = call.pause()
        call.send(Transcript("what time is it", final=False, start=at, end=end, speculative=True))
        call.send(Transcript("what time is it", final=False, start=at, end=end))  # a partial
        assert call.candidates() == ["what time is it"]
        call.send(SpeechResumed(end + 60 * MS))
        call.send(Transcript("what time is", final=False, start=at, end=end, speculative=True))
        assert call.candidates() == ["what time is it"]  # not paused any more: no candidate
    asyncio.run(main())


def test_a_failing_model_falls_back_to_the_fixed_silence_and_says_so() -> None:
    async def main() -> None:
        scorer = ScriptedScorer(0.0, fail=True)
        call = SemanticCall(scorer, TurnConfig(pause_ms=VAD_STOP_MS, silence_ms=600, max_wait_ms=1500))
        await call.begin()
        stop = call.say(900)
        call.final("hello there", stop.started_at, stop.at)
        while not call.ends():
            call.audio(20)
            await call.settle()
        assert 600 * MS <= call.pos - stop.at < 700 * MS
        assert len([f for f in call.out if isinstance(f, ErrorFrame)]) == 1
        assert call.turn.model_failures == 1
    asyncio.run(main())


def test_the_trace_gets_the_decision_and_the_model_span() -> None:
    async def main() -> None:
        trace = Trace()
        call = SemanticCall(ScriptedScorer(0.9), trace=trace)
        await call.begin()
        stop = call.say(900)
        await call.settle()
        call.final("book it", stop.started_at, stop.at)
        turn = trace.current
        assert turn is not None
        assert {"turn_model_request", "turn_model_result", "vad_decision"} <= set(turn.events)
        assert turn.info["p_complete"] == 0.9
        assert turn.events["asr_final"] >= turn.events["vad_decision"]
    asyncio.run(main())


# --- false interruptions: a barge-in pauses the agent; words cut it off, no words resume it ---


@pytest.mark.parametrize(("text", "words"), [
    ("", False), ("...", False), ("[BLANK_AUDIO]", False), ("(coughing)", False), ("Hmm?", False),
    ("uh-huh", False), ("Wait.", True), ("hmm, wait", True), ("No", True), ("2", True),
    ("huh?", True),  # "what?": the caller wants the floor
])
def test_what_counts_as_words(text: str, words: bool) -> None:
    assert has_words(text) is words


def test_a_barge_in_pauses_then_words_interrupt() -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=160))
    bot_speaking(call)
    at = call.speech_start()
    call.audio(300)
    (pause,) = [f for f in call.out if isinstance(f, PausePlayout)]
    assert pause.at == at and not any(isinstance(f, Interrupt) for f in call.out)
    call.send(Transcript("", final=False, start=at, end=call.pos))  # nothing yet: still paused
    assert not any(isinstance(f, Interrupt) for f in call.out)
    call.send(Transcript("wait", final=False, start=at, end=call.pos))
    (interrupt,) = [f for f in call.out if isinstance(f, Interrupt)]
    assert interrupt.at == at and call.turn.interrupts == 1
    stop = call.speech_stop(at)
    call.final("wait a second", stop.started_at, stop.at)
    call.audio(400)
    assert call.ends() == ["wait a second"]
    assert not any(isinstance(f, ResumePlayout) for f in call.out)


@pytest.mark.parametrize("heard", ["", "  ", "[coughs]", "(noise)", "*cough*", ".", "Hmm.",
                                   "Mm-hmm.", "uh, um"])
def test_a_barge_in_without_words_resumes_the_agent(heard: str) -> None:
    call = Call(TurnConfig(barge_in_min_speech_ms=160))
    bot_speaking(call)
    at = call.speech_start()
    call.audio(300)
    call.bot(BotStoppedSpeaking(interrupted=True))  # the playout paused
    stop = call.speech_stop(at)
    call.final(heard, stop.started_at, stop.at)
    assert isinstance(call.out[-1], ResumePlayout)
    call.audio(1000)
    assert call.ends() == [] and call.turn.interrupts == 0 and call.turn.false_interrupts == 1
    assert not any(isinstance(f, Interrupt) for f in call.out)
    # the agent speaks again and the caller can still barge in for real
    bot_speaking(call)
    again = call.speech_start()
    call.audio(300)
    call.send(Transcript("stop", final=False, start=again, end=call.pos))
    assert [f.at for f in call.out if isinstance(f, Interrupt)] == [again]


# --- the words' end-of-turn check (turn.text_check): sound and words must both say finished ---


class ScriptedWords:
    """A words model answering P(the message ends) per text; records what it was asked."""

    def __init__(self, answers: dict[str, float], fail: bool = False) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.warmed: list[str] = []
        self.fail = fail

    def warm(self, text: str) -> None:
        self.warmed.append(text)

    async def predict(self, text: str) -> float:
        self.asked.append(text)
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("words model exploded")
        return self.answers[text]


def words_call(words: ScriptedWords, verdict: float = 0.95, trace: Trace | None = None,
               **cfg: object) -> SemanticCall:
    opts: dict = {"pause_ms": VAD_STOP_MS, "text_check": True, "text_threshold": 0.1,
                  "text_wait_ms": 900, "text_sure": 0.5,
                  "text_sure_wait_ms": 500, "max_wait_ms": 1500, "rescore_ms": 0, **cfg}
    turn_cfg = TurnConfig(**opts)
    call = SemanticCall(ScriptedScorer(verdict), turn_cfg, trace=trace)
    call.turn = TurnDetector(turn_cfg, vad_stop_ms=VAD_STOP_MS, scorer=call.turn.scorer,
                             text_scorer=words)
    call.pipe = Pipeline([call.turn], on_output=call.out.append, on_upstream=call.up.append)
    return call


async def _silence_until_end(call: SemanticCall, limit_ms: int = 3000) -> int:
    """Feed silence until the turn ends; the silence since the last stop, in ms."""
    for _ in range(limit_ms // 20):
        if call.ends():
            break
        call.audio(20)
        await call.settle()
    return call.pos


def test_sound_and_words_both_finished_end_the_turn_at_once() -> None:
    async def main() -> None:
        trace = Trace()
        words = ScriptedWords({"book a table for two": 0.6})
        call = words_call(words, trace=trace)
        await call.begin()
        stop = call.say(900)
        call.final("book a table for two", stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == ["book a table for two"]
        assert words.asked == ["book a table for two"] and call.turn.text_holds == 0
        assert trace.current is not None and trace.current.info["p_words"] == 0.6
    asyncio.run(main())


def test_words_that_read_unfinished_hold_a_turn_the_sound_called_finished() -> None:
    async def main() -> None:
        words = ScriptedWords({"I would like a table for": 0.01})
        call = words_call(words)
        await call.begin()
        stop = call.say(900)
        call.final("I would like a table for", stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == [] and call.turn.text_holds == 1
        end = await _silence_until_end(call)
        assert call.ends() == ["I would like a table for"]
        # text_wait_ms, not max_wait_ms
        assert 900 * MS <= end - stop.at < 960 * MS
        assert words.asked == ["I would like a table for"]  # once, not at every frame
        assert call.turn.text_holds == 1
    asyncio.run(main())


@pytest.mark.parametrize(("text", "p", "held"), [
    ("ten of clubs", 0.02, False),  # a short answer: the short threshold (0.01)
    ("my name is", 0.002, True),  # a short cut
    ("ten of clubs", 0.011, False),  # three words
    ("ten of clubs please", 0.02, True),  # four: the threshold (0.1)
    ("Ten, of-clubs!", 0.02, False),  # words, not marks, are counted
])
def test_a_short_turn_needs_less_of_the_words(text: str, p: float, held: bool) -> None:
    async def main() -> None:
        words = ScriptedWords({text: p})
        call = words_call(words)
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == ([] if held else [text])
        assert call.turn.text_holds == held
    asyncio.run(main())


@pytest.mark.parametrize(("p", "verdict", "wait_ms"), [
    (0.06, 0.95, 500),  # the words fall short of 0.1 by little, the sound is sure
    (0.05, 0.8, 500),  # both at their bounds (text_near_share 0.5, text_near_sound 0.8)
    (0.04, 0.95, 900),  # the words fall short by more: text_wait_ms
    (0.06, 0.7, 900),  # the sound says finished, not surely
])
def test_words_just_short_of_their_threshold_wait_less_when_the_sound_is_sure(
        p: float, verdict: float, wait_ms: int) -> None:
    async def main() -> None:
        text = "four queen of clubs"
        words = ScriptedWords({text: p})
        call = words_call(words, verdict=verdict)
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == [] and call.turn.text_holds == 1
        end = await _silence_until_end(call)
        assert call.ends() == [text]
        assert wait_ms * MS <= end - stop.at < (wait_ms + 60) * MS
        assert call.turn.text_near_ends == (wait_ms == 500)
    asyncio.run(main())


@pytest.mark.parametrize(("p", "wait_ms"), [(0.8, 500), (0.5, 500), (0.3, 1500)])
def test_words_that_are_sure_end_a_turn_the_sound_heard_as_unfinished(p: float, wait_ms: int
                                                                     ) -> None:
    async def main() -> None:
        text = "he might even have been made amiable himself"
        words = ScriptedWords({text: p})
        call = words_call(words, verdict=0.2)  # Smart Turn: mid-thought
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == []
        end = await _silence_until_end(call)
        assert call.ends() == [text]
        # text_sure (0.5) or more: text_sure_wait_ms; less: max_wait_ms
        assert wait_ms * MS <= end - stop.at < (wait_ms + 60) * MS
        assert call.turn.text_sure_ends == (wait_ms == 500) and call.turn.text_holds == 0
    asyncio.run(main())


@pytest.mark.parametrize(("text", "loop"), [
    ("5, 5, 5, 5, 5, 5, 5, 5,", True),  # Whisper's loop on a caller's "five five"
    ("why is it one? Why is it one? Why is it one?", True),  # ...on a cut "why should one halt"
    ("I said why is it one? Why is it one?", False),  # a phrase twice: words
    ("I said no no no", False),  # a word three times: words
    ("thank you, thank you, thank you", False),  # a pair of words three times: words
    ("hearts and clubs, hearts and clubs", False),
    ("up to ten, ten, ten, ten", True),
    ("four queen, four queen, four queen, four queen", True),  # a pair of words
])
def test_a_transcript_ending_in_a_loop_leaves_the_turn_to_the_sound(text: str, loop: bool
                                                                   ) -> None:
    async def main() -> None:
        words = ScriptedWords({text: 0.001})  # a list that goes on, as the words read it
        call = words_call(words, verdict=0.95)
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == ([text] if loop else [])
        assert words.asked == ([] if loop else [text]) and call.turn.text_holds == (not loop)
    asyncio.run(main())


def test_a_loop_the_sound_hears_as_unfinished_waits_the_longest() -> None:
    async def main() -> None:
        text = "five, five, five, five, five"
        words = ScriptedWords({text: 0.9})  # never asked: sure words would end it at 500 ms
        call = words_call(words, verdict=0.2)
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        end = await _silence_until_end(call)
        assert call.ends() == [text] and words.asked == []
        assert 1500 * MS <= end - stop.at < 1560 * MS and call.turn.text_sure_ends == 0
    asyncio.run(main())


@pytest.mark.parametrize(("text", "hesitating"), [
    ("I have a cold, um", True),  # SmolLM2 reads the clause before the "um" as whole: 0.16
    ("a table for, uh...", True),
    ("Um, um, um, um, um", True),  # a filled pause said over and over is one too, not a loop
    ("Uh-huh.", False),  # backchannels and "uh-uh" (no) can be a whole answer
    ("mm-hmm", False),
    ("no, uh-uh", False),
    ("play the drum", False),
])
def test_words_ending_in_a_filled_pause_hold_the_turn_without_asking(text: str, hesitating: bool
                                                                   ) -> None:
    async def main() -> None:
        words = ScriptedWords({text: 0.9})  # what the words model would say: sure, finished
        call = words_call(words, verdict=0.95)
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        if not hesitating:
            assert call.ends() == [text] and words.asked == [text]
            return
        assert call.ends() == [] and words.asked == [] and call.turn.text_holds == 1
        end = await _silence_until_end(call)
        assert call.ends() == [text] and words.asked == []
        assert 900 * MS <= end - stop.at < 960 * MS  # text_wait_ms, the words' longest hold
    asyncio.run(main())


def test_a_filled_pause_the_sound_hears_as_unfinished_is_not_ended_by_sure_words() -> None:
    async def main() -> None:
        text = "so I was thinking, um"
        call = words_call(ScriptedWords({text: 0.9}), verdict=0.2)
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        end = await _silence_until_end(call)
        assert call.ends() == [text] and call.turn.text_sure_ends == 0
        assert 1500 * MS <= end - stop.at < 1560 * MS  # max_wait_ms
    asyncio.run(main())


def test_no_hesitations_configured_leaves_a_trailing_um_to_the_words_model() -> None:
    async def main() -> None:
        text = "I have a cold, um"
        words = ScriptedWords({text: 0.9})
        call = words_call(words, verdict=0.95, hesitations="")
        await call.begin()
        stop = call.say(900)
        call.final(text, stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == [text] and words.asked == [text]
    asyncio.run(main())


# --- the ASR's own reading of the end (Transcript.end_p, turn.text_asr_end) ---


def _final_heard(call: SemanticCall, text: str, stop: SpeechStopped, end_p: float | None) -> None:
    call.send(Transcript(text, final=True, start=stop.started_at, end=stop.at, end_p=end_p,
                         t_ns=call.tick()))


WHOLE_READING_CUT = "the cat has taught them that he's in charge"


@pytest.mark.parametrize(("text", "end_p", "asr_end", "wait_ms"), [
    (WHOLE_READING_CUT, 0.9, 0.5, 0),  # the ASR heard a full stop coming: the words stand
    (WHOLE_READING_CUT, 0.5, 0.5, 0),  # at the bound
    (WHOLE_READING_CUT, None, 0.5, 0),  # an ASR that does not tell
    (WHOLE_READING_CUT, 0.3, 0.5, 900),  # said with more to come: text_wait_ms
    (WHOLE_READING_CUT, 0.01, 0.0, 0),  # text_asr_end 0: not read
    ("seven of clubs", 0.3, 0.5, 0),  # a short answer: not asked (as unsure as short cuts)
])
def test_words_that_read_finished_wait_when_the_asr_heard_no_sentence_end(
        text: str, end_p: float | None, asr_end: float, wait_ms: int) -> None:
    async def main() -> None:
        trace = Trace()
        call = words_call(ScriptedWords({text: 0.6}), verdict=0.95, trace=trace,
                          text_asr_end=asr_end)
        await call.begin()
        stop = call.say(900)
        _final_heard(call, text, stop, end_p)
        await call.settle()
        if wait_ms:
            assert call.ends() == []
            end = await _silence_until_end(call)
            assert wait_ms * MS <= end - stop.at < (wait_ms + 60) * MS
        assert call.ends() == [text]  # at once (the final came VAD_STOP_MS after the stop)
        assert call.turn.asr_end_holds == (wait_ms > 0) and call.turn.text_holds == 0
        assert trace.current is not None and trace.current.info.get("p_asr_end") == end_p
    asyncio.run(main())


@pytest.mark.parametrize(("p", "verdict", "end_p", "wait_ms"), [
    (0.8, 0.2, 0.9, 500),  # sure words, the sound mid-thought: text_sure_wait_ms...
    (0.8, 0.2, 0.2, 1500),  # ...unless the ASR heard no end: max_wait_ms
    (0.06, 0.95, 0.9, 500),  # words just short, the sound sure: text_near_wait_ms...
    (0.06, 0.95, 0.2, 900),  # ...unless the ASR heard no end: text_wait_ms
])
def test_the_shorter_waits_need_the_asr_to_have_heard_the_end(
        p: float, verdict: float, end_p: float, wait_ms: int) -> None:
    async def main() -> None:
        text = "he might even have been made amiable himself"
        call = words_call(ScriptedWords({text: p}), verdict=verdict)
        await call.begin()
        stop = call.say(900)
        _final_heard(call, text, stop, end_p)
        await call.settle()
        end = await _silence_until_end(call)
        assert call.ends() == [text]
        assert wait_ms * MS <= end - stop.at < (wait_ms + 60) * MS
        assert call.turn.asr_end_holds == (end_p < 0.5)
    asyncio.run(main())


@pytest.mark.parametrize(("text", "verdict", "end_p", "asr_sure", "asr_end", "wait_ms"), [
    ("what's the weather like", 0.55, 0.94, 0.9, 0.5, 500),  # the ASR sure: text_near_wait_ms
    ("what's the weather like", 0.55, 0.9, 0.9, 0.5, 500),  # at the bound
    ("what's the weather like", 0.55, 0.85, 0.9, 0.5, 900),  # less sure: text_wait_ms
    ("what's the weather like", 0.55, None, 0.9, 0.5, 900),  # an ASR that does not tell
    ("what's the weather like", 0.55, 0.99, 1.1, 0.5, 900),  # text_asr_sure above 1: never
    # sure by text_asr_sure, not by a stricter text_asr_end: text_wait_ms
    ("what's the weather like", 0.55, 0.92, 0.9, 0.95, 900),
    ("what's the weather like", 0.3, 0.94, 0.9, 0.5, 1500),  # the sound mid-thought: max_wait_ms
    ("seven of", 0.55, 0.95, 0.9, 0.5, 500),  # a short turn as well
    ("I have a cold, um", 0.95, 0.97, 0.9, 0.5, 900),  # a filled pause: the words' longest hold
])
def test_an_end_the_asr_is_sure_of_outweighs_words_that_read_unfinished(
        text: str, verdict: float, end_p: float | None, asr_sure: float, asr_end: float,
        wait_ms: int) -> None:
    async def main() -> None:
        # the LM reads "what's the weather like" without its voice: a preposition last
        words = ScriptedWords({text: 0.001})
        call = words_call(words, verdict=verdict, text_asr_sure=asr_sure, text_asr_end=asr_end)
        await call.begin()
        stop = call.say(900)
        _final_heard(call, text, stop, end_p)
        await call.settle()
        assert call.ends() == []
        end = await _silence_until_end(call)
        assert call.ends() == [text]
        assert wait_ms * MS <= end - stop.at < (wait_ms + 60) * MS
        assert call.turn.asr_sure_ends == (wait_ms == 500)
        assert call.turn.text_holds == (verdict >= 0.5)
    asyncio.run(main())


@pytest.mark.parametrize(("text", "text_check"), [
    ("the cat has taught them that he's in charge", False),  # the sound alone judges
    ("5, 5, 5, 5, 5", True),  # a loop: the same
])
def test_without_the_words_check_the_asr_end_is_not_read(text: str, text_check: bool) -> None:
    async def main() -> None:
        call = words_call(ScriptedWords({text: 0.6}), verdict=0.95, text_check=text_check)
        await call.begin()
        stop = call.say(900)
        _final_heard(call, text, stop, 0.01)
        await call.settle()
        assert call.ends() == [text] and call.turn.asr_end_holds == 0
    asyncio.run(main())


def test_the_pause_transcript_s_end_is_judged_until_the_final_comes() -> None:
    async def main() -> None:
        text = "your call is now first in line"
        call = words_call(ScriptedWords({text: 0.6}), verdict=0.95)
        await call.begin()
        at = call.speech_start()
        call.audio(900 - VAD_START_MS)
        end = call.pos
        call.audio(40)
        call.send(SpeechPaused(end, t_ns=call.tick()))
        # the speculative transcript of the pause: the words read whole, the ASR heard no end
        call.send(Transcript(text, final=False, start=at, end=end, speculative=True,
                             end_p=0.2, t_ns=call.tick()))
        await call.settle()
        assert call.candidates() == [text]
        call.audio(VAD_STOP_MS - 40)
        stop = call.send(SpeechStopped(end, started_at=at, t_ns=call.tick()))
        await call.settle()
        assert call.ends() == [] and call.turn.asr_end_holds == 1
        _final_heard(call, text, stop, 0.7)  # the final hears it end after all
        await call.settle()
        assert call.ends() == [text]
    asyncio.run(main())


@pytest.mark.parametrize(("mode", "text_check", "asr_end", "told"), [
    ("semantic", True, 0.5, True),  # the defaults: the words' check reads it
    ("vad", True, 0.5, False),
    ("semantic", False, 0.5, False),
    ("semantic", True, 0.0, False),
])
def test_the_asr_tells_sentence_ends_only_where_the_turn_reads_them(
        monkeypatch: pytest.MonkeyPatch, mode: str, text_check: bool, asr_end: float,
        told: bool) -> None:
    from agent import presets

    class Built(Exception):
        pass

    def backend_class(kind: str, name: str):  # noqa: ANN202
        def build(cfg):  # noqa: ANN001, ANN202
            raise Built(cfg.sentence_ends)  # what the ASR backend was asked for; load no more
        return build

    monkeypatch.setattr(presets, "backend_class", backend_class)
    cfg = Config()
    cfg.turn.mode, cfg.turn.text_check, cfg.turn.text_asr_end = mode, text_check, asr_end
    with pytest.raises(Built) as built:
        load_models(cfg)
    assert built.value.args == (told,) and cfg.asr.sentence_ends is False  # its own untouched


def test_a_hesitation_of_more_than_one_word_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="turn.hesitations: 'you know' is not one word"):
        TurnDetector(TurnConfig(hesitations="um, you know"))
    cfg = Config()
    cfg.turn.hesitations = "um, you know"
    with pytest.raises(ConfigError, match="turn.hesitations: 'you know' is not one word"):
        load_models(cfg)  # refused as the models load (before the ASR's), not at a call


def test_a_failing_words_model_is_never_sure() -> None:
    async def main() -> None:
        words = ScriptedWords({}, fail=True)
        call = words_call(words, verdict=0.2)
        await call.begin()
        stop = call.say(900)
        call.final("he was not an ill disposed young man", stop.started_at, stop.at)
        await call.settle()
        end = await _silence_until_end(call)
        assert call.ends() == ["he was not an ill disposed young man"]
        assert 1500 * MS <= end - stop.at < 1560 * MS and call.turn.text_sure_ends == 0
    asyncio.run(main())


def test_a_final_differing_only_in_case_and_full_stop_is_not_asked_again() -> None:
    async def main() -> None:
        words = ScriptedWords({"and what time is it": 0.5})
        call = words_call(words)
        await call.begin()
        at, end = _speculative_pause(call, "and what time is it")
        await call.settle()
        call.final("And what time is it.", at, end)
        assert call.ends() == ["And what time is it."]
        assert words.asked == ["and what time is it"]
    asyncio.run(main())


def test_the_caller_going_on_during_the_hold_joins_the_turn() -> None:
    async def main() -> None:
        words = ScriptedWords({"I would like": 0.0, "I would like a table for two": 0.7})
        call = words_call(words)
        await call.begin()
        first = call.say(900)
        call.final("I would like", first.started_at, first.at)
        await call.settle()
        call.audio(300)  # 600 ms of silence in all: the sound said finished, the words did not
        await call.settle()
        assert call.ends() == []
        second = call.say(700)
        call.final("a table for two", second.started_at, second.at)
        await call.settle()
        assert call.ends() == ["I would like a table for two"]
        assert words.asked == ["I would like", "I would like a table for two"]
    asyncio.run(main())


def _speculative_pause(call: SemanticCall, text: str) -> tuple[int, int]:
    """800 ms of speech, its speculative transcript at the VAD's pause, then its stop; the
    speech's (start, end)."""
    at = call.speech_start()
    call.audio(800)
    end = call.pos
    call.audio(40)
    call.send(SpeechPaused(end, t_ns=call.tick()))
    call.send(Transcript(text, final=False, start=at, end=end, speculative=True))
    call.audio(VAD_STOP_MS - 40)
    call.send(SpeechStopped(end, started_at=at, t_ns=call.tick()))
    return at, end


def test_the_words_are_asked_at_the_speculative_text_beside_the_sound() -> None:
    async def main() -> None:
        words = ScriptedWords({"what time is it": 0.5})
        call = words_call(words)
        await call.begin()
        at, end = _speculative_pause(call, "what time is it")
        await call.settle()
        assert words.asked == ["what time is it"] and call.ends() == []  # no final yet
        call.final("what time is it", at, end)
        assert call.ends() == ["what time is it"]  # the answer was in: no second question
        assert words.asked == ["what time is it"]
    asyncio.run(main())


def test_a_failing_words_model_leaves_the_sound_to_decide_and_says_so() -> None:
    async def main() -> None:
        words = ScriptedWords({}, fail=True)
        call = words_call(words)
        await call.begin()
        stop = call.say(900)
        call.final("hello there", stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == ["hello there"]
        assert call.turn.text_failures == 1
        assert len([f for f in call.out if isinstance(f, ErrorFrame)]) == 1
        second = call.say(700)
        call.final("and goodbye", second.started_at, second.at)
        await call.settle()
        assert call.ends() == ["hello there", "and goodbye"] and len(words.asked) == 1
    asyncio.run(main())


def test_the_words_check_is_on_by_default_and_can_be_turned_off() -> None:
    async def main() -> None:
        assert TurnConfig().text_check is True
        words = ScriptedWords({})
        call = words_call(words, text_check=False)
        await call.begin()
        stop = call.say(900)
        call.final("I would like a table for", stop.started_at, stop.at)
        await call.settle()
        assert call.ends() == ["I would like a table for"] and words.asked == []
    asyncio.run(main())


def test_the_words_model_reads_the_stable_words_ahead_while_the_caller_speaks() -> None:
    async def main() -> None:
        words = ScriptedWords({"I would like a table": 0.6})
        call = words_call(words)
        await call.begin()
        at = call.speech_start()
        call.audio(600)
        text = "I would like a ta"
        call.send(Transcript(text, final=False, start=at, end=call.pos, stable=14))
        call.send(Transcript(text, final=False, start=at, end=call.pos, stable=10))
        end = call.pos
        call.audio(40)
        call.send(SpeechPaused(end, t_ns=call.tick()))
        # paused: the speculative text is a question, not a read-ahead
        call.send(Transcript("I would like a table", final=False, start=at, end=end,
                             speculative=True))
        await call.settle()
        # the stable prefix up to its last whole word ("I would" of "I would li")
        assert words.warmed == ["I would like a", "I would"]
        off = ScriptedWords({})
        quiet = words_call(off, text_check=False)
        await quiet.begin()
        at = quiet.speech_start()
        quiet.audio(600)
        quiet.send(Transcript(text, final=False, start=at, end=quiet.pos, stable=14))
        assert off.warmed == []
    asyncio.run(main())
