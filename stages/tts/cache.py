"""Short phrases spoken before: their audio is kept and played again instead of synthesized again.

A reply's first chunk is one or two words ("Sure,", "I'm sorry,"), and the caller waits for its
audio: Piper takes 40-100 ms for it on a busy 2-core machine, nearly all of it fixed cost. The
same few openers, fillers ("One moment.") and greetings come back call after call, so one cache
per process, shared by every call, answers them at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from agent.config import TTSConfig
from stages.tts.base import TTS


@dataclass(slots=True)
class PhraseCacheStats:
    hits: int = 0
    misses: int = 0  # short phrases not kept yet: synthesized, then kept
    evicted: int = 0


class PhraseCache:
    """A :class:`~stages.tts.base.TTS` in front of another: a text of at most ``max_words``
    words (and ``max_chars`` characters) is synthesized once; its audio is kept, up to
    ``max_bytes`` in all (the least recently spoken go first), and yielded again for the same
    text. The text is the key as written: "Sure," and "Sure." are spoken differently. Audio is
    kept only when its synthesis ran to the end (a caller that stops iterating early leaves
    nothing behind). Thread-safe: every call's TTS worker shares it."""

    def __init__(self, tts: TTS, max_words: int = 3, max_bytes: int = 16 << 20,
                 max_chars: int = 40) -> None:
        self.tts = tts
        self.max_words = max_words
        self.max_chars = max_chars
        self.max_bytes = max_bytes
        self.stats = PhraseCacheStats()
        self._lock = threading.Lock()
        self._audio: OrderedDict[str, tuple[np.ndarray, ...]] = OrderedDict()
        self._bytes = 0

    @property
    def sample_rate(self) -> int:
        return self.tts.sample_rate

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def cacheable(self, text: str) -> bool:
        return 0 < len(text) <= self.max_chars and len(text.split()) <= self.max_words

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        key = text.strip()
        if not self.cacheable(key):
            yield from self.tts.synthesize(text)
            return
        with self._lock:
            kept = self._audio.get(key)
            if kept is not None:
                self._audio.move_to_end(key)
                self.stats.hits += 1
            else:
                self.stats.misses += 1
        if kept is not None:
            yield from kept
            return
        chunks: list[np.ndarray] = []
        audio = self.tts.synthesize(text)
        try:
            for pcm in audio:
                chunks.append(pcm)
                yield pcm
        finally:
            close = getattr(audio, "close", None)  # a plain iterable has nothing to close
            if close is not None:
                close()
        self._keep(key, chunks)

    def _keep(self, key: str, chunks: list[np.ndarray]) -> None:
        frozen = []
        for pcm in chunks:
            pcm = np.array(pcm, dtype=np.int16)  # a copy the backend cannot reuse
            pcm.setflags(write=False)
            frozen.append(pcm)
        size = sum(p.nbytes for p in frozen)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._audio.pop(key, None)
            if old is not None:
                self._bytes -= sum(p.nbytes for p in old)
            self._audio[key] = tuple(frozen)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._audio.popitem(last=False)
                self._bytes -= sum(p.nbytes for p in dropped)
                self.stats.evicted += 1

    def warmup(self) -> None:
        self.tts.warmup()


def with_phrase_cache(tts: TTS, cfg: TTSConfig) -> TTS:
    """``tts`` behind a fresh, empty phrase cache as ``[tts] cache_words`` / ``cache_mb`` say,
    or ``tts`` itself where they turn it off (a cache already in front is replaced)."""
    if isinstance(tts, PhraseCache):
        tts = tts.tts
    if cfg.cache_words <= 0 or cfg.cache_mb <= 0:
        return tts
    return PhraseCache(tts, max_words=cfg.cache_words, max_bytes=cfg.cache_mb << 20)


__all__ = ["PhraseCache", "PhraseCacheStats", "with_phrase_cache"]
