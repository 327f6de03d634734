"""The pipeline's audio conversions: lossless int16 file I/O, one float scale both ways, and
reading any common input (WAV/FLAC/OGG via soundfile, MP3 and others via av; any rate, stereo)."""

import io
from pathlib import Path

import numpy as np
import pytest

from agent.audio import (
    float_to_int16,
    int16_to_float,
    read_audio,
    read_channels,
    read_wav,
    write_wav,
)
from agent.errors import AudioInputError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
CLIP = DATA / "ls-dev-clean-1988-24833-0000.wav"
WAVS = sorted(DATA.glob("*.wav")) + sorted((ROOT / "examples" / "audio").glob("*.wav"))


def _clip() -> np.ndarray:
    return read_wav(CLIP)[0][:, 0]


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("path", WAVS, ids=lambda p: p.name)
def test_every_wav_round_trips_bit_exact(path, tmp_path):
    samples, rate = read_wav(path)
    mono = samples[:, 0]
    assert np.array_equal(read_audio(path, rate=rate), mono)
    if rate == 16000:
        assert np.array_equal(read_audio(path), mono)
    write_wav(tmp_path / "copy.wav", read_audio(path, rate=rate), rate)
    back, back_rate = read_wav(tmp_path / "copy.wav")
    assert back_rate == rate and np.array_equal(back[:, 0], mono)


def test_16_bit_flac_and_equal_stereo_channels_are_read_bit_exact(tmp_path):
    sf = pytest.importorskip("soundfile")
    pcm = read_wav(DATA / "ls-test-clean-4507-16021-0012.wav")[0][:, 0]
    sf.write(tmp_path / "a.flac", pcm, 16000, subtype="PCM_16")
    sf.write(tmp_path / "b.wav", np.stack([pcm, pcm], axis=1), 16000, subtype="PCM_16")
    assert np.array_equal(read_audio(tmp_path / "a.flac"), pcm)
    assert np.array_equal(read_audio(tmp_path / "b.wav"), pcm)


def encode_with_av(av, path: Path, codec: str, pcm: np.ndarray) -> None:
    """Write mono 16 kHz ``pcm`` to ``path`` with ``codec`` (the container from the suffix)."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def test_integer_pcm_through_av_stays_bit_exact(tmp_path):
    av = pytest.importorskip("av")
    pcm = read_wav(DATA / "ls-test-clean-4507-16021-0012.wav")[0][:, 0]
    path = tmp_path / "call.mka"  # Matroska: soundfile cannot read it, av must
    encode_with_av(av, path, "pcm_s16le", pcm)
    assert np.array_equal(read_audio(path), pcm)


def test_one_float_scale_both_ways():
    every = np.arange(-32768, 32768, dtype=np.int16)
    as_float = int16_to_float(every)
    assert as_float.dtype == np.float32 and as_float[0] == -1.0 and as_float[-1] == 32767 / 32768
    assert np.array_equal(float_to_int16(as_float), every)  # int16 -> float -> int16: exact
    x = np.random.default_rng(0).uniform(-1.0, 32767 / 32768, 200_000).astype(np.float32)
    back = int16_to_float(float_to_int16(x))
    assert np.abs(back - x).max() <= 0.5 / 32768 + 1e-9  # float -> int16 -> float: half a step
    assert float_to_int16(np.array([1.5, -1.5, 1.0])).tolist() == [32767, -32768, 32767]  # clipped


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
    encode_with_av(av, path, "mp3", pcm)
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


def _in_every_form(path: Path) -> dict[str, object]:
    """The file at ``path`` as each kind of source read_audio takes."""

    class Pipe(io.RawIOBase):  # a stream that cannot seek, like a socket or stdin
        def __init__(self, data: bytes) -> None:
            self.data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            return self.data.readinto(b)

    data = path.read_bytes()
    return {"str": str(path), "bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data),
            "file": open(path, "rb"), "BytesIO": io.BytesIO(data), "pipe": Pipe(data)}


@pytest.mark.parametrize("codec", ["wav", "flac", "pcm_s16le", "aac", "libopus"])
def test_bytes_and_file_objects_decode_exactly_as_the_path(codec, tmp_path):
    """16-bit PCM (WAV, FLAC; Matroska, which only av reads) bit-exact from memory as from disk;
    lossy codecs (AAC in M4A through av, Opus in Ogg) give the very same samples either way."""
    pcm = read_wav(DATA / "ls-test-clean-4507-16021-0012.wav")[0][:, 0]
    if codec in ("wav", "flac"):
        sf = pytest.importorskip("soundfile")
        path = tmp_path / f"call.{codec}"
        sf.write(path, pcm, 16000, subtype="PCM_16")
    else:
        av = pytest.importorskip("av")
        path = tmp_path / ("call." + {"pcm_s16le": "mka", "aac": "m4a", "libopus": "ogg"}[codec])
        try:
            encode_with_av(av, path, codec, pcm)
        except Exception as exc:  # an FFmpeg build without this encoder
            pytest.skip(f"av cannot encode {codec}: {exc}")
    from_path = read_audio(path)
    if codec in ("wav", "flac", "pcm_s16le"):
        assert np.array_equal(from_path, pcm)
    else:
        # it is the clip (lossy codecs delay it by up to 2048 samples of priming)
        assert max(_corr(from_path[k:], pcm) for k in range(0, 2400, 8)) > 0.9
    for kind, source in _in_every_form(path).items():
        assert np.array_equal(read_audio(source), from_path), kind
        if kind == "file":
            source.close()


def test_bad_bytes_are_named_in_the_error():
    with pytest.raises(AudioInputError, match=r"cannot decode upload\.wav: unknown or corrupt"):
        read_audio(b"RIFF not really" * 50, name="upload.wav")
    with pytest.raises(AudioInputError, match="cannot decode the audio"):
        read_audio(io.BytesIO(b"\x00\x01garbage" * 100))
    with pytest.raises(AudioInputError, match="empty: upload.wav"):
        read_audio(b"", name="upload.wav")


def test_channels_come_back_each_on_its_own_bit_exact(tmp_path):
    left = _clip()
    right = np.roll(left, 4000) // 2  # another signal: not the mean, not a copy
    write_wav(tmp_path / "call.wav", np.stack([left, right], axis=1))
    got = read_channels(tmp_path / "call.wav")
    assert len(got) == 2 and np.array_equal(got[0], left) and np.array_equal(got[1], right)
    at_8k = read_channels(tmp_path / "call.wav", rate=8000)
    assert [len(c) for c in at_8k] == [len(left) // 2] * 2
    assert _corr(at_8k[0], read_audio(CLIP, rate=8000)) > 0.999
    mono = read_channels(CLIP)
    assert len(mono) == 1 and np.array_equal(mono[0], left)
    with pytest.raises(AudioInputError, match="not found"):
        read_channels(tmp_path / "nothing.wav")
