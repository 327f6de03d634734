"""Who spoke when through asr-serve's OpenAI-compatible endpoint, with the official ``openai``
SDK: OpenAI's diarized_json shape, its stream of ``transcript.text.segment`` events, word times
in verbose_json, subtitles that parse with real parsers; and the event writer's pacing."""

import asyncio
import io
import json
import threading

import numpy as np
import pytest
import soundfile
import speech
import srt
import webvtt

from agent.audio import RATE, read_audio
from agent.config import ASRConfig, VADConfig
from stages.asr.engine import ASREngine
from stages.asr.openai_api import EventWriter, SpeakerTools, speaker_label
from stages.asr.server import ASRServer
from stages.asr.wer import wer

openai = pytest.importorskip("openai")

SPEAKER = speech.DATA / "speaker"


def two_voices() -> tuple[bytes, list[tuple[str, str]]]:
    """A WAV of two voices taking turns (CAM++ centroids 1.13 apart), and (voice, reference)
    in order."""
    a = [("kittens", speech.load("kittens")),
         ("", read_audio(SPEAKER / "ls-dev-clean-1988-24833-0003.wav"))]
    turns = [("A", *a[0]), ("B", "quilter", speech.load("quilter")), ("A", *a[1])]
    gap = np.zeros(RATE, np.int16)
    pcm = np.concatenate([gap] + [x for _, _, clip in turns for x in (clip, gap)])
    buf = io.BytesIO()
    soundfile.write(buf, pcm, RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue(), [(who, speech.text(name) if name else "") for who, name, _ in turns]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    from stages.asr.whisper import WhisperBackend
    from stages.speaker import load_embedder
    from stages.vad import SileroModel

    backend = WhisperBackend(ASRConfig(), word_times=True)
    backend.warmup()
    tools = SpeakerTools(SileroModel(VADConfig()), load_embedder("campplus"))
    started, stop = threading.Event(), {}
    sock = str(tmp_path_factory.mktemp("asr") / "asr.sock")

    def serve() -> None:
        async def main():
            engine = ASREngine(backend, capacity=4)
            server = ASRServer(engine)
            server.speakers = tools
            await server.start_unix(sock)
            stop["port"] = await server.start_http("127.0.0.1", 0)
            # one started without --diarize or --word-times
            plain = ASRServer(ASREngine(WhisperBackend(ASRConfig()), capacity=2))
            await plain.start_unix(sock + "2")
            stop["plain"] = await plain.start_http("127.0.0.1", 0)
            stop["event"] = asyncio.Event()
            stop["loop"] = asyncio.get_running_loop()
            started.set()
            await stop["event"].wait()
            for s in (server, plain):
                await s.close()
                s.engine.close()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert started.wait(120)
        yield f"http://127.0.0.1:{stop['port']}/v1", f"http://127.0.0.1:{stop['plain']}/v1"
    finally:
        if "loop" in stop:
            stop["loop"].call_soon_threadsafe(stop["event"].set)
        thread.join(60)


def test_diarized_json_has_each_voice_on_its_own_speaker(server_url):
    url, _ = server_url
    clip, turns = two_voices()
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    got = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize", file=("t.wav", clip),
                                             response_format="diarized_json",
                                             chunking_strategy="auto")
    assert type(got).__name__ == "TranscriptionDiarized"  # the SDK's own parse of the shape
    assert got.task == "transcribe" and got.duration == pytest.approx(len(clip[44:]) / 2 / RATE, abs=0.01)
    speakers = [s.speaker for s in got.segments]
    assert speakers[0] == "A" and set(speakers) == {"A", "B"}
    by = {w: " ".join(s.text for s in got.segments if s.speaker == w) for w in ("A", "B")}
    assert wer(speech.text("quilter"), by["B"]) <= 0.1, by
    assert wer(speech.text("kittens"), by["A"].split(".")[0]) <= 0.15, by
    assert [s.id for s in got.segments] == [f"seg_{i}" for i in range(len(got.segments))]
    assert all(s.type == "transcript.text.segment" and s.start < s.end for s in got.segments)
    assert got.text == " ".join(s.text for s in got.segments)


