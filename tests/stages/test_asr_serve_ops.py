"""``voxline asr-serve`` operated: ``/metrics`` (parsed with prometheus-client's own parser)
during a stream, ``/healthz`` and ``/readyz``, and the drain on SIGTERM — a stream under way
finishes with its transcript while a new stream and a new upload are refused with the reason,
and the process exits 0 once the stream is done."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

import httpx
import speech
from asr_serve import Served
from prom_text import samples
from test_asr_serve_hardening import SyncClient, wav

from stages.asr import wire
from stages.asr.wer import wer

MAX_WER = 0.15  # (as the hardening tests: far above what tiny.en makes of this clip)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return samples(body.decode())


def test_metrics_health_and_a_drain_that_lets_the_stream_finish(tmp_path):
    served = Served(tmp_path, "--asr-slots", "2", "--http", "127.0.0.1:0", drain_s=60)
    clip = speech.load("honest")
    client = SyncClient(served.path)
    try:
        port = served.port
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        client.send(wire.encode_open(1), *wire.encode_audio_chunks(1, clip[: len(clip) // 2].tobytes()))
        deadline = time.monotonic() + 30
        while (m := scrape(port))[("voxline_asr_serve_streams", ())] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert m[("voxline_asr_slots", (("state", "in_use"),))] == 1
        assert m[("voxline_asr_slots", (("state", "free"),))] == 1
        assert m[("voxline_server_info", (("server", "asr-serve"),))] == 1
        assert ("voxline_event_loop_lag_seconds_count", ()) in m

        served.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while get(f"http://127.0.0.1:{port}/readyz")[0] != 503:
            assert time.monotonic() < deadline, "readyz never turned 503"
            time.sleep(0.05)
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and b'"draining"' in body
        # a new stream, on another connection, is refused with the reason
        other = SyncClient(served.path)
        try:
            other.send(wire.encode_open(7))
            refused = other.answer(7)
        finally:
            other.close()
        assert isinstance(refused, wire.Error) and refused.code == wire.ErrorCode.CAPACITY
        assert "shutting down" in refused.message
        upload = httpx.post(served.url, files={"file": ("a.wav", wav(clip))}, timeout=30)
        assert upload.status_code == 503 and "shutting down" in upload.json()["error"]["message"]
        # the stream under way finishes, with its transcript
        assert served.proc.poll() is None
        client.send(*wire.encode_audio_chunks(1, clip[len(clip) // 2:].tobytes()), wire.encode_end(1))
        final = client.answer(1)
        assert isinstance(final, wire.Final), final
        assert wer(speech.text("honest"), final.text) <= MAX_WER, final.text
    finally:
        client.close()
    rc = served.proc.wait(timeout=30)  # drained: the last stream ended
    served.log.close()
    assert rc == 0, served.log_path.read_text()[-2000:]
    assert "drained in" in served.log_path.read_text()
