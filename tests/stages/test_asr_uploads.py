"""Uploads decoded so they reach nothing but their own bytes: every accepted container decoded
like ``voxline run`` decodes a file, anything that lists other files refused, FFmpeg opening no
protocol even when told a listing demuxer, and decoding stopped at the cap."""

import io
import tracemalloc

import numpy as np
import pytest
import soundfile
import speech

from agent.audio import read_audio
from agent.errors import AudioInputError
from stages.asr import sources, uploads
from stages.asr.uploads import AudioTooLong, UnsupportedUpload, container_of, decode_upload

av = pytest.importorskip("av")
HOUR = 3600 * 16000


def encoded(fmt: str, codec: str, pcm: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def written(pcm: np.ndarray, rate: int = 16000, **kw) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, pcm, rate, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def clip():
    return speech.load("kittens")


@pytest.mark.parametrize("block_s", [0.1, 0.256, 1.0])
def test_an_mp3_gives_the_same_samples_however_it_is_read(clip, tmp_path, monkeypatch, block_s):
    # libsndfile's MP3 decoding depended on the reads' lengths (its 4096-sample reads of this
    # file were up to 32 steps off its whole read, with libmpg123 errors); FFmpeg's does not
    monkeypatch.setattr(uploads, "BLOCK_S", block_s)
    monkeypatch.setattr(sources, "BLOCK_S", block_s)
    data = encoded("mp3", "mp3", clip)
    whole = read_audio(data)  # voxline run
    assert np.array_equal(decode_upload(data, HOUR, "mp3"), whole)  # asr-serve
    (tmp_path / "call.mp3").write_bytes(data)
    source, parts = sources.FileSource(tmp_path / "call.mp3"), []  # voxline transcribe
    while len(part := source.read(3000)):
        parts.append(part[:, 0])
    source.close()
    assert np.array_equal(np.concatenate(parts), whole)


def test_every_accepted_container_decodes_as_a_file_would(clip):
    files = {
        "wav": written(clip, format="WAV", subtype="PCM_16"),
        "wav 44.1 kHz stereo": written(np.repeat(clip[:, None], 2, 1), 44100, format="WAV"),
        "flac": written(clip, format="FLAC"),
        "ogg opus": written(clip, format="OGG", subtype="OPUS"),
        "aiff": written(clip, format="AIFF"),
        "mp3": encoded("mp3", "mp3", clip),
        "matroska": encoded("matroska", "pcm_s16le", clip),
        "webm opus": encoded("webm", "opus", clip, rate=48000),
        "m4a": encoded("ipod", "aac", clip),
        "adts aac": encoded("adts", "aac", clip),
    }
    for name, data in files.items():
        got = decode_upload(data, HOUR, name)
        assert np.array_equal(got, read_audio(data)), name  # the same samples as voxline run
    assert np.array_equal(decode_upload(files["wav"], HOUR), clip)  # PCM16: bit-exact
    assert {container_of(d) for d in files.values()} == set(uploads.DEMUXERS)


LISTS = {
    "hls": b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n/etc/hostname.ts\n#EXT-X-ENDLIST\n",
    "concat": b"ffconcat version 1.0\nfile 'secret.wav'\n",
    "pls": b"[playlist]\nFile1=/tmp/x.mp3\n",
    "spaced": b"\n  #EXTM3U\n#EXTINF:1,\nx.aac\n",
}


@pytest.mark.parametrize("kind", LISTS)
def test_lists_of_other_files_are_refused_before_any_decoder_sees_them(kind):
    with pytest.raises(UnsupportedUpload, match="playlist or a list of other files"):
        decode_upload(LISTS[kind], HOUR, "list")


def test_anything_else_is_refused_with_the_list_of_what_is_taken():
    for data in (b"RIFF not a wave file", b"\x00" * 64, b"<html>hello</html>", b"\xff\x00junk"):
        with pytest.raises(UnsupportedUpload, match="WAV, FLAC, MP3"):
            decode_upload(data, HOUR, "it")
    with pytest.raises(AudioInputError, match="empty"):
        decode_upload(b"", HOUR, "it")


def test_ffmpeg_may_open_no_protocol_even_when_told_a_listing_demuxer(tmp_path, monkeypatch, clip):
    """The second wall: were a listing demuxer ever chosen, it could still open nothing."""
    (tmp_path / "secret.wav").write_bytes(written(clip, format="WAV"))
    monkeypatch.chdir(tmp_path)
    listing = b"ffconcat version 1.0\nfile 'secret.wav'\n"
    assert len(read_audio(listing)) == len(clip)  # what plain FFmpeg does with it
    monkeypatch.setitem(uploads.DEMUXERS, "wav", "concat")
    monkeypatch.setattr(uploads, "container_of", lambda data: "wav")
    monkeypatch.setitem(uploads.SOUNDFILE_FORMATS, "wav", set())
    with pytest.raises(AudioInputError, match="cannot decode"):
        decode_upload(listing, HOUR, "list")


def test_decoding_stops_at_the_cap_and_memory_follows_the_cap_not_the_file():
    minutes = 40
    zeros = np.zeros(16000 * 60, np.int16)
    buf = io.BytesIO()
    with soundfile.SoundFile(buf, "w", 16000, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(minutes):
            f.write(zeros)
    data = buf.getvalue()
    tracemalloc.start()  # numpy's buffers are traced too
    try:
        with pytest.raises(AudioTooLong, match="at most 60 s") as info:
            decode_upload(data, 60 * 16000, "quiet.flac")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.limit_s == 60
    # 60 s of samples are 1.9 MB; the file's 40 minutes would be 77 MB
    assert peak < 12 * 2**20, f"peak {peak / 2**20:.0f} MB for a 60-s cap ({minutes} min in the file)"
    assert len(decode_upload(data, minutes * 60 * 16000, "quiet.flac")) == minutes * 60 * 16000


def test_a_header_claiming_an_absurd_rate_is_refused():
    data = bytearray(written(np.zeros(1600, np.int16), format="WAV"))
    data[24:28] = (10**9).to_bytes(4, "little")  # sample rate
    with pytest.raises(AudioInputError, match="this server takes up to"):
        decode_upload(bytes(data), HOUR, "odd.wav")


def test_a_cut_short_upload_raises_or_gives_its_audio_and_the_damage():
    from stages.asr.uploads import DamagedUpload, decode_upload_partial

    pcm = (np.random.default_rng(3).standard_normal(10 * 16000) * 3000).astype(np.int16)
    wav = written(pcm, format="WAV")
    cut = wav[: len(wav) // 2]
    with pytest.raises(DamagedUpload, match="cut short: its header promises 10.0 s"):
        decode_upload(cut, HOUR, "half.wav")
    got, damage = decode_upload_partial(cut, HOUR, "half.wav")
    assert isinstance(damage, DamagedUpload) and "half.wav is damaged 5.0 s in" in str(damage)
    assert np.array_equal(got, pcm[: len(got)]) and len(got) == (len(cut) - 44) // 2
    flac = written(pcm, format="FLAC")
    got, damage = decode_upload_partial(flac[: len(flac) // 2], HOUR, "half.flac")
    assert damage is not None and 0 < len(got) < len(pcm)
    assert np.array_equal(got, pcm[: len(got)])  # lossless: what came before is exact
    got, damage = decode_upload_partial(wav, HOUR, "whole.wav")
    assert damage is None and np.array_equal(got, pcm)
    with pytest.raises(AudioInputError, match="cannot decode"):  # damaged before any audio
        decode_upload_partial(wav[:44], HOUR, "none.wav")
