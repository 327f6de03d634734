"""The TTS stage: frame order, the ``last`` marker, trace events, and barge-in cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from stage_harness import StageHarness

from agent.config import TTSConfig
from agent.frames import Direction, Frame, Interrupt, LLMEnd, TextToSpeak, TTSAudio
from stages.tts.espeak import EspeakTTS
from stages.tts.piper import PiperTTS
from stages.tts.stage import TTSStage

DOWN = Direction.DOWNSTREAM


@pytest.fixture(scope="module")
def espeak() -> EspeakTTS:
    return EspeakTTS(TTSConfig(backend="espeak"))


@pytest.fixture(scope="module")
def piper() -> PiperTTS:
    tts = PiperTTS(TTSConfig())
    tts.warmup()
    return tts


class CountingTTS:
    """The real backend, counting the chunks it hands out (to see where synthesis stopped)."""

    def __init__(self, inner: PiperTTS) -> None:
        self.inner = inner
        self.chunks = 0

    @property
    def sample_rate(self) -> int:
        return self.inner.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        for pcm in self.inner.synthesize(text):
            self.chunks += 1
            yield pcm

    def warmup(self) -> None:
        self.inner.warmup()


class Harness(StageHarness):
    def __init__(self, tts: object, chunk_ms: int = 20) -> None:
        super().__init__(TTSStage(tts, TTSConfig(chunk_ms=chunk_ms)))  # type: ignore[arg-type]

    def lasts(self) -> list[TTSAudio]:
        return [f for f in self.frames if isinstance(f, TTSAudio) and f.last]


def test_utterances_come_out_in_order_each_closed_by_one_last_frame(espeak: EspeakTTS) -> None:
    async def main() -> list[Frame]:
        async with Harness(espeak) as h:
            h.trace.begin_turn(speech_end=1)
            h.pipeline.push(TextToSpeak("Hello there."), DOWN)
            h.pipeline.push(TextToSpeak("How are you today?"), DOWN)
            h.pipeline.push(LLMEnd(text="Hello there. How are you today?"), DOWN)
            await h.until(
                lambda fs: len([f for f in fs if isinstance(f, TTSAudio) and f.last]) == 2
            )
            events = h.trace.current.events  # type: ignore[union-attr]
            assert events["tts_request"] <= events["tts_first_audio"]
            return h.frames

    frames = asyncio.run(main())
    # LLMEnd is not queued behind the synthesis: it passes straight through.
    assert isinstance(frames[0], LLMEnd)
    # each text goes on (clients show it) as its synthesis starts, ahead of its audio
    said = [i for i, f in enumerate(frames) if isinstance(f, TextToSpeak)]
    assert [frames[i].text for i in said] == ["Hello there.", "How are you today?"]
    assert isinstance(frames[said[0] + 1], TTSAudio) and frames[said[1] - 1].last
    audio = [f for f in frames if isinstance(f, TTSAudio)]
    cut = next(i for i, f in enumerate(audio) if f.last)
    first, second = audio[: cut + 1], audio[cut + 1 :]
    assert [f.last for f in first] == [False] * (len(first) - 1) + [True]
    assert [f.last for f in second] == [False] * (len(second) - 1) + [True]
    assert first[-1].text == "Hello there." and second[-1].text == "How are you today?"
    assert len(first) > 10 and len(second) > 10  # 20 ms chunks of about a second of speech
    assert all(len(f.pcm) == 320 for f in audio if not f.last)


def test_empty_text_still_gets_its_last_frame(espeak: EspeakTTS) -> None:
    async def main() -> list[Frame]:
        async with Harness(espeak) as h:
            h.pipeline.push(TextToSpeak("  "), DOWN)
            await h.until(lambda fs: len(fs) == 2)
            return h.frames

    said, frame = asyncio.run(main())
    assert isinstance(said, TextToSpeak)
    assert isinstance(frame, TTSAudio) and frame.last and len(frame.pcm) == 0


def test_interrupt_stops_the_utterance_in_flight_and_the_stage_goes_on(piper: PiperTTS) -> None:
    counting = CountingTTS(piper)
    sentences = [
        "This is the first sentence of a long answer.",
        "Here comes the second one, which is longer still.",
        "A third sentence follows it.",
        "And a fourth, to be sure there is more to say.",
        "The fifth sentence.",
        "Finally the sixth and last sentence of the answer.",
    ]

    async def main() -> tuple[list[Frame], int]:
        async with Harness(counting) as h:
            h.pipeline.push(TextToSpeak(" ".join(sentences)), DOWN)
            await h.until(lambda fs: any(isinstance(f, TTSAudio) for f in fs))
            before = len(h.frames)
            h.pipeline.push(Interrupt(), DOWN)
            # A job queued behind the synthesis runs once the worker has let go of it.
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.run_in_executor(h.stage._synth_worker, lambda: None), 20)
            await asyncio.sleep(0.05)  # let any frame the worker emitted reach the loop
            assert [type(f) for f in h.frames[before:]] == [Interrupt]  # nothing more of it
            stopped_at = counting.chunks
            h.pipeline.push(TextToSpeak("Okay."), DOWN)
            await h.until(lambda fs: any(isinstance(f, TTSAudio) and f.last for f in fs))
            return h.frames, stopped_at

    frames, stopped_at = asyncio.run(main())
    assert stopped_at < len(sentences)  # Piper yields a sentence at a time: it stopped early
    lasts = [f for f in frames if isinstance(f, TTSAudio) and f.last]
    assert [f.text for f in lasts] == ["Okay."]  # the interrupted utterance was never closed
    i = next(i for i, f in enumerate(frames) if isinstance(f, Interrupt))
    assert all(f.text in ("", "Okay.") for f in frames[i + 1 :] if isinstance(f, TTSAudio))


def test_leading_silence_is_trimmed_to_10_ms_and_never_more_than_300(piper: PiperTTS) -> None:
    from stages.tts.stage import LEAD_KEEP, LEAD_MAX, _trim_lead

    class LateStart(CountingTTS):
        """Piper with 200 ms of digital silence before its first sample."""

        def synthesize(self, text: str) -> Iterator[np.ndarray]:
            yield np.zeros(self.sample_rate // 5, np.int16)
            yield from self.inner.synthesize(text)

    async def main() -> list[TTSAudio]:
        async with Harness(LateStart(piper)) as h:
            h.pipeline.push(TextToSpeak("Hello there."), DOWN)
            await h.until(lambda fs: any(isinstance(f, TTSAudio) and f.last for f in fs))
            return [f for f in h.frames if isinstance(f, TTSAudio)]

    audio = np.concatenate([f.pcm for f in asyncio.run(main())])
    first_loud = int(np.flatnonzero(np.abs(audio.astype(np.int32)) > 100)[0])
    assert first_loud <= LEAD_KEEP  # the 200 ms (and Piper's own lead) are gone
    assert len(audio) > 16000 * 0.5  # the words are all there
    # Pure rule: silence is dropped up to 300 ms, then kept; the voice is never cut.
    quiet, voice = np.zeros(8000, np.int16), np.full(100, 3000, np.int16)
    rest, dropped = _trim_lead(quiet[:3000], 0)
    assert len(rest) == 0 and dropped == 3000
    rest, dropped = _trim_lead(np.concatenate([quiet[:3000], voice]), dropped)
    assert dropped == -1 and len(rest) == 3000 + 100 - (LEAD_MAX - 3000) and rest[-1] == 3000
    rest, dropped = _trim_lead(np.concatenate([quiet[:500], voice]), 0)
    assert len(rest) == LEAD_KEEP + 100 and dropped == -1


# --- faults (issue 18) ------------------------------------------------------------------------


def test_the_apology_is_said_by_both_voices_with_the_dash_as_a_pause(
    espeak: EspeakTTS, piper: PiperTTS
) -> None:
    from stages.faults import APOLOGY

    as_pause = APOLOGY.replace(" —", ";")
    # Piper reads text through its phonemizer: the dash becomes the pause a ";" is, no word
    assert piper._voice.phonemize(APOLOGY) == piper._voice.phonemize(as_pause)
    seconds = [
        sum(len(c) for c in espeak.synthesize(t)) / espeak.sample_rate for t in (APOLOGY, as_pause)
    ]
    assert seconds[0] > 1.5 and abs(seconds[0] - seconds[1]) < 0.15, seconds  # no "em dash"


class FailsOn:
    """eSpeak NG that raises for the texts in ``bad``."""

    def __init__(self, inner: EspeakTTS, *bad: str) -> None:
        self.inner = inner
        self.bad = set(bad)

    @property
    def sample_rate(self) -> int:
        return self.inner.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        if text in self.bad:
            raise RuntimeError(f"cannot say {text!r} with /srv/voices/v.onnx")
        return self.inner.synthesize(text)

    def warmup(self) -> None:
        pass


def test_a_failed_synthesis_is_closed_reported_and_apologized_for(espeak: EspeakTTS) -> None:
    from agent.frames import ErrorFrame
    from stages.faults import APOLOGY, TTS_FAILED, fault_frame

    async def main() -> tuple[list[Frame], int]:
        async with Harness(FailsOn(espeak, "Bad one.")) as h:
            h.pipeline.push(TextToSpeak("Bad one."), DOWN)
            h.pipeline.push(TextToSpeak("Good one."), DOWN)
            await h.until(lambda fs: [f.text for f in fs if isinstance(f, TTSAudio) and f.last]
                          == ["Bad one.", APOLOGY, "Good one."])
            return h.frames, h.stage.errors

    frames, errors = asyncio.run(main())
    kinds = [type(f).__name__ for f in frames[:3]]
    assert kinds == ["TextToSpeak", "TTSAudio", "ErrorFrame"]  # said, closed, then reported
    (error,) = [f for f in frames if isinstance(f, ErrorFrame)]
    assert error.message == fault_frame(TTS_FAILED, "tts").message and "/srv" not in error.message
    assert errors == 1
    said = [f.text for f in frames if isinstance(f, TextToSpeak)]
    assert said == ["Bad one.", APOLOGY, "Good one."]


def test_a_held_texts_failure_and_its_apology_wait_for_the_speculation(espeak: EspeakTTS) -> None:
    from agent.frames import ErrorFrame, SpeculationResolved
    from stages.faults import APOLOGY

    async def run(confirmed: bool) -> list[Frame]:
        async with Harness(FailsOn(espeak, "Held.")) as h:
            h.pipeline.push(TextToSpeak("Held.", held=7), DOWN)
            await asyncio.sleep(0.5)  # synthesized (and failed, and apologized) meanwhile
            assert h.frames == [] and not h.stage.busy  # nothing of it is out yet
            h.pipeline.push(SpeculationResolved(7, confirmed=confirmed), DOWN)
            h.pipeline.push(TextToSpeak("Next."), DOWN)
            await h.until(lambda fs: any(isinstance(f, TTSAudio) and f.last and f.text == "Next."
                                         for f in fs))
            return h.frames

    heard = asyncio.run(run(True))
    assert [f.text for f in heard if isinstance(f, TextToSpeak)] == ["Held.", APOLOGY, "Next."]
    assert sum(isinstance(f, ErrorFrame) for f in heard) == 1
    unheard = asyncio.run(run(False))
    assert [f.text for f in unheard if isinstance(f, TextToSpeak)] == ["Next."]
    assert not any(isinstance(f, ErrorFrame) for f in unheard)
