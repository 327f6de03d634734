"""Audio files read a block at a time, for offline transcription of recordings of any length:
16-kHz int16 (samples, channels) in pieces, never the whole file at once, and a damaged or
cut-short file reported *after* the audio before the damage has been handed out.

A file goes to libsndfile first (bit-exact for 16-bit PCM WAV/FLAC/AIFF/Ogg), else to FFmpeg
(PyAV), as MP3 does where PyAV is installed (libsndfile's MP3 depends on the reads' lengths).
Other rates are resampled as a stream (soxr, HQ), mixed to mono first unless each channel is
wanted on its own. A truncated file is found by what its header promised: a WAV whose data
chunk, or a FLAC whose stream info, claims more samples than the file holds ends with
:class:`DamagedAudio` after the samples it does hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from agent.audio import (
    _INT16_EXACT,
    RATE,
    _packed,
    check_file,
    float_to_int16,
    int16_to_float,
    soundfile_decodes,
    to_mono,
)
from agent.errors import AudioInputError, require
from stages.asr.uploads import _ffmpeg_words, _words, wav_frames

BLOCK_S = 1.0  # seconds of source audio decoded per step: at most this is lost at a damage


class DamagedAudio(AudioInputError):
    """The file's audio stops early (truncated, or undecodable from some point on); the audio
    before the damage has been read."""

    def __init__(self, label: str, at_s: float, why: str) -> None:
        super().__init__(f"{label} is damaged {at_s:.1f} s in ({why}): the transcript covers "
                         "the audio before that point")
        self.at_s = at_s


class AudioSource(Protocol):
    """Audio handed out in pieces: ``read(n)`` gives up to ``n`` samples (fewer only at the
    end; none after it) as int16 (samples, channels) at 16 kHz."""

    name: str
    channels: int
    duration_s: float | None  # what the header says, for progress; None: unknown

    def read(self, samples: int) -> np.ndarray: ...

    def close(self) -> None: ...


class ArraySource:
    """In-memory audio (int16 or float32 mono arrays, one per channel) as a source."""

    def __init__(self, name: str, channels: list[np.ndarray]) -> None:
        self.name, self._chans, self._at = name, channels, 0
        self.channels = len(channels)
        self.duration_s = len(channels[0]) / RATE

    def read(self, samples: int) -> np.ndarray:
        a, self._at = self._at, min(self._at + samples, len(self._chans[0]))
        if self.channels == 1:
            return self._chans[0][a : self._at].reshape(-1, 1)
        return np.stack([c[a : self._at] for c in self._chans], axis=1)

    def close(self) -> None:
        pass


class FileSource:
    """A file on disk read a block at a time; ``split``: every channel on its own (else one,
    the channels' mean). Opening raises AudioInputError for a file that cannot be read at
    all; :meth:`read` raises :class:`DamagedAudio` after the last good samples."""

    def __init__(self, path: str | Path, split: bool = False) -> None:
        p = Path(path)
        self.name = str(path)
        check_file(p, self.name)
        self.split = split
        self._buf = np.zeros((0, 1), np.int16)
        self._ended = False
        self._error: DamagedAudio | None = None
        self._closing: list = []
        self._blocks = self._open(p)
        self._resampler = None
        if self._rate != RATE:
            soxr = require("soxr", what="resampling audio", extra="embedded")
            self._resampler = soxr.ResampleStream(self._rate, RATE, self.channels,
                                                  dtype="float32", quality="HQ")

    # --- opening -------------------------------------------------------------------------
    def _open(self, p: Path) -> Iterator[np.ndarray]:
        try:
            import soundfile
        except ImportError:
            soundfile = None
        if soundfile is not None:
            try:
                f = soundfile.SoundFile(str(p))
            except Exception:  # not a format libsndfile reads: FFmpeg's turn
                f = None
            if f is not None and not soundfile_decodes(f.format):  # MP3: FFmpeg's too
                f.close()
                f = None
            if f is not None:
                self._closing.append(f)
                self._rate, file_channels = int(f.samplerate), int(f.channels)
                # what the header promised (libsndfile trims a WAV's claim to the file)
                with open(p, "rb") as head:
                    claim = wav_frames(head, f.channels) if f.format in ("WAV", "WAVEX") else None
                promised = (claim if f.format in ("WAV", "WAVEX")
                            else int(f.frames) if f.format == "FLAC" else None)
                self.channels = file_channels if self.split else 1
                self.duration_s = (promised or int(f.frames)) / self._rate
                return self._soundfile_blocks(f, promised)
        av = require("av", what="reading audio files", extra="embedded")
        try:
            container = av.open(str(p))
        except Exception as exc:
            raise AudioInputError(f"cannot decode {self.name}: unknown or corrupt audio format "
                                  f"({_ffmpeg_words(av, exc)})") from None
        self._closing.append(container)
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            container.close()
            raise AudioInputError(f"{self.name} has no audio stream")
        stream = streams[0]
        self._rate = int(stream.rate or RATE)
        file_channels = int(stream.codec_context.channels or 1)
        self.channels = file_channels if self.split else 1
        self.duration_s = (float(container.duration) / 1e6 if container.duration else None)
        return self._av_blocks(av, container, stream)

    def _soundfile_blocks(self, f: object, promised: int | None) -> Iterator[np.ndarray]:
        exact = f.subtype in _INT16_EXACT  # type: ignore[attr-defined]
        step = max(1, int(self._rate * BLOCK_S))
        got = 0
        while True:
            try:
                block = f.read(step, dtype="int16" if exact else "float32", always_2d=True)  # type: ignore[attr-defined]
            except Exception as exc:
                raise DamagedAudio(self.name, got / self._rate, _words(exc)) from None
            if not len(block):
                break
            got += len(block)
            yield block if exact else float_to_int16(block)
        if promised is not None and got < promised:
            raise DamagedAudio(self.name, got / self._rate,
                               f"cut short: its header promises {promised / self._rate:.1f} s")

    def _av_blocks(self, av: object, container: object, stream: object) -> Iterator[np.ndarray]:
        codec_format = stream.codec_context.format  # type: ignore[attr-defined]
        exact = codec_format is not None and codec_format.name in ("s16", "s16p", "u8", "u8p")
        resampler = av.AudioResampler(format="s16" if exact else "dbl", rate=self._rate)  # type: ignore[attr-defined]
        got = 0
        try:
            for frame in container.decode(stream):  # type: ignore[attr-defined]
                for out in resampler.resample(frame):
                    x = _packed(out)
                    got += len(x)
                    yield x if exact else float_to_int16(x)
            for out in resampler.resample(None):
                x = _packed(out)
                yield x if exact else float_to_int16(x)
        except Exception as exc:
            raise DamagedAudio(self.name, got / self._rate, _ffmpeg_words(av, exc)) from None

    # --- reading -------------------------------------------------------------------------
    def read(self, samples: int) -> np.ndarray:
        while len(self._buf) < samples and not self._ended:
            try:
                block = next(self._blocks)
            except StopIteration:
                self._ended = True
                self._append(self._flush())
                break
            except DamagedAudio as exc:  # the samples before it go out first, then the error
                self._ended, self._error = True, exc
                self._append(self._flush())
                break
            self._append(self._convert(block))
        if not len(self._buf) and self._error is not None:
            exc, self._error = self._error, None
            raise exc
        out, self._buf = self._buf[:samples], self._buf[samples:]
        return out

    def _convert(self, block: np.ndarray) -> np.ndarray:
        x = block if self.split else to_mono(block).reshape(-1, 1)
        if self._resampler is not None:
            x = float_to_int16(self._resampler.resample_chunk(int16_to_float(x)))
            x = x.reshape(-1, self.channels)
        return x

    def _flush(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros((0, self.channels), np.int16)
        tail = self._resampler.resample_chunk(np.zeros((0, self.channels), np.float32), last=True)
        return float_to_int16(tail).reshape(-1, self.channels)

    def _append(self, x: np.ndarray) -> None:
        if len(x):
            self._buf = x if not len(self._buf) else np.concatenate([self._buf, x])

    def close(self) -> None:
        for f in self._closing:
            f.close()
        self._closing = []
