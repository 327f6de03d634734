"""The ASR stream core alone, with no loop, engine or thread: the caller answers each request
at once with the fake word reader of test_asr_shells (the audio names its words)."""

from __future__ import annotations

import numpy as np
import pytest
from test_asr_shells import FRAME, SR, WORDS, WordBackend, speech

from stages.asr.stream import (
    TRANSITIONS,
    ASRStream,
    Cancel,
    Event,
    Failure,
    Kind,
    Phase,
    Request,
    Result,
    StreamConfig,
)

read = WordBackend.read


def _cfg(max_utterance_s=25.0, commit_after_s=6.0, **kw) -> StreamConfig:
    from dataclasses import replace

    return replace(StreamConfig.from_ms(SR, 400, max_utterance_s, commit_after_s), **kw)


class Driver:
    """Feeds a core and answers its requests at once; keeps everything it said."""

    def __init__(self, config: StreamConfig, answer=read, end_p=None) -> None:
        self.core = ASRStream(np.zeros(config.ring, np.float32), config)
        self.answer = answer
        self.end_p = end_p  # request -> the model's P(a sentence ends), if it tells
        self.requests: list[Request] = []
        self.results: list[Result] = []
        self.failures: list[Failure] = []
        self.cancelled: list[int] = []
        self.held: list[Request] = []  # requests not answered yet (hold=True)
        self.hold = False

    def pump(self) -> None:
        while out := self.core.take():
            for o in out:
                if isinstance(o, Request):
                    self.requests.append(o)
                    if self.hold:
                        self.held.append(o)
                    else:
                        self._answer(o)
                elif isinstance(o, Result):
                    self.results.append(o)
                elif isinstance(o, Cancel):  # as the engine does: dropped if not started
                    self.cancelled.append(o.id)
                    self.held = [r for r in self.held if r.id != o.id]
                else:
                    self.failures.append(o)

    def release(self) -> None:
        held, self.held = self.held, []
        for r in held:
            self._answer(r)
        self.pump()

    def _answer(self, req: Request) -> None:
        self.core.done(req.id, self.answer(req.audio),
                       end_p=self.end_p(req) if self.end_p else None)

    def play(self, audio: np.ndarray, start: int = 0, events=()) -> None:
        events = sorted(events)
        k = 0
        for off in range(0, len(audio), FRAME):
            self.core.audio(audio[off : off + FRAME], start + off)
            self.pump()
            while k < len(events) and events[k][0] <= start + off + FRAME:
                _, name, *args = events[k]
                getattr(self.core, name)(*args)
                self.pump()
                k += 1

    def finals(self) -> list[str]:
        return [r.text for r in self.results if r.final]


def test_every_transition_is_in_the_table_and_anything_else_is_a_bug():
    assert TRANSITIONS[(Phase.SPEAKING, Event.PAUSE)] is Phase.PAUSED
    assert TRANSITIONS[(Phase.STOPPED, Event.FINAL)] is Phase.DONE
    with pytest.raises(KeyError):
        TRANSITIONS[(Phase.DONE, Event.STOP)]
    # every phase but DONE can be reached, and DONE only through a final
    reached = {to for (_, ev), to in TRANSITIONS.items()}
    assert reached == {Phase.SPEAKING, Phase.PAUSED, Phase.STOPPED, Phase.DONE}
    assert {ev for (_, ev), to in TRANSITIONS.items() if to is Phase.DONE} <= {Event.FINAL,
                                                                             Event.SPECULATED}


def test_a_tail_final_reads_only_the_uncommitted_audio_and_keeps_every_word():
    words = " ".join(WORDS[1:21])  # 8 s
    audio = speech(f"_ {words} _ _")
    d = Driver(_cfg(commit_after_s=3.0, whole_finals=False))
    d.play(audio, events=[(s(0.46), "started", s(0.4)), (s(8.7), "stopped", s(8.4), s(0.4))])
    assert d.finals() == [words]
    final = next(r for r in d.requests if r.kind is Kind.FINAL)
    assert final.end - final.start < s(3.5)  # the tail only
    assert final.prompt.startswith("alpha bravo")  # read in the context of what was committed
    assert d.core.commits >= 2


