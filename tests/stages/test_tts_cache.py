"""The phrase cache: short texts are synthesized once and their audio played again; long
texts, abandoned syntheses and the byte limit behave as documented."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from stage_harness import StageHarness

from agent.config import TTSConfig
from agent.frames import Direction, TextToSpeak, TTSAudio
from stages.tts.cache import PhraseCache
from stages.tts.espeak import EspeakTTS
from stages.tts.piper import PiperTTS
from stages.tts.stage import TTSStage

DOWN = Direction.DOWNSTREAM


class Recorder:
    """A real backend that records which texts it was asked to synthesize."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.asked: list[str] = []

    @property
    def sample_rate(self) -> int:
        return self.inner.sample_rate  # type: ignore[attr-defined]

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        self.asked.append(text)
        yield from self.inner.synthesize(text)  # type: ignore[attr-defined]

    def warmup(self) -> None:
        pass


class Tones:
    """Three 1-s chunks of a tone per text (for the byte arithmetic and early stops)."""

    sample_rate = 16_000

    def __init__(self) -> None:
        self.asked: list[str] = []

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        self.asked.append(text)
        for _ in range(3):
            yield np.full(16_000, 1000, np.int16)

    def warmup(self) -> None:
        pass


@pytest.fixture(scope="module")
def piper() -> PiperTTS:
    tts = PiperTTS(TTSConfig())
    tts.warmup()
    return tts


def _audio(tts: object, text: str) -> np.ndarray:
    return np.concatenate(list(tts.synthesize(text)))  # type: ignore[attr-defined]


def test_a_short_phrase_is_synthesized_once_and_played_again(piper: PiperTTS) -> None:
    backend = Recorder(piper)
    cache = PhraseCache(backend, max_words=3)  # type: ignore[arg-type]
    first = _audio(cache, "Sure,")
    again = _audio(cache, " Sure, ")  # the same text, spaces aside
    assert backend.asked == ["Sure,"]
    assert np.array_equal(first, again) and len(first) > 0.2 * piper.sample_rate
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    # the mark is part of the phrase: "Sure." is spoken differently and synthesized anew
    _audio(cache, "Sure.")
    assert backend.asked == ["Sure,", "Sure."]
    # a text past max_words is never kept
    for _ in range(2):
        _audio(cache, "I can help with that.")
    assert backend.asked[-2:] == ["I can help with that."] * 2
    assert cache.cacheable("I can help") and not cache.cacheable("I can help you")


def test_an_abandoned_synthesis_leaves_nothing_behind() -> None:
    backend = Tones()
    cache = PhraseCache(backend)  # type: ignore[arg-type]
    audio = cache.synthesize("Hello.")
    next(audio)
    audio.close()  # the TTS stage stops iterating on a barge-in
    assert cache.size_bytes == 0
    assert len(_audio(cache, "Hello.")) == 48_000  # synthesized whole, then kept
    assert backend.asked == ["Hello.", "Hello."] and cache.size_bytes == 96_000
    assert len(_audio(cache, "Hello.")) == 48_000 and len(backend.asked) == 2


def test_the_least_recently_spoken_go_first_past_the_byte_limit() -> None:
    backend = Tones()
    cache = PhraseCache(backend, max_bytes=200_000)  # type: ignore[arg-type]  # two phrases
    for text in ("One.", "Two.", "One.", "Three."):  # "One." spoken again: "Two." is older
        _audio(cache, text)
    assert backend.asked == ["One.", "Two.", "Three."]
    assert cache.stats.evicted == 1 and cache.size_bytes == 192_000
    _audio(cache, "One.")
    _audio(cache, "Two.")
    assert backend.asked == ["One.", "Two.", "Three.", "Two."]
    # a phrase larger than the whole cache is spoken and not kept
    small = PhraseCache(Tones(), max_bytes=50_000)  # type: ignore[arg-type]
    assert len(_audio(small, "Hi.")) == 48_000 and small.size_bytes == 0


def test_kept_audio_cannot_be_changed_by_whoever_reads_it() -> None:
    cache = PhraseCache(Tones())  # type: ignore[arg-type]
    _audio(cache, "Hi.")
    chunk = next(cache.synthesize("Hi."))
    with pytest.raises(ValueError):
        chunk[0] = 0


def test_the_tts_stage_speaks_a_kept_phrase_as_it_spoke_it_the_first_time() -> None:
    backend = Recorder(EspeakTTS(TTSConfig(backend="espeak")))
    cache = PhraseCache(backend)  # type: ignore[arg-type]

    async def speak() -> np.ndarray:
        async with StageHarness(TTSStage(cache, TTSConfig(chunk_ms=20))) as h:
            h.pipeline.push(TextToSpeak("Of course."), DOWN)
            await h.until(lambda fs: any(isinstance(f, TTSAudio) and f.last for f in fs))
            return np.concatenate([f.pcm for f in h.frames if isinstance(f, TTSAudio)])

    first = asyncio.run(speak())
    again = asyncio.run(speak())
    assert backend.asked == ["Of course."]
    assert len(first) > 0.3 * 16_000 and np.array_equal(first, again)
