"""asr-serve end to end with the real Whisper model: a real Unix socket, real speech, the
OpenAI-compatible endpoint through a real HTTP client, the remote backend, and bad clients."""

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import wave
from multiprocessing import shared_memory
from pathlib import Path

import httpx
import numpy as np
import pytest
import speech

from agent.audio import int16_to_float
from agent.config import ASRConfig
from stages.asr import wire
from stages.asr.engine import ASREngine
from stages.asr.long_audio import cut_points
from stages.asr.remote import RemoteASRBackend, RemoteASRError
from stages.asr.server import ASRServer
from stages.asr.wer import wer

ROOT = Path(__file__).resolve().parents[2]
CLIPS = ("kittens", "quilter", "honest")  # far from Whisper's edge: see tests/speech.py
# Whisper tiny.en on LibriSpeech utterances of 9-17 words: one word wrong in the shortest passes,
# two fail; several clips in one test are judged together
MAX_WER = 0.15
WAIT = 120  # seconds: a hang fails the test instead of blocking the run


@pytest.fixture(scope="module")
def backend():
    from stages.asr.whisper import WhisperBackend

    be = WhisperBackend(ASRConfig())
    be.warmup()
    return be


@pytest.fixture(scope="module")
def pcm():
    return {name: speech.load(name) for name in CLIPS}


def ref(name):
    return speech.text(name)


def judged(*pairs):
    """WER of several (clip name, transcript) pairs taken together."""
    return wer(" ".join(ref(name) for name, _ in pairs), " ".join(text for _, text in pairs))


