"""The servers' heap trimmer: memory a thread's malloc arena freed goes back to the OS."""

import asyncio
import subprocess
import sys

from agent.config import RuntimeConfig
from agent.runtime import keep_heap_trimmed

# In a fresh interpreter (the test process's own heap has a history): what a model runtime's
# thread does — many small blocks in its own arena, freed, a few survivors scattered among
# them so the arena cannot shrink by itself — then the trimmer runs for half a second.
CHURN = r'''
import asyncio, threading
from agent.config import RuntimeConfig
from agent.runtime import keep_heap_trimmed

def rss():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024

def work():
    blocks = [bytearray(1024) for _ in range(120_000)]
    threading.current_thread().kept = blocks[::500]

async def main():
    t = threading.Thread(target=work)
    t.start()
    t.join()
    before = rss()
    task = keep_heap_trimmed(RuntimeConfig(heap_trim_s=0.1))
    await asyncio.sleep(0.5)
    names = [th.name for th in threading.enumerate()]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    print(round(before - rss(), 1), "heap-trim_0" in names, task.done())

asyncio.run(main())
'''


def test_the_trimmer_returns_freed_arena_memory_and_stops_when_cancelled():
    out = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    returned_mb, had_thread, stopped = float(out[0]), out[1] == "True", out[2] == "True"
    assert returned_mb > 30, out  # of the ~120 MB churned (measured: ~118 MB)
    assert had_thread and stopped


def test_off_it_starts_nothing():
    async def main():
        return keep_heap_trimmed(RuntimeConfig(heap_trim_s=0))

    assert asyncio.run(main()) is None


# Eight threads alive at once, each allocating (a thread takes an arena at its first malloc);
# then glibc's malloc_stats() names every arena on stderr ("Arena N:").
ARENAS = r'''
import ctypes, sys, threading
from agent.config import RuntimeConfig
from agent.runtime import limit_malloc_arenas

cap = limit_malloc_arenas(RuntimeConfig(malloc_arenas=int(sys.argv[1])))
ready, done = threading.Barrier(9), threading.Event()

def work():
    kept = [bytearray(4096) for _ in range(64)]
    ready.wait()
    done.wait()

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
print(cap, flush=True)
ctypes.CDLL("libc.so.6").malloc_stats()
done.set()
'''


def _arenas(setting: int, env: dict[str, str] | None = None) -> tuple[int, int]:
    import os

    proc = subprocess.run([sys.executable, "-c", ARENAS, str(setting)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[0]), proc.stderr.count("Arena ")


def test_the_arena_cap_holds_with_more_threads_than_it() -> None:
    cap, arenas = _arenas(2)
    assert cap == 2 and arenas == 2
    # glibc's own default: a thread that finds every arena busy makes a new one
    cap, arenas = _arenas(-1)
    assert cap == 0 and arenas > 2
    # $MALLOC_ARENA_MAX is the operator's: left as it is
    cap, arenas = _arenas(2, {"MALLOC_ARENA_MAX": "3"})
    assert cap == 0 and arenas <= 3


def test_the_default_cap_is_the_cores_this_process_may_use() -> None:
    import os

    from agent.runtime import malloc_arenas

    assert malloc_arenas(RuntimeConfig()) == max(2, len(os.sched_getaffinity(0)))
    assert malloc_arenas(RuntimeConfig(malloc_arenas=5)) == 5
    assert malloc_arenas(RuntimeConfig(malloc_arenas=-1)) == 0


def test_the_trimmer_frees_the_cycles_an_ended_call_leaves() -> None:
    """A session is a cycle (the pipeline's stages and the session point at each other):
    refcounting never frees it, and after gc.freeze() Python's own full collections are rare;
    the trimmer's collection frees it within one period."""
    import gc
    import weakref

    import numpy as np

    from agent.config import Config
    from agent.presets import new_echo_test_session

    async def main() -> tuple[bool, bool]:
        session = new_echo_test_session(Config())
        await session.start()
        session.send_audio(np.zeros(320, np.int16))
        await session.close()
        ref = weakref.ref(session)
        del session
        alone = ref() is not None  # refcounting alone did not free it: it is a cycle
        task = keep_heap_trimmed(RuntimeConfig(heap_trim_s=0.05))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return alone, ref() is None

    was_on = gc.isenabled()
    gc.disable()  # (the collector's own runs would free it too, whenever they came)
    try:
        alone, freed = asyncio.run(main())
    finally:
        if was_on:
            gc.enable()
    assert alone and freed
