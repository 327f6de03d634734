"""The pipeline's audio format and every conversion into and out of it: 16 kHz mono int16
inside; files decoded losslessly where they can be (a PCM file at the pipeline's rate comes back
sample for sample); one float scale, ``int16 / 32768``, in both directions.

Files come as paths, bytes or file objects, decoded the same way. The optional decoders
(soundfile, av) and the resampler (soxr) are imported when first needed.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import wave
from pathlib import Path
from typing import BinaryIO

import numpy as np

from agent.errors import AudioInputError, require

RATE = 16_000
# float = int16 / 32768 exactly (every int16 value is a float32 in [-1, 1)); back again,
# x * 32768 rounded to the nearest step and clipped to int16. A float32 → int16 → float32 round
# trip therefore moves a sample in range by at most half a step, and int16 → float → int16 is
# exact. (The other common convention, x * 32767 on the way out, moves every loud sample by one
# step per round trip — enough to flip a small ASR model's word.)
INT16_SCALE = 32768.0
FROM_INT16 = np.float32(1.0 / INT16_SCALE)

# a path, a file's bytes, or a binary file object holding them
AudioSource = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO

# libsndfile subtypes whose samples are int16 values or fewer bits (read as int16: exact)
_INT16_EXACT = {"PCM_16", "PCM_S8", "PCM_U8", "ULAW", "ALAW", "DWVW_12", "DWVW_16"}

# libsndfile's MP3 decoding depends on how the file is read: reads of other lengths give samples
# a float LSB apart, and in some encoders' files a read that ends where a frame leans on the bit
# reservoir garbles ~200 samples of it (libmpg123: "part2_3_length too large"). FFmpeg's does
# not, so with av installed MP3 goes to FFmpeg, and a file gives the same samples read whole
# (voxline run), in blocks (voxline transcribe) or uploaded (asr-serve).
_FFMPEG_FIRST = frozenset({"MP3", "MPEG"})


@functools.cache
def _have_av() -> bool:
    return importlib.util.find_spec("av") is not None


def soundfile_decodes(fmt: str) -> bool:
    """Whether a file libsndfile opened as ``fmt`` (its format's name) is decoded by libsndfile:
    False for MP3 when FFmpeg (av) is there to decode it instead."""
    return fmt not in _FFMPEG_FIRST or not _have_av()


def int16_to_float(pcm: np.ndarray) -> np.ndarray:
    """int16 samples as float32 in [-1, 1): ``pcm / 32768``."""
    return np.asarray(pcm, dtype=np.int16).astype(np.float32) * FROM_INT16


def float_to_int16(x: np.ndarray) -> np.ndarray:
    """float samples (nominally [-1, 1]) as int16: ``x * 32768`` rounded, clipped to int16."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    y = np.rint(x * INT16_SCALE)  # a power of two: exact in the input's own float type
    return np.clip(y, -32768, 32767).astype(np.int16)


def resample(pcm: np.ndarray, rate: int, to_rate: int) -> np.ndarray:
    """int16 mono at ``rate`` → int16 mono at ``to_rate`` (soxr, high quality)."""
    if rate == to_rate:
        return np.asarray(pcm, dtype=np.int16)
    soxr = require("soxr", what="resampling audio", extra="embedded")
    return float_to_int16(soxr.resample(int16_to_float(pcm), rate, to_rate, quality="HQ"))


def to_mono(frames: np.ndarray) -> np.ndarray:
    """(samples, channels) int16 → mono int16: the channels' mean, rounded (a file whose
    channels are equal comes back unchanged)."""
    if frames.ndim == 1 or frames.shape[1] == 1:
        return np.ascontiguousarray(frames.reshape(-1), dtype=np.int16)
    channels = frames.shape[1]
    total = frames.sum(axis=1, dtype=np.int32)  # 4 bytes a sample: an hour of audio fits
    return ((total + channels // 2) // channels).astype(np.int16)  # halves round up


def read_audio(source: AudioSource, rate: int = RATE, name: str | None = None) -> np.ndarray:
    """Decode ``source`` — a path, the bytes of a file, or a binary file object (read from its
    start) — to mono int16 at ``rate``. Raises AudioInputError with the reason; ``name`` is what
    the messages call the audio (default: the path, or "the audio" for bytes and file objects).

    A file whose samples are 16-bit (or fewer) integers — PCM WAV/FLAC/AIFF, G.711 — is read as
    integers, never through floats: at ``rate`` it comes back bit-exact. Other encodings (24-bit,
    float, lossy codecs) are decoded to float and rounded once. Bytes and file objects are
    decoded in memory, exactly as the same file on disk would be."""
    frames, sr = _frames(source, name)
    return resample(to_mono(frames), sr, rate)


def read_channels(source: AudioSource, rate: int = RATE, name: str | None = None) -> list[np.ndarray]:
    """:func:`read_audio`, but each channel on its own (int16 at ``rate``), in the file's order:
    a call recording's caller and agent (``voxline run --output``: left and right)."""
    frames, sr = _frames(source, name)
    if frames.ndim == 1:
        return [resample(frames, sr, rate)]
    return [resample(np.ascontiguousarray(frames[:, c]), sr, rate) for c in range(frames.shape[1])]


def check_file(path: Path, label: str) -> None:
    """AudioInputError unless ``path`` is a file with something in it."""
    if not path.exists():
        raise AudioInputError(f"audio file not found: {label}")
    if path.is_dir():
        raise AudioInputError(f"expected an audio file, got a directory: {label}")
    if path.stat().st_size == 0:
        raise AudioInputError(f"audio file is empty: {label}")


def _frames(source: AudioSource, name: str | None) -> tuple[np.ndarray, int]:
    """The decoded (samples, channels) int16 of ``source`` and its rate, or AudioInputError."""
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        label = name or str(p)
        check_file(p, label)
        opened: str | BinaryIO = str(p)
    else:
        label = name or "the audio"
        opened = _in_memory(source, label)
    frames, sr = _decode(opened, label)
    if frames.size == 0:
        raise AudioInputError(f"audio file holds no samples: {label}")
    return frames, sr


def _in_memory(source: bytes | bytearray | memoryview | BinaryIO, label: str) -> BinaryIO:
    """A seekable file object over ``source`` (the decoders seek; a pipe is read into memory)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data: BinaryIO = io.BytesIO(source)
    else:
        data = source if source.seekable() else io.BytesIO(source.read())
    if data.seek(0, io.SEEK_END) == 0:
        raise AudioInputError(f"audio file is empty: {label}")
    return data


def _rewound(source: str | BinaryIO) -> str | BinaryIO:
    """``source`` ready for a decoder to open: a path as it is, a file object at its start."""
    if not isinstance(source, str):
        source.seek(0)
    return source


def _decode(source: str | BinaryIO, label: str) -> tuple[np.ndarray, int]:
    """int16 samples (frames, channels) and the rate; soundfile first, then av."""
    try:
        import soundfile
    except ImportError:
        soundfile = None
    if soundfile is not None:
        try:
            with soundfile.SoundFile(_rewound(source)) as f:
                if f.subtype in _INT16_EXACT:
                    return f.read(dtype="int16", always_2d=True), int(f.samplerate)
                if soundfile_decodes(f.format):  # (MP3: FFmpeg's, below)
                    # float32 holds 24-bit samples exactly
                    return float_to_int16(f.read(dtype="float32", always_2d=True)), int(f.samplerate)
        except Exception:  # soundfile cannot read it: MP3 on old libsndfile, M4A, ...
            pass
    try:
        import av
    except ImportError:
        if soundfile is None:
            require("soundfile", what="reading audio files", extra="embedded")
        raise AudioInputError(
            f"cannot decode {label}: not a format soundfile reads, and av is not installed "
            "(pip install 'voxline[embedded]')"
        ) from None
    return _decode_av(av, source, label)


def _decode_av(av: object, source: str | BinaryIO, label: str) -> tuple[np.ndarray, int]:
    try:
        with av.open(_rewound(source)) as container:  # type: ignore[attr-defined]
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise AudioInputError(f"{label} has no audio stream")
            stream = streams[0]
            sr = stream.rate or RATE
            # integer codecs stay integers (u8 becomes s16 exactly); the rest become float once
            codec_format = stream.codec_context.format
            exact = codec_format is not None and codec_format.name in ("s16", "s16p", "u8", "u8p")
            resampler = av.AudioResampler(format="s16" if exact else "dbl", rate=sr)  # type: ignore[attr-defined]
            parts: list[np.ndarray] = []
            for frame in container.decode(stream):
                parts.extend(_packed(out) for out in resampler.resample(frame))
            parts.extend(_packed(out) for out in resampler.resample(None))
    except AudioInputError:
        raise
    except Exception as exc:
        why: object = exc
        if isinstance(exc, av.error.FFmpegError) and exc.strerror:  # type: ignore[attr-defined]
            why = exc.strerror  # FFmpeg's words, without the file name ('<none>' for bytes)
        raise AudioInputError(f"cannot decode {label}: unknown or corrupt audio format ({why})") from None
    if not parts:
        raise AudioInputError(f"audio file holds no samples: {label}")
    data = np.concatenate(parts)
    return (data if exact else float_to_int16(data)), int(sr)


def _packed(frame: object) -> np.ndarray:
    """A packed (interleaved) av frame as (samples, channels)."""
    channels = len(frame.layout.channels)  # type: ignore[attr-defined]
    return frame.to_ndarray().reshape(-1, channels)  # type: ignore[attr-defined]


def write_wav(path: str | Path, pcm: np.ndarray, rate: int = RATE) -> None:
    """Write int16 samples; a 2-D array (samples, channels) is written interleaved."""
    pcm = np.asarray(pcm, dtype=np.int16)
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(pcm).astype("<i2", copy=False).tobytes())


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """int16 samples (samples, channels) of a PCM16 WAV, without optional dependencies."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise AudioInputError(f"{path}: only 16-bit PCM WAV is read here")
        raw = w.readframes(w.getnframes())
        data = np.frombuffer(raw, dtype="<i2").astype(np.int16).reshape(-1, w.getnchannels())
        return data, w.getframerate()
