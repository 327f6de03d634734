"""An agent whose words can be read back from its audio: a scripted LLM (a fixed reply) and a
TTS that speaks each character as its own block of samples, so a test knows which characters
of which text left the transport without trusting the playout's own bookkeeping."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import numpy as np

from stages.llm.chat import LLMCapabilities

SPC = 400  # samples per character (25 ms)
BASE = 1_000  # a character's sample value is BASE + its code
MARK = "…"
REPLY = ("Sure, I can help with that. The table for four is free at seven tonight. "
         "Shall I book it for you now?")


class CharTTS:
    """Speaks each character as SPC samples of BASE + its code point."""

    sample_rate = 16_000

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        for i in range(0, len(text), 8):
            yield np.concatenate([np.full(SPC, BASE + ord(c), np.int16) for c in text[i:i + 8]])

    def warmup(self) -> None:
        pass


class ScriptedLLM:
    """Streams REPLY word by word (``delay_s`` between words); records every request."""

    capabilities = LLMCapabilities()

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.requests: list[list[dict[str, Any]]] = []

    async def stream(self, messages: list[dict[str, Any]]) -> AsyncGenerator[str, None]:
        self.requests.append([dict(m) for m in messages])
        for i, word in enumerate(REPLY.split(" ")):
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield word if i == 0 else " " + word

    def prefill(self, messages: list[dict[str, Any]]) -> asyncio.Future[None]:
        raise AssertionError("no prefill")

    def warmup(self) -> None:
        pass


def decode(pulled: list[np.ndarray]) -> str:
    """The characters whose every sample left the transport."""
    audio = np.concatenate(pulled) if pulled else np.zeros(0, np.int16)
    audio = audio[audio != 0]  # (the padding of the last frame of an utterance)
    whole = len(audio) // SPC * SPC
    blocks = audio[:whole].reshape(-1, SPC)
    assert (blocks == blocks[:, :1]).all(), "a character's block was split or mixed"
    return "".join(chr(int(v) - BASE) for v in blocks[:, 0])


def heard_words(chunks: list[str], played: str) -> str:
    """What the caller heard of a message spoken as ``chunks``, given the characters that
    played: each chunk's fully played words, joined."""
    out: list[str] = []
    for chunk in chunks:
        part, played = played[: len(chunk)], played[len(chunk):]
        words = [m.group() for m in re.finditer(r"\S+", chunk) if m.end() <= len(part)]
        out.extend(words)
        if len(part) < len(chunk):
            break
    return " ".join(out)
