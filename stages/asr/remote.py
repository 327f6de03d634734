"""An ASR backend that is a client of ``voxline asr-serve``: a voice pipeline uses it like any
backend and shares one out-of-process engine with every other process on the machine.

The socket path is ``ASRConfig.model`` (``--asr-backend remote --asr-model /path/to.sock``),
else ``$VOXLINE_ASR_SOCKET``, else :func:`stages.asr.local_socket.default_path` (the private
per-user directory ``voxline asr-serve`` listens in by default). Audio goes only to a server run
by this user (or root, or ``$VOXLINE_ASR_SERVER_USER``): the socket's owner and the serving
process's credentials are checked on every connect.

When asr-serve goes away (killed, restarted) the requests it had not answered are sent again
once it is back — reconnecting with backoff for up to ``reconnect_s`` — and only then fail, so a
turn in flight is transcribed late rather than lost; a turn that still cannot be transcribed
fails with :class:`RemoteASRError` (the pipeline reports it as an error event). A request the
server refuses for want of room (its slots, or the streams one connection may hold) is sent again
the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from agent.audio import float_to_int16
from agent.config import ASRConfig
from agent.errors import VoxlineError
from stages.asr import local_socket, wire
from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis

log = logging.getLogger("voxline.asr.remote")

SHM_ABOVE_S = 30.0  # buffers longer than this go through shared memory instead of the socket
# Calls in flight at once (the engine's lanes). The server batches every client's streams
# itself, so a call here costs a waiting thread and no CPU; with one lane a final waited out
# the round trip of a batch of partials ahead of it and two batching windows stacked. Four
# lets a final overtake the partials of a few windows while the requests of one process still
# reach the server together, where they share its batches.
DEFAULT_LANES = 4
# finals with words and not one sentence end among them: the server's backend cannot tell it
# (Whisper leaves one out only where its decoding stopped at the last word)
UNTOLD_AFTER = 5
RECONNECT_S = 15.0  # how long a request waits for a lost asr-serve to come back
BACKOFF_FIRST_S = 0.05  # the first reconnect waits this long, each next one twice as long...
BACKOFF_MAX_S = 1.0  # ...up to this


class RemoteASRError(VoxlineError):
    """asr-serve is unreachable or refused a request."""


class _Again(RemoteASRError):
    """The request is worth sending again shortly: the server's limits refused it for now
    (its slots, or this connection's share), or the connection went with it unanswered."""


class _ConnectionLost(_Again):
    """The connection went (or could not be made) with the request unanswered."""


class RemoteASRBackend:
    """The ASRBackend protocol over one persistent Unix-socket connection to asr-serve.

    ``transcribe_batch`` sends every buffer as its own stream (OPEN without partials, AUDIO,
    END) in one write and waits for the finals, so the server batches them with everybody
    else's work. With ``cfg.sentence_ends`` each stream asks for the model's P(a sentence ends)
    (``{"end_p": true}``), which a Whisper server then tells (:attr:`Hypothesis.end_p`); a
    server whose backend cannot leaves it None, and an older server that refuses the option
    gets the request again without it — either said once in the log. Thread-safe: any number
    of worker threads may call it at once; writes are serialised by a lock and a reader thread
    hands each FINAL to the caller waiting for it. A broken connection is re-opened, and the
    requests it lost are sent again (see the module).
    """

    name = "remote"
    sample_rate = wire.SAMPLE_RATE

    def __init__(self, cfg: ASRConfig, socket_path: str | None = None, max_batch: int = 64,
                 timeout_s: float = 60.0, lanes: int | None = None,
                 reconnect_s: float = RECONNECT_S) -> None:
        """``lanes``: calls in flight at once; default ``cfg.workers``, else
        :data:`DEFAULT_LANES`. ``timeout_s``: the longest wait for one answer from a live
        server; ``reconnect_s``: the longest wait for a lost server to come back."""
        self.cfg = cfg
        self.path = (socket_path or cfg.model or os.environ.get("VOXLINE_ASR_SOCKET")
                     or local_socket.default_path())
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
            sentence_ends=True,  # asked of the server (which tells it where its backend can)
        )
        self.timeout_s = timeout_s
        self.reconnect_s = reconnect_s
        self.reconnects = 0  # connections re-opened after one was lost
        self.resent = 0  # requests sent again (their connection was lost, or no room for them)
        self._lock = threading.Lock()  # guards the socket, the stream counter and the waiters
        self._sock: socket.socket | None = None
        self._waiters: dict[int, Future[Hypothesis]] = {}
        self._next = 0
        self._connections = 0
        self._open = {"partials": False}
        self.sentence_ends = False
        if cfg.sentence_ends:
            self.tell_sentence_ends()
        self._worded = self._told = 0  # finals with words; of them, those with the end told

    # --- the backend interface ---------------------------------------------------------------
    @property
    def max_batch(self) -> int:
        return self.capabilities.max_batch

    def transcribe_batch(
        self, audio: Sequence[np.ndarray], prompts: Sequence[str] | None = None
    ) -> list[Hypothesis]:
        """One hypothesis per float32 buffer, in order (prompts are not sent: the server keeps
        no per-request prompt). Requests a lost connection took with it, or the server refused
        for want of room, are sent again (backoff, for up to ``reconnect_s``)."""
        pcms = [_to_pcm16(buf) for buf in audio]
        out: list[Hypothesis | None] = [None] * len(pcms)
        deadline = time.monotonic() + self.reconnect_s
        delay = BACKOFF_FIRST_S
        while True:
            todo = [i for i, h in enumerate(out) if h is None]
            again: _Again | None = None
            for i, got in zip(todo, self._round([pcms[i] for i in todo]), strict=True):
                if isinstance(got, _Again):
                    again = got
                else:
                    out[i] = got
            if again is None:
                return [h for h in out if h is not None]
            if time.monotonic() + delay > deadline:
                raise RemoteASRError(f"{again} — still so after {self.reconnect_s:.0f} s") from None
            time.sleep(delay)
            delay = min(2 * delay, BACKOFF_MAX_S)
            self.resent += sum(h is None for h in out)

    def _round(self, pcms: list[np.ndarray]) -> list[Hypothesis | _Again]:
        """Send each buffer as a stream on the current connection and wait for the answers; a
        request to send again comes back as its :class:`_Again`."""
        futures: list[Future[Hypothesis]] = []
        shms = []
        try:
            with self._lock:
                try:
                    sock = self._connected()
                except _ConnectionLost as exc:
                    return [exc] * len(pcms)
                frames = []
                for pcm in pcms:
                    sid = self._stream_id()
                    fut: Future[Hypothesis] = Future()
                    self._waiters[sid] = fut
                    futures.append(fut)
                    if len(pcm) > SHM_ABOVE_S * self.sample_rate:
                        shm = _share(pcm)
                        shms.append(shm)
                        frames.append(wire.encode_shm(sid, shm.name, pcm.nbytes, len(pcm)))
                    else:
                        frames.append(wire.encode_open(sid, self._open))
                        frames.extend(wire.encode_audio_chunks(sid, pcm.tobytes()))
                        frames.append(wire.encode_end(sid))
                try:
                    sock.sendall(b"".join(frames))
                except OSError as exc:
                    self._broken(exc.strerror or exc)
            return [self._wait(f) for f in futures]
        finally:
            for shm in shms:
                shm.close()
                shm.unlink()

    def tell_sentence_ends(self) -> None:
        """Ask the server for the sentence end on every request from now on (it tells it where
        its backend can; see the class)."""
        self._open = {"partials": False, "end_p": True}
        self.sentence_ends = True

    def warmup(self) -> None:
        """Connect now, so a missing server is reported at start-up rather than mid-call."""
        with self._lock:
            try:
                self._connected()
            except _ConnectionLost as exc:
                raise RemoteASRError(str(exc)) from None

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
        """The connection, opened if need be (raises _ConnectionLost when asr-serve is not
        there, RemoteASRError when what is there is not this user's)."""
        if self._sock is not None:
            return self._sock
        try:
            trusted = local_socket.trusted_uids()
            local_socket.check_socket_file(self.path, trusted)
        except local_socket.SocketTrustError as exc:
            raise RemoteASRError(str(exc)) from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise _ConnectionLost(
                f"cannot reach asr-serve at {self.path} ({exc.strerror or exc}) — start it with "
                f"`voxline asr-serve --socket {self.path}`, or pass --asr-model SOCKET"
            ) from None
        try:
            local_socket.check_server(sock, self.path, trusted)
        except local_socket.SocketTrustError as exc:
            sock.close()
            raise RemoteASRError(str(exc)) from None
        if self._connections:
            self.reconnects += 1
        self._connections += 1
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
                with self._lock:
                    if self._sock is sock:
                        if decoder.error is not None:
                            self._broken(f"its answer broke the protocol: {decoder.error}", again=False)
                        else:
                            self._broken("asr-serve closed the connection")
                sock.close()
                return

    def _deliver(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Partial):
            return
        with self._lock:
            if isinstance(msg, wire.Error) and msg.stream == 0:
                self._broken(msg.message, again=False)  # it refused the connection itself
                return
            fut = self._waiters.pop(msg.stream, None)
        if fut is None:
            return
        if isinstance(msg, wire.Final):
            if self.sentence_ends and msg.text:
                self._worded += 1
                self._told += msg.end_p is not None
                if self._worded == UNTOLD_AFTER and not self._told:
                    log.warning("asr-serve at %s tells no sentence end (its backend cannot): "
                                "turns are judged without the ASR's end", self.path)
            fut.set_result(Hypothesis(msg.text, end_p=msg.end_p))
        elif (isinstance(msg, wire.Error) and msg.code is wire.ErrorCode.BAD_REQUEST
              and "'end_p'" in msg.message and "end_p" in self._open):
            self._open = {"partials": False}  # a server from before the option: ask no more
            self.sentence_ends = False
            log.warning("asr-serve at %s does not know the sentence-end option (an older "
                        "server): turns are judged without the ASR's end", self.path)
            fut.set_exception(_Again("asr-serve refused the sentence-end option"))
        elif isinstance(msg, wire.Error):
            error = _Again if msg.code in (wire.ErrorCode.CAPACITY, wire.ErrorCode.LIMIT) else RemoteASRError
            fut.set_exception(error(f"asr-serve refused the request: {msg.message}"))

    def _broken(self, why: object, again: bool = True) -> None:
        """Fail every waiting request — to be sent again (``again``), or for good; the next
        call reconnects. Called with the lock held."""
        if self._sock is not None:
            with contextlib.suppress(OSError):  # already gone
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock = None
        waiters, self._waiters = self._waiters, {}
        error = _ConnectionLost if again else RemoteASRError
        for fut in waiters.values():
            if not fut.done():
                fut.set_exception(error(f"lost the connection to asr-serve at {self.path}: {why}"))

    def _wait(self, fut: Future[Hypothesis]) -> Hypothesis | _Again:
        try:
            return fut.result(timeout=self.timeout_s)
        except _Again as exc:
            return exc
        except FutureTimeout:
            raise RemoteASRError(f"asr-serve at {self.path} gave no result within {self.timeout_s:.0f} s") from None


def _to_pcm16(buf: np.ndarray) -> np.ndarray:
    x = np.asarray(buf)
    if x.dtype == np.int16:
        return x.astype("<i2", copy=False)
    return float_to_int16(x).astype("<i2", copy=False)


def _share(pcm: np.ndarray):  # noqa: ANN202 — a multiprocessing SharedMemory
    """A new segment holding ``pcm``, named as asr-serve takes them: this process's pid and a
    random tag (:func:`stages.asr.wire.shm_name`); mode 0600, as SharedMemory makes them."""
    from multiprocessing import shared_memory

    name = wire.shm_name(os.getpid(), secrets.token_hex(8))
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(1, pcm.nbytes))
    np.ndarray(len(pcm), dtype="<i2", buffer=shm.buf)[:] = pcm
    return shm