def test_whole_finals_read_the_utterance_and_agree_with_tail_finals_on_clean_cuts():
    words = " ".join(WORDS[1:21])
    audio = speech(f"_ {words} _ _")
    events = [(s(0.46), "started", s(0.4)), (s(8.7), "stopped", s(8.4), s(0.4))]
    whole, tail = Driver(_cfg(commit_after_s=3.0)), Driver(_cfg(commit_after_s=3.0,
                                                                whole_finals=False))
    whole.play(audio, events=events)
    tail.play(audio, events=events)
    assert whole.finals() == tail.finals() == [words]
    final = next(r for r in whole.requests if r.kind is Kind.FINAL)
    assert final.end - final.start >= s(8.0)
    # partials are the same either way: only the final differs
    assert [r.text for r in whole.results if not r.final] == \
        [r.text for r in tail.results if not r.final]


def test_a_request_waiting_too_long_reports_lost_audio_and_the_final_still_comes():
    config = _cfg(max_utterance_s=2.0)  # a 12.2-s ring
    d = Driver(config)
    d.hold = True
    audio = speech("alpha bravo charlie")
    d.play(audio, events=[(s(0.06), "started", 0)])
    assert d.held  # the first partial, unanswered
    # 20 s later the stream stops; the ring no longer has the utterance's start
    later = s(20.0)
    d.core.audio(np.zeros(config.ring, np.int16), later - config.ring + FRAME)
    d.core.stopped(later, 0)
    d.pump()
    d.hold = False
    d.release()
    assert any("overwritten" in f.message for f in d.failures)
    assert len([r for r in d.results if r.kind is Kind.FINAL]) == 1


def test_end_of_stream_delivers_each_owed_final_at_once_with_the_best_text():
    d = Driver(_cfg())
    audio = speech("alpha bravo charlie delta _")
    d.play(audio, events=[(s(0.06), "started", 0)])
    d.hold = True
    d.core.stopped(s(1.6), 0)
    d.pump()
    assert d.core.busy  # the final's call is out
    d.core.end_of_stream()
    d.pump()
    finals = [r for r in d.results if r.final]
    stable = [r for r in d.results if not r.final][-1]
    assert [f.text for f in finals] == [stable.text[: stable.stable]]  # the stable prefix
    assert finals[0].text.startswith("alpha bravo") and d.core.flushed == 1
    d.release()  # the late answer changes nothing
    assert len([r for r in d.results if r.final]) == 1


def test_the_ring_takes_int16_and_float_and_fills_gaps_with_silence():
    config = _cfg(max_utterance_s=1.0)
    core = ASRStream(np.zeros(config.ring, np.float32), config)
    core.audio(np.full(320, 16384, np.int16), 0)
    core.audio(np.array([np.nan, 2.0, -3.0, 0.25] * 80, np.float32), 640)  # a 320-sample gap
    got = core._span_copy(0, 960)
    assert np.all(got[:320] == 0.5)
    assert np.all(got[320:640] == 0.0)
    assert list(got[640:644]) == [0.0, 1.0, -1.0, 0.25]
    # wrapping around the ring's end keeps every sample
    at = config.ring - 100
    core.audio(np.arange(320, dtype=np.int16), at)
    assert np.array_equal(core._span_copy(at, at + 320) * 32768, np.arange(320))


def test_a_config_shrinks_its_longest_utterance_to_fit_a_ring():
    config = _cfg(max_utterance_s=25.0)
    small = config.fitting(30 * SR)
    assert small.ring == 30 * SR and small.max_utterance < config.max_utterance
    assert config.fitting(config.ring) is config
    with pytest.raises(ValueError, match="no room"):
        config.fitting(10 * SR)
    with pytest.raises(ValueError, match="needs"):
        ASRStream(np.zeros(SR, np.float32), config)


