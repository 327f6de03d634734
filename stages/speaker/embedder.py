"""Speaker embeddings of audio windows: our numpy front end, then the network on onnxruntime.

:func:`load_embedder` takes ``"campplus"`` (the default; 192 dims), ``"ge2e"`` (256 dims) or
the path of a ``.onnx`` file whose input is [batch, frames, 80] Kaldi fbank (a CAM++-style
export) or [batch, frames, 40] mel power (a GE2E-style export).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.audio import FROM_INT16
from agent.errors import ConfigError, ModelNotFoundError, require
from stages.onnx_session import cpu_session
from stages.speaker import features
from stages.speaker.export import SOURCES, ensure_export

RATE = features.RATE
# Shorter windows are repeated up to this length: the networks pool statistics over time and
# need a few frames (CAM++'s standard deviation over time divides by frames - 1).
MIN_SAMPLES = RATE // 2
BATCH = 32  # windows per network run: past ~16 the per-window cost stops falling

FRONTENDS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "kaldi-fbank": features.kaldi_fbank,
    "ge2e-mel": features.ge2e_mel,
}
_BY_FEATURES = {80: "kaldi-fbank", 40: "ge2e-mel"}


class Embedder:
    """One embedding network on onnxruntime. :meth:`embed` is safe to call from several
    threads (onnxruntime sessions are)."""

    def __init__(
        self,
        path: str | Path,
        frontend: str | None = None,
        threads: int = 1,
        name: str | None = None,
    ) -> None:
        ort = require("onnxruntime", what="speaker embeddings", extra="embedded")
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(
                f"speaker-embedding model not found: {self.path} — pass an exported .onnx file, "
                "or 'campplus' / 'ge2e' for the weights pip packages ship"
            )
        # diarization calls it in bursts between other work: idle threads must not spin
        self._session: Any = cpu_session(ort, self.path, max(1, threads))
        inp = self._session.get_inputs()[0]
        self._input = inp.name
        if frontend is None:
            frontend = _BY_FEATURES.get(inp.shape[-1]) if len(inp.shape) == 3 else None
            if frontend is None:
                raise ConfigError(
                    f"{self.path}: input {inp.name} {inp.shape} is neither [batch, frames, 80] "
                    "fbank (CAM++) nor [batch, frames, 40] mel power (GE2E)"
                )
        self.frontend = frontend
        self._features = FRONTENDS[frontend]
        self.name = name or self.path.stem
        self.dim = int(self._run(np.zeros((1, MIN_SAMPLES), np.float32)).shape[1])

    def _run(self, batch: np.ndarray) -> np.ndarray:
        return self._session.run(None, {self._input: self._features(batch)})[0]

    def embed(self, windows: Sequence[np.ndarray], batch: int = BATCH) -> np.ndarray:
        """[N, dim] float32 L2-normalised embeddings of 16-kHz mono windows (float32 in
        [-1, 1], or int16). Windows of equal length run together, ``batch`` at a time."""
        out = np.zeros((len(windows), self.dim), np.float32)
        by_length: dict[int, list[int]] = {}
        for i, w in enumerate(windows):
            if len(w) == 0:
                raise ValueError(f"window {i} is empty")
            by_length.setdefault(max(len(w), MIN_SAMPLES), []).append(i)
        for length, idx in by_length.items():
            for k in range(0, len(idx), batch):
                part = idx[k : k + batch]
                stack = np.stack([_as_float(windows[i], length) for i in part])
                out[part] = self._run(stack)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


def _as_float(window: np.ndarray, length: int) -> np.ndarray:
    """float32 samples, repeated up to ``length`` when the window is shorter."""
    w = np.asarray(window)
    w = w.astype(np.float32) * FROM_INT16 if w.dtype == np.int16 else w.astype(np.float32)
    return w if len(w) == length else np.resize(w, length)


def load_embedder(model: str = "campplus", threads: int = 1) -> Embedder:
    """The speaker embedder named by ``model``: "campplus", "ge2e", or a .onnx path. A named
    model's first use exports its weights to ONNX (needs torch once; see
    :mod:`stages.speaker.export`)."""
    src = SOURCES.get(model)
    if src is not None:
        return Embedder(ensure_export(src), src.frontend, threads, name=src.name)
    if model.endswith(".onnx") or Path(model).is_file():
        return Embedder(model, threads=threads)
    raise ConfigError(
        f"unknown speaker model {model!r} — use 'campplus', 'ge2e' or the path of a .onnx file"
    )
