"""Reading any common input: WAV/FLAC/OGG via soundfile, MP3 and others via av; any rate, stereo."""

from pathlib import Path

import numpy as np
import pytest

from agent.errors import AudioInputError
from transports.audio_file import read_audio, read_wav, write_wav

DATA = Path(__file__).resolve().parents[1] / "data"
CLIP = DATA / "ls-dev-clean-1988-24833-0000.wav"


def _clip() -> np.ndarray:
    return read_wav(CLIP)[0][:, 0]


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_wav_at_16k_is_read_bit_exact():
    assert np.array_equal(read_audio(CLIP), _clip())


def test_stereo_flac_at_44k1_is_mixed_down_and_resampled(tmp_path):
    sf = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    mono = _clip().astype(np.float32) / 32768
    up = soxr.resample(mono, 16000, 44100)
    sf.write(tmp_path / "call.flac", np.stack([up, up * 0.5], axis=1), 44100)
    got = read_audio(tmp_path / "call.flac")
    assert abs(len(got) - len(mono)) <= 2
    assert _corr(got, _clip()) > 0.99


def test_mp3_goes_through_av(tmp_path):
    av = pytest.importorskip("av")
    pcm = _clip()
    path = tmp_path / "call.mp3"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mp3", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    got = read_audio(path)
    assert abs(len(got) - len(pcm)) < 16000 * 0.1  # encoder padding
    # mp3 delays the signal a little: the best alignment within 50 ms must match well
    best = max(_corr(got[k:], pcm) for k in range(0, 1600, 16))
    assert best > 0.9


def test_errors_are_clear(tmp_path):
    with pytest.raises(AudioInputError, match="not found"):
        read_audio(tmp_path / "nope.wav")
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioInputError, match="empty"):
        read_audio(tmp_path / "empty.wav")
    (tmp_path / "junk.mp3").write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(AudioInputError, match="cannot decode"):
        read_audio(tmp_path / "junk.mp3")
    with pytest.raises(AudioInputError, match="directory"):
        read_audio(tmp_path)


def test_write_then_read_stereo(tmp_path):
    st = np.stack([np.arange(100, dtype=np.int16), -np.arange(100, dtype=np.int16)], axis=1)
    write_wav(tmp_path / "s.wav", st)
    back, rate = read_wav(tmp_path / "s.wav")
    assert rate == 16000 and np.array_equal(back, st)