def s(t: float) -> int:
    return int(round(t * SR))


def test_a_final_does_not_wait_for_a_partial_in_flight():
    d = Driver(_cfg())
    audio = speech("alpha bravo charlie delta _ _")
    d.play(audio[: s(1.2)], events=[(s(0.06), "started", 0)])
    d.hold = True
    d.play(audio[s(1.2) : s(1.6)], start=s(1.2))  # a partial goes out and is not answered
    partial = d.held[-1]
    assert partial.kind is Kind.PARTIAL
    d.core.stopped(s(1.6), 0)
    d.pump()
    final = d.held[-1]
    assert final.kind is Kind.FINAL and d.cancelled == [partial.id]  # at once, not after it
    d.core.done(partial.id, "a late answer")  # one that had started anyway is ignored
    d.core.done(final.id, read(final.audio))
    d.pump()
    assert [r.text for r in d.results if r.final] == ["alpha bravo charlie delta"]
    assert all(r.text != "a late answer" for r in d.results)


def test_a_partial_waits_for_room_and_then_reads_the_newest_audio():
    room = [False]
    config = _cfg()
    d = Driver(config)
    d.core = ASRStream(np.zeros(config.ring, np.float32), config, room=lambda: room[0])
    audio = speech("alpha bravo charlie delta _ _")
    d.play(audio[: s(1.0)], events=[(s(0.06), "started", 0)])
    assert not d.requests  # the engine is full: nothing goes
    room[0] = True
    d.play(audio[s(1.0) : s(1.02)], start=s(1.0))
    assert [(r.kind, r.end) for r in d.requests] == [(Kind.PARTIAL, s(1.02))]
    room[0] = False  # a final never waits for room
    d.core.stopped(s(1.02), 0)
    d.pump()
    assert d.requests[-1].kind is Kind.FINAL and d.finals()


def _partial_ends(share: float, answer_after: float) -> list[int]:
    """Where each partial's audio ended, over 6 s of speech whose partials are each answered
    ``answer_after`` seconds of audio after their request."""
    d = Driver(_cfg(partial_share=share))
    audio = speech(" ".join(["alpha bravo charlie delta"] * 6))[: s(6.0)]
    d.hold = True
    lag = s(answer_after)
    d.core.started(0)
    for off in range(0, len(audio), FRAME):
        d.core.audio(audio[off : off + FRAME], off)
        d.pump()
        while d.held and off + FRAME - d.held[0].end >= lag:
            d.release()
    return [r.end for r in d.requests if r.kind is Kind.PARTIAL]


def test_partials_space_themselves_out_when_their_calls_take_long():
    # answered at once: every 400 ms, whatever the share
    quick = _partial_ends(0.5, 0.0)
    assert np.diff(quick).tolist() == [s(0.4)] * (len(quick) - 1)
    assert _partial_ends(0.0, 0.0) == quick
    # each call takes 300 ms of audio: off, the next goes 400 ms after the last (model busy
    # 75% of the time); at a share of 0.5, 600 ms after (50%)
    slow_off = _partial_ends(0.0, 0.3)
    slow = _partial_ends(0.5, 0.3)
    assert np.diff(slow_off).tolist() == [s(0.4)] * (len(slow_off) - 1)
    assert set(np.diff(slow).tolist()) == {s(0.6)}
    assert len(slow) < len(slow_off) * 0.75
    # a call under interval * share changes nothing
    assert np.diff(_partial_ends(0.5, 0.15)).tolist() == np.diff(quick).tolist()


