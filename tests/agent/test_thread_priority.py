"""lower_thread_priority: the calling thread gets nicer, the process's other threads do not."""

import os
import sys
import threading

import pytest

from agent.runtime import lower_thread_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="a niceness per thread is Linux's")


def niceness(tid: int | None = None) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid or threading.get_native_id())


def in_thread(by: int) -> tuple[bool, int]:
    seen: list[tuple[bool, int]] = []
    t = threading.Thread(target=lambda: seen.append((lower_thread_priority(by), niceness())))
    t.start()
    t.join()
    return seen[0]


def test_only_the_calling_thread_gets_nicer() -> None:
    base = niceness()
    if base > 14:
        pytest.skip(f"the test process already runs at niceness {base}")
    assert in_thread(5) == (True, base + 5)
    assert niceness() == base


def test_nothing_changes_for_zero_or_less() -> None:
    base = niceness()
    assert in_thread(0) == (False, base)
    assert in_thread(-3) == (False, base)  # never raises a thread's priority
