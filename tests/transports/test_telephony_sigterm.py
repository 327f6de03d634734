"""SIGTERM to a real ``voxline sip`` / ``voxline twilio`` process with a call live: it drains —
stops taking calls (a new INVITE gets 503 with a Retry-After; a new media stream 503 and
``/readyz`` 503) while the live call goes on — and at ``--drain-timeout`` ends the live call on
its wire (a SIP BYE; the media stream closed with 1001), prints the call's end record and exits
0; a live call that ends by itself ends the drain at once. The processes run the real CLI with a small agent in place of
the model stack (``telephony_cli_agent.py``), whose stop takes a second, so the test can call
in while the server is shutting down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest
from sip_requests import SDP_OFFER, request

from transports.g711 import ulaw_encode
from transports.rtp.packet import Packetizer
from transports.sip.message import SipMessage, parse_sip

AGENT_CLI = Path(__file__).with_name("telephony_cli_agent.py")


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Voxline:
    """``voxline ARGS`` as a subprocess; its stdout and stderr lines read on threads."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TWILIO_AUTH_TOKEN"}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, str(AGENT_CLI), *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: queue.Queue[str] = queue.Queue()
        self.err_lines: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out.append),
                         daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err.put),
                         daemon=True).start()

    @staticmethod
    def _read(stream, put) -> None:
        for line in stream:
            put(line)

    def wait_for_stderr(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.err.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.log()}"
                continue
            self.err_lines.append(line)
            if text in line:
                return
        raise AssertionError(f"{text!r} not seen: {self.log()}")

    def finish(self, timeout: float = 20.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.1)  # the reader threads' last lines
        while not self.err.empty():
            self.err_lines.append(self.err.get())
        return rc

    def log(self) -> str:
        return "".join(self.err_lines) + "".join(self.out)

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out if line.startswith("{")]


SIP_DRAIN_S = 3.0


async def _rtp_after(sock: socket.socket, loop: asyncio.AbstractEventLoop) -> int:
    """Packets of agent audio read within 0.2 s."""
    n = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.2):
            while True:
                await loop.sock_recv(sock, 2048)
                n += 1
    return n


def test_sip_sigterm_drains_then_ends_the_live_call_with_a_bye_and_exits_0(tmp_path) -> None:
    port = free_port(socket.SOCK_DGRAM)
    vox = Voxline("sip", "--port", str(port), "--rtp-ports", "47000-47998", "--json",
                  "--drain-timeout", str(SIP_DRAIN_S), "--metrics-port", "0",
                  "--record", str(tmp_path))
    try:
        vox.wait_for_stderr("listening on udp")
        vox.wait_for_stderr("metrics on")
        metrics_url = vox.err_lines[-1].split("metrics on ")[1].split()[0]
        asyncio.run(_sip_call_then_sigterm(port, vox, metrics_url))
        rc = vox.finish()
    finally:
        if vox.proc.poll() is None:
            vox.proc.kill()
    assert rc == 0, vox.log()
    stats = [e for e in vox.events() if e.get("type") == "stats"]
    assert len(stats) == 1 and stats[0]["calls"] == 1 and stats[0]["asr_slots"] == 4, vox.log()
    assert stats[0]["tasks"] > 0
    ended = [e for e in vox.events() if e.get("state") == "ended"]
    assert len(ended) == 1 and ended[0]["reason"] == "shutdown", vox.log()
    assert ended[0]["rtp_dropped"] == {"foreign": 0, "stray_ssrc": 0}
    assert any("stopped after 1 call(s)" in line for line in vox.err_lines), vox.log()
    # --record: the call, both sides (the caller's tone, the agent saying it back), and its trace
    (recording,) = tmp_path.glob("call-*.wav")
    with wave.open(str(recording), "rb") as w:
        assert (w.getnchannels(), w.getframerate()) == (2, 16000)
        stereo = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    assert len(stereo) > 16000 and np.abs(stereo).max(axis=0).min() > 3000
    assert recording.with_suffix(".jsonl").exists()


async def _sip_call_then_sigterm(port: int, vox: Voxline, metrics_url: str) -> None:
    loop = asyncio.get_running_loop()
    sip, rtp = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
    for s in (sip, rtp):
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)

    async def recv(timeout: float = 10.0) -> SipMessage:
        return parse_sip(await asyncio.wait_for(loop.sock_recv(sip, 65535), timeout))

    offer = SDP_OFFER.replace("m=audio 6000", f"m=audio {rtp.getsockname()[1]}")
    server = ("127.0.0.1", port)
    try:
        sip.sendto(request("INVITE", call_id="live", body=offer), server)
        while (ok := await recv()).status < 200:
            pass
        assert ok.status == 200
        tag = ok.header("To").split("tag=")[1]
        sip.sendto(request("ACK", call_id="live", to_tag=tag), server)
        media = ("127.0.0.1", int(ok.body.decode().split("m=audio ")[1].split()[0]))
        out = Packetizer(0)
        tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(160) / 8000)).astype(np.int16)
        for _ in range(25):
            rtp.sendto(out.packet(ulaw_encode(tone)).to_bytes(), media)
            await asyncio.sleep(0.02)

        vox.proc.send_signal(signal.SIGUSR1)  # a stats line, the call going on
        live = _scrape(metrics_url)
        assert live[("voxline_calls_admitted", ())] == 1
        assert live[("voxline_server_info", (("server", "sip"),))] == 1
        assert live[("voxline_rtp_dropped_total", (("cause", "foreign"),))] == 0
        assert live[("voxline_sip_byes_unanswered_total", ())] == 0
        assert _get_json(metrics_url.replace("/metrics", "/readyz"))[0] == 200
        await asyncio.sleep(0.3)
        vox.proc.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        vox.wait_for_stderr("draining")
        status, ready = _get_json(metrics_url.replace("/metrics", "/readyz"))
        assert status == 503 and ready["reasons"] == ["draining: the server is shutting down"]
        # while the server drains, a new call is turned away, told to come back later
        sip.sendto(request("INVITE", call_id="late", body=offer), server)
        late = await recv()
        assert late.call_id == "late" and late.status == 503, vox.log()
        assert int(late.header("Retry-After")) > 0
        assert _scrape(metrics_url)[("voxline_sip_invites_refused_total", (("status", "503"),))] == 1
        # ... and the live call goes on: the agent still speaks back what it hears
        while await _rtp_after(rtp, loop) < 5:
            rtp.sendto(out.packet(ulaw_encode(tone)).to_bytes(), media)
        assert time.monotonic() - t_term < SIP_DRAIN_S
        bye = await recv()  # at the drain timeout: the server ends it
        assert bye.method == "BYE" and bye.call_id == "live", vox.log()
        assert 'text="shutdown"' in bye.header("Reason")
        assert time.monotonic() - t_term > SIP_DRAIN_S - 0.5
    finally:
        sip.close()
        rtp.close()


