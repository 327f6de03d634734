"""The OpenAI-compatible endpoint on its own: a stand-in server (the four attributes of
``TranscriptionServer``) and an engine that reports what it was given, so uploads are checked
fast and exactly: decoded in memory, cut like long audio, bad uploads refused with a message."""

import asyncio
import io
import tempfile
import wave
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
import speech

from agent.ops import Health, OpsEndpoints
from stages.asr import openai_api
from stages.asr.cutting import cut_points
from stages.asr.engine_share import EngineShare

RATE = 16000


@dataclass
class Heard:
    text: str
    words: tuple = ()


class CountingEngine:
    """Answers every chunk with its length and first sample, at once."""

    max_batch = 4

    def __init__(self) -> None:
        self.open_slots = 0
        self.chunks: list[np.ndarray] = []

    def open(self) -> object:
        self.open_slots += 1
        return object()

    def close_slot(self, slot: object) -> None:
        self.open_slots -= 1

    def submit(self, slot: object, audio: np.ndarray, final: bool = False, prompt: str = "") -> asyncio.Future:
        self.chunks.append(audio)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(Heard(f"n{len(audio)}"))
        return fut


@dataclass
class StandIn:
    engine: CountingEngine
    decode_pool: object = None
    language: str = "en"
    max_file_samples: int = 60 * RATE
    draining: bool = False
    uploads: int = 0
    ops: OpsEndpoints = field(default_factory=lambda: OpsEndpoints(Health(loaded=True)))

    def share(self) -> EngineShare:
        return EngineShare(self.engine, 4)


def wav_bytes(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def post_all(uploads, max_file_s=60.0):
    """POST each (filename, bytes, form fields) in turn to a fresh endpoint; the responses,
    the stand-in server and its engine."""
    server = StandIn(CountingEngine(), max_file_samples=int(max_file_s * RATE))

    async def main():
        runner, port = await openai_api.start(server, "127.0.0.1", 0,
                                              openai_api.HTTPOptions(max_upload_mb=4))
        url = f"http://127.0.0.1:{port}{openai_api.PATH}"
        try:
            async with httpx.AsyncClient(timeout=60) as http:
                return [await http.post(url, files={"file": (name, data)}, data=fields)
                        for name, data, fields in uploads]
        finally:
            await runner.cleanup()
            server.decode_pool.shutdown(wait=True)

    return asyncio.run(main()), server


@pytest.fixture
def no_temporary_files(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an upload went through a temporary file")

    for name in ("mkstemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
        monkeypatch.setattr(tempfile, name, refuse)


def test_garbage_is_refused_with_a_message_and_the_server_keeps_serving(no_temporary_files):
    clip = speech.load("kittens")
    (bad, empty, good), server = post_all([
        ("call.wav", b"RIFF not really" * 50, {}),
        ("call.wav", b"", {}),
        ("kittens.wav", wav_bytes(clip), {}),
    ])
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["param"] == "file" and error["type"] == "invalid_request_error"
    assert "could not decode the uploaded audio" in error["message"] and "call.wav" in error["message"]
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    assert good.status_code == 200 and good.json() == {"text": f"n{len(clip)}"}
    assert np.array_equal(server.engine.chunks[0], clip / np.float32(32768))  # decoded bit-exact
    assert server.engine.open_slots == 0


def test_long_uploads_are_cut_like_long_audio_and_timed_in_seconds():
    gap = np.zeros(RATE // 2, np.int16)
    pcm = np.concatenate([p for _ in range(4) for n in ("kittens", "honest") for p in (speech.load(n), gap)])
    (resp,), _ = post_all([("long.wav", wav_bytes(pcm), {"response_format": "verbose_json"})])
    out = resp.json()
    cuts = cut_points(pcm)
    assert len(cuts) > 1
    assert out["duration"] == round(len(pcm) / RATE, 3)
    assert [(s["start"], s["end"], s["text"]) for s in out["segments"]] == [
        (round(a / RATE, 3), round(b / RATE, 3), f"n{b - a}") for a, b in cuts]
    assert out["text"] == " ".join(s["text"] for s in out["segments"])


def test_a_format_only_av_reads_is_decoded_in_memory_bit_exact(no_temporary_files):
    pytest.importorskip("av")
    clip = speech.load("kittens")
    buf = io.BytesIO()
    speech.matroska(clip, buf)  # soundfile cannot read Matroska
    (resp,), server = post_all([("upload", buf.getvalue(), {})])
    assert resp.status_code == 200
    assert np.array_equal(server.engine.chunks[0], clip / np.float32(32768))


def test_audio_longer_than_the_server_takes_is_refused():
    clip = speech.load("kittens")
    (resp,), server = post_all([("k.wav", wav_bytes(clip), {})], max_file_s=1.0)
    assert resp.status_code == 413 and resp.json()["error"]["param"] == "file"
    assert "at most 1 s" in resp.json()["error"]["message"]
    assert server.engine.chunks == []


def test_a_damaged_upload_gives_what_came_before_the_damage_and_says_so():
    import soundfile

    gap = np.zeros(2 * RATE, np.int16)
    pcm = np.concatenate([speech.load("kittens"), gap, speech.load("honest"), gap])
    flac = io.BytesIO()
    soundfile.write(flac, pcm, RATE, format="FLAC")
    cut_flac = flac.getvalue()[: int(len(flac.getvalue()) * 0.6)]
    cut_wav = wav_bytes(pcm)[: 44 + 2 * 4 * RATE]  # the header promises all, 4 s arrive
    (a, b, c), server = post_all([("c.flac", cut_flac, {}), ("c.wav", cut_wav, {}),
                                  ("c.wav", cut_wav, {"response_format": "text"})])
    for resp, why in ((a, "corrupt flac data"), (b, "cut short: its header promises")):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["text"].startswith("n") and why in body["warning"]
        assert "before that point" in body["warning"] and "damaged" in resp.headers["X-Voxline-Warning"]
    assert c.status_code == 200 and "damaged 4.0 s in" in c.headers["X-Voxline-Warning"]
    # the WAV's four seconds reached the engine, every sample of them
    assert sum(len(x) for x in server.engine.chunks[1:2]) <= 4 * RATE
    assert server.engine.open_slots == 0
