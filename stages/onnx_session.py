"""The onnxruntime sessions of voxline's small CPU models (Silero VAD, Smart Turn, Piper, the
speaker embedders): each shares the cores with other models between calls, so its idle threads
must sleep, not spin."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_session(ort: Any, path: str | Path, threads: int) -> Any:
    """A CPU ``InferenceSession`` of ``path`` with ``threads`` intra-op threads (one inter-op)
    that sleep while they wait; ``threads`` 0 keeps onnxruntime's default pool (a thread per
    core, spinning). ``ort`` is the onnxruntime module its caller required."""
    opts = ort.SessionOptions()
    if threads > 0:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
