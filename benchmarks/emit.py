"""How every benchmark ends: one JSON line on stdout, and the whole result in ``--json-out``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], json_out: str | None, line: dict[str, Any] | None = None) -> None:
    """Print ``line`` (default: the result) as one JSON line; write the result to ``json_out``."""
    print(json.dumps(result if line is None else line))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2))
