"""Offline transcription piece by piece (``stages.asr.progressive``): the same answer as the
whole file at once, segments out before the file is read to its end, a damaged file's audio
before the damage kept, and diarization whose speakers keep their numbers as the file goes on."""

import numpy as np
import pytest
import soundfile
import speech

from agent.audio import RATE, read_audio
from agent.config import ASRConfig, VADConfig
from agent.errors import AudioInputError
from stages.asr.progressive import DiarizeWith, FileDone, FileSegments, transcribe_progressively
from stages.asr.sources import ArraySource, DamagedAudio, FileSource
from stages.asr.wer import wer

CLIPS = ("kittens", "quilter", "honest")  # far from the model's edge (tests/speech.py)


@pytest.fixture(scope="module")
def models():
    from stages.asr.whisper import WhisperBackend
    from stages.vad import SileroModel

    backend = WhisperBackend(ASRConfig(threads=1))
    backend.warmup()
    return backend, SileroModel(VADConfig())


def recording(seconds: float) -> tuple[np.ndarray, str]:
    """The clips over and over with pauses of 0.5-2 s, whole utterances up to ``seconds``
    (int16), and its reference text."""
    rng = np.random.default_rng(7)
    parts, said, n = [], [], 0
    while True:
        for name in CLIPS:
            clip, gap = speech.load(name), np.zeros(int(rng.uniform(0.5, 2.0) * RATE), np.int16)
            if n + len(clip) + len(gap) > seconds * RATE:
                return np.concatenate(parts), " ".join(said)
            parts += [clip, gap]
            said.append(speech.text(name))
            n += len(clip) + len(gap)


class Counted(ArraySource):
    """A source that counts what it has handed out."""

    def __init__(self, name, channels):
        super().__init__(name, channels)
        self.given = 0

    def read(self, samples):
        out = super().read(samples)
        self.given += len(out)
        return out


def test_pieces_give_the_whole_files_answer_and_the_first_segments_early(models):
    backend, vad = models
    pcm, said = recording(400)  # pieces of 120 + 240 s, then the rest
    # (12-s chunks: tiny.en skips sentences in 28-s ones, whatever the pieces)
    whole = [e for e in transcribe_progressively([ArraySource("a", [pcm])], backend, vad,
                                                 max_chunk_s=12.0, pieces_s=(10_000,))
             if isinstance(e, FileDone)]
    src = Counted("a", [pcm])
    first_at, events = None, []
    for e in transcribe_progressively([src], backend, vad, max_chunk_s=12.0):
        events.append(e)
        if isinstance(e, FileSegments) and first_at is None:
            first_at = src.given
    (done,) = [e for e in events if isinstance(e, FileDone)]
    (a,), (b,) = whole[0].results, done.results
    # the VAD saw the same 60-s pieces: the same regions, chunks and text
    assert a.regions == b.regions and a.speech == b.speech
    assert [(s.start, s.end, s.text) for s in a.segments] == [(s.start, s.end, s.text) for s in b.segments]
    assert first_at == 120 * RATE  # the first segments came out after the first piece
    streamed = [s for e in events if isinstance(e, FileSegments) for s in e.segments]
    assert streamed == done.segments
    starts = [s.start for s in streamed]
    assert starts == sorted(starts) and len(streamed) > 20
    # (tiny.en on ~70 utterances in 12-s chunks: at most 0.07 here, exact, ±1 and dithered)
    assert wer(said, " ".join(s.text for s in streamed)) <= 0.15


def test_many_short_files_share_a_round_and_come_back_in_order(models):
    backend, vad = models
    clips = [speech.load(c) for c in CLIPS]
    events = list(transcribe_progressively([ArraySource(c, [x]) for c, x in zip(CLIPS, clips, strict=True)],
                                           backend, vad))
    done = [e for e in events if isinstance(e, FileDone)]
    assert [d.name for d in done] == list(CLIPS)
    text = " ".join(s.text for d in done for s in d.segments)
    assert wer(" ".join(speech.text(c) for c in CLIPS), text) <= 0.1