@pytest.mark.parametrize("pad_ms", [40, 100])
def test_the_end_pad_sets_what_the_speculative_transcript_and_the_final_read(pad_ms):
    config = StreamConfig.from_ms(SR, 400, 25.0, 6.0, end_pad_ms=pad_ms)
    assert config.end_pad == s(pad_ms / 1000)
    d = Driver(config)
    audio = speech("alpha bravo charlie delta _ _ _")
    pause = s(1.2)
    # the pause is heard a window after it; the speculative call waits for the pad's audio
    d.play(audio[: s(1.8)], events=[(s(0.06), "started", 0), (pause + 512, "paused", pause)])
    spec = [r for r in d.requests if r.kind is Kind.SPECULATIVE]
    assert [r.end for r in spec] == [pause + s(pad_ms / 1000)]
    asked = len(d.requests)
    d.core.stopped(pause, 0)
    d.pump()
    assert len(d.requests) == asked  # the speculative result is the final: no new call
    assert d.finals() == ["alpha bravo charlie delta"]


def _held_partial(until: float) -> Driver:
    """Speech whose voice ends at 1.5 s, partials every 400 ms answered at once, then one
    asked at ``until`` and held (the model still has it)."""
    d = Driver(_cfg())
    audio = speech("alpha bravo charlie delta _ _")
    last = until - 0.4
    d.play(audio[: s(last)], events=[(s(0.06), "started", 0)])
    d.hold = True
    d.play(audio[s(last) : s(until)], start=s(last))
    assert [r.kind for r in d.held] == [Kind.PARTIAL] and d.held[0].end == s(until)
    d.play(audio[s(until) : s(1.8)], start=s(until))
    return d


def test_a_partial_asked_after_the_voice_ended_stands_for_the_pause_transcript():
    d = _held_partial(1.6)  # the voice ended at 1.5 s
    partial = d.held[0]
    asked = len(d.requests)
    d.core.paused(s(1.7), s(1.5))
    d.pump()
    assert len(d.requests) == asked and not d.cancelled  # no new call, the partial kept
    d.release()
    spec = [r for r in d.results if r.kind is Kind.SPECULATIVE]
    assert [r.text for r in spec] == ["alpha bravo charlie delta"]
    assert spec[0].end == s(1.7) + d.core.cfg.end_pad  # it covers what the pause asked for
    d.core.stopped(s(1.7), 0)
    d.pump()
    assert len(d.requests) == asked  # and it is the final: no call after the stop
    assert d.finals() == ["alpha bravo charlie delta"]
    assert d.core.adopted_partials == 1 and partial.kind is Kind.PARTIAL


def test_the_final_waits_for_an_adopted_partial_still_with_the_model():
    d = _held_partial(1.6)
    asked = len(d.requests)
    d.core.paused(s(1.7), s(1.5))
    d.core.stopped(s(1.7), 0)  # the stop comes before the model answers
    d.pump()
    assert len(d.requests) == asked and not d.finals()
    d.release()
    assert len(d.requests) == asked and d.finals() == ["alpha bravo charlie delta"]


@pytest.mark.parametrize("until, voice_end", [(1.2, 1.5), (1.6, 1.59), (1.6, -1)],
                         ids=["asked-before-the-voice-ended", "within-the-margin", "voice-end-unknown"])
def test_a_partial_that_may_have_missed_words_is_given_up_at_the_pause(until, voice_end):
    d = _held_partial(until)
    partial = d.held[0]
    d.core.paused(s(1.7), s(voice_end) if voice_end >= 0 else -1)
    d.pump()
    spec = [r for r in d.requests if r.kind is Kind.SPECULATIVE]
    assert d.cancelled == [partial.id] and len(spec) == 1  # a call of its own, as before
    assert spec[0].end == s(1.7) + d.core.cfg.end_pad
    assert d.core.adopted_partials == 0
    d.release()
    d.core.stopped(s(1.7), 0)
    d.pump()
    assert d.finals() == ["alpha bravo charlie delta"]


