"""asr-serve as a hostile client and a careless operator would try it, each finding of the
security review reproduced against the real server: ``voxline asr-serve`` as a subprocess where
the attack could kill or bloat the process, the in-process server with the real Whisper model
elsewhere. Each test failed on the server as it was before."""

import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import threading
import time
from multiprocessing import shared_memory
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
import speech
from asr_serve import Served

from agent.audio import int16_to_float, write_wav
from agent.config import ASRConfig
from stages.asr import wire
from stages.asr.engine import ASREngine
from stages.asr.remote import RemoteASRBackend, RemoteASRError
from stages.asr.server import ASRServer
from stages.asr.wer import wer
from transports.auth import TokenAuth

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120
MAX_WER = 0.15
MB = 1 << 20


# --- helpers ---------------------------------------------------------------------------------


class SyncClient:
    """The wire protocol over a blocking Unix socket (a client in this test's process)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(WAIT)
        self.decoder = wire.Decoder()
        self.got: list = []

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def answer(self, sid: int):
        """The FINAL or ERROR for ``sid``; None if the server hung up first."""
        while True:
            for m in self.got:
                if isinstance(m, (wire.Final, wire.Error)) and m.stream in (sid, 0):
                    return m
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.got += self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()


def segment(pcm: np.ndarray, pid: int | None = None) -> shared_memory.SharedMemory:
    """A segment holding ``pcm``, named the way asr-serve's clients name theirs."""
    shm = shared_memory.SharedMemory(name=wire.shm_name(pid or os.getpid(), os.urandom(8).hex()),
                                     create=True, size=pcm.nbytes)
    np.ndarray(len(pcm), np.int16, buffer=shm.buf)[:] = pcm
    return shm


def drop(shm: shared_memory.SharedMemory) -> None:
    shm.close()
    shm.unlink()