def damaged_flac(tmp_path, pcm: np.ndarray, keep: float):
    path = tmp_path / "cut.flac"
    soundfile.write(path, pcm, RATE)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def test_a_damaged_file_keeps_the_segments_before_the_damage(models, tmp_path):
    backend, vad = models
    gap = np.zeros(3 * RATE, np.int16)  # long pauses: the cut falls in one of them
    pcm = np.concatenate([x for c in CLIPS for x in (speech.load(c), gap)])
    path = damaged_flac(tmp_path, pcm, 0.75)
    (done,) = [e for e in transcribe_progressively([FileSource(path)], backend, vad)
               if isinstance(e, FileDone)]
    assert isinstance(done.error, DamagedAudio)
    assert "damaged" in str(done.error) and "before that point" in str(done.error)
    assert 0 < done.error.at_s < len(pcm) / RATE and done.duration_s == pytest.approx(done.error.at_s)
    got = " ".join(s.text for s in done.segments)
    assert wer(" ".join(speech.text(c) for c in CLIPS[:2]), got) <= 0.1, got


def test_sources_report_a_truncated_wav_after_its_samples(tmp_path):
    pcm = (np.random.default_rng(1).standard_normal(10 * RATE) * 2000).astype(np.int16)
    path = tmp_path / "t.wav"
    soundfile.write(path, pcm, RATE, subtype="PCM_16")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    src = FileSource(path)
    got = []
    with pytest.raises(DamagedAudio, match="cut short: its header promises 10.0 s"):
        while len(block := src.read(RATE)):
            got.append(block)
    assert sum(map(len, got)) == (len(data) // 2 - 44) // 2  # every sample the file holds
    assert np.array_equal(np.concatenate(got)[:, 0], pcm[: sum(map(len, got))])


def test_sources_read_other_rates_and_split_channels_like_the_whole_file_readers(tmp_path):
    from agent.audio import read_channels

    rng = np.random.default_rng(2)
    stereo = (rng.standard_normal((3 * 44100, 2)) * 3000).astype(np.int16)
    path = tmp_path / "s.wav"
    soundfile.write(path, stereo, 44100, subtype="PCM_16")
    src = FileSource(path, split=True)
    assert src.channels == 2
    blocks = []
    while len(block := src.read(RATE // 3)):
        blocks.append(block)
    got = np.concatenate(blocks)
    whole = read_channels(path)
    assert got.shape == (len(whole[0]), 2)
    for c in range(2):  # a streamed resampler: the same signal to within rounding
        assert np.max(np.abs(got[:, c].astype(int) - whole[c].astype(int))) <= 2
    mono = FileSource(path)
    assert mono.channels == 1 and mono.read(RATE).shape == (RATE, 1)


def test_unreadable_files_fail_to_open_with_the_reason(tmp_path):
    empty = tmp_path / "e.wav"
    empty.write_bytes(b"")
    junk = tmp_path / "j.wav"
    junk.write_bytes(b"not audio at all" * 100)
    for path, why in ((empty, "empty"), (junk, "cannot decode"), (tmp_path / "no.wav", "not found")):
        with pytest.raises(AudioInputError, match=why):
            FileSource(path)


# --- diarization as the file goes on ------------------------------------------------------------
SPEAKER = speech.DATA / "speaker"


def voices() -> dict[str, list[np.ndarray]]:
    """Three voices far apart (CAM++ centroid distances 1.03-1.16; the clustering cuts at 0.8)."""
    return {
        "A": [speech.load("kittens"), read_audio(SPEAKER / "ls-dev-clean-1988-24833-0003.wav"),
              read_audio(SPEAKER / "ls-dev-clean-1988-24833-0001.wav")],
        "B": [speech.load("quilter")],
        "C": [read_audio(speech.DATA / "ls-test-clean-4507-16021-0012.wav")],
    }


def test_a_voice_first_heard_later_becomes_a_new_speaker_and_the_others_keep_theirs():
    from stages.speaker import load_embedder
    from stages.speaker.online import OnlineDiarizer

    v = voices()
    # pieces of utterances: C first comes after the first clustering, twice in one piece
    pieces = [[("A", 0)], [("B", 0)], [("A", 1)], [("B", 0)], [("C", 0), ("C", 0)], [("A", 2)],
              [("C", 0)]]
    gap = np.zeros(RATE, np.int16)
    pcm, spans, fed, at = [gap], [], [], len(gap)
    for piece in pieces:
        fed.append([])
        for who, i in piece:
            clip = v[who][i]
            pcm += [clip, gap]
            spans.append((at, at + len(clip), who))
            fed[-1].append((at, at + len(clip)))
            at += len(clip) + len(gap)
    audio = np.concatenate(pcm)
    emb = load_embedder("campplus")
    online = OnlineDiarizer(emb, first_s=8.0)
    turns, calls_with_none = [], 0
    for regions in fed:
        got = online.add(audio, 0, regions)
        calls_with_none += not got
        turns += got
    assert calls_with_none >= 1  # the first speech waited for the first clustering
    assert online.count == 3
    heard: dict[int, set[int]] = {}
    for t in turns:  # each turn lies inside one utterance
        (u,) = [i for i, (a, b, _) in enumerate(spans) if a <= t.start < b]
        heard.setdefault(u, set()).add(t.speaker)
    assert sorted(heard) == list(range(len(spans)))
    label: dict[str, set[int]] = {}
    for u, got in heard.items():
        assert len(got) == 1, heard  # one voice per utterance
        label.setdefault(spans[u][2], set()).update(got)
    assert all(len(x) == 1 for x in label.values()), label  # a voice keeps its number
    assert len(set.union(*label.values())) == 3, label


def test_diarized_progressive_run_labels_every_segment(models):
    from stages.asr.whisper import WhisperBackend
    from stages.speaker import load_embedder

    _, vad = models
    backend = WhisperBackend(ASRConfig(threads=1), word_times=True)
    v = voices()
    gap = np.zeros(RATE, np.int16)
    order = [("A", 0), ("B", 0), ("A", 1), ("C", 0)] * 3
    pcm = np.concatenate([x for who, i in order for x in (v[who][i], gap)])
    emb = load_embedder("campplus")
    events = list(transcribe_progressively([ArraySource("d", [pcm])], backend, vad,
                                           diarize=DiarizeWith(emb, first_s=20.0),
                                           pieces_s=(30, 30)))
    (done,) = [e for e in events if isinstance(e, FileDone)]
    assert len([e for e in events if isinstance(e, FileSegments)]) >= 2  # out as it went
    assert {s.speaker for s in done.segments} == {0, 1, 2}
    # every "kittens" line (speaker A) is on the speaker of the first segment
    kittens = [s for s in done.segments if "kittens" in s.text.lower()]
    assert len(kittens) == 3 and {s.speaker for s in kittens} == {done.segments[0].speaker}


def test_a_short_file_after_a_long_one_finishes_first_and_results_keep_the_inputs_order(models):
    from stages.asr.progressive import transcribe_files

    backend, vad = models
    long, said = recording(200)  # two pieces: 120 s, then the rest
    short = speech.load("honest")
    events = list(transcribe_progressively([ArraySource("long", [long]), ArraySource("short", [short])],
                                           backend, vad, max_chunk_s=12.0))
    assert [e.name for e in events if isinstance(e, FileDone)] == ["short", "long"]
    assert [e.index for e in events if isinstance(e, FileDone)] == [1, 0]
    results = transcribe_files([("long", long), ("short", short)], backend, vad, max_chunk_s=12.0)
    assert [r.name for r in results] == ["long", "short"]
    assert wer(speech.text("honest"), results[1].text) == 0


def test_a_file_only_ffmpeg_reads_streams_the_samples_the_whole_file_reader_gives(tmp_path):
    pytest.importorskip("av")
    clip = speech.load("kittens")
    path = tmp_path / "k.mkv"  # libsndfile cannot read Matroska: the PyAV path
    speech.matroska(clip, path)
    src = FileSource(path)
    blocks = []
    while len(block := src.read(RATE // 2)):
        blocks.append(block)
    src.close()
    assert np.array_equal(np.concatenate(blocks)[:, 0], read_audio(path))
    assert np.array_equal(read_audio(path), clip)
