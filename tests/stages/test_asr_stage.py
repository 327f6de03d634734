"""StreamingASR driven by real speech frames and the real Whisper backend: partials, local
agreement, one final per utterance, silence bypass, speculative finals, long utterances, errors."""

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import speech

from agent.config import ASRConfig
from agent.frames import (
    FRAME_SAMPLES,
    AudioIn,
    EndOfCall,
    ErrorFrame,
    Frame,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    Transcript,
)
from agent.stage import DOWN, Direction, Stage, StageContext
from agent.trace import Trace
from stages.asr.agreement import LocalAgreement
from stages.asr.backend import ASRCapabilities
from stages.asr.stage import StreamingASR, make_engine
from stages.asr.wer import wer

pytest.importorskip("ctranslate2")
pytest.importorskip("faster_whisper")

from stages.asr.whisper import WhisperBackend  # noqa: E402

SR = 16000
# (clip, reference): clips far from the model's edge (tests/speech.py)
KITTENS = ("kittens", speech.text("kittens"))
HONEST = ("honest", speech.text("honest"))
QUILTER = ("quilter", speech.text("quilter"))
MAX_WER = 0.15  # one word in the shortest clip (9 words) passes, two fail


def clip(name: str) -> np.ndarray:
    return speech.load(name)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.int16)


class Counting:
    """The real backend, counting its calls and the buffer lengths it was given."""

    def __init__(self, inner: WhisperBackend, fail_calls: tuple[int, ...] = ()) -> None:
        self.inner = inner
        self.name, self.sample_rate, self.max_batch = inner.name, inner.sample_rate, inner.max_batch
        self.capabilities = inner.capabilities
        self.calls = 0
        self.lengths: list[int] = []
        self.threads: set[int] = set()
        self.fail_calls = fail_calls

    def transcribe_batch(self, audio, prompts=None, **kw):  # kw: wanted, as the capabilities say
        self.calls += 1
        self.threads.add(threading.get_ident())
        self.lengths.extend(len(a) for a in audio)
        if self.calls in self.fail_calls:
            raise RuntimeError("backend broke on purpose")
        return self.inner.transcribe_batch(audio, prompts, **kw)

    def warmup(self) -> None:
        self.inner.warmup()


class Sink(Stage):
    def __init__(self) -> None:
        super().__init__("sink")
        self.frames: list[Frame] = []

    def process(self, frame: Frame, direction: Direction) -> None:
        self.frames.append(frame)


@dataclass
class Script:
    """A call's audio plus VAD frames placed at known samples (they follow the audio frame whose
    end passes ``after``, as a VAD's would)."""

    audio: np.ndarray
    events: list[tuple[int, object]] = field(default_factory=list)  # (after sample, frame maker)