class Client:
    """A test client speaking the wire protocol over asyncio streams."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.decoder = wire.Decoder()
        self.received: list = []

    @classmethod
    async def connect(cls, path):
        return cls(*await asyncio.open_unix_connection(path))

    def send(self, *frames):
        self.writer.write(b"".join(frames))

    async def stream(self, sid, pcm, chunk_s=0.2, pause_s=0.02, options=None):
        self.send(wire.encode_open(sid, options or {}))
        step = int(chunk_s * 16000)
        for i in range(0, len(pcm), step):
            self.send(wire.encode_audio(sid, pcm[i : i + step].tobytes()))
            await self.writer.drain()
            await asyncio.sleep(pause_s)
        self.send(wire.encode_end(sid))

    async def until(self, done):
        async def loop():
            while not done(self.received):
                data = await self.reader.read(1 << 16)
                if not data:
                    return False
                self.received += self.decoder.feed(data)
            return True

        return await asyncio.wait_for(loop(), WAIT)

    async def final(self, sid):
        await self.until(lambda got: any(isinstance(m, (wire.Final, wire.Error)) and m.stream == sid
                                         for m in got))
        return next(m for m in self.received if isinstance(m, (wire.Final, wire.Error)) and m.stream == sid)

    def close(self):
        self.writer.close()


async def serve(backend, tmp_path, capacity=4, max_batch=None, **kw):
    engine = ASREngine(backend, capacity=capacity, max_batch=max_batch)
    server = ASRServer(engine, **kw)
    path = str(tmp_path / "asr.sock")
    await server.start_unix(path)
    return engine, server, path


async def until_true(check):
    for _ in range(WAIT * 100):
        if check():
            return True
        await asyncio.sleep(0.01)
    return False


def test_a_stream_of_real_speech_gets_partials_then_a_final(backend, pcm, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path)
        c = await Client.connect(path)
        # at twice real time: a loaded machine still decodes every partial (faster, partials
        # are shed under load and no two may agree on a stable prefix)
        await c.stream(7, pcm["quilter"], pause_s=0.1)
        final = await c.final(7)
        c.close()
        free = await until_true(lambda: engine.pool.in_use == 0)
        await server.close()
        engine.close()
        return c.received, final, free

    got, final, free = asyncio.run(main())
    partials = [m for m in got if isinstance(m, wire.Partial)]
    assert partials, "no partial before the final"
    assert got.index(final) > got.index(partials[0])
    assert [p.samples for p in partials] == sorted(p.samples for p in partials)
    assert isinstance(final, wire.Final), final
    assert final.samples == len(pcm["quilter"])
    assert wer(ref("quilter"), final.text) <= MAX_WER, final.text
    assert free
    stable = ""  # the stream core's stable prefix: it never moves back
    for p in partials:
        assert p.text.startswith(stable), (stable, p.text)
        stable = p.text[: p.stable]
    assert stable, "no partial had a stable prefix"


def speculative(got) -> int:
    return sum(isinstance(m, wire.Partial) and m.speculative for m in got)


def test_a_stream_with_vad_events_gets_speculative_partials_and_a_final_per_utterance(
        backend, pcm, tmp_path):
    sr = 16000
    gap = np.zeros(sr, np.int16)
    parts = [gap[: sr // 2], pcm["kittens"], gap, pcm["honest"], gap[: sr // 2]]
    audio = np.concatenate(parts)
    spans, at = [], 0
    for part, voiced in zip(parts, (False, True, False, True, False), strict=True):
        if voiced:
            spans.append((at, at + len(part)))
        at += len(part)
    events = []  # (after sample, event, at, started_at), where a VAD would send them
    for a, b in spans:
        events += [(a + 1024, wire.SpeechEvent.STARTED, a, 0),
                   (b + 512, wire.SpeechEvent.PAUSED, b, 0),
                   (b + 4800, wire.SpeechEvent.STOPPED, b, a)]

    async def main():
        engine, server, path = await serve(backend, tmp_path)
        c = await Client.connect(path)
        c.send(wire.encode_open(3, {"events": True}))
        step, k, pause = 3200, 0, None
        for i in range(0, len(audio), step):
            c.send(wire.encode_audio(3, audio[i : i + step].tobytes()))
            while k < len(events) and events[k][0] <= i + step:
                if events[k][1] is wire.SpeechEvent.PAUSED:
                    pause = (events[k][2], speculative(c.received))
                c.send(wire.encode_event(3, *events[k][1:]))
                k += 1
            await c.writer.drain()
            if pause is not None and i + step >= pause[0] + 1600:
                # A VAD's stop comes 300 ms after its pause. Here the stop waits until the
                # speculative result (the pause + 100 ms) is back, however slow the machine.
                await c.until(lambda got, seen=pause[1]: speculative(got) > seen)
                pause = None
            await asyncio.sleep(0.05)
        c.send(wire.encode_end(3))
        done = await c.until(lambda got: any(isinstance(m, wire.End) for m in got))
        c.close()
        await server.close()
        engine.close()
        return c.received, done

    got, done = asyncio.run(main())
    assert done and isinstance(got[-1], wire.End)
    finals = [m for m in got if isinstance(m, wire.Final)]
    assert [(f.start, f.samples) for f in finals] == spans
    assert judged(("kittens", finals[0].text), ("honest", finals[1].text)) <= MAX_WER
    partials = [m for m in got if isinstance(m, wire.Partial)]
    assert any(p.speculative for p in partials)  # the pause was transcribed before the stop
    first = got.index(finals[0])
    for group in (partials[: len([p for p in got[:first] if isinstance(p, wire.Partial)])],
                  [p for p in got[first:] if isinstance(p, wire.Partial)]):
        stable = ""
        for p in group:
            assert p.text.startswith(stable), (stable, p.text)
            stable = p.text[: p.stable]


def test_a_served_stream_s_pause_reaches_the_core_with_the_voice_s_end(backend, tmp_path,
                                                                    monkeypatch):
    """ServedStream.paused → the wire → the server's stream core, in the stream's offsets: the
    voice's end is what lets a partial already with the model stand for the pause's call."""
    from stages.asr.stream import ASRStream
    from stages.asr.stream_client import ServedStream

    calls = []
    paused = ASRStream.paused

    def spy(self, at, voice_end=-1):
        calls.append((at, voice_end))
        return paused(self, at, voice_end)

    monkeypatch.setattr(ASRStream, "paused", spy)

    async def main():
        engine, server, path = await serve(backend, tmp_path)
        errors = []
        stream = ServedStream(lambda r: None, errors.append, socket_path=path, partials=False)
        await stream.open()
        stream.audio(np.zeros(16000, np.int16).tobytes())
        stream.paused(4000, 3000)  # no utterance open: not sent
        stream.started(1600)
        stream.paused(12000, 11000)
        stream.paused(13000)  # the VAD could not tell
        stream.paused(14000, 800)  # a voice end before the utterance: not the voice's
        stream.paused(20000, 15000)  # past the audio sent: at the last sample heard
        stream.stopped(15000, 1600)
        stream.paused(15500, 15200)  # after the stop: no utterance open
        ok = await until_true(lambda: len(calls) >= 4)
        await asyncio.sleep(0.1)
        stream.close()
        await server.close()
        engine.close()
        return ok, errors

    ok, errors = asyncio.run(main())
    assert ok and not errors
    assert calls == [(12000, 11000), (13000, -1), (14000, -1), (16000, 15000)]


def test_many_streams_on_one_connection(backend, pcm, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path, max_streams=3)
        c = await Client.connect(path)
        await asyncio.gather(*(c.stream(sid, pcm[name], options={"partials": False})
                               for sid, name in [(1, "kittens"), (2, "quilter"), (3, "honest")]))
        finals = {sid: await c.final(sid) for sid in (1, 2, 3)}
        c.close()
        await server.close()
        engine.close()
        return c.received, finals, engine.stats

    got, finals, stats = asyncio.run(main())
    assert not any(isinstance(m, wire.Partial) for m in got)  # partials were switched off
    assert all(isinstance(f, wire.Final) for f in finals.values()), finals
    pairs = [(name, finals[sid].text) for sid, name in [(1, "kittens"), (2, "quilter"), (3, "honest")]]
    assert judged(*pairs) <= MAX_WER, pairs
    assert stats.requests == 3


def long_file():
    """43 s of speech (three clips, three times, with pauses): several chunks."""
    return speech.joined(speech.LONG_FILE, gap_s=0.5, tail_s=0.5)


def segment(size):
    """A shared-memory segment named the way asr-serve takes them (this process's pid)."""
    return shared_memory.SharedMemory(name=wire.shm_name(os.getpid(), os.urandom(8).hex()),
                                      create=True, size=size)


def test_shared_memory_file_is_copied_out_and_batched(backend, pcm, tmp_path):
    audio, text = long_file()
    shm = segment(audio.nbytes)
    try:
        np.ndarray(len(audio), np.int16, buffer=shm.buf)[:] = audio

        async def main():
            engine, server, path = await serve(backend, tmp_path, max_batch=16)
            c = await Client.connect(path)
            c.send(wire.encode_shm(5, shm.name, audio.nbytes, len(audio)))
            final = await c.final(5)
            c.close()
            await server.close()
            engine.close()
            return final, engine.stats

        final, stats = asyncio.run(main())
        # the server did not take the segment away from its owner
        assert bytes(shm.buf[:64]) == audio[:32].tobytes()
    finally:
        shm.close()
        shm.unlink()
    assert isinstance(final, wire.Final), final
    assert final.samples == len(audio)
    assert wer(text, final.text) <= MAX_WER, final.text
    chunks = len(cut_points(audio))
    assert chunks >= 2
    assert stats.batch_sizes == {chunks: 1}  # all chunks in one backend call


MISSING = wire.shm_name(os.getpid(), "0" * 16)


def test_bad_shared_memory_requests_get_errors_and_the_connection_stays(backend, pcm, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path)
        c = await Client.connect(path)
        c.send(wire.encode_shm(1, MISSING, 64, 32),
               wire.encode_shm(2, "x", 63, 32),
               wire.encode_shm(3, "../etc/passwd", 64, 32))
        errors = [await c.final(sid) for sid in (1, 2, 3)]
        await c.stream(4, pcm["honest"], chunk_s=1.0, pause_s=0, options={"partials": False})
        final = await c.final(4)
        c.close()
        await server.close()
        engine.close()
        return errors, final, engine.pool.in_use

    errors, final, in_use = asyncio.run(main())
    assert [e.code for e in errors] == [wire.ErrorCode.BAD_REQUEST] * 3
    assert "cannot be used: it must be a segment this client process made" in errors[0].message
    assert "size must be 2 × samples" in errors[1].message
    # the same words whether the name is badly formed or names no segment: no oracle
    assert errors[2].message == errors[0].message.replace(MISSING, "../etc/passwd")
    assert isinstance(final, wire.Final) and wer(ref("honest"), final.text) <= MAX_WER, final.text
    assert in_use == 0


def wav_bytes(pcm):
    import io

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def test_openai_compatible_endpoint(backend, pcm, tmp_path):
    clip = wav_bytes(pcm["kittens"])

    async def main():
        engine, server, _ = await serve(backend, tmp_path)
        port = await server.start_http("127.0.0.1", 0, max_upload_mb=0.5)
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        out = {}
        async with httpx.AsyncClient(timeout=WAIT) as http:
            for fmt in ("json", "text", "verbose_json"):
                out[fmt] = await http.post(url, files={"file": ("kittens.wav", clip)},
                                           data={"model": "whisper-1", "response_format": fmt})
            out["stream"] = await http.post(url, files={"file": ("kittens.wav", clip)},
                                            data={"model": "whisper-1", "stream": "true"})
            out["no_file"] = await http.post(url, files={"model": (None, "whisper-1")})
            out["bad_format"] = await http.post(url, files={"file": ("k.wav", clip)},
                                                data={"response_format": "docx"})
            out["not_audio"] = await http.post(url, files={"file": ("k.wav", b"RIFF not really")})
            out["too_large"] = await http.post(url, files={"file": ("k.wav", b"\0" * 600_000)})
            out["get"] = await http.get(url)
        await server.close()
        engine.close()
        return out, engine.pool.in_use

    out, in_use = asyncio.run(main())
    assert out["json"].status_code == 200
    text = out["json"].json()["text"]
    assert wer(ref("kittens"), text) <= MAX_WER, text
    assert out["text"].headers["content-type"].startswith("text/plain")
    assert out["text"].text.strip() == text
    verbose = out["verbose_json"].json()
    assert verbose["text"] == text
    assert verbose["duration"] == pytest.approx(len(pcm["kittens"]) / 16000, abs=0.01)
    assert [(s["start"], s["text"]) for s in verbose["segments"]] == [(0.0, text)]
    assert verbose["segments"][0]["end"] == pytest.approx(verbose["duration"], abs=0.01)

    assert out["stream"].headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in out["stream"].text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["transcript.text.delta", "transcript.text.done"]
    assert events[0]["delta"] == text and events[-1]["text"] == text

    for key, status, param in [("no_file", 400, "file"), ("bad_format", 400, "response_format"),
                               ("not_audio", 400, "file"), ("too_large", 413, "file")]:
        r = out[key]
        assert r.status_code == status, (key, r.text)
        assert r.json()["error"]["param"] == param, (key, r.text)
        assert r.json()["error"]["message"]
    assert out["get"].status_code == 405 and "error" in out["get"].json()
    assert in_use == 0


def test_malformed_frames_close_that_connection_only(backend, pcm, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path)
        good = await Client.connect(path)
        good.send(wire.encode_open(1, {"partials": False}))
        bad = await Client.connect(path)
        bad.send(wire.encode_open(9, {}), b"\xff\xff\xff\xff garbage")
        closed = await bad.until(lambda got: False) is False  # read until the server hangs up
        good.send(wire.encode_audio(1, pcm["honest"].tobytes()), wire.encode_end(1))
        final = await good.final(1)
        good.close()
        await until_true(lambda: engine.pool.in_use == 0)
        await server.close()
        engine.close()
        return bad.received, closed, final, server.protocol_errors, engine.pool.in_use

    bad_got, closed, final, errors, in_use = asyncio.run(main())
    assert closed
    assert len(bad_got) == 1 and bad_got[0].code == wire.ErrorCode.PROTOCOL and bad_got[0].stream == 0
    assert "exceeds" in bad_got[0].message
    assert isinstance(final, wire.Final) and wer(ref("honest"), final.text) <= MAX_WER, final.text
    assert errors == 1
    assert in_use == 0  # the bad connection's open stream gave its slot back


def test_disconnect_mid_stream_frees_the_slot_within_a_second(backend, pcm, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path)
        c = await Client.connect(path)
        c.send(wire.encode_open(1, {}), wire.encode_audio(1, pcm["quilter"][:32000].tobytes()))
        await c.writer.drain()
        taken = await until_true(lambda: engine.pool.in_use == 1)
        c.writer.transport.abort()
        t0 = time.monotonic()
        while engine.pool.in_use and time.monotonic() - t0 < 1.0:
            await asyncio.sleep(0.01)
        freed = engine.pool.in_use == 0
        connections = len(server.connections)
        await server.close()
        engine.close()
        return taken, freed, connections

    taken, freed, connections = asyncio.run(main())
    assert taken and freed
    assert connections == 0


def test_a_full_pool_refuses_only_the_new_stream(backend, pcm, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path, capacity=2, max_streams=2)
        a = await Client.connect(path)
        a.send(wire.encode_open(1, {"partials": False}), wire.encode_open(2, {"partials": False}))
        await until_true(lambda: engine.pool.in_use == 2)
        b = await Client.connect(path)
        b.send(wire.encode_open(1, {}), wire.encode_audio(1, pcm["honest"].tobytes()), wire.encode_end(1))
        refusal = await b.final(1)
        a.send(wire.encode_audio(1, pcm["kittens"].tobytes()), wire.encode_end(1),
               wire.encode_audio(2, pcm["honest"].tobytes()), wire.encode_end(2))
        finals = [await a.final(1), await a.final(2)]
        # with the pool free again, the refused client is served on the same connection
        b.send(wire.encode_open(3, {"partials": False}), wire.encode_audio(3, pcm["honest"].tobytes()),
               wire.encode_end(3))
        retry = await b.final(3)
        a.close()
        b.close()
        await server.close()
        engine.close()
        return refusal, a.received, finals, b.received, retry

    refusal, a_got, finals, b_got, retry = asyncio.run(main())
    assert isinstance(refusal, wire.Error) and refusal.code == wire.ErrorCode.CAPACITY
    assert "ASR slots are in use" in refusal.message
    assert len([m for m in b_got if isinstance(m, wire.Error)]) == 1  # its audio was not an error
    assert not any(isinstance(m, wire.Error) for m in a_got)
    assert isinstance(retry, wire.Final), retry
    pairs = [("kittens", finals[0].text), ("honest", finals[1].text), ("honest", retry.text)]
    assert judged(*pairs) <= MAX_WER, pairs


def test_remote_backend_shares_the_server_from_worker_threads(backend, pcm, tmp_path):
    audio, long_text = long_file()
    floats = {k: int16_to_float(v) for k, v in pcm.items()}

    async def main():
        engine, server, path = await serve(backend, tmp_path)
        remote = RemoteASRBackend(ASRConfig(model=path))
        await asyncio.to_thread(remote.warmup)
        calls = [
            asyncio.to_thread(remote.transcribe_batch, [floats["kittens"], floats["honest"]]),
            asyncio.to_thread(remote.transcribe_batch, [floats["quilter"]]),
            asyncio.to_thread(remote.transcribe_batch, [int16_to_float(audio)]),  # via shm
        ]
        results = await asyncio.gather(*calls)
        remote.close()
        await server.close()
        engine.close()
        return results

    (kittens, honest), (quilter,), (long,) = asyncio.run(main())
    pairs = [("kittens", kittens.text), ("honest", honest.text), ("quilter", quilter.text)]
    assert judged(*pairs) <= MAX_WER, pairs
    assert wer(long_text, long.text) <= MAX_WER, long.text


def test_remote_backend_without_a_server_says_how_to_start_one(tmp_path):
    remote = RemoteASRBackend(ASRConfig(model=str(tmp_path / "nobody.sock")))
    with pytest.raises(RemoteASRError, match="voxline asr-serve --socket"):
        remote.warmup()


def test_the_asr_serve_command(pcm, tmp_path):
    path = str(tmp_path / "cli.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "asr-serve", "--socket", path, "--asr-slots", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline()
        assert f"listening on unix:{path}" in line, (line, proc.stderr.read() if proc.poll() else "")
        remote = RemoteASRBackend(ASRConfig(model=path))
        (hyp,) = remote.transcribe_batch([int16_to_float(pcm["honest"])])
        remote.close()
        assert wer(ref("honest"), hyp.text) <= MAX_WER, hyp.text
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0


def test_a_remote_backend_that_asks_gets_the_servers_sentence_end(pcm, tmp_path):
    """The ASR's P(a sentence ends) over the socket: what the words' check of an agent on a
    shared asr-serve reads. The first stream that asks switches the backend on; streams that
    do not ask get finals as before (no END_P on the wire)."""
    from stages.asr.whisper import WhisperBackend

    be = WhisperBackend(ASRConfig())  # its own: this test switches it on
    be.warmup()
    floats = [int16_to_float(pcm[name]) for name in CLIPS]

    async def main():
        engine, server, path = await serve(be, tmp_path)
        plain = RemoteASRBackend(ASRConfig(model=path))
        told = RemoteASRBackend(ASRConfig(model=path, sentence_ends=True))
        before = await asyncio.to_thread(plain.transcribe_batch, floats)
        switched = (be.sentence_ends, server.sentence_ends)
        after = await asyncio.to_thread(told.transcribe_batch, floats)
        still = await asyncio.to_thread(plain.transcribe_batch, floats[:1])
        c = await Client.connect(path)
        c.send(wire.encode_open(5, {"end_p": True}), wire.encode_audio(5, pcm["honest"].tobytes()),
               wire.encode_end(5))
        final = await c.final(5)
        c.close()
        for r in (plain, told):
            r.close()
        await server.close()
        engine.close()
        return before, switched, after, still, final

    before, switched, after, still, final = asyncio.run(main())
    assert [h.end_p for h in before] == [None] * len(CLIPS) and switched == (False, None)
    assert be.sentence_ends and still[0].end_p is None  # on for the engine, sent where asked
    local = be.transcribe_batch(floats)  # the same model in this process
    for name, remote, here in zip(CLIPS, after, local, strict=True):
        assert remote.text == here.text, name
        # whole sentences, read as such: 0.87-0.96 in int8 and float32, exact and with every
        # sample one step off (speech.STEPS), far from the bar; carried in 65,535ths
        assert here.end_p > 0.6 and abs(remote.end_p - here.end_p) <= 1 / wire.END_P_SCALE, name
    assert isinstance(final, wire.Final) and abs(final.end_p - local[2].end_p) <= 1 / wire.END_P_SCALE


def test_an_older_server_refusing_the_sentence_end_still_transcribes(backend, pcm, tmp_path,
                                                                      monkeypatch, caplog):
    from stages.asr import server as server_mod

    old = {k: v for k, v in server_mod.OPTIONS.items() if k != "end_p"}
    monkeypatch.setattr(server_mod, "OPTIONS", old)  # as asr-serve was before the option

    async def main():
        engine, server, path = await serve(backend, tmp_path)
        told = RemoteASRBackend(ASRConfig(model=path, sentence_ends=True))
        hyps = await asyncio.to_thread(told.transcribe_batch, [int16_to_float(pcm["kittens"])])
        again = await asyncio.to_thread(told.transcribe_batch, [int16_to_float(pcm["honest"])])
        more = []  # past the count of worded finals a server that cannot tell is warned of
        for name in [*CLIPS, *CLIPS]:
            more += await asyncio.to_thread(told.transcribe_batch, [int16_to_float(pcm[name])])
        told.close()
        await server.close()
        engine.close()
        return hyps + again, told.resent, more

    with caplog.at_level("WARNING", logger="voxline.asr.remote"):
        hyps, resent, more = asyncio.run(main())
    assert judged(("kittens", hyps[0].text), ("honest", hyps[1].text)) <= MAX_WER
    assert [h.end_p for h in hyps + more] == [None] * (2 + len(more))
    # it no longer asks, so it warns of nothing more (one warning, and the right one)
    assert all(h.text for h in more) and "tells no sentence end" not in caplog.text
    assert resent == 1  # the first request once more, without the option; the next never asks
    assert "does not know the sentence-end option" in caplog.text


class _Untelling:
    """A backend that cannot tell the sentence end (as Parakeet's): the real model without it."""

    def __init__(self, inner):
        self.inner = inner
        self.name = "untelling"
        self.capabilities = dataclasses.replace(inner.capabilities, sentence_ends=False)
        self.sample_rate, self.max_batch = inner.sample_rate, inner.max_batch

    def transcribe_batch(self, audio, prompts=None, **kw):
        return self.inner.transcribe_batch(audio, prompts, **kw)

    def warmup(self):
        pass


def test_a_backend_that_cannot_tell_the_sentence_end_says_so_once(backend, pcm, tmp_path, caplog):
    from stages.asr.remote import UNTOLD_AFTER

    floats = [int16_to_float(pcm[name]) for name in CLIPS] * 2

    async def main():
        engine, server, path = await serve(_Untelling(backend), tmp_path)
        told = RemoteASRBackend(ASRConfig(model=path, sentence_ends=True))
        hyps = []
        for f in floats:  # one at a time: the warning comes at the UNTOLD_AFTER-th
            hyps += await asyncio.to_thread(told.transcribe_batch, [f])
        told.close()
        await server.close()
        engine.close()
        return hyps, server.sentence_ends

    with caplog.at_level("WARNING"):
        hyps, told = asyncio.run(main())
    assert told is False and [h.end_p for h in hyps] == [None] * len(floats)
    assert all(h.text for h in hyps) and len(floats) > UNTOLD_AFTER
    assert "backend 'untelling' cannot tell it" in caplog.text
    assert caplog.text.count("tells no sentence end") == 1


def test_a_backend_that_declares_the_sentence_end_must_tell_it(backend):
    from stages.asr.backend import ask_sentence_ends

    liar = _Untelling(backend)
    liar.capabilities = dataclasses.replace(liar.capabilities, sentence_ends=True)
    with pytest.raises(TypeError, match="declares sentence_ends but lacks tell_sentence_ends"):
        ask_sentence_ends(liar)
    assert not ask_sentence_ends(_Untelling(backend))