def test_sip_call_that_ends_during_the_drain_ends_it_at_once() -> None:
    port = free_port(socket.SOCK_DGRAM)
    vox = Voxline("sip", "--port", str(port), "--rtp-ports", "47000-47998", "--json")
    try:
        vox.wait_for_stderr("listening on udp")
        t_bye = asyncio.run(_sip_call_sigterm_then_bye(port, vox))
        rc = vox.finish()
    finally:
        if vox.proc.poll() is None:
            vox.proc.kill()
    assert rc == 0, vox.log()
    assert time.monotonic() - t_bye < 15  # not the default 60 s drain
    ended = [e for e in vox.events() if e.get("state") == "ended"]
    assert len(ended) == 1 and ended[0]["reason"] != "shutdown", vox.log()
    assert any("drained in" in line for line in vox.err_lines), vox.log()


async def _sip_call_sigterm_then_bye(port: int, vox: Voxline) -> float:
    loop = asyncio.get_running_loop()
    sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sip.bind(("127.0.0.1", 0))
    sip.setblocking(False)
    server = ("127.0.0.1", port)

    async def recv(timeout: float = 10.0) -> SipMessage:
        return parse_sip(await asyncio.wait_for(loop.sock_recv(sip, 65535), timeout))

    try:
        sip.sendto(request("INVITE", call_id="live", body=SDP_OFFER), server)
        while (ok := await recv()).status < 200:
            pass
        tag = ok.header("To").split("tag=")[1]
        sip.sendto(request("ACK", call_id="live", to_tag=tag), server)
        await asyncio.sleep(0.5)
        vox.proc.send_signal(signal.SIGTERM)
        vox.wait_for_stderr("draining")
        await asyncio.sleep(0.5)
        sip.sendto(request("BYE", call_id="live", to_tag=tag, cseq=2), server)
        t_bye = time.monotonic()
        answer = await recv()
        assert answer.status == 200 and answer.call_id == "live", vox.log()
        return t_bye
    finally:
        sip.close()


TWILIO_DRAIN_S = 3.0


def test_twilio_sigterm_drains_then_closes_the_live_stream_and_exits_0() -> None:
    port = free_port(socket.SOCK_STREAM)
    vox = Voxline("twilio", "--port", str(port), "--json", "--drain-timeout", str(TWILIO_DRAIN_S))
    try:
        vox.wait_for_stderr("media streams on")
        close_code, refused = asyncio.run(_twilio_call_then_sigterm(port, vox))
        rc = vox.finish()
    finally:
        if vox.proc.poll() is None:
            vox.proc.kill()
    assert close_code == 1001 and refused, vox.log()
    assert rc == 0, vox.log()
    ended = [e for e in vox.events() if e.get("state") == "ended"]
    assert len(ended) == 1, vox.log()
    assert any("stopped after 1 call(s)" in line for line in vox.err_lines), vox.log()


async def _twilio_call_then_sigterm(port: int, vox: Voxline) -> tuple[int | None, bool]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    from transports.twilio.caller import TwilioCaller

    url = f"ws://127.0.0.1:{port}/twilio/media"
    async with connect(url) as ws:
        caller = TwilioCaller()
        speech = (4000 * np.sin(2 * np.pi * 300 * np.arange(8000 * 30) / 8000)).astype(np.int16)
        call = asyncio.get_running_loop().create_task(caller.run(ws, speech, tail_s=0.0))
        await asyncio.sleep(1.0)
        assert not call.done(), vox.log()
        live = _scrape(f"http://127.0.0.1:{port}/metrics")
        assert live[("voxline_calls_admitted", ())] == 1 and live[("voxline_calls_active", ())] == 1
        vox.proc.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        vox.wait_for_stderr("draining")
        # draining: not ready, and a new stream is refused with the reason
        status, ready = _get_json(f"http://127.0.0.1:{port}/readyz")
        assert status == 503 and any("draining" in r for r in ready["reasons"]), ready
        with pytest.raises(InvalidStatus) as refusal:
            async with connect(url, open_timeout=3):
                pass
        assert refusal.value.response.status_code == 503
        assert b"shutting down" in refusal.value.response.body
        assert not call.done(), vox.log()  # the live call goes on
        log = await asyncio.wait_for(call, 15)
        assert time.monotonic() - t_term > TWILIO_DRAIN_S - 0.5
    try:
        async with connect(url, open_timeout=3):
            refused = False
    except OSError:  # nothing listens any more
        refused = True
    return log.close_code, refused


def _get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prom_text import samples

    with urllib.request.urlopen(url, timeout=5) as resp:
        return samples(resp.read().decode())
