"""Decoding an uploaded audio file so that it can reach nothing but its own bytes, and cost no
more memory than the longest audio the server takes.

FFmpeg opens whatever its probe recognises, and some demuxers follow references: an HLS playlist
or a concat list naming a local file decodes *that file*. So the container is named from the
upload's first bytes and must be one of a short list of self-contained formats
(:data:`DEMUXERS`); FFmpeg is then told that demuxer (no probing) and may open no protocol at all
(``protocol_whitelist``), so nothing else is ever opened. And a few kilobytes of FLAC can hold
hours of silence, so samples go into a buffer sized for the longest audio allowed, and decoding
stops — :class:`AudioTooLong` — the moment the audio passes it: memory is bounded by the cap
(16 kHz int16: 115 MB an hour), never by what the file claims.
"""

from __future__ import annotations

import io
import struct
from typing import BinaryIO

import numpy as np

from agent.audio import (
    _INT16_EXACT,
    RATE,
    float_to_int16,
    int16_to_float,
    soundfile_decodes,
    to_mono,
)
from agent.errors import AudioInputError, require

# What the upload's first bytes say → the FFmpeg demuxer told to read it. None of these opens
# another file: a WAV, FLAC, MP3, Ogg, Matroska/WebM, MP4/M4A (external data references off),
# ADTS AAC or AIFF file holds its own samples.
DEMUXERS = {"wav": "wav", "aiff": "aiff", "flac": "flac", "ogg": "ogg", "mp3": "mp3",
            "matroska": "matroska", "mp4": "mov", "aac": "aac"}
# The containers libsndfile reads itself (bit-exact for 16-bit PCM), as it names them; MP3 only
# where av is not installed (agent.audio.soundfile_decodes).
SOUNDFILE_FORMATS = {"wav": {"WAV", "WAVEX", "RF64"}, "aiff": {"AIFF"}, "flac": {"FLAC"},
                     "ogg": {"OGG"}, "mp3": {"MP3", "MPEG"}}
ACCEPTED = ("WAV, FLAC, MP3, Ogg (Opus, Vorbis, FLAC), WebM/Matroska, MP4/M4A, AAC (ADTS) "
            "or AIFF")
MAX_RATE = 384_000  # a header claiming more is refused before any buffer is sized by it
MAX_CHANNELS = 16
BLOCK_S = 1.0  # seconds of source audio decoded per step
_NOTHING = "none"  # a protocol whitelist no protocol is on
_LISTS = (b"#EXTM3U", b"ffconcat", b"[playlist]", b"<?xml", b"#EXT")


class UnsupportedUpload(AudioInputError):
    """The upload is not one of the self-contained containers decoded here."""


