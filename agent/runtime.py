"""Process runtime: the event loop (uvloop when installed) and ``gc.freeze()`` after warm-up.

Freezing moves every object alive after warm-up (models, preallocated pools, imported modules)
into a permanent generation the cyclic collector no longer scans, which removes the multi-ms
pauses a full collection over that long-lived state would cause during a call.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agent.config import RuntimeConfig

T = TypeVar("T")
log = logging.getLogger("voxline.runtime")


def event_loop_name(cfg: RuntimeConfig) -> str:
    if cfg.uvloop:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return "asyncio"
        return "uvloop"
    return "asyncio"


def run(main: Coroutine[Any, Any, T], cfg: RuntimeConfig | None = None) -> T:
    """Run ``main`` on a fresh event loop of the configured kind (the malloc arenas capped
    first: :func:`limit_malloc_arenas`)."""
    cfg = cfg or RuntimeConfig()
    limit_malloc_arenas(cfg)
    if event_loop_name(cfg) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def malloc_arenas(cfg: RuntimeConfig) -> int:
    """The arena cap ``[runtime] malloc_arenas`` asks for: 0 if none (glibc's default)."""
    if cfg.malloc_arenas < 0:
        return 0
    if cfg.malloc_arenas > 0:
        return cfg.malloc_arenas
    return max(2, len(os.sched_getaffinity(0)))


def limit_malloc_arenas(cfg: RuntimeConfig | None = None) -> int:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``) before the model runtimes start
    their threads: with glibc's default of 8 arenas a core, threads that come and go spread
    the heap over many arenas whose fragments no ``malloc_trim`` returns, and a server's RSS
    grows with the calls it served; as many arenas as cores keeps contention where it was
    (no more threads than cores run at once). Left alone where ``$MALLOC_ARENA_MAX`` is set
    (glibc read it) or the C library is not glibc. Returns the cap set (0: none)."""
    cfg = cfg or RuntimeConfig()
    arenas = malloc_arenas(cfg)
    if not arenas or os.environ.get("MALLOC_ARENA_MAX"):
        return 0
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return 0
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_ARENA_MAX, arenas) != 1:
        log.warning("mallopt(M_ARENA_MAX, %d) was refused: malloc arenas left as they are", arenas)
        return 0
    return arenas


_blas_limits: Any = None  # the threadpoolctl limiter in force, if any


def limit_blas_threads(cfg: RuntimeConfig | None = None) -> int:
    """Hold NumPy's BLAS to ``[runtime] blas_threads`` threads (0: undo, its own default) through
    threadpoolctl; again with another setting replaces the last. Returns the limit now in force
    (0: none; also where threadpoolctl, in the ``embedded`` extra, is not installed)."""
    global _blas_limits
    cfg = cfg or RuntimeConfig()
    try:
        import threadpoolctl
    except ImportError:
        return 0
    if _blas_limits is not None:
        _blas_limits.restore_original_limits()
        _blas_limits = None
    if cfg.blas_threads <= 0:
        return 0
    _blas_limits = threadpoolctl.threadpool_limits(limits=cfg.blas_threads, user_api="blas")
    return cfg.blas_threads


def blas_threads_in_force() -> int | None:
    """The threads NumPy's BLAS uses now, read back through threadpoolctl (the most of its
    libraries' where it loaded several); None where threadpoolctl is not installed or no BLAS
    is loaded."""
    try:
        import threadpoolctl
    except ImportError:
        return None
    counts = [d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"]
    return max(counts) if counts else None


def keep_heap_trimmed(cfg: RuntimeConfig | None = None) -> asyncio.Task[None] | None:
    """In a long-running server: every ``heap_trim_s``, a full collection of the cyclic
    garbage on the loop, then glibc's ``malloc_trim(0)`` on a thread of its own, returning the
    free pages of every malloc arena to the OS. Returns the task (cancel it to stop).

    The collection: a call's session is a web of references (stages and pipeline, the session
    and its playout) that only the cyclic collector frees, and after ``gc.freeze()`` Python
    runs a full collection only once the heap has grown by a quarter: the ended calls' memory
    (their audio buffers, and the native state of their echo cancellers and resamplers) piled
    up between those — a SIP server in the soak swung by 80 MB. The collection pauses the loop
    for what it finds: 40 ms of CPU for 30 s of a soak's short calls ending 7.6 a second, far
    less where calls last minutes. The calls' largest native state, the echo cancellers', is
    released at the end of each call anyway (``EchoCanceller.close``).

    The trim: without it RSS grows with the calls served though no object outlives its call
    (the model runtimes' threads each allocate in their own arena, and glibc returns only the
    main arena's top by itself). Skipped where the C library is not glibc."""
    cfg = cfg or RuntimeConfig()
    if cfg.heap_trim_s <= 0:
        return None
    trim = malloc_trimmer()
    pool = ThreadPoolExecutor(1, thread_name_prefix="heap-trim")

    async def every() -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:  # (the first at once: the thread exists from start-up on)
                t, cpu = time.perf_counter(), time.thread_time()
                found = gc.collect()
                ms, cpu_ms = 1000 * (time.perf_counter() - t), 1000 * (time.thread_time() - cpu)
                (log.warning if cpu_ms > SLOW_COLLECT_MS else log.debug)(
                    "gc.collect(): %d objects in %.1f ms (%.1f ms of CPU)", found, ms, cpu_ms)
                if trim is not None:
                    await loop.run_in_executor(pool, trim)
                await asyncio.sleep(cfg.heap_trim_s)
        finally:
            pool.shutdown(wait=False)

    task = asyncio.get_running_loop().create_task(every(), name="heap-trim")
    _KEPT.add(task)  # (the loop holds tasks weakly)
    task.add_done_callback(_KEPT.discard)
    return task


def malloc_trimmer() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, returning the free pages of every malloc arena to the OS;
    None where the C library is not glibc (musl, macOS)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


SLOW_COLLECT_MS = 20.0  # a full collection that takes this much CPU is logged as a warning


_KEPT: set[asyncio.Task[None]] = set()


def lower_thread_priority(by: int) -> bool:
    """Make the calling thread ``by`` steps nicer than it is (Linux keeps a niceness per
    thread; threads it starts inherit it), so that on busy cores the threads left as they were
    go first. True when it took; False where threads have no niceness of their own (not
    Linux), for ``by`` <= 0, or when the system refused."""
    if by <= 0 or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError as exc:
        log.warning("could not lower thread %s's priority: %s", threading.current_thread().name, exc)
        return False
    return True


def freeze_after_warmup(cfg: RuntimeConfig | None = None) -> int:
    """Collect once, then freeze what survives. Returns the number of frozen objects."""
    cfg = cfg or RuntimeConfig()
    if not cfg.gc_freeze:
        return 0
    gc.collect()
    gc.freeze()
    n = gc.get_freeze_count()
    log.debug("gc.freeze(): %d objects frozen", n)
    return n
