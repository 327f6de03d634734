"""End of turn from the audio: the Smart Turn v3.2 ONNX model (shipped in the ``pipecat-ai`` wheel,
never imported) and :class:`TurnScorer`, which batches every call's "has the caller finished?"
questions into one model run on a worker thread."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.audio import FROM_INT16
from agent.config import TurnConfig
from agent.errors import ModelNotFoundError, require
from agent.runtime import lower_thread_priority
from stages.onnx_session import cpu_session

log = logging.getLogger("voxline.smart_turn")

SAMPLE_RATE = 16_000
WINDOW_SAMPLES = 8 * SAMPLE_RATE  # the model hears the last 8 s of the turn
MEL_BINS = 80
FRAMES = 800  # 10-ms log-mel frames in the 8-s window
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
INSTALL = "pip install --no-deps pipecat-ai"
# The model was trained on Whisper features of a waveform scaled to zero mean and unit variance
# over the whole (front-padded) 8-s window; this epsilon keeps an all-silent window finite.
NORM_EPS = 1e-7


def smart_turn_model_path() -> Path:
    """The Smart Turn v3.2 ONNX file inside the installed ``pipecat-ai`` package.

    Located with ``find_spec`` only: pipecat's ``__init__`` pulls dependencies voxline does not
    install, and the wheel is installed without them.
    """
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the Smart Turn v3.2 model is not installed (it ships in the pipecat-ai wheel) — "
            f"install it with `{INSTALL}`; voxline never imports pipecat, so none of its "
            "dependencies are needed"
        )
    folders = list(spec.submodule_search_locations)
    for folder in folders:
        path = Path(folder) / "audio" / "turn" / "smart_turn" / "data" / MODEL_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"{MODEL_FILE} not found in the pipecat-ai package at {', '.join(folders)} — reinstall "
        f"it with `{INSTALL} --force-reinstall` (a 1.x wheel carries the model), or pass the "
        "model file's path"
    )


class SmartTurnModel:
    """Smart Turn v3.2 on onnxruntime: 16-kHz mono audio in, P(turn complete) out.

    :meth:`features` is safe from several threads (a lock guards its window buffer); ONNX runs
    are thread-safe in onnxruntime.
    """

    def __init__(self, path: str | Path | None = None, threads: int = 1) -> None:
        ort = require("onnxruntime", what="Smart Turn", extra="embedded")
        mel = require("faster_whisper.feature_extractor", what="Smart Turn", extra="embedded",
                      package="faster-whisper")
        model_path = Path(path) if path else smart_turn_model_path()
        if not model_path.is_file():
            raise ModelNotFoundError(
                f"Smart Turn model file not found: {model_path} — pass the path of "
                f"{MODEL_FILE}, or install the model with `{INSTALL}`"
            )
        self.path = model_path
        # A call every few hundred ms per caller: spinning threads would burn a core between them.
        self._session: Any = cpu_session(ort, model_path, max(1, threads))
        self._mel = mel.FeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE)
        self._window = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
        self._lock = threading.Lock()

    def features(self, pcm: np.ndarray) -> np.ndarray:
        """The model's input for ``pcm`` (int16 or float mono 16 kHz, any length): the last 8 s,
        zero-padded at the front, as float32 log-mel ``[80, 800]``."""
        _check_mono(pcm)
        n = min(len(pcm), WINDOW_SAMPLES)
        tail = pcm[len(pcm) - n:]
        with self._lock:
            x = self._window
            x[: WINDOW_SAMPLES - n] = 0.0
            if pcm.dtype == np.int16:
                np.multiply(tail, FROM_INT16, out=x[WINDOW_SAMPLES - n:], casting="unsafe")
            else:
                x[WINDOW_SAMPLES - n:] = tail
            x -= x.mean()
            x /= np.sqrt(x.var() + NORM_EPS)
            # padding=0: the extractor's default 160 extra samples would make 801 frames.
            feats = self._mel(x, padding=0)
        return np.asarray(feats, dtype=np.float32)

    def score_batch(self, feats: np.ndarray) -> np.ndarray:
        """P(turn complete) for each of ``feats`` ``[B, 80, 800]``, as float32 ``[B]``."""
        feats = np.ascontiguousarray(feats, dtype=np.float32)
        if feats.ndim != 3 or feats.shape[1:] != (MEL_BINS, FRAMES):
            raise ValueError(f"Smart Turn features must be [B, {MEL_BINS}, {FRAMES}], "
                             f"got {list(feats.shape)}")
        if not len(feats):
            return np.zeros(0, dtype=np.float32)
        (probs,) = self._session.run(["logits"], {"input_features": feats})
        return np.asarray(probs, dtype=np.float32).reshape(len(feats))  # already a sigmoid

    def score(self, pcm: np.ndarray) -> float:
        """P(turn complete) for one caller's audio up to now."""
        return float(self.score_batch(self.features(pcm)[None])[0])

    def warmup(self) -> None:
        """One run on silence, so the first real question does not pay onnxruntime's set-up."""
        self.score_batch(np.full((1, MEL_BINS, FRAMES), -1.5, dtype=np.float32))


