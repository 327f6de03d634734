"""Reading any common audio file (WAV, FLAC, OGG, MP3, M4A; any rate; stereo) as 16 kHz mono
int16, and writing the stereo call recording."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from agent.errors import AudioInputError, require

TARGET_RATE = 16_000


def read_audio(path: str | Path, rate: int = TARGET_RATE) -> np.ndarray:
    """Decode ``path`` to mono int16 at ``rate``. Raises AudioInputError with the reason."""
    p = Path(path)
    if not p.exists():
        raise AudioInputError(f"audio file not found: {p}")
    if p.is_dir():
        raise AudioInputError(f"expected an audio file, got a directory: {p}")
    if p.stat().st_size == 0:
        raise AudioInputError(f"audio file is empty: {p}")
    data, sr = _decode(p)
    if data.ndim == 2:
        data = data.mean(axis=1)
    if data.size == 0:
        raise AudioInputError(f"audio file holds no samples: {p}")
    if sr != rate:
        soxr = require("soxr", what="resampling audio", extra="embedded")
        data = soxr.resample(data.astype(np.float32), sr, rate, quality="HQ")
    return float_to_int16(data)


def _decode(p: Path) -> tuple[np.ndarray, int]:
    """float32 samples (frames, channels) and the rate; soundfile first, then av."""
    try:
        import soundfile
    except ImportError:
        soundfile = None
    if soundfile is not None:
        try:
            data, sr = soundfile.read(str(p), dtype="float32", always_2d=True)
            return data, int(sr)
        except Exception:  # soundfile cannot read it: MP3 on old libsndfile, M4A, ...
            pass
    try:
        import av
    except ImportError:
        if soundfile is None:
            require("soundfile", what="reading audio files", extra="embedded")
        raise AudioInputError(
            f"cannot decode {p}: not a format soundfile reads, and av is not installed "
            "(pip install 'voxline[embedded]')"
        ) from None
    try:
        with av.open(str(p)) as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise AudioInputError(f"{p} has no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono")
            sr = streams[0].rate or TARGET_RATE
            parts = []
            for frame in container.decode(streams[0]):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except AudioInputError:
        raise
    except Exception as exc:
        raise AudioInputError(f"cannot decode {p}: unknown or corrupt audio format ({exc})") from None
    if not parts:
        raise AudioInputError(f"audio file holds no samples: {p}")
    return np.concatenate(parts).astype(np.float32)[:, None], int(sr)


def float_to_int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype(np.int16)


def write_wav(path: str | Path, pcm: np.ndarray, rate: int = TARGET_RATE) -> None:
    """Write int16 samples; a 2-D array (samples, channels) is written interleaved."""
    pcm = np.asarray(pcm, dtype=np.int16)
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(pcm).tobytes())


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """int16 samples (samples, channels) of a PCM16 WAV, without optional dependencies."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise AudioInputError(f"{path}: only 16-bit PCM WAV is read here")
        raw = w.readframes(w.getnframes())
        data = np.frombuffer(raw, dtype=np.int16).reshape(-1, w.getnchannels())
        return data, w.getframerate()
