"""Shared by the telephony e2e tests: the caller clip, the transcript check, agent-audio energy."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
CLIP_8K = DATA / "asterisk-queue-youarenext.wav"
REFERENCE = "your call is now first in line and will be answered by the next available representative"


def require_sipp() -> str:
    """The sipp binary; skipped when missing locally, a failure in CI (CI=true)."""
    path = shutil.which("sipp")
    if path is None:
        msg = "sipp is not installed (Debian package sip-tester: apt-get install -y sip-tester)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def read_clip_8k() -> np.ndarray:
    import soundfile as sf

    pcm, rate = sf.read(CLIP_8K, dtype="int16")
    assert rate == 8000
    return pcm


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def recall(hypothesis: str, reference: str = REFERENCE) -> float:
    """The share of the reference's words the transcript contains (order-free, lenient on
    the tiny model's slips, strict enough to fail on noise or silence)."""
    ref, hyp = words(reference), set(words(hypothesis))
    return sum(w in hyp for w in ref) / len(ref)


def loud_frames(pcm: np.ndarray, frame: int = 160, rms: float = 300.0) -> int:
    n = len(pcm) // frame
    if n == 0:
        return 0
    x = pcm[: n * frame].astype(np.float64).reshape(n, frame)
    return int((np.sqrt((x**2).mean(axis=1)) > rms).sum())