def test_the_diarized_stream_sends_segments_then_done(server_url):
    url, _ = server_url
    clip, _ = two_voices()
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    events = list(client.audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize", file=("t.wav", clip), response_format="diarized_json",
        stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.segment"}
    segs = events[:-1]
    assert {e.speaker for e in segs} == {"A", "B"} and segs[0].speaker == "A"
    assert events[-1].text == " ".join(e.text for e in segs)


def test_word_times_and_subtitles_with_speakers(server_url):
    url, _ = server_url
    clip, _ = two_voices()
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    verbose = client.audio.transcriptions.create(model="whisper-1", file=("t.wav", clip),
                                                 response_format="verbose_json",
                                                 timestamp_granularities=["word", "segment"])
    words = verbose.words
    assert len(words) >= 20 and all(w.start <= w.end for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
    first = next(w for w in words if "kitten" in w.word.lower())
    assert 1.5 < first.start < 3.5  # "kittens" is about 0.8 s into the clip, 1 s in
    as_srt = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize",
                                                file=("t.wav", clip), response_format="srt")
    cues = list(srt.parse(str(as_srt)))
    assert {c.content.split(":", 1)[0] for c in cues} == {"A", "B"}
    as_vtt = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize",
                                                file=("t.wav", clip), response_format="vtt")
    vtt = webvtt.from_buffer(io.StringIO(str(as_vtt)))
    assert {c.voice for c in vtt.captions} == {"A", "B"}


def test_a_server_without_speaker_tools_says_how_to_get_them(server_url):
    _, plain = server_url
    clip, _ = two_voices()
    client = openai.OpenAI(base_url=plain, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="--diarize"):
        client.audio.transcriptions.create(model="whisper-1", file=("t.wav", clip),
                                           response_format="diarized_json")
    with pytest.raises(openai.BadRequestError, match="--word-times"):
        client.audio.transcriptions.create(model="whisper-1", file=("t.wav", clip),
                                           response_format="verbose_json",
                                           timestamp_granularities=["word"])
    with pytest.raises(openai.BadRequestError, match="stream=true"):
        client.audio.transcriptions.create(model="whisper-1", file=("t.wav", clip),
                                           response_format="srt", stream=True)


def test_speaker_labels_run_like_spreadsheet_columns():
    assert [speaker_label(i) for i in (0, 1, 25, 26, 27, 51, 52)] == \
        ["A", "B", "Z", "AA", "AB", "AZ", "BA"]


class Recorder:
    def __init__(self):
        self.writes: list[tuple[float, bytes]] = []

    async def write(self, data: bytes) -> None:
        self.writes.append((asyncio.get_running_loop().time(), data))
        await asyncio.sleep(0)


def test_events_go_out_whole_the_first_at_once_then_at_most_every_50_ms():
    async def main():
        resp = Recorder()
        w = EventWriter(resp)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        w.send({"type": "transcript.text.delta", "delta": "東京で"})
        await asyncio.sleep(0.005)
        assert len(resp.writes) == 1 and resp.writes[0][0] - t0 < 0.01  # the first at once
        for i in range(200):  # a fast producer: 200 events in ~0.2 s
            w.send({"type": "transcript.text.delta", "delta": f" é{i}"})
            await asyncio.sleep(0.001)
        await w.close()
        return t0, resp.writes

    t0, writes = asyncio.run(main())
    gaps = [b[0] - a[0] for a, b in zip(writes, writes[1:], strict=False)]
    assert min(gaps) >= 0.049 and len(writes) <= 8  # ~0.2 s / 50 ms, not 201 writes
    body = b"".join(d for _, d in writes)
    events = [json.loads(x.removeprefix(b"data: ")) for x in body.split(b"\n\n") if x]
    assert [e["delta"] for e in events] == ["東京で"] + [f" é{i}" for i in range(200)]
    for _, data in writes:  # every write is whole events: UTF-8 that decodes on its own
        assert data.endswith(b"\n\n") and data.decode("utf-8")


def test_a_known_voice_is_named_and_the_others_lettered(server_url):
    import base64

    url, _ = server_url
    clip, _ = two_voices()
    # another recording of voice A, not in the upload
    sample = io.BytesIO()
    soundfile.write(sample, read_audio(SPEAKER / "ls-dev-clean-1988-24833-0001.wav"), RATE,
                    format="WAV", subtype="PCM_16")
    ref = "data:audio/wav;base64," + base64.b64encode(sample.getvalue()).decode()
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    got = client.audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize", file=("t.wav", clip), response_format="diarized_json",
        known_speaker_names=["agnes"], known_speaker_references=[ref])
    speakers = [s.speaker for s in got.segments]
    assert speakers[0] == "agnes" and set(speakers) == {"agnes", "A"}, speakers
    quilter = next(s for s in got.segments if "quilter" in s.text.lower())
    assert quilter.speaker == "A"  # the voice nobody named gets the first letter
    with pytest.raises(openai.BadRequestError, match="one reference per name"):
        client.audio.transcriptions.create(
            model="gpt-4o-transcribe-diarize", file=("t.wav", clip),
            response_format="diarized_json", known_speaker_names=["a", "b"],
            known_speaker_references=[ref])
    with pytest.raises(openai.BadRequestError, match="data URL"):
        client.audio.transcriptions.create(
            model="gpt-4o-transcribe-diarize", file=("t.wav", clip),
            response_format="diarized_json", known_speaker_names=["a"],
            known_speaker_references=["https://example.com/a.wav"])
