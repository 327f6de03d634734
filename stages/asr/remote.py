"""An ASR backend that is a client of ``voxline asr-serve``: a voice pipeline uses it like any
backend and shares one out-of-process engine with every other process on the machine.

The socket path is ``ASRConfig.model`` (``--asr-backend remote --asr-model /path/to.sock``),
else ``$VOXLINE_ASR_SOCKET``, else :data:`stages.asr.wire.DEFAULT_SOCKET`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from agent.audio import float_to_int16
from agent.config import ASRConfig
from agent.errors import VoxlineError
from stages.asr import wire
from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis

SHM_ABOVE_S = 30.0  # buffers longer than this go through shared memory instead of the socket
# Calls in flight at once (the engine's lanes). The server batches every client's streams
# itself, so a call here costs a waiting thread and no CPU; with one lane a final waited out
# the round trip of a batch of partials ahead of it and two batching windows stacked. Four
# lets a final overtake the partials of a few windows while the requests of one process still
# reach the server together, where they share its batches.
DEFAULT_LANES = 4


class RemoteASRError(VoxlineError):
    """asr-serve is unreachable or refused a request."""


class RemoteASRBackend:
    """The ASRBackend protocol over one persistent Unix-socket connection to asr-serve.

    ``transcribe_batch`` sends every buffer as its own stream (OPEN without partials, AUDIO,
    END) in one write and waits for the finals, so the server batches them with everybody
    else's work. Thread-safe: any number of worker threads may call it at once; writes are
    serialised by a lock and a reader thread hands each FINAL to the caller waiting for it.
    A broken connection is re-opened on the next call.
    """

    name = "remote"
    sample_rate = wire.SAMPLE_RATE

    def __init__(self, cfg: ASRConfig, socket_path: str | None = None, max_batch: int = 64,
                 timeout_s: float = 60.0, lanes: int | None = None) -> None:
        """``lanes``: calls in flight at once; default ``cfg.workers``, else
        :data:`DEFAULT_LANES`."""
        self.cfg = cfg
        self.path = socket_path or cfg.model or os.environ.get("VOXLINE_ASR_SOCKET") or wire.DEFAULT_SOCKET
        self.capabilities = ASRCapabilities(
            sample_rate=wire.SAMPLE_RATE,
            max_batch=max_batch,
            lanes=lanes or cfg.workers or DEFAULT_LANES,
            # Every buffer becomes a stream of its own on the server, and a call returns when
            # its slowest buffer does: a bigger batch here saves nothing and only makes a final
            # wait for partials, so it is declared linear (finals then go alone).
            batch_cost=BatchCost.LINEAR,
            prompts=False,  # the wire protocol carries no per-request prompt
            word_times=False,  # a FINAL carries text only
        )
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # guards the socket, the stream counter and the waiters
        self._sock: socket.socket | None = None
        self._waiters: dict[int, Future[Hypothesis]] = {}
        self._next = 0

    # --- the backend interface ---------------------------------------------------------------
    @property
    def max_batch(self) -> int:
        return self.capabilities.max_batch

    def transcribe_batch(
        self, audio: Sequence[np.ndarray], prompts: Sequence[str] | None = None
    ) -> list[Hypothesis]:
        """One hypothesis per float32 buffer, in order (prompts are not sent: the server keeps
        no per-request prompt)."""
        futures: list[Future[Hypothesis]] = []
        shms = []
        try:
            with self._lock:
                sock = self._connected()
                frames = []
                for buf in audio:
                    sid = self._stream_id()
                    fut: Future[Hypothesis] = Future()
                    self._waiters[sid] = fut
                    futures.append(fut)
                    pcm = _to_pcm16(buf)
                    if len(pcm) > SHM_ABOVE_S * self.sample_rate:
                        shm = _share(pcm)
                        shms.append(shm)
                        frames.append(wire.encode_shm(sid, shm.name, pcm.nbytes, len(pcm)))
                    else:
                        frames.append(wire.encode_open(sid, {"partials": False}))
                        frames.extend(wire.encode_audio_chunks(sid, pcm.tobytes()))
                        frames.append(wire.encode_end(sid))
                try:
                    sock.sendall(b"".join(frames))
                except OSError as exc:
                    self._broken(exc)
            return [self._wait(f) for f in futures]
        finally:
            for shm in shms:
                shm.close()
                shm.unlink()

    def warmup(self) -> None:
        """Connect now, so a missing server is reported at start-up rather than mid-call."""
        with self._lock:
            self._connected()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    # --- internals ----------------------------------------------------------------------------
    def _stream_id(self) -> int:
        self._next = self._next % 0xFFFF_FFFE + 1  # 1 .. 2^32-1; 0 is the connection
        return self._next

    def _connected(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise RemoteASRError(
                f"cannot reach asr-serve at {self.path} ({exc.strerror or exc}) — start it with "
                f"`voxline asr-serve --socket {self.path}`, or pass --asr-model SOCKET"
            ) from None
        self._sock = sock
        threading.Thread(target=self._read, args=(sock,), name="asr-remote-reader", daemon=True).start()
        return sock

    def _read(self, sock: socket.socket) -> None:
        decoder = wire.Decoder()
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            msgs = decoder.feed(data) if data else []
            for msg in msgs:
                self._deliver(msg)
            if not data or decoder.error is not None:
                why = decoder.error or "asr-serve closed the connection"
                with self._lock:
                    if self._sock is sock:
                        self._broken(why)
                sock.close()
                return

    def _deliver(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Partial):
            return
        with self._lock:
            if isinstance(msg, wire.Error) and msg.stream == 0:
                self._broken(msg.message)
                return
            fut = self._waiters.pop(msg.stream, None)
        if fut is None:
            return
        if isinstance(msg, wire.Final):
            fut.set_result(Hypothesis(msg.text))
        elif isinstance(msg, wire.Error):
            fut.set_exception(RemoteASRError(f"asr-serve refused the request: {msg.message}"))

    def _broken(self, why: object) -> None:
        """Fail every waiting caller; the next call reconnects. Called with the lock held."""
        if self._sock is not None:
            with contextlib.suppress(OSError):  # already gone
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock = None
        waiters, self._waiters = self._waiters, {}
        for fut in waiters.values():
            if not fut.done():
                fut.set_exception(RemoteASRError(f"lost the connection to asr-serve at {self.path}: {why}"))

    def _wait(self, fut: Future[Hypothesis]) -> Hypothesis:
        try:
            return fut.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise RemoteASRError(f"asr-serve at {self.path} gave no result within {self.timeout_s:.0f} s") from None


def _to_pcm16(buf: np.ndarray) -> np.ndarray:
    x = np.asarray(buf)
    if x.dtype == np.int16:
        return x.astype("<i2", copy=False)
    return float_to_int16(x).astype("<i2", copy=False)


def _share(pcm: np.ndarray):  # noqa: ANN202 — a multiprocessing SharedMemory
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=max(1, pcm.nbytes))
    np.ndarray(len(pcm), dtype="<i2", buffer=shm.buf)[:] = pcm
    return shm
