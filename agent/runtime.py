"""Process runtime: the event loop (uvloop when installed) and ``gc.freeze()`` after warm-up.

Freezing moves every object alive after warm-up (models, preallocated pools, imported modules)
into a permanent generation the cyclic collector no longer scans, which removes the multi-ms
pauses a full collection over that long-lived state would cause during a call.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Coroutine
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
    """Run ``main`` on a fresh event loop of the configured kind."""
    cfg = cfg or RuntimeConfig()
    if event_loop_name(cfg) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


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
