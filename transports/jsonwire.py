"""JSON as it comes off a socket: ``loads`` turns every way a hostile message can break the
standard parser into ``ValueError``, so a shell catches one exception for all of them.

``json.loads`` alone accepts ``NaN`` and ``Infinity`` (a number no field of ours can hold:
``int(float("inf"))`` raises ``OverflowError``), raises ``RecursionError`` on deep nesting
(``[[[[…`` a few thousand deep), and reads huge exponents as infinity.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def loads(text: str | bytes) -> Any:
    """Parse ``text``; any malformed, non-finite or too deeply nested document raises
    ``ValueError`` (``UnicodeDecodeError`` is one)."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
