"""The SIP/RTP server as a hostile caller meets it, over real UDP sockets on loopback: offers
naming an address we cannot or will not send to, calls that go silent or never ACK, media
tasks that fail, spoofed RTP and DTMF, guessable ports, BYEs outside the dialog, a full server,
an INVITE flood, and numbers ``int()`` cannot read. Each test reproduces a finding of the
security review (issue 18) and shows the call's session — its slot, tasks and RTP socket —
freed whatever happened."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
from sip_requests import SDP_OFFER, request

from agent.errors import CapacityError, ConfigError
from agent.frames import AudioIn, Direction, Dtmf, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from transports.g711 import ulaw_encode
from transports.ratelimit import InviteRateLimit, source_key
from transports.rtp.dtmf import TelephoneEvent
from transports.rtp.packet import Packetizer
from transports.sip.message import SipMessage, SipParseError, parse_sip
from transports.sip.sdp import SdpError, parse_offer
from transports.sip.server import SipServer
from transports.sip.uas import (
    CallEstablished,
    CallOffered,
    MediaChanged,
    Outgoing,
    UserAgentServer,
)

PEER = ("127.0.0.1", 5061)
RTP_PORTS = (46000, 46998)
TONE = (8000 * np.sin(2 * np.pi * 440 * np.arange(160) / 8000)).astype(np.int16)


# --- a small agent holding a slot of a fixed pool, like the ASR engine's ---------------------
class Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size


class PoolAgent(Stage):
    """Takes a slot at start (CapacityError when none is left, as the ASR engine raises),
    gives it back at stop; says back what it hears and notes the loudest sample and keys."""

    name = "pool_agent"

    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.pool = pool
        self.holds = False
        self.peak = 0
        self.keys: list[str] = []

    async def start(self, ctx) -> None:
        await super().start(ctx)
        if not self.pool.free:
            raise CapacityError(f"no free ASR slot (all {self.pool.size} in use)")
        self.pool.free -= 1
        self.holds = True

    async def stop(self) -> None:
        if self.holds:
            self.pool.free += 1
            self.holds = False

    def process(self, frame, direction) -> None:
        if isinstance(frame, AudioIn):
            self.peak = max(self.peak, int(np.abs(frame.pcm.astype(np.int32)).max()))
            self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
        elif isinstance(frame, Dtmf):
            self.keys.append(frame.digit)
        else:
            self.push(frame, direction)


class Made:
    def __init__(self, slots: int = 64) -> None:
        self.pool = Pool(slots)
        self.sessions: list[Session] = []
        self.agents: list[PoolAgent] = []

    def __call__(self) -> Session:
        self.agents.append(PoolAgent(self.pool))
        self.sessions.append(Session(Pipeline([self.agents[-1]])))
        return self.sessions[-1]


# --- a caller over real sockets --------------------------------------------------------------
def udp(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, port))
    s.setblocking(False)
    return s


class Caller:
    def __init__(self, server: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.server = server
        self.host = host
        self.sip, self.rtp = udp(host), udp(host)
        self.rtp_port = self.rtp.getsockname()[1]

    def close(self) -> None:
        self.sip.close()
        self.rtp.close()

    def offer(self, connection: str = "") -> str:
        return SDP_OFFER.replace("m=audio 6000", f"m=audio {self.rtp_port}").replace(
            "c=IN IP4 127.0.0.1", connection or f"c=IN IP4 {self.host}")

    def send(self, data: bytes) -> None:
        self.sip.sendto(data, self.server)

    async def recv(self, timeout: float = 5.0) -> SipMessage:
        loop = asyncio.get_running_loop()
        return parse_sip(await asyncio.wait_for(loop.sock_recv(self.sip, 65535), timeout))

    async def invite(self, call_id: str, offer: str | None = None) -> list[SipMessage]:
        """INVITE; the responses up to the final one."""
        self.send(request("INVITE", call_id=call_id, body=offer or self.offer()))
        got = [await self.recv()]
        while got[-1].status < 200:
            got.append(await self.recv())
        return got

    async def call(self, call_id: str) -> str:
        """INVITE and ACK; our To tag (the dialog's)."""
        ok = (await self.invite(call_id))[-1]
        assert ok.status == 200, ok.status
        tag = ok.header("To").split("tag=")[1]
        self.send(request("ACK", call_id=call_id, to_tag=tag))
        return tag

    def rtp_to(self, call_ok: SipMessage) -> tuple[str, int]:
        return "127.0.0.1", int(call_ok.body.decode().split("m=audio ")[1].split()[0])


async def wait_for(pred, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


def drain(sock: socket.socket) -> int:
    n = 0
    while True:
        try:
            sock.recv(65535)
        except BlockingIOError:
            return n
        n += 1


# --- finding 1: an SDP address the socket cannot use ----------------------------------------
def test_an_sdp_address_the_socket_cannot_use_is_refused_and_leaks_nothing() -> None:
    """Before: under uvloop (voxline's event loop) each such call's send loop died of a
    ValueError that its close re-raised at BYE, so the session never closed: four calls held
    all four slots for good and every later call got 500."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        made = Made(slots=4)
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS)
        caller = Caller(await server.start())
        statuses, warnings = [], []
        try:
            for i, c in enumerate(["c=IN IP4 localhost", "c=IN IP6 ::1", "c=IN IP4 ::1",
                                   "c=IN IP4 voxline.invalid"]):
                final = (await caller.invite(f"bad-{i}", caller.offer(c)))[-1]
                statuses.append(final.status)
                warnings.append(final.header("Warning"))
                if final.status == 200:  # what the attacker did next
                    tag = final.header("To").split("tag=")[1]
                    caller.send(request("ACK", call_id=f"bad-{i}", to_tag=tag))
                    await asyncio.sleep(0.1)
                    caller.send(request("BYE", call_id=f"bad-{i}", cseq=2, to_tag=tag))
                    await asyncio.sleep(0.2)
                    drain(caller.sip)
            good = (await caller.invite("good"))[-1].status
            assert statuses == [488] * 4, statuses
            assert "not a numeric IP address" in warnings[0]
            assert "IPv6" in warnings[1] and "not an IP4 address" in warnings[2]
            assert good == 200 and made.pool.free == 3
        finally:
            caller.close()
            await server.stop()
        assert made.pool.free == 4 and all(s.closed for s in made.sessions)

    uvloop.run(main())


def test_a_call_whose_media_task_fails_is_ended_and_freed() -> None:
    """Whatever the media task raises, the call ends (a BYE with reason ``error``) and its
    session closes; before, the call stayed up with no audio and its slot leaked at BYE."""

    async def main() -> None:
        made = Made(slots=2)

        def break_media(call) -> None:
            def tick(now_ns: int) -> list[bytes]:
                raise RuntimeError("a bug in the playout")

            call.media.call.tick = tick

        server = SipServer(made, port=0, rtp_ports=RTP_PORTS, on_call=break_media)
        caller = Caller(await server.start())
        try:
            await caller.call("breaks")
            bye = await caller.recv(timeout=5)
            assert bye.method == "BYE" and 'text="error"' in bye.header("Reason")
            await wait_for(lambda: server.reports)
            assert server.reports[0].reason == "error" and server.calls == {}
            assert made.pool.free == 2 and made.sessions[0].closed
        finally:
            caller.close()
            await server.stop()

    asyncio.run(main())


# --- finding 2: calls that never end ---------------------------------------------------------
def test_a_call_that_goes_silent_is_ended_after_the_rtp_timeout() -> None:
    async def main() -> None:
        made = Made(slots=1)
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS, rtp_timeout_s=0.6)
        caller = Caller(await server.start())
        try:
            ok = (await caller.invite("quiet"))[-1]
            tag = ok.header("To").split("tag=")[1]
            caller.send(request("ACK", call_id="quiet", to_tag=tag))
            out = Packetizer(0)
            for _ in range(75):  # 1.5 s of RTP: longer than the timeout, the call stays up
                caller.rtp.sendto(out.packet(ulaw_encode(TONE)).to_bytes(), caller.rtp_to(ok))
                await asyncio.sleep(0.02)
            assert "quiet" in server.calls and not server.reports
            t_quiet = asyncio.get_running_loop().time()
            bye = await caller.recv(timeout=6)  # then it goes silent
            waited = asyncio.get_running_loop().time() - t_quiet
            assert bye.method == "BYE" and 'text="rtp-timeout"' in bye.header("Reason")
            assert 0.5 < waited < 4.0
            await wait_for(lambda: server.reports)
            assert server.reports[0].reason == "rtp-timeout" and made.pool.free == 1
            assert (await caller.invite("next"))[-1].status == 200  # the slot is back
        finally:
            caller.close()
            await server.stop()

    asyncio.run(main())


def test_an_answered_call_never_acked_is_ended() -> None:
    async def main() -> None:
        made = Made(slots=1)
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS, ack_timeout_s=1.0)
        caller = Caller(await server.start())
        try:
            assert (await caller.invite("no-ack"))[-1].status == 200  # and no ACK
            async with asyncio.timeout(6):
                while (msg := await caller.recv()).method != "BYE":
                    assert msg.status == 200  # the 200 OK, retransmitted meanwhile
            await wait_for(lambda: server.reports)
            assert server.reports[0].reason == "no-ack" and made.pool.free == 1
            assert made.sessions[0].closed and server.calls == {}
        finally:
            caller.close()
            await server.stop()

    asyncio.run(main())


# --- finding 3: RTP from elsewhere, guessable ports ------------------------------------------
def test_spoofed_rtp_and_dtmf_from_another_address_are_dropped_and_counted() -> None:
    async def main() -> None:
        made = Made()
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS)
        caller = Caller(await server.start())
        attacker = udp()
        try:
            ok = (await caller.invite("spoofed"))[-1]
            tag = ok.header("To").split("tag=")[1]
            caller.send(request("ACK", call_id="spoofed", to_tag=tag))
            media = caller.rtp_to(ok)
            mine, theirs, keys = Packetizer(0), Packetizer(0), Packetizer(101)
            quiet = ulaw_encode(np.zeros(160, np.int16))
            for i in range(40):
                caller.rtp.sendto(mine.packet(quiet).to_bytes(), media)
                attacker.sendto(theirs.packet(ulaw_encode(TONE)).to_bytes(), media)
                if i == 20:
                    for j, end in enumerate([False, False, True, True, True]):
                        ev = TelephoneEvent(7, end, 10, 160 * (j + 1)).to_bytes()
                        attacker.sendto(keys.packet(ev).to_bytes(), media)
                        keys.timestamp -= 160
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            agent = made.agents[0]
            assert agent.peak < 100 and agent.keys == []  # nothing of the attacker was heard
            caller.send(request("BYE", call_id="spoofed", cseq=2, to_tag=tag))
            await wait_for(lambda: server.reports)
            stats = server.reports[0].media
            assert stats.foreign == 45 and stats.packets_in >= 35 and stats.dtmf == ""
        finally:
            attacker.close()
            caller.close()
            await server.stop()

    asyncio.run(main())


def test_rtp_ports_are_random_and_taken_ports_are_skipped() -> None:
    async def main() -> None:
        server = SipServer(Made(), port=0, rtp_ports=RTP_PORTS)
        caller = Caller(await server.start())
        try:
            ports = []
            for i in range(8):
                ok = (await caller.invite(f"port-{i}"))[-1]
                ports.append(caller.rtp_to(ok)[1])
            assert all(p % 2 == 0 and RTP_PORTS[0] <= p <= RTP_PORTS[1] for p in ports)
            # in order they would be 46000, 46002, ...: random ones are not even sorted
            assert ports != sorted(ports) or ports[-1] - ports[0] != 14
        finally:
            caller.close()
            await server.stop()
        # a range of four even ports, three taken by others: the call gets the fourth
        taken = [udp(port=p) for p in (46900, 46902, 46906)]
        server = SipServer(Made(), port=0, rtp_ports=(46900, 46907))
        caller = Caller(await server.start())
        try:
            for i in range(3):
                ok = (await caller.invite(f"narrow-{i}"))[-1]
                if i == 0:
                    assert ok.status == 200 and caller.rtp_to(ok)[1] == 46904
                else:  # no port left: refused, nothing kept
                    assert ok.status == 500
        finally:
            for s in taken:
                s.close()
            caller.close()
            await server.stop()

    asyncio.run(main())


# --- finding 6: BYE outside the dialog, third-party media, capacity, floods -------------------
def test_bye_must_match_the_dialog_tags() -> None:
    async def main() -> None:
        made = Made()
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS)
        caller = Caller(await server.start())
        try:
            tag = await caller.call("tags")
            other_from = request("BYE", call_id="tags", cseq=2, to_tag=tag).replace(
                b";tag=42", b";tag=43")
            caller.send(other_from)
            assert (await caller.recv()).status == 481
            caller.send(request("BYE", call_id="tags", cseq=2, to_tag="not-ours"))
            assert (await caller.recv()).status == 481
            caller.send(request("BYE", call_id="tags", cseq=2))  # no To tag at all
            assert (await caller.recv()).status == 481
            assert "tags" in server.calls and not made.sessions[0].closed
            caller.send(request("BYE", call_id="tags", cseq=2, to_tag=tag))
            assert (await caller.recv()).status == 200
            await wait_for(lambda: server.reports)
            assert server.uas.mismatched == 3
        finally:
            caller.close()
            await server.stop()

    asyncio.run(main())


def test_media_aimed_at_a_third_party_is_refused_unless_its_network_is_allowed() -> None:
    async def main() -> None:
        victim = udp("127.0.0.2")
        third_party = f"c=IN IP4 127.0.0.2\r\nm=audio {victim.getsockname()[1]}"
        try:
            server = SipServer(Made(), port=0, rtp_ports=RTP_PORTS)
            caller = Caller(await server.start())
            try:
                offer = caller.offer().replace(f"m=audio {caller.rtp_port}", third_party)
                final = (await caller.invite("aimed", offer))[-1]
                assert final.status == 488 and "not the address" in final.header("Warning")
                await asyncio.sleep(0.3)
                assert drain(victim) == 0 and server.calls == {}
            finally:
                caller.close()
                await server.stop()
            # a PBX whose media servers sit elsewhere: allowed by --media-peers
            server = SipServer(Made(), port=0, rtp_ports=RTP_PORTS, media_peers=["127.0.0.0/8"])
            caller = Caller(await server.start())
            try:
                offer = caller.offer().replace(f"m=audio {caller.rtp_port}", third_party)
                ok = (await caller.invite("allowed", offer))[-1]
                assert ok.status == 200
                caller.send(request("ACK", call_id="allowed",
                                    to_tag=ok.header("To").split("tag=")[1]))
                await asyncio.sleep(0.3)
                assert drain(victim) > 5  # the media server gets the call's RTP
            finally:
                caller.close()
                await server.stop()
        finally:
            victim.close()

    asyncio.run(main())


def test_no_free_slot_is_answered_503_with_retry_after() -> None:
    async def main() -> None:
        made = Made(slots=1)
        seen, ended = [], []
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS,
                           on_call=lambda c: seen.append(c.call_id),
                           on_end=lambda r: ended.append((r.call_id, r.reason)))
        caller = Caller(await server.start())
        try:
            await caller.call("first")
            full = (await caller.invite("second"))[-1]
            assert full.status == 503 and full.header("Retry-After") == "5"
            assert made.sessions[1].closed and made.pool.free == 0
            assert list(server.calls) == ["first"]
            # a call whose start was announced gets its end record too (it never had one)
            assert seen == ["first", "second"] and ended == [("second", "refused")]
        finally:
            caller.close()
            await server.stop()

    asyncio.run(main())


def test_an_invite_flood_from_one_source_does_not_lock_out_another() -> None:
    """2,000 INVITEs from one address (never ACKed) used to fill every call place for the 32 s
    of timer H. Now that source gets its burst, then 503s that allocate nothing."""

    async def main() -> None:
        made = Made()
        server = SipServer(made, port=0, rtp_ports=RTP_PORTS)
        addr = await server.start()
        flood = Caller(addr)
        flood.sip.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
        other = Caller(addr, host="127.0.0.2")
        try:
            for i in range(2000):
                flood.send(request("INVITE", call_id=f"flood-{i}", body=flood.offer()))
                if i % 50 == 49:
                    await asyncio.sleep(0.005)  # let the server read: a loopback buffer is small
            await asyncio.sleep(0.5)
            final = (await other.invite("honest"))[-1]
            assert final.status == 200
            loop = asyncio.get_running_loop()
            refused = []
            while True:
                try:
                    msg = parse_sip(await asyncio.wait_for(loop.sock_recv(flood.sip, 65535), 0.5))
                except TimeoutError:
                    break
                if msg.status == 503:
                    refused.append(msg.header("Retry-After"))
            # UDP on a busy 2-core loopback drops some of the 2,000 (1,448 of them answered in
            # one suite run): most, not all, of the flood is read and refused
            assert len(refused) > 1000 and all(r.isdigit() and int(r) >= 1 for r in refused)
            assert server.uas.rejected.get(503, 0) >= len(refused)
            # the flood was given its burst of 20 places at most (and no RTP port beyond them)
            assert len(made.sessions) <= 21 and len(server.calls) <= 21
            assert server.crashes == 0
        finally:
            flood.close()
            other.close()
            await server.stop()
        assert all(s.closed for s in made.sessions)

    asyncio.run(main())


# --- finding 5: numbers int() cannot read ----------------------------------------------------
@pytest.mark.parametrize("raw", [
    request("INVITE", body=SDP_OFFER).replace(b"Content-Length: 2", b"Content-Length: \xc2\xb2"),
    request("OPTIONS").replace(b"Content-Length: 0", "Content-Length: ٠".encode()),
    request("OPTIONS").replace(b"Content-Length: 0", b"Content-Length: +0"),
    request("OPTIONS").replace(b"Max-Forwards: 70", "Max-Forwards: ²".encode()),
    request("OPTIONS").replace(b"CSeq: 1 OPTIONS", "CSeq: ١ OPTIONS".encode()),
    request("OPTIONS").replace(b"CSeq: 1 OPTIONS", b"CSeq: 1_0 OPTIONS"),
])
def test_sip_numbers_must_be_ascii_digits(raw: bytes) -> None:
    with pytest.raises(SipParseError) as err:
        parse_sip(raw)
    assert err.value.status == 400
    out = UserAgentServer("127.0.0.1", 5060).receive(raw, PEER, 0.0)
    assert [parse_sip(o.data).status for o in out if isinstance(o, Outgoing)] == [400]


def test_a_status_code_in_superscript_is_a_bad_response() -> None:
    with pytest.raises(SipParseError):
        parse_sip("SIP/2.0 ²00 OK\r\nCall-ID: x\r\n\r\n".encode())
    assert UserAgentServer("127.0.0.1", 5060).receive("SIP/2.0 ²00 OK\r\n\r\n".encode(), PEER) == []


@pytest.mark.parametrize(("old", "new"), [
    ("m=audio 6000", "m=audio ²"),
    ("m=audio 6000", "m=audio 6⁰00"),
    ("RTP/AVP 0 8 101", "RTP/AVP 0 ⁸ 101"),
    ("a=rtpmap:8 PCMA/8000", "a=rtpmap:⁸ PCMA/8000"),
    ("a=fmtp:101 0-11,16", "a=fmtp:101 0-11,16\r\na=ptime:²"),
])
def test_sdp_numbers_must_be_ascii_digits(old: str, new: str) -> None:
    sdp = SDP_OFFER.replace(old, new)
    with pytest.raises(SdpError):
        parse_offer(sdp.encode())
    out = UserAgentServer("127.0.0.1", 5060).receive(request("INVITE", body=sdp), PEER, 0.0)
    assert [parse_sip(o.data).status for o in out if isinstance(o, Outgoing)] == [488]


def test_rtp_port_range_flag_takes_ascii_digits_only() -> None:
    from agent.commands.telephony import _port_range

    assert _port_range("40000-40999") == (40000, 40999)
    for bad in ("4²-5", "١٠-٢٠", "+1-5", "40000"):
        with pytest.raises(ConfigError):
            _port_range(bad)


# --- the sans-I/O rules behind the above -----------------------------------------------------
def _offer(uas: UserAgentServer, call_id: str, now: float, addr=PEER) -> list[int]:
    sdp = SDP_OFFER.replace("c=IN IP4 127.0.0.1", f"c=IN IP4 {addr[0]}")
    out = uas.receive(request("INVITE", call_id=call_id, body=sdp), addr, now)
    return [parse_sip(o.data).status for o in out if isinstance(o, Outgoing)]


def test_the_invite_rate_is_per_source_and_refusals_allocate_nothing() -> None:
    uas = UserAgentServer("127.0.0.1", 5060, invite_rate=InviteRateLimit(rate=2, burst=3))
    assert [_offer(uas, f"a{i}", 0.0) for i in range(3)] == [[100, 180]] * 3
    out = uas.receive(request("INVITE", call_id="a3", body=SDP_OFFER), PEER, 0.0)
    resp = parse_sip(out[0].data)
    assert resp.status == 503 and resp.header("Retry-After") == "1" and "a3" not in uas.dialogs
    assert _offer(uas, "b0", 0.0, ("127.0.0.9", 5061)) == [100, 180]  # another source
    # tokens come back at the rate, but three calls of "a" are still being set up (not ACKed)
    assert _offer(uas, "a4", 10.0) == [503]
    for cid in ("a0", "a1"):
        ok = parse_sip(uas.accept(cid, b"v=0\r\n", 10.0)[0].data)
        uas.receive(request("ACK", call_id=cid, to_tag=ok.header("To").split("tag=")[1]),
                    PEER, 10.0)
    assert _offer(uas, "a5", 10.0) == [100, 180]
    # a retransmission of an INVITE in progress is answered from its dialog, never limited
    assert _offer(uas, "a5", 10.0) == [180]


def test_a_per_source_call_limit_and_shutdown_refusals() -> None:
    uas = UserAgentServer("127.0.0.1", 5060, max_calls_per_source=1)
    assert _offer(uas, "one", 0.0) == [100, 180]
    assert _offer(uas, "two", 0.0) == [503]
    assert _offer(uas, "elsewhere", 0.0, ("127.0.0.9", 5061)) == [100, 180]
    uas.draining = True
    out = uas.receive(request("INVITE", call_id="late", body=SDP_OFFER), ("10.0.0.1", 5060))
    resp = parse_sip(out[0].data)
    assert resp.status == 503 and resp.header("Retry-After") == "30"


def test_in_dialog_requests_must_match_tags() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    tag = parse_sip(uas.accept("abc@127.0.0.1", b"v=0\r\n", 0.0)[0].data).header("To").split(
        "tag=")[1]
    stranger = request("ACK", to_tag=tag).replace(b";tag=42", b";tag=41")
    assert uas.receive(stranger, PEER, 0.1) == []  # not this dialog's ACK: ignored
    assert uas.dialogs["abc@127.0.0.1"].state == "answered"
    assert uas.receive(request("ACK", to_tag=tag), PEER, 0.2) == [CallEstablished("abc@127.0.0.1")]
    reinvite = request("INVITE", cseq=3, body=SDP_OFFER, to_tag="guess")
    assert [parse_sip(o.data).status for o in uas.receive(reinvite, PEER, 0.3)] == [481]
    cancel = request("CANCEL").replace(b";tag=42", b";tag=41")
    assert [parse_sip(o.data).status for o in uas.receive(cancel, PEER, 0.4)] == [481]
    merged = request("INVITE", body=SDP_OFFER).replace(b";tag=42", b";tag=41")
    assert [parse_sip(o.data).status for o in uas.receive(merged, PEER, 0.5)] == [482]
    assert "abc@127.0.0.1" in uas.dialogs


def test_media_refusal_rules() -> None:
    uas = UserAgentServer("127.0.0.1", 5060, media_peers=["10.1.0.0/16"])
    assert uas.media_refusal("127.0.0.1", PEER) == ""
    assert uas.media_refusal("10.1.2.3", PEER) == ""
    assert "not the address" in uas.media_refusal("10.2.0.1", PEER)
    assert "IPv6" in uas.media_refusal("::1", PEER)
    v6 = UserAgentServer("::", 5060)
    assert v6.media_refusal("192.0.2.1", ("::ffff:192.0.2.1", 5060)) == ""  # dual stack
    sdp = SDP_OFFER.replace("c=IN IP4 127.0.0.1", 'c=IN IP4 "quoted"\\name')
    out = uas.receive(request("INVITE", body=sdp), PEER, 0.0)
    warning = parse_sip(out[0].data).header("Warning")
    assert warning.startswith('399 voxline "') and warning.count('"') == 2


def test_invite_rate_limit_table_is_bounded_and_ipv6_counts_by_prefix() -> None:
    limit = InviteRateLimit(rate=1, burst=1, max_sources=100)
    for i in range(1000):
        assert limit.allow(f"10.0.{i // 256}.{i % 256}", 0.0) == 0.0
    assert len(limit._buckets) == 100
    assert source_key("2001:db8::1") == source_key("2001:db8::ffff:2") == "2001:db8::/64"
    assert source_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert limit.allow("2001:db8::1", 0.0) == 0.0
    assert limit.allow("2001:db8::2", 0.0) == pytest.approx(1.0)
    assert InviteRateLimit(rate=0).allow("10.0.0.1", 0.0) == 0.0


def test_sip_flags_parse() -> None:
    from agent.cli import build_parser
    from agent.commands.telephony import _invite_rate, _networks

    args = build_parser().parse_args(["sip", "--rtp-timeout", "5", "--media-peers",
                                      "10.0.0.0/8, 192.0.2.7", "--invite-rate", "3/s"])
    assert args.rtp_timeout == 5.0 and _invite_rate(args.invite_rate) == 3.0
    assert [str(n) for n in _networks(args.media_peers)] == ["10.0.0.0/8", "192.0.2.7/32"]
    for bad in ("fast", "nan", "-1", "１０"):
        with pytest.raises(ConfigError):
            _invite_rate(bad)
    with pytest.raises(ConfigError):
        _networks("10.0.0.0/33")
    defaults = build_parser().parse_args(["sip"])
    assert (defaults.rtp_timeout, defaults.invite_rate, defaults.invite_burst) == (30.0, "10/s", 20)


def test_offered_call_event_still_carries_the_canonical_address() -> None:
    uas = UserAgentServer("::1", 5060)
    sdp = SDP_OFFER.replace("c=IN IP4 127.0.0.1", "c=IN IP6 0:0::1")
    out = uas.receive(request("INVITE", body=sdp), ("::1", 5061), 0.0)
    (offered,) = [e for e in out if isinstance(e, CallOffered)]
    assert offered.offer.address == "::1"


def test_a_reinvite_moves_the_media_only_where_we_may_send() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    tag = parse_sip(uas.accept("abc@127.0.0.1", b"v=0\r\n", 0.0)[0].data).header("To").split(
        "tag=")[1]
    uas.receive(request("ACK", to_tag=tag), PEER, 0.1)

    def reinvite(cseq: int, sdp: str) -> list:
        out = uas.receive(request("INVITE", cseq=cseq, body=sdp, to_tag=tag), PEER, 1.0)
        assert [parse_sip(o.data).status for o in out if isinstance(o, Outgoing)] == [200]
        return [e for e in out if isinstance(e, MediaChanged)]

    assert reinvite(2, SDP_OFFER) == []  # a session refresh: the same media
    (moved,) = reinvite(3, SDP_OFFER.replace("m=audio 6000", "m=audio 7000"))
    assert (moved.offer.address, moved.offer.port) == ("127.0.0.1", 7000)
    # a hold (c=0.0.0.0) and a third party keep the media where it was
    assert reinvite(4, SDP_OFFER.replace("c=IN IP4 127.0.0.1", "c=IN IP4 0.0.0.0")) == []
    assert reinvite(5, SDP_OFFER.replace("c=IN IP4 127.0.0.1", "c=IN IP4 192.0.2.1")) == []