def _check_mono(pcm: np.ndarray) -> None:
    if np.ndim(pcm) != 1:
        raise ValueError(f"Smart Turn takes mono audio as a 1-D array, got shape {np.shape(pcm)}")


@dataclass(slots=True)
class TurnScorerStats:
    batches: int = 0
    requests: int = 0
    largest_batch: int = 0


@dataclass(slots=True, eq=False)
class _Request:
    pcm: np.ndarray
    enqueued_ns: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[float]
    cancelled: bool = False  # set on the caller's loop; the worker skips it if not yet taken


class TurnScorer:
    """One per process, shared by every call: :meth:`predict` requests that arrive within
    ``window_ms`` of the oldest waiting one (up to ``max_batch``) go to the model as one batch,
    features and ONNX run on one worker thread, never on an event loop.

    Measured on one CPU thread, this int8 model's batch costs about the sum of its parts (~45 ms
    a request at B = 1, 4 and 16), so there batching saves only per-call overhead while a
    batch's first request waits for its last; it pays where a batch is cheaper per request.
    """

    def __init__(
        self, model: SmartTurnModel | None = None, window_ms: float = 5.0, max_batch: int = 16,
        warmed: bool = False, nice: int = 0,
    ) -> None:
        self.model = model if model is not None else SmartTurnModel()
        self.nice = nice  # the worker thread runs this much nicer (lower_thread_priority)
        self._warmed = warmed  # else the worker warms the model up first
        self.window_ns = int(window_ms * 1e6)
        self.max_batch = max(1, max_batch)
        self.stats = TurnScorerStats()
        self._feats = np.empty((self.max_batch, MEL_BINS, FRAMES), dtype=np.float32)
        self._queue: deque[_Request] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="smart-turn", daemon=True)
        self._thread.start()
        # the worker must not be inside onnxruntime when the interpreter exits (an abort)
        atexit.register(self.close)

    async def predict(self, pcm: np.ndarray) -> float:
        """P(turn complete) for ``pcm`` (int16 or float mono 16 kHz, the turn so far). The audio
        is copied before this returns control, so the caller may reuse its buffer."""
        _check_mono(pcm)
        audio = pcm[-WINDOW_SAMPLES:].copy()  # only the last 8 s are heard
        loop = asyncio.get_running_loop()
        req = _Request(audio, time.monotonic_ns(), loop, loop.create_future())
        with self._cv:
            if self._closed:
                raise RuntimeError("the turn scorer is closed")
            self._queue.append(req)
            # The worker needs waking only to start a window or to end one early when full.
            if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
                self._cv.notify()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True
            raise

    def close(self) -> None:
        """Stop the worker; requests still waiting fail with RuntimeError."""
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for r in pending:
            _deliver(r, _fail, RuntimeError("the turn scorer was closed"))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _gather(self) -> list[_Request] | None:
        with self._cv:
            while True:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return None
                deadline = self._queue[0].enqueued_ns + self.window_ns
                while len(self._queue) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic_ns()
                    if left <= 0:
                        break
                    self._cv.wait(left / 1e9)
                batch: list[_Request] = []
                while self._queue and len(batch) < self.max_batch:
                    r = self._queue.popleft()
                    if not r.cancelled:
                        batch.append(r)
                if batch:
                    return batch  # (all cancelled: wait again; a close is seen at the top)

    def _work(self) -> None:
        lower_thread_priority(self.nice)
        try:
            if not self._warmed:
                self.model.warmup()
        except Exception:  # a broken model fails each request below, with its own error
            log.exception("Smart Turn warm-up failed")
        while (batch := self._gather()) is not None:
            n = len(batch)
            feats = self._feats[:n]
            try:
                for i, r in enumerate(batch):
                    feats[i] = self.model.features(r.pcm)
                probs = self.model.score_batch(feats)
            except Exception as exc:  # a failing batch fails its requests, not the scorer
                log.exception("Smart Turn failed on a batch of %d", n)
                for r in batch:
                    _deliver(r, _fail, exc)
                continue
            with self._cv:
                st = self.stats
                st.batches += 1
                st.requests += n
                st.largest_batch = max(st.largest_batch, n)
            for r, p in zip(batch, probs.tolist(), strict=True):
                _deliver(r, _resolve, p)


def _deliver(r: _Request, how: Any, value: object) -> None:
    with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody waits
        r.loop.call_soon_threadsafe(how, r.future, value)


def _resolve(fut: asyncio.Future[float], value: float) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[float], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def load_turn_scorer(cfg: TurnConfig) -> TurnScorer:
    """The process's turn model for semantic endpointing, warmed up (blocking: call it while
    models load). ``cfg.max_batch`` bounds a batch: 1 by default, because on a CPU a batch
    costs what its requests cost one by one, and a caller should not wait for another's."""
    model = SmartTurnModel(cfg.model or None, threads=cfg.threads)
    # Warmed here, not on the worker: a process that exits while a thread is inside
    # onnxruntime aborts ("terminate called without an active exception").
    model.warmup()
    return TurnScorer(model, max_batch=cfg.max_batch, warmed=True, nice=cfg.model_nice)
