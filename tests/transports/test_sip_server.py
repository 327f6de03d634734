"""The SIP/RTP shell over real UDP sockets on 127.0.0.1, with a small agent that speaks back
what it hears: a call is set up, audio flows both ways paced at 20 ms, DTMF becomes a frame,
bad SIP and bad RTP are answered or counted, and BYE frees the session."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
from sip_requests import SDP_OFFER, request

from agent.frames import AudioIn, Direction, Dtmf, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from transports.g711 import ulaw_decode, ulaw_encode
from transports.rtp.dtmf import TelephoneEvent
from transports.rtp.packet import Packetizer, parse_rtp
from transports.sip.message import parse_sip
from transports.sip.server import SipServer


class SpeakBack(Stage):
    """Answers every caller frame with the same audio (the agent's voice in this test)."""

    name = "speak_back"

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def process(self, frame, direction) -> None:
        if isinstance(frame, AudioIn):
            self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
        elif isinstance(frame, Dtmf):
            self.seen.append(frame)
        else:
            self.push(frame, direction)


def udp(port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))
    s.setblocking(False)
    return s


def drain_rtp(sock: socket.socket) -> list:
    """Every RTP packet waiting on ``sock``, parsed."""
    got = []
    while True:
        try:
            got.append(parse_rtp(sock.recv(2048)))
        except BlockingIOError:
            return got


async def hang_up(loop, server, sip, addr, tag: str, user: str = "agent") -> None:  # noqa: ANN001
    """The caller's BYE, its 200, and the server's end report of the call."""
    sip.sendto(request("BYE", cseq=2, to_tag=tag, user=user), addr)
    (bye_ok,) = await recv_sip(loop, sip, 1)
    assert bye_ok.status == 200
    for _ in range(50):
        if server.reports:
            return
        await asyncio.sleep(0.02)


async def recv_sip(loop, sock, want: int) -> list:
    got = []
    while len(got) < want:
        data = await asyncio.wait_for(loop.sock_recv(sock, 65535), 5)
        got.append(parse_sip(data))
    return got


def test_call_over_udp() -> None:
    asyncio.run(_call())


async def _call() -> None:
    loop = asyncio.get_running_loop()
    dtmf: list = []
    sessions: list[Session] = []
    server = SipServer(lambda: Session(Pipeline([SpeakBack(dtmf)])), port=0,
                       rtp_ports=(42000, 42100), on_call=lambda call: sessions.append(call.session))
    host, port = await server.start()
    sip, rtp = udp(), udp()
    offer = SDP_OFFER.replace("m=audio 6000", f"m=audio {rtp.getsockname()[1]}")
    try:
        # malformed requests first: answered, never fatal
        sip.sendto(request("INVITE", body=offer, drop=("From",)), (host, port))
        sip.sendto(request("INVITE", body="x" * 20000), (host, port))
        sip.sendto(request("INVITE", body=offer, content_length=len(offer) + 50), (host, port))
        bad = await recv_sip(loop, sip, 3)
        assert sorted(m.status for m in bad) == [400, 400, 513]

        sip.sendto(request("INVITE", body=offer), (host, port))
        trying, ringing, ok = await recv_sip(loop, sip, 3)
        assert (trying.status, ringing.status, ok.status) == (100, 180, 200)
        media_port = int(ok.body.decode().split("m=audio ")[1].split()[0])
        tag = ok.header("To").split("tag=")[1]
        sip.sendto(request("ACK", to_tag=tag), (host, port))

        # 1 s of a 440 Hz tone as μ-law RTP, then junk, then DTMF '7' with three end packets
        tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)).astype(np.int16)
        out = Packetizer(0)
        for i in range(50):
            pkt = out.packet(ulaw_encode(tone[i * 160:(i + 1) * 160]), marker=i == 0)
            rtp.sendto(pkt.to_bytes(), ("127.0.0.1", media_port))
            await asyncio.sleep(0.02)
        for junk in (b"", b"\x00" * 5, b"\x40" + b"\x00" * 20):
            rtp.sendto(junk, ("127.0.0.1", media_port))
        ev = Packetizer(101)
        for i, end in enumerate([False, False, True, True, True]):
            payload = TelephoneEvent(7, end, 10, 160 * (i + 1)).to_bytes()
            rtp.sendto(ev.packet(payload).to_bytes(), ("127.0.0.1", media_port))
            ev.timestamp -= 160  # one event: every packet carries its start timestamp
        await asyncio.sleep(0.5)

        received = drain_rtp(rtp)
        speech = [p for p in received if np.abs(ulaw_decode(p.payload)).max() > 1000]
        assert len(received) >= 40 and len(speech) >= 30
        assert all(p.payload_type == 0 and len(p.payload) == 160 for p in received)
        seqs = [p.sequence for p in received]
        assert all((b - a) & 0xFFFF == 1 for a, b in zip(seqs, seqs[1:], strict=False))
        assert [d.digit for d in dtmf] == ["7"]
        call = next(iter(server.calls.values()))
        assert call.media.stats.malformed == 3 and call.media.stats.dtmf == "7"
        # the caller went quiet on the wire: the session keeps hearing (filled) silence
        assert call.media.stats.silence_filled > 5

        await hang_up(loop, server, sip, (host, port), tag)
        assert server.calls == {} and sessions[0].closed
        assert server.reports[0].reason == "bye" and server.crashes == 0
    finally:
        sip.close()
        rtp.close()
        await server.stop()