class AudioTooLong(AudioInputError):
    """The upload's audio runs past the longest the server takes; decoding stopped there."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"the uploaded audio is longer than this server takes "
                         f"(at most {limit_s:.0f} s) — send it in parts")
        self.limit_s = limit_s


def container_of(data: bytes | memoryview) -> str | None:
    """The container the bytes start with, as a key of :data:`DEMUXERS`, or None."""
    head = bytes(data[:12])
    if head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:4] == b"ADIF":
        return "aac"
    if head[:3] == b"ID3" and len(head) >= 10:  # an ID3v2 tag, then the audio
        size = 10 + ((head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7
                     | (head[9] & 0x7F)) + (10 if head[5] & 0x10 else 0)
        after = bytes(data[size : size + 4])
        if after[:4] == b"fLaC":
            return "flac"
        return "aac" if _adts(after) else "mp3"
    if _adts(head):
        return "aac"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
        return "mp3"  # an MPEG audio frame sync with a layer (I, II or III)
    return None


def _adts(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0


class DamagedUpload(AudioInputError):
    """The upload's audio stops early: cut short of what its header promises, or undecodable
    from some point on."""


def decode_upload(data: bytes | memoryview, max_samples: int, label: str = "the upload") -> np.ndarray:
    """``data`` (a whole uploaded file) as mono int16 at 16 kHz. Raises
    :class:`UnsupportedUpload` for anything but the containers of :data:`DEMUXERS`,
    :class:`AudioTooLong` as soon as the audio passes ``max_samples``, :class:`DamagedUpload`
    when it stops early, and AudioInputError when it cannot be decoded; ``label`` is what the
    messages call it."""
    pcm, damage = decode_upload_partial(data, max_samples, label)
    if damage is not None:
        raise damage
    return pcm


def decode_upload_partial(data: bytes | memoryview, max_samples: int,
                          label: str = "the upload") -> tuple[np.ndarray, DamagedUpload | None]:
    """:func:`decode_upload`, but a damaged upload that held some audio before the damage gives
    that audio and the damage (its message says where) instead of raising."""
    try:
        return _decode_all(data, max_samples, label), None
    except _Partial as part:
        return part.samples, part.damage


class _Partial(Exception):
    def __init__(self, samples: np.ndarray, damage: DamagedUpload) -> None:
        self.samples, self.damage = samples, damage


def _damaged(sink: _Sink, label: str, why: str) -> Exception:
    """The damage as the exception to raise: with the audio before it when there is some."""
    at = sink.seconds
    if at <= 0:
        return AudioInputError(f"cannot decode {label}: {why}")
    return _Partial(sink.samples(), DamagedUpload(
        f"{label} is damaged {at:.1f} s in ({why}): the transcript covers the audio before that "
        "point"))


def _decode_all(data: bytes | memoryview, max_samples: int, label: str) -> np.ndarray:
    if not len(data):
        raise AudioInputError(f"{label} is empty")
    kind = container_of(data)
    if kind is None:
        if any(bytes(data[:16]).lstrip().startswith(m) for m in _LISTS):
            raise UnsupportedUpload(f"{label} is a playlist or a list of other files: upload "
                                    f"the audio itself ({ACCEPTED})")
        raise UnsupportedUpload(f"{label} is not an audio file this server decodes: send "
                                f"{ACCEPTED}")
    sink = _Sink(max_samples)
    if kind in SOUNDFILE_FORMATS and _soundfile(data, kind, sink, label):
        return sink.samples()
    sink = _Sink(max_samples)  # libsndfile could not open it: FFmpeg starts over
    _ffmpeg(data, kind, sink, label)
    return sink.samples()


class _Sink:
    """Mono int16 at 16 kHz, resampled on the way in, into a buffer sized for the cap (only the
    pages written become memory)."""

    def __init__(self, max_samples: int) -> None:
        self.max = max_samples
        self._buf = np.empty(max_samples + RATE, np.int16)  # + 1 s: the resampler's rounding
        self._n = 0
        self._rate = RATE
        self._source = 0  # samples at the source rate so far
        self._stream = None

    def start(self, rate: int, channels: int, label: str) -> None:
        if not 0 < rate <= MAX_RATE or not 0 < channels <= MAX_CHANNELS:
            raise AudioInputError(f"{label} claims {rate} Hz and {channels} channels; this "
                                  f"server takes up to {MAX_RATE} Hz and {MAX_CHANNELS} channels")
        self._rate = rate
        if rate != RATE:
            soxr = require("soxr", what="resampling uploads", extra="embedded")
            self._stream = soxr.ResampleStream(rate, RATE, 1, dtype="float32", quality="HQ")

    @property
    def seconds(self) -> float:
        """Seconds of source audio taken so far."""
        return self._source / self._rate if self._rate else 0.0

    @property
    def block(self) -> int:
        return max(1, int(self._rate * BLOCK_S))

    def add(self, frames: np.ndarray) -> None:
        """``frames``: int16 (samples, channels) at the source rate."""
        self._source += len(frames)
        if self._source * RATE > self.max * self._rate:
            raise AudioTooLong(self.max / RATE)
        mono = to_mono(frames)
        if self._stream is not None:
            mono = float_to_int16(self._stream.resample_chunk(int16_to_float(mono)))
        self._put(mono)

    def _put(self, mono: np.ndarray) -> None:
        end = min(self._n + len(mono), len(self._buf))
        self._buf[self._n : end] = mono[: end - self._n]
        self._n = end

    def samples(self) -> np.ndarray:
        if self._stream is not None:
            self._put(float_to_int16(self._stream.resample_chunk(np.zeros(0, np.float32), last=True)))
            self._stream = None
        if self._n == 0:
            raise AudioInputError("the upload holds no samples")
        return self._buf[: self._n]


def _soundfile(data: bytes | memoryview, kind: str, sink: _Sink, label: str) -> bool:
    """Decode with libsndfile (bit-exact for 16-bit PCM); False when it cannot open the file."""
    if not any(soundfile_decodes(name) for name in SOUNDFILE_FORMATS[kind]):
        return False  # MP3 with av installed: FFmpeg's, without libsndfile opening it first
    try:
        import soundfile
    except ImportError:
        return False
    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except Exception:  # a codec libsndfile lacks (MP3 on an old one, WAV with ADPCM, ...)
        return False
    with f:
        if f.format not in SOUNDFILE_FORMATS[kind]:
            return False
        sink.start(int(f.samplerate), int(f.channels), label)
        exact = f.subtype in _INT16_EXACT
        # what the header promised (libsndfile trims a WAV's claim to what the file holds)
        promised = (wav_frames(io.BytesIO(data), f.channels) if f.format in ("WAV", "WAVEX")
                    else int(f.frames) if f.format == "FLAC" else None)
        got = 0
        try:
            while True:
                block = f.read(sink.block, dtype="int16" if exact else "float32", always_2d=True)
                if not len(block):
                    break
                got += len(block)
                sink.add(block if exact else float_to_int16(block))
        except AudioInputError:
            raise
        except Exception as exc:
            raise _damaged(sink, label, f"corrupt {kind} data: {_words(exc)}") from None
        if promised is not None and got < promised:
            raise _damaged(sink, label, f"cut short: its header promises "
                           f"{promised / f.samplerate:.1f} s")
        return True


def _ffmpeg(data: bytes | memoryview, kind: str, sink: _Sink, label: str) -> None:
    av = require("av", what="decoding uploads", extra="embedded")
    options = {"protocol_whitelist": _NOTHING}
    if kind == "mp4":
        options["enable_drefs"] = "0"  # the default; said, since it is the one reference MP4 has
    try:
        with av.open(io.BytesIO(data), format=DEMUXERS[kind], options=options) as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise AudioInputError(f"{label} has no audio stream")
            stream = streams[0]
            channels = stream.codec_context.channels or 1
            sink.start(int(stream.rate or 0), int(channels), label)
            codec_format = stream.codec_context.format
            exact = codec_format is not None and codec_format.name in ("s16", "s16p", "u8", "u8p")
            resampler = av.AudioResampler(format="s16" if exact else "dbl", rate=stream.rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    sink.add(_int16(out, exact))
            for out in resampler.resample(None):
                sink.add(_int16(out, exact))
    except AudioInputError:
        raise
    except Exception as exc:
        why = _ffmpeg_words(av, exc)
        raise _damaged(sink, label, f"corrupt or unsupported {kind} data ({why})") from None


def _int16(frame: object, exact: bool) -> np.ndarray:
    """A packed av frame as int16 (samples, channels)."""
    channels = len(frame.layout.channels)  # type: ignore[attr-defined]
    x = frame.to_ndarray().reshape(-1, channels)  # type: ignore[attr-defined]
    return x if exact else float_to_int16(x)


def _ffmpeg_words(av: object, exc: Exception) -> str:
    """FFmpeg's reason, without a file name or a path in it."""
    if isinstance(exc, av.error.FFmpegError) and exc.strerror:  # type: ignore[attr-defined]
        return str(exc.strerror)
    return type(exc).__name__


def _words(exc: Exception) -> str:
    """libsndfile's reason, without its prefix."""
    text = str(exc).strip()
    return text.removeprefix("Error : ").rstrip(".") or type(exc).__name__


def wav_frames(f: BinaryIO, channels: int) -> int | None:
    """The frames a PCM WAV's ``data`` chunk claims, read from its header (None: unknown, as in
    a streamed WAV whose size was never filled in)."""
    head = f.read(12)
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    width = 0
    for _ in range(64):
        chunk = f.read(8)
        if len(chunk) < 8:
            return None
        tag, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if tag == b"fmt ":
            fmt = f.read(size + (size & 1))
            if len(fmt) >= 16:
                width = struct.unpack("<H", fmt[14:16])[0] // 8
            continue
        if tag == b"data":
            if size in (0, 0xFFFFFFFF) or width == 0:
                return None
            return size // (width * channels)
        f.seek(size + (size & 1), 1)
    return None