def utterances(*parts: tuple[np.ndarray, bool], pause_first: bool = True) -> tuple[Script, list]:
    """Audio parts (speech or not) in a row; each speech part gets Started/Paused/Stopped."""
    audio = np.concatenate([p for p, _ in parts])
    script = Script(audio)
    spans = []
    pos = 0
    for pcm, voiced in parts:
        if voiced:
            a, b = pos, pos + len(pcm)
            spans.append((a, b))
            script.events.append((a + 64 * SR // 1000, lambda a=a: SpeechStarted(a)))
            if pause_first:
                script.events.append((b + 512, lambda b=b: SpeechPaused(b)))
            script.events.append(
                (b + 300 * SR // 1000, lambda a=a, b=b: SpeechStopped(b, started_at=a,
                                                                      speech_end_ns=1)))
        pos += len(pcm)
    return script, spans


async def play(stage: StreamingASR, script: Script, frame_s: float, tail_s: float = 6.0,
               end_call: bool = False) -> None:
    """Feed the script in 20 ms AudioIn frames, one every ``frame_s`` seconds, then wait until
    the stage has nothing left to do (at most ``tail_s``)."""
    events = sorted(script.events, key=lambda e: e[0])
    t0 = time.monotonic()
    k = 0
    for i, off in enumerate(range(0, len(script.audio), FRAME_SAMPLES)):
        pcm = script.audio[off : off + FRAME_SAMPLES]
        stage.process(AudioIn(pcm, offset=off), DOWN)
        while k < len(events) and events[k][0] <= off + len(pcm):
            stage.process(events[k][1](), DOWN)
            k += 1
        delay = t0 + (i + 1) * frame_s - time.monotonic()
        await asyncio.sleep(max(0.0, delay))
    if end_call:
        stage.process(EndOfCall(), DOWN)
    deadline = time.monotonic() + tail_s
    while stage.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def run_stage(backend, script, cfg=None, frame_s=0.02, trace=None, end_call=False, tail_s=6.0):
    async def main():
        stage = StreamingASR(backend, cfg or ASRConfig())
        sink = Sink()
        stage.link(sink)
        await stage.start(StageContext(trace))
        await play(stage, script, frame_s, tail_s=tail_s, end_call=end_call)
        busy = stage.busy
        await stage.stop()
        return stage, sink.frames, busy

    return asyncio.run(main())


@pytest.fixture(scope="module")
def whisper() -> WhisperBackend:
    be = WhisperBackend(ASRConfig())
    be.warmup()
    return be


def transcripts(frames):
    return [f for f in frames if isinstance(f, Transcript)]


def check_partials_of(parts: list[Transcript]) -> None:
    """Stable prefixes never shrink and every partial starts with the previous stable text."""
    stable_text = ""
    for p in parts:
        assert p.text.startswith(stable_text), (stable_text, p.text)
        assert p.stable >= len(stable_text)
        stable_text = p.text[: p.stable]


# --- the real thing, in real time -----------------------------------------------------------


def test_two_utterances_in_real_time(whisper):
    be = Counting(whisper)
    script, spans = utterances(
        (silence(0.6), False), (clip(KITTENS[0]), True), (silence(1.0), False),
        (clip(HONEST[0]), True), (silence(0.5), False),
    )
    trace = Trace()
    engine = make_engine(be, ASRConfig(), capacity=1)  # held here: its counters are read below
    try:
        stage, frames, busy = run_stage(engine, script, trace=trace)
    finally:
        engine.close()
    assert not busy

    # every input frame went on unchanged and in order, the transcripts in between
    audio_out = [f for f in frames if isinstance(f, AudioIn)]
    assert len(audio_out) == -(-len(script.audio) // FRAME_SAMPLES)
    assert [f.offset for f in audio_out] == sorted(f.offset for f in audio_out)
    assert sum(isinstance(f, SpeechStopped) for f in frames) == 2

    finals = [t for t in transcripts(frames) if t.final]
    assert len(finals) == 2
    for final, (a, b), (_, ref) in zip(finals, spans, (KITTENS, HONEST), strict=True):
        assert (final.start, final.end) == (a, b)
        assert wer(ref, final.text) <= MAX_WER, final.text

    # partials arrive while the first (3.3 s) utterance is spoken, and none after its final
    first_final = frames.index(finals[0])
    first_stop = next(i for i, f in enumerate(frames) if isinstance(f, SpeechStopped))
    partials1 = [f for f in frames[:first_final] if isinstance(f, Transcript) and not f.final]
    assert len([p for p in partials1 if frames.index(p) < first_stop]) >= 2
    check_partials_of(partials1)
    assert any(p.stable > 0 for p in partials1)  # the agreement committed something
    after1 = frames[first_final + 1 :]
    assert all(t.start >= spans[1][0] - 4000 for t in transcripts(after1))
    partials2 = [t for t in transcripts(after1) if not t.final]
    check_partials_of(partials2)
    for p in partials1 + partials2:
        assert p.end > p.start

    # every request reached the model but a partial a final overtook before the engine started
    # it (on a slow or loaded CPU the final can come while the partial still waits): dropped unrun
    unrun = engine.stats.cancelled + engine.stats.dropped_stale
    assert be.calls == stage.backend_calls - unrun > 0
    # silence never reached the model: every buffer fits in an utterance plus its pre-roll and
    # the VAD's 300 ms between SpeechPaused and SpeechStopped (partials go on until the stop)
    assert threading.get_ident() not in be.threads  # never on the event loop's thread
    longest = max(b - a for a, b in spans) + (200 + 300 + 20) * SR // 1000
    assert max(be.lengths) <= longest
    speech_frames = sum(
        1 for off in range(0, len(script.audio), FRAME_SAMPLES)
        for a, b in spans if a + 64 * SR // 1000 <= off + FRAME_SAMPLES <= b + 300 * SR // 1000
    )
    assert stage.bypassed_chunks >= len(audio_out) - speech_frames - 2 * 2
    assert stage.bypassed_chunks <= len(audio_out) - speech_frames + 2 * 2
    # one partial lag per partial
    assert len(trace.partial_lags_ms) == stage.partials == len(partials1) + len(partials2)
    assert all(lag > 0 for lag in trace.partial_lags_ms)
    # the pause hint was enough: no model call was needed after SpeechStopped
    assert stage.speculative_finals == 2


def test_silence_never_calls_the_model(whisper):
    be = Counting(whisper)
    script = Script(silence(1.0))
    stage, frames, _ = run_stage(be, script, frame_s=0.0)
    assert be.calls == 0 and stage.backend_calls == 0
    assert stage.bypassed_chunks == len(script.audio) // FRAME_SAMPLES
    assert transcripts(frames) == []


def test_speech_resumed_after_a_pause_gets_the_whole_utterance(whisper):
    # A pause hint in the middle of the sentence, then speech goes on: the early speculative
    # transcription must not become the final.
    kittens = clip(KITTENS[0])
    script, spans = utterances((silence(0.3), False), (kittens, True), (silence(0.5), False))
    a, b = spans[0]
    mid = a + len(kittens) // 2
    script.events.append((mid + 512, lambda: SpeechPaused(mid)))
    stage, frames, _ = run_stage(be := Counting(whisper), script, frame_s=0.01)
    finals = [t for t in transcripts(frames) if t.final]
    assert len(finals) == 1
    assert wer(KITTENS[1], finals[0].text) <= MAX_WER, finals[0].text
    assert max(be.lengths) >= b - a  # the final covered the utterance to its end


def test_no_pause_hint_still_gives_one_final(whisper):
    script, spans = utterances((silence(0.2), False), (clip(HONEST[0]), True),
                               (silence(0.5), False), pause_first=False)
    stage, frames, _ = run_stage(Counting(whisper), script, frame_s=0.005)
    finals = [t for t in transcripts(frames) if t.final]
    assert len(finals) == 1 and stage.speculative_finals == 0
    assert wer(HONEST[1], finals[0].text) <= MAX_WER, finals[0].text
    assert (finals[0].start, finals[0].end) == spans[0]


def test_long_utterance_is_cut_into_finals(whisper):
    be = Counting(whisper)
    voice = np.concatenate([clip(KITTENS[0]), clip(QUILTER[0])])  # 9.2 s without a VAD stop
    script, spans = utterances((silence(0.2), False), (voice, True), (silence(0.5), False))
    cfg = ASRConfig(max_utterance_s=4.0)
    stage, frames, _ = run_stage(be, script, cfg=cfg, frame_s=0.005, tail_s=15.0)
    finals = [t for t in transcripts(frames) if t.final]
    assert len(finals) >= 3  # at least two cuts, plus the final of the SpeechStopped
    assert finals[-1].end == spans[0][1]
    for x, y in zip(finals, finals[1:], strict=False):
        assert x.end == y.start  # the segments tile the utterance
    text = " ".join(f.text for f in finals)
    assert wer(f"{KITTENS[1]} {QUILTER[1]}", text) < 0.3, text
    # every model call saw a bounded buffer: at most the limit, plus the time to find a cut
    assert max(be.lengths) <= (4.0 + 0.2 + 1.0) * SR


def test_backend_errors_become_error_frames_and_the_final_still_comes(whisper):
    be = Counting(whisper, fail_calls=(1, 2, 3))
    script, spans = utterances((silence(0.2), False), (clip(KITTENS[0]), True),
                               (silence(0.6), False), (clip(HONEST[0]), True),
                               (silence(0.5), False))
    stage, frames, _ = run_stage(be, script, frame_s=0.005)
    errors = [f for f in frames if isinstance(f, ErrorFrame)]
    assert len(errors) == 3 and all("broke on purpose" in e.message for e in errors)
    assert all(e.stage == "asr" and not e.fatal for e in errors)
    finals = [t for t in transcripts(frames) if t.final]
    assert len(finals) == 2  # one per SpeechStopped, even when calls failed
    assert wer(HONEST[1], finals[1].text) <= MAX_WER, finals[1].text  # and it keeps working


def test_end_of_call_mid_speech_flushes_without_hanging(whisper):
    script = Script(np.concatenate([silence(0.2), clip(KITTENS[0])]))
    script.events.append((3200 + 1024, lambda: SpeechStarted(3200)))
    stage, frames, busy = run_stage(Counting(whisper), script, frame_s=0.003, end_call=True)
    assert not busy and not stage.in_speech
    end = next(i for i, f in enumerate(frames) if isinstance(f, EndOfCall))
    assert not transcripts(frames[end:])  # nothing of the call comes after its end


def test_end_of_call_right_after_a_stop_still_delivers_that_final_first(whisper):
    script, spans = utterances((silence(0.2), False), (clip(HONEST[0]), True),
                               pause_first=False)
    script.audio = np.concatenate([script.audio, silence(0.32)])
    stage, frames, busy = run_stage(Counting(whisper), script, frame_s=0.0, end_call=True)
    assert not busy
    kinds = [type(f).__name__ for f in frames if not isinstance(f, AudioIn)]
    assert kinds[-3:] == ["SpeechStopped", "Transcript", "EndOfCall"], kinds
    final = frames[-2]
    assert final.final and (final.start, final.end) == spans[0]
    assert sum(isinstance(f, Transcript) and f.final for f in frames) == 1


def test_streams_share_one_engine_and_give_their_slots_back(whisper):
    from agent.errors import CapacityError
    from stages.asr.stage import make_engine

    async def main():
        engine = make_engine(whisper, ASRConfig(), capacity=2)
        a, b, c = (StreamingASR(engine, ASRConfig()) for _ in range(3))
        await a.start(StageContext())
        await b.start(StageContext())
        full = engine.pool.in_use
        try:
            await c.start(StageContext())
            refused = False
        except CapacityError:
            refused = True
        slot = a._slot
        a.stream.audio(np.full(320, 1000, np.int16), 0)
        await a.stop()
        zeroed = slot is not None and not slot.audio.any() and a._slot is None
        await b.stop()
        engine.close()
        return full, refused, zeroed, engine.pool.in_use

    full, refused, zeroed, left = asyncio.run(main())
    assert full == 2 and refused and zeroed and left == 0


def test_frames_pass_through_before_start_of_work():
    class Unused:
        name, sample_rate, max_batch = "unused", SR, 1
        capabilities = ASRCapabilities(sample_rate=SR, max_batch=1)

        def transcribe_batch(self, audio, prompts=None):
            raise AssertionError("no speech, no call")

        def warmup(self):
            pass

    stage = StreamingASR(Unused(), ASRConfig())
    sink = Sink()
    stage.link(sink)
    frame = AudioIn(silence(0.02), offset=0)
    stage.process(frame, DOWN)
    assert sink.frames == [frame] and stage.bypassed_chunks == 1


# --- local agreement ---------------------------------------------------------------------------


def test_agreement_commits_what_two_hypotheses_share():
    la = LocalAgreement()
    assert la.update("The two") == ("The two", 0)
    text, stable = la.update("The two stray")
    assert (text, stable) == ("The two stray", len("The two"))
    text, stable = la.update("the two stray kittens")  # case does not count
    assert text == "The two stray kittens" and stable == len("The two stray")
    # a later hypothesis that disagrees inside the committed part cannot undo it
    # ("kittens" agrees with the previous hypothesis, so it is committed now)
    text, stable = la.update("A tune stray kittens gradually")
    assert text == "The two stray kittens gradually" and stable == len("The two stray kittens")


def test_agreement_realigns_when_a_word_is_inserted():
    la = LocalAgreement()
    la.update("somehow or other cat has")
    la.update("somehow or other cat has taught")
    assert la.committed_text == "somehow or other cat has"
    text, stable = la.update("somehow or other the cat has taught them")
    assert text == "somehow or other cat has taught them"
    assert stable == len("somehow or other cat has taught")  # "taught" agreed past the insertion


def test_agreement_reset_and_empty_hypotheses():
    la = LocalAgreement()
    la.update("hello there")
    la.update("hello there")
    assert la.committed_text == "hello there"
    assert la.update("") == ("hello there", len("hello there"))
    la.reset()
    assert la.update("") == ("", 0) and la.committed_text == ""