def wav(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, pcm, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def backend():
    from stages.asr.whisper import WhisperBackend

    be = WhisperBackend(ASRConfig())
    be.warmup()
    return be


async def serve(backend, tmp_path, capacity=4, **kw):
    engine = ASREngine(backend, capacity=capacity)
    server = ASRServer(engine, **kw)
    path = str(tmp_path / "asr.sock")
    await server.start_unix(path)
    return engine, server, path


def long_speech(seconds: float) -> np.ndarray:
    """Real speech, the three clips over and over, at least ``seconds`` long."""
    one, _ = speech.joined(speech.LONG_FILE, gap_s=0.5, tail_s=0.5)
    return np.tile(one, int(np.ceil(seconds * 16000 / len(one))))


# --- 1. a segment shrunk under the server ------------------------------------------------------


def test_a_client_that_shrinks_its_segment_cannot_crash_the_server(tmp_path):
    """Before: the server mapped the segment and read it chunk by chunk while transcribing; the
    client's ftruncate then made the next read a SIGBUS, and the shared engine was gone."""
    audio = long_speech(60)
    served = Served(tmp_path, "--asr-slots", "2")
    try:
        answers = []
        for sid, delay in enumerate((0.0, 0.05, 0.3, 1.0), start=1):
            shm = segment(audio)
            client = SyncClient(served.path)
            try:
                client.send(wire.encode_shm(sid, shm.name, audio.nbytes, len(audio)))
                time.sleep(delay)
                os.ftruncate(shm._fd, 0)  # the client takes its pages away
                answers.append(client.answer(sid))
            finally:
                client.close()
                drop(shm)
            if answers[-1] is None:  # it hung up: did it die?
                with contextlib.suppress(subprocess.TimeoutExpired):
                    served.proc.wait(10)
            assert served.proc.poll() is None, (
                f"asr-serve died (rc {served.proc.returncode}; SIGBUS is -{signal.SIGBUS})")
        # each got an answer — a transcript (copied before the shrink) or a plain refusal
        for a in answers:
            assert isinstance(a, (wire.Final, wire.Error)), answers
            if isinstance(a, wire.Error):
                assert a.code == wire.ErrorCode.BAD_REQUEST and "cannot be used" in a.message
        # and the server goes on serving
        clip = speech.load("honest")
        (hyp,) = RemoteASRBackend(ASRConfig(model=served.path)).transcribe_batch([int16_to_float(clip)])
        assert wer(speech.text("honest"), hyp.text) <= MAX_WER, hyp.text
    finally:
        rc = served.stop()
    assert rc == 0


# --- 2a. uploads that point at other files -----------------------------------------------------


def _uploads_pointing_at(secret: Path) -> dict[str, tuple[str, bytes, str]]:
    rel = secret.name
    return {
        # the review's attack: an HLS playlist naming a local file (FFmpeg 8 only probes it under
        # a .m3u8 name, which the server never gave it — but forcing the HLS demuxer did read it)
        "hls": ("list.m3u8", (f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXT-X-MEDIA-SEQUENCE:0\n"
                              f"#EXTINF:10.0,\n{secret}\n#EXT-X-ENDLIST\n").encode(),
                "application/vnd.apple.mpegurl"),
        # the same file read through a concat list, relative to the server's directory: this one
        # FFmpeg probes from the bytes alone, so the old server transcribed the file
        "concat": ("list.txt", f"ffconcat version 1.0\nfile '{rel}'\n".encode(), "text/plain"),
        "concat_abs": ("list.txt", f"ffconcat version 1.0\nfile '{secret}'\n".encode(), "text/plain"),
    }


def test_an_upload_naming_a_local_file_is_refused_not_followed(backend, tmp_path, monkeypatch):
    secret = tmp_path / "secret.wav"
    write_wav(secret, speech.load("kittens"))
    monkeypatch.chdir(tmp_path)  # where a relative name in a list would be looked up

    async def main():
        engine, server, _ = await serve(backend, tmp_path)
        port = await server.start_http("127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        out = {}
        async with httpx.AsyncClient(timeout=WAIT) as http:
            for key, (name, body, ctype) in _uploads_pointing_at(secret).items():
                out[key] = await http.post(url, files={"file": (name, body, ctype)},
                                           data={"model": "whisper-1"})
            out["real"] = await http.post(url, files={"file": ("k.wav", secret.read_bytes())})
        await server.close()
        engine.close()
        return out

    out = asyncio.run(main())
    for key in ("hls", "concat", "concat_abs"):
        r = out[key]
        assert r.status_code == 400, (key, r.status_code, r.text)
        message = r.json()["error"]["message"]
        assert "playlist or a list of other files" in message, (key, message)
        assert "kittens" not in r.text.lower() and "secret" not in message
    assert out["real"].status_code == 200  # the file itself, uploaded, is fine
    assert wer(speech.text("kittens"), out["real"].json()["text"]) <= MAX_WER


# --- 2b/2c. token off loopback; Host names on loopback -----------------------------------------


def test_off_loopback_the_endpoint_needs_the_printed_token(tmp_path):
    served = Served(tmp_path, "--asr-slots", "2", "--http", "0.0.0.0:0", token=True)
    clip = wav(speech.load("honest"))
    try:
        assert served.token and len(served.token) >= 16
        with httpx.Client(timeout=WAIT) as http:
            def post(headers):
                return http.post(served.url, files={"file": ("h.wav", clip)}, headers=headers)

            none, wrong = post({}), post({"Authorization": "Bearer not-it"})
            right = post({"Authorization": f"Bearer {served.token}"})
            header = post({"X-Voxline-Token": served.token})
            garbled = _raw_post(served.port, b'filename="h.wav"', clip,
                                extra=b"Authorization: Bearer \xff\xfe\r\n")  # not UTF-8
    finally:
        served.stop()
    for r in (none, wrong):
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert "Authorization: Bearer" in r.json()["error"]["message"]
    for r in (right, header):
        assert r.status_code == 200, r.text
        assert wer(speech.text("honest"), r.json()["text"]) <= MAX_WER
    assert garbled.startswith(b"HTTP/1.1 400") and b"not valid UTF-8" in garbled, garbled[:300]
    assert served.token not in served._stderr()  # printed once to the operator, never logged


def test_the_endpoint_refuses_to_start_off_loopback_without_a_token_check(backend, tmp_path):
    from agent.errors import ConfigError

    async def main():
        engine, server, _ = await serve(backend, tmp_path)
        try:
            with pytest.raises(ConfigError, match="needs a token"):
                await server.start_http("0.0.0.0", 0)
        finally:
            await server.close()
            engine.close()

    asyncio.run(main())


def test_a_loopback_bind_answers_loopback_host_names_only(backend, tmp_path):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends
    ``Host: evil.example``; before, it got the transcript (and could read local files)."""
    clip = wav(speech.load("honest"))

    async def main():
        engine, server, _ = await serve(backend, tmp_path)
        port = await server.start_http("127.0.0.1", 0, allowed_hosts=("asr.internal",),
                                       token_check=TokenAuth("s3cret"))
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        auth = {"Authorization": "Bearer s3cret"}
        out = {}
        async with httpx.AsyncClient(timeout=WAIT) as http:
            for host in ("evil.example", "evil.example:80", f"127.0.0.1.evil.example:{port}",
                         "localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}",
                         "asr.internal", "ASR.internal.:8300"):
                out[host] = await http.post(url, files={"file": ("h.wav", clip)},
                                            headers={**auth, "Host": host})
            out["no token"] = await http.post(url, files={"file": ("h.wav", clip)})
        await server.close()
        engine.close()
        return out

    out = asyncio.run(main())
    for host in ("evil.example", "evil.example:80", next(h for h in out if ".evil." in h)):
        r = out[host]
        assert r.status_code == 403, (host, r.text)
        assert "loopback name" in r.json()["error"]["message"]
    for host in out:
        if "evil" not in host and host != "no token":
            assert out[host].status_code == 200, (host, out[host].text)
    assert out["no token"].status_code == 401  # a token given on loopback is required there too


# --- 3. decoded duration ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def silence_flac():
    """1.0 MB of FLAC holding 330 minutes of silence: the review's memory bomb."""
    buf = io.BytesIO()
    zeros = np.zeros(16000 * 60, np.int16)
    with soundfile.SoundFile(buf, "w", 16000, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(330):
            f.write(zeros)
    return buf.getvalue()


def test_a_tiny_file_of_hours_of_silence_stops_at_the_cap_in_bounded_memory(tmp_path, silence_flac):
    """Before: 1.0 MB of FLAC peaked at 3.76 GB of RSS; now decoding stops at the cap
    (default an hour: 115 MB of samples) with 413."""
    assert len(silence_flac) < 1.2 * MB
    served = Served(tmp_path, "--asr-slots", "2", "--http", "127.0.0.1:0")
    try:
        with httpx.Client(timeout=WAIT) as http:
            warm = http.post(served.url, files={"file": ("h.wav", wav(speech.load("honest")))})
            assert warm.status_code == 200
            before = served.peak_rss_mb()
            t0 = time.monotonic()
            bomb = http.post(served.url, files={"file": ("quiet.flac", silence_flac)})
            took = time.monotonic() - t0
            after = served.peak_rss_mb()
            again = http.post(served.url, files={"file": ("h.wav", wav(speech.load("honest")))})
    finally:
        served.stop()
    assert bomb.status_code == 413, bomb.text
    assert "at most 3600 s" in bomb.json()["error"]["message"]
    assert after - before < 300, f"peak RSS rose {after - before:.0f} MB (from {before:.0f} MB)"
    assert took < 60
    assert again.status_code == 200


# --- 4. one connection's share ---------------------------------------------------------------


def test_one_connection_holds_at_most_half_the_slots(backend, tmp_path):
    async def main():
        engine, server, path = await serve(backend, tmp_path, capacity=4)
        greedy = SyncClient(path)
        await asyncio.to_thread(greedy.send, *(wire.encode_open(sid, {"partials": False})
                                               for sid in (1, 2, 3, 4)))
        refused = [await asyncio.to_thread(greedy.answer, sid) for sid in (3, 4)]
        other = SyncClient(path)
        clip = speech.load("honest").tobytes()
        await asyncio.to_thread(other.send, wire.encode_open(1, {"partials": False}),
                                *wire.encode_audio_chunks(1, clip), wire.encode_end(1))
        final = await asyncio.to_thread(other.answer, 1)
        greedy.close()
        other.close()
        await server.close()
        engine.close()
        return refused, final

    refused, final = asyncio.run(main())
    for r in refused:
        assert isinstance(r, wire.Error) and r.code == wire.ErrorCode.LIMIT, r
        assert "the most one connection may" in r.message
    assert isinstance(final, wire.Final), final  # before: CAPACITY, all four slots were taken
    assert wer(speech.text("honest"), final.text) <= MAX_WER


def test_a_greedy_connection_cannot_starve_another(backend, tmp_path):
    """Before: one connection's backlog (every slot, minutes of audio each) queued ahead of a
    short request, which then waited for nearly all of it (0.09 s → 12.7 s in the review)."""
    audio = long_speech(80)  # 7 chunks a stream

    async def main():
        engine, server, path = await serve(backend, tmp_path, capacity=32)
        clip = speech.load("honest").tobytes()

        async def normal(sid: int) -> tuple[float, object]:
            c = SyncClient(path)
            t0 = time.monotonic()
            await asyncio.to_thread(c.send, wire.encode_open(sid, {"partials": False}),
                                    *wire.encode_audio_chunks(sid, clip), wire.encode_end(sid))
            answer = await asyncio.to_thread(c.answer, sid)
            c.close()
            return time.monotonic() - t0, answer

        alone, _ = await normal(1)
        greedy = SyncClient(path)
        shms = [segment(audio) for _ in range(31)]
        try:
            await asyncio.to_thread(greedy.send, *(wire.encode_shm(sid, s.name, audio.nbytes, len(audio))
                                                   for sid, s in enumerate(shms, start=1)))
            await asyncio.sleep(1.0)  # its chunks are queued and running
            waited, answer = await normal(2)
            in_use = engine.pool.in_use
        finally:
            greedy.close()
            for s in shms:
                drop(s)
        await server.close()
        engine.close()
        return alone, waited, answer, in_use

    alone, waited, answer, in_use = asyncio.run(main())
    assert isinstance(answer, wire.Final), answer
    assert wer(speech.text("honest"), answer.text) <= MAX_WER
    assert in_use <= 16 + 1  # the greedy one held half the slots, the normal one its own
    # behind at most its share of the engine (4 requests), not behind 31 streams' backlog
    assert waited < alone + 6.0, f"waited {waited:.1f} s behind the greedy client (alone {alone:.1f} s)"


def test_whole_file_audio_held_per_connection_is_bounded(backend, tmp_path):
    """Before: whole-file streams were gathered in memory until END, any number of them."""
    half_hour = np.ones(16000 * 1800, np.int16).tobytes()  # 57.6 MB each

    async def main():
        engine, server, path = await serve(backend, tmp_path, capacity=4, max_streams=4)
        c = SyncClient(path)
        for sid in (1, 2, 3):
            await asyncio.to_thread(c.send, wire.encode_open(sid, {"file": True}),
                                    *wire.encode_audio_chunks(sid, half_hour))
        refusal = await asyncio.to_thread(c.answer, 3)
        held = server.buffered
        c.close()  # its files are abandoned: what they held is given back
        for _ in range(WAIT * 10):
            if server.buffered == 0 and engine.pool.in_use == 0:
                break
            await asyncio.sleep(0.1)
        freed = server.buffered
        await server.close()
        engine.close()
        return refusal, held, freed

    refusal, held, freed = asyncio.run(main())
    assert isinstance(refusal, wire.Error) and refusal.code == wire.ErrorCode.LIMIT, refusal
    assert "128 MiB" in refusal.message
    assert held <= 128 * MB
    assert freed == 0


def test_a_client_that_never_reads_cannot_make_the_server_hold_unbounded_replies(backend, tmp_path):
    """Every frame for a stream that is not open gets an error back; a client that sends them
    and never reads used to pile those up in the server without end."""
    frame = wire.encode_audio(9, b"\0\0")  # 11 bytes in, a ~40-byte error out

    async def main():
        engine, server, path = await serve(backend, tmp_path)
        c = SyncClient(path)
        c.sock.settimeout(3)

        def flood() -> int:
            sent = 0
            with contextlib.suppress(OSError):  # blocks, then times out, once the server waits
                for _ in range(50):
                    c.sock.sendall(frame * 20_000)
                    sent += 1
            return sent

        sent = await asyncio.to_thread(flood)
        (conn,) = server.connections
        owed = conn.transport.get_write_buffer_size()
        other = SyncClient(path)  # the server still serves everybody else
        clip = speech.load("honest").tobytes()
        await asyncio.to_thread(other.send, wire.encode_open(1, {"partials": False}),
                                *wire.encode_audio_chunks(1, clip), wire.encode_end(1))
        final = await asyncio.to_thread(other.answer, 1)
        c.close()
        other.close()
        await server.close()
        engine.close()
        return sent, owed, final

    sent, owed, final = asyncio.run(main())
    assert sent < 50  # it was made to wait
    assert owed < 4 * MB, f"{owed / MB:.1f} MB of replies held for a client that never reads"
    assert isinstance(final, wire.Final)


# --- 5. who may use the socket ----------------------------------------------------------------


def test_another_processes_segment_is_never_read_and_errors_tell_nothing(backend, tmp_path):
    """Before: any readable /dev/shm name was transcribed (another process's segment), and the
    errors told whether a name existed and how big it was."""
    clip = speech.load("honest")
    foreign = shared_memory.SharedMemory(create=True, size=clip.nbytes)  # psm_…: not ours
    np.ndarray(len(clip), np.int16, buffer=foreign.buf)[:] = clip
    other_pid = segment(clip, pid=os.getpid() + 1)  # named for another process
    missing = wire.shm_name(os.getpid(), "ab" * 8)

    async def main():
        engine, server, path = await serve(backend, tmp_path)
        c = SyncClient(path)
        await asyncio.to_thread(c.send, wire.encode_shm(1, foreign.name, clip.nbytes, len(clip)),
                                wire.encode_shm(2, other_pid.name, clip.nbytes, len(clip)),
                                wire.encode_shm(3, missing, clip.nbytes, len(clip)))
        answers = [await asyncio.to_thread(c.answer, sid) for sid in (1, 2, 3)]
        c.close()
        await server.close()
        engine.close()
        return answers

    try:
        answers = asyncio.run(main())
    finally:
        drop(foreign)
        drop(other_pid)
    names = (foreign.name, other_pid.name, missing)
    for a in answers:
        assert isinstance(a, wire.Error) and a.code == wire.ErrorCode.BAD_REQUEST, a
    texts = {a.message.replace(n, "NAME") for a, n in zip(answers, names, strict=True)}
    assert len(texts) == 1, texts  # existing or not, big or small: the same words


def test_the_default_socket_is_private_and_remote_finds_it(backend, tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("VOXLINE_ASR_SOCKET", raising=False)
    from stages.asr.local_socket import default_path

    path = default_path()
    assert path == str(runtime / "voxline" / "asr.sock")

    async def main():
        old = os.umask(0)  # the most permissive umask: the modes must not depend on it
        try:
            engine = ASREngine(backend, capacity=2)
            server = ASRServer(engine)
            await server.start_unix(path)
        finally:
            os.umask(old)
        modes = (os.stat(runtime / "voxline").st_mode & 0o777, os.stat(path).st_mode & 0o777)
        remote = RemoteASRBackend(ASRConfig())  # no socket given: the default
        (hyp,) = await asyncio.to_thread(remote.transcribe_batch, [speech.load_float("honest")])
        remote.close()
        await server.close()
        engine.close()
        return modes, remote.path, hyp

    (dir_mode, sock_mode), used, hyp = asyncio.run(main())
    assert dir_mode == 0o700 and sock_mode == 0o600  # before: /tmp/voxline-asr.sock, 0777 & ~umask
    assert used == path
    assert wer(speech.text("honest"), hyp.text) <= MAX_WER
    # without a runtime directory: a private one under /tmp, per user
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_path() == f"/tmp/voxline-{os.geteuid()}/asr.sock"


NOBODY = 65534
# another user's process: a Python that user can run (the tests' own may live under /root)
OTHER_PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(OTHER_PYTHON, os.X_OK),
    reason="acts as another user: needs root and a system python3")


def as_nobody(code: str, *args: str) -> subprocess.Popen:
    """``code`` run by the user nobody (standard library only), its stdout piped."""
    return subprocess.Popen([OTHER_PYTHON, "-c", code, *args], user=NOBODY, group=NOBODY,
                            extra_groups=[], cwd="/", stdout=subprocess.PIPE, text=True)


@pytest.fixture
def open_dir():
    """A directory everybody may use (pytest's own are private to this user)."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="voxline-test-"))
    where.chmod(0o777)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@needs_root
def test_a_socket_another_user_made_gets_no_audio(open_dir):
    """Before: a socket pre-created by another user received the pipeline's audio (and could
    have answered with forged transcripts)."""
    path = open_dir / "asr.sock"
    heard = open_dir / "heard"
    squatter = as_nobody(
        "import os, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "os.chmod(sys.argv[1], 0o777); print('ready', flush=True)\n"
        "got = 0\n"
        "s.settimeout(3)\n"
        "try:\n"
        "    while True:\n"
        "        c, _ = s.accept(); c.settimeout(2)\n"
        "        try:\n"
        "            got += len(c.recv(1 << 20))\n"
        "        except OSError:\n"
        "            pass\n"
        "except OSError:\n"
        "    pass\n"
        "open(sys.argv[2], 'w').write(str(got))\n", str(path), str(heard))
    try:
        assert squatter.stdout.readline().strip() == "ready"
        remote = RemoteASRBackend(ASRConfig(model=str(path)), reconnect_s=0.5)
        with pytest.raises(RemoteASRError, match="belongs to another user"):
            remote.transcribe_batch([speech.load_float("honest")])
        # the file made to look like root's: the process behind it is still not ours
        os.chown(path, 0, 0)
        with pytest.raises(RemoteASRError, match="runs as another user"):
            remote.transcribe_batch([speech.load_float("honest")])
    finally:
        squatter.wait(timeout=30)
    assert heard.read_text() == "0"  # it never got a byte of audio


@needs_root
def test_the_server_refuses_another_users_connection_and_segment(backend, open_dir):
    clip = speech.load("honest")
    raw = open_dir / "clip.raw"
    raw.write_bytes(clip.tobytes())
    raw.chmod(0o644)
    name = wire.shm_name(os.getpid(), "cd" * 8)  # named as if this process had made it

    async def main():
        engine = ASREngine(backend, capacity=4)
        server = ASRServer(engine)
        path = str(open_dir / "asr.sock")
        await server.start_unix(path)
        os.chmod(path, 0o777)  # an operator's mistake: the peer check still holds
        probe = as_nobody(
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(30)\n"
            "data = b''\n"
            "try:\n"
            "    s.sendall(bytes.fromhex(sys.argv[2]))\n"
            "    while chunk := s.recv(65536):\n"
            "        data += chunk\n"
            "except OSError:\n"
            "    pass\n"
            "print(data.hex())\n", path, wire.encode_open(1, {}).hex())
        out = await asyncio.to_thread(probe.communicate, timeout=WAIT)
        maker = as_nobody(
            "import os, sys\n"
            "fd = os.open('/dev/shm/' + sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)\n"
            "os.write(fd, open(sys.argv[2], 'rb').read())\n", name, str(raw))
        await asyncio.to_thread(maker.wait, WAIT)
        c = SyncClient(path)
        await asyncio.to_thread(c.send, wire.encode_shm(1, name, clip.nbytes, len(clip)))
        answer = await asyncio.to_thread(c.answer, 1)
        c.close()
        refused = server.refused_peers
        await server.close()
        engine.close()
        return out[0], answer, refused

    try:
        out, answer, refused = asyncio.run(main())
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/shm/" + name)
    (msg,) = wire.Decoder().feed(bytes.fromhex(out.strip()))
    assert msg.code == wire.ErrorCode.FORBIDDEN and "its own user only" in msg.message, msg
    assert refused == 1
    # readable, named right, but another user's: refused with the same words as a missing one
    assert isinstance(answer, wire.Error) and "cannot be used" in answer.message, answer


# --- 6. malformed uploads, many uploads, slow uploads ------------------------------------------


def _raw_post(port: int, disposition: bytes, body: bytes, extra: bytes = b"") -> bytes:
    part = (b"--B\r\nContent-Disposition: form-data; name=\"file\"; " + disposition + b"\r\n"
            b"Content-Type: audio/wav\r\n\r\n" + body + b"\r\n--B--\r\n")
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: multipart/form-data; boundary=B\r\nContent-Length: {len(part)}\r\n"
            "Connection: close\r\n").encode() + extra + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(head + part)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_nul_in_the_file_name_is_a_400_with_words(backend, tmp_path):
    clip = wav(speech.load("honest"))

    async def main():
        engine, server, _ = await serve(backend, tmp_path)
        port = await server.start_http("127.0.0.1", 0)
        raw = await asyncio.to_thread(_raw_post, port, b'filename="a\x00b.wav"', clip)
        star = await asyncio.to_thread(_raw_post, port, b"filename*=utf-8''a%00b.wav", b"RIFFjunk")
        await server.close()
        engine.close()
        return raw, star

    raw, star = asyncio.run(main())
    assert raw.startswith(b"HTTP/1.1 400"), raw[:200]  # before: 500 "Server got itself in trouble"
    assert b"multipart/form-data body is malformed" in raw
    assert star.startswith(b"HTTP/1.1 400"), star[:200]
    body = json.loads(star.split(b"\r\n\r\n", 1)[1])
    assert "\x00" not in body["error"]["message"] and "a?b.wav" in body["error"]["message"]


def test_uploads_at_once_are_capped_and_slow_ones_time_out(backend, tmp_path):
    clip = wav(speech.load("honest"))

    async def main():
        engine, server, _ = await serve(backend, tmp_path)
        port = await server.start_http("127.0.0.1", 0, max_uploads=1, body_timeout_s=1.5,
                                       header_timeout_s=1.0)
        # one upload that announces 10 MB and sends a little of it
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: multipart/form-data; boundary=B\r\n"
                     b"Content-Length: 10000000\r\n\r\n--B\r\nContent-Disposition: form-data; "
                     b"name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF")
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(timeout=WAIT) as http:
            busy = await http.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions",
                                   files={"file": ("h.wav", clip)})
            slow.settimeout(WAIT)
            t0 = time.monotonic()
            answer = await asyncio.to_thread(slow.recv, 65536)
            timed_out_after = time.monotonic() - t0
            slow.close()
            served = await http.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions",
                                     files={"file": ("h.wav", clip)})
        # slowloris: headers that never end are cut off after the header timeout
        loris = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        for s in loris:
            s.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: loc")
            s.settimeout(WAIT)
        t0 = time.monotonic()
        ends = await asyncio.gather(*(asyncio.to_thread(s.recv, 1024) for s in loris))
        loris_held = time.monotonic() - t0
        for s in loris:
            s.close()
        await server.close()
        engine.close()
        return busy, answer, timed_out_after, served, ends, loris_held

    busy, answer, timed_out_after, served, ends, loris_held = asyncio.run(main())
    assert busy.status_code == 503 and "its limit" in busy.json()["error"]["message"]
    assert busy.headers["Retry-After"] == "1"
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert timed_out_after < 10
    assert served.status_code == 200  # its place was given back
    assert all(e == b"" for e in ends)  # closed, nothing sent
    assert loris_held < 10  # before: held until aiohttp's keep-alive (an hour)


# --- 7. asr-serve killed and restarted ----------------------------------------------------------


def test_remote_asr_survives_asr_serve_killed_and_restarted(tmp_path):
    clip = speech.load_float("honest")
    long_audio, long_text = speech.joined(speech.LONG_FILE, gap_s=0.5, tail_s=0.5)
    first = Served(tmp_path, "--asr-slots", "4")
    remote = RemoteASRBackend(ASRConfig(model=first.path), reconnect_s=WAIT)
    served = [first]
    try:
        (before,) = remote.transcribe_batch([clip])
        # a turn in flight when the server dies: 43 s of audio takes it a few seconds
        result: dict = {}
        call = threading.Thread(target=lambda: result.update(
            hyps=remote.transcribe_batch([int16_to_float(long_audio)])))
        call.start()
        time.sleep(0.5)
        first.kill()
        assert first.proc.returncode == -signal.SIGKILL
        time.sleep(1.0)  # down a while: the call keeps trying
        second = Served(tmp_path, "--asr-slots", "4", socket_path=first.path)
        served.append(second)
        call.join(WAIT)
        assert not call.is_alive()
        (after,) = remote.transcribe_batch([clip])  # a new turn on the new server
        reconnects, resent = remote.reconnects, remote.resent
    finally:
        remote.close()
        for s in served:
            s.stop()
    assert wer(speech.text("honest"), before.text) <= MAX_WER
    (in_flight,) = result["hyps"]
    assert wer(long_text, in_flight.text) <= MAX_WER, in_flight.text
    assert wer(speech.text("honest"), after.text) <= MAX_WER
    assert reconnects >= 1 and resent >= 1


def test_remote_asr_reports_a_server_that_does_not_come_back(tmp_path):
    served = Served(tmp_path, "--asr-slots", "2")
    remote = RemoteASRBackend(ASRConfig(model=served.path), reconnect_s=1.0)
    try:
        remote.warmup()
        served.kill()
        t0 = time.monotonic()
        with pytest.raises(RemoteASRError, match="still so after 1 s"):
            remote.transcribe_batch([speech.load_float("honest")])
        took = time.monotonic() - t0
    finally:
        remote.close()
    assert took < 10