def test_concurrent_calls_each_get_a_session() -> None:
    asyncio.run(_concurrent(5))


async def _concurrent(n: int) -> None:
    loop = asyncio.get_running_loop()
    sessions: list[Session] = []
    server = SipServer(lambda: Session(Pipeline([SpeakBack([])])), port=0,
                       rtp_ports=(42200, 42300), on_call=lambda call: sessions.append(call.session))
    host, port = await server.start()
    sip = udp()
    try:
        for i in range(n):
            sip.sendto(request("INVITE", call_id=f"call-{i}", body=SDP_OFFER), (host, port))
        answers = [m for m in await recv_sip(loop, sip, 3 * n) if m.status == 200]
        assert sorted(m.call_id for m in answers) == [f"call-{i}" for i in range(n)]
        ports = {m.body.decode().split("m=audio ")[1].split()[0] for m in answers}
        assert len(ports) == n and len(server.calls) == n
        for m in answers:
            tag = m.header("To").split("tag=")[1]
            sip.sendto(request("ACK", call_id=m.call_id, to_tag=tag), (host, port))
        # the agent hangs up the first call: the caller gets a BYE inside that dialog
        await server.hangup("call-0")
        (bye,) = await recv_sip(loop, sip, 1)
        assert bye.method == "BYE" and bye.call_id == "call-0" and bye.cseq == (2, "BYE")
        assert "tag=" in bye.header("From") and bye.header("To").endswith("tag=42")
        for m in answers:
            if m.call_id == "call-0":
                continue
            tag = m.header("To").split("tag=")[1]
            sip.sendto(request("BYE", call_id=m.call_id, cseq=2, to_tag=tag), (host, port))
        assert [m.status for m in await recv_sip(loop, sip, n - 1)] == [200] * (n - 1)
        for _ in range(100):
            if len(server.reports) == n:
                break
            await asyncio.sleep(0.02)
        assert server.calls == {} and all(s.closed for s in sessions) and len(sessions) == n
    finally:
        sip.close()
        await server.stop()


def test_the_echo_test_answers_its_own_uri_and_plays_the_caller_back() -> None:
    asyncio.run(_echo_test())


async def _echo_test() -> None:
    from agent.config import Config
    from agent.presets import new_echo_test_session

    loop = asyncio.get_running_loop()
    made: list[str] = []

    def agent() -> Session:
        made.append("agent")
        return Session(Pipeline([SpeakBack([])]))

    def echo() -> Session:
        made.append("echo")
        return new_echo_test_session(Config())

    server = SipServer(agent, port=0, rtp_ports=(42400, 42500), echo_session_factory=echo)
    host, port = await server.start()
    sip, rtp = udp(), udp()
    offer = SDP_OFFER.replace("m=audio 6000", f"m=audio {rtp.getsockname()[1]}")
    try:
        sip.sendto(request("INVITE", body=offer, user="echo"), (host, port))
        *_, ok = await recv_sip(loop, sip, 3)
        assert ok.status == 200 and made == ["echo"]
        media_port = int(ok.body.decode().split("m=audio ")[1].split()[0])
        tag = ok.header("To").split("tag=")[1]
        sip.sendto(request("ACK", to_tag=tag, user="echo"), (host, port))
        # 1 s of a rising tone as μ-law: it must come back, in order, about 200 ms late
        t = np.arange(8000) / 8000
        tone = (8000 * np.sin(2 * np.pi * (300 + 200 * t) * t)).astype(np.int16)
        out = Packetizer(0)
        for i in range(50):
            rtp.sendto(out.packet(ulaw_encode(tone[i * 160:(i + 1) * 160]), marker=i == 0)
                       .to_bytes(), ("127.0.0.1", media_port))
            await asyncio.sleep(0.02)
        for _ in range(20):  # the line's quiet, while the last of the tone comes back
            rtp.sendto(out.packet(ulaw_encode(np.zeros(160, np.int16))).to_bytes(),
                       ("127.0.0.1", media_port))
            await asyncio.sleep(0.02)
        received = drain_rtp(rtp)
        back = np.concatenate([ulaw_decode(p.payload) for p in received]).astype(np.float64)
        # the echo went 8 kHz -> 16 kHz -> 8 kHz through two resamplers: compare by shape
        lag = int(np.argmax(np.correlate(back, tone.astype(np.float64), "valid")))
        seg = back[lag:lag + len(tone)]
        corr = float(np.corrcoef(seg, tone)[0, 1])
        assert corr > 0.9 and 0.1 * 8000 <= lag <= 0.5 * 8000, (corr, lag)
        await hang_up(loop, server, sip, (host, port), tag, user="echo")
        (report,) = server.reports
        (ev,) = [e for e in report.summary["events"] if e["event"] == "echo_test"]
        assert ev["dropped_samples"] == 0 and ev["echoed_samples"] >= 60 * 320 - 1600
        # any other user still reaches the agent
        sip.sendto(request("INVITE", call_id="other@127.0.0.1", body=offer), (host, port))
        *_, ok = await recv_sip(loop, sip, 3)
        assert ok.status == 200 and made == ["echo", "agent"]
    finally:
        sip.close()
        rtp.close()
        await server.stop()