def test_a_partial_of_the_tail_alone_is_not_adopted_for_a_whole_transcript():
    # after a commit a partial reads only the uncommitted tail, with the committed text as its
    # prompt: the pause's transcript reads the whole utterance, so it gets its own call
    d = Driver(_cfg(commit_after_s=1.0))
    audio = speech("alpha bravo charlie delta _ _")
    d.play(audio[: s(1.2)], events=[(s(0.06), "started", 0)])
    assert d.core.commits >= 1
    d.hold = True
    d.play(audio[s(1.2) : s(1.8)], start=s(1.2))
    partial = d.held[0]
    assert partial.kind is Kind.PARTIAL and partial.start > 0 and partial.end >= s(1.52)
    d.core.paused(s(1.7), s(1.5))
    d.pump()
    assert d.cancelled == [partial.id]
    assert [r.start for r in d.requests if r.kind is Kind.SPECULATIVE] == [0]


def test_adopting_partials_can_be_turned_off():
    d = Driver(_cfg(adopt_partials=False))
    audio = speech("alpha bravo charlie delta _ _")
    d.play(audio[: s(1.2)], events=[(s(0.06), "started", 0)])
    d.hold = True
    d.play(audio[s(1.2) : s(1.8)], start=s(1.2))
    partial = d.held[0]
    assert partial.kind is Kind.PARTIAL and partial.end == s(1.6)
    d.core.paused(s(1.7), s(1.5))
    d.pump()
    assert d.cancelled == [partial.id] and d.requests[-1].kind is Kind.SPECULATIVE
    assert d.core.adopted_partials == 0


def _told(req: Request) -> float:
    """A model's P(a sentence ends), told with every answer: 0.9 for partials, 0.25 else."""
    return 0.9 if req.kind is Kind.PARTIAL else 0.25


def test_the_model_s_sentence_end_reaches_the_pause_transcript_and_the_final():
    d = Driver(_cfg(), end_p=_told)
    audio = speech("alpha bravo charlie delta _ _ _")
    pause = s(1.2)
    d.play(audio[: s(1.8)], events=[(s(0.06), "started", 0), (pause + 512, "paused", pause)])
    spec = [r for r in d.results if r.kind is Kind.SPECULATIVE]
    assert [(r.text, r.end_p) for r in spec] == [("alpha bravo charlie delta", 0.25)]
    partials = [r for r in d.results if r.kind is Kind.PARTIAL]
    assert partials and all(r.end_p is None for r in partials)  # nobody judges a partial's end
    d.core.stopped(pause, 0)
    d.pump()
    # the speculative result is the final: it keeps what the model said of its end
    assert [(r.text, r.end_p) for r in d.results if r.final] == [("alpha bravo charlie delta", 0.25)]


def test_a_final_of_its_own_call_carries_its_end_and_a_fallback_final_none():
    audio = speech("alpha bravo charlie _ _")
    events = [(s(0.06), "started", 0), (s(1.0), "stopped", s(0.9), 0)]
    d = Driver(_cfg(), end_p=_told)
    d.play(audio, events=events)
    assert [(r.text, r.end_p) for r in d.results if r.final] == [("alpha bravo charlie", 0.25)]
    failing = Driver(_cfg())
    failing.hold = True
    failing.play(audio, events=events)
    final = next(r for r in failing.held if r.kind is Kind.FINAL)
    failing.core.done(final.id, None, "RuntimeError: boom", end_p=0.25)
    failing.pump()
    # the best text at hand stands in for the final; nothing was heard of its end
    assert [r.end_p for r in failing.results if r.final] == [None] and failing.failures


def test_settle_passes_the_hypothesis_end_on():
    from concurrent.futures import Future

    from stages.asr.backend import Hypothesis

    d = Driver(_cfg())
    d.hold = True
    d.play(speech("alpha bravo _ _"), events=[(s(0.06), "started", 0), (s(0.8), "stopped", s(0.7), 0)])
    final = next(r for r in d.held if r.kind is Kind.FINAL)
    fut: Future = Future()
    fut.set_result(Hypothesis("alpha bravo.", end_p=0.75))
    d.core.settle(final.id, fut)
    d.pump()
    assert [(r.text, r.end_p) for r in d.results if r.final] == [("alpha bravo.", 0.75)]
