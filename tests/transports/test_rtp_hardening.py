"""RTP under attack and failure: only the caller's source is heard (symmetric RTP, the latch
rule of ``transports/rtp/latch.py``), a new SSRC cannot take over a live stream, and a media
stream whose socket cannot send still closes cleanly."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
from speak_back import MS, T0, TONE, speak_back_session

from agent.frames import Dtmf, TTSAudio
from transports.g711 import PCMU, ulaw_encode
from transports.rtp.call import SSRC_QUIET_NS, RtpCall
from transports.rtp.dtmf import TelephoneEvent
from transports.rtp.latch import PeerLatch
from transports.rtp.packet import Packetizer
from transports.rtp.stream import RtpMediaStream

CALLER = ("192.0.2.10", 6000)  # what the SDP named
SILENCE = ulaw_encode(np.zeros(160, np.int16))
LOUD = ulaw_encode(TONE)


class Heard:
    """What the session got: the loudest caller sample (the agent says it back) and the keys."""

    def __init__(self, call: RtpCall) -> None:
        self.peak = 0
        self.keys: list[str] = []
        call.session.listen(self._on, frozenset({TTSAudio, Dtmf}))

    def _on(self, frame) -> None:
        if isinstance(frame, TTSAudio):
            self.peak = max(self.peak, int(np.abs(frame.pcm.astype(np.int32)).max()))
        elif isinstance(frame, Dtmf):
            self.keys.append(frame.digit)


def make_call() -> tuple[RtpCall, Heard]:
    call = RtpCall(speak_back_session(), PCMU, remote=CALLER)
    return call, Heard(call)


def key_packets(digit: int, pk: Packetizer) -> list[bytes]:
    out = []
    for i, end in enumerate([False, False, True, True, True]):
        out.append(pk.packet(TelephoneEvent(digit, end, 10, 160 * (i + 1)).to_bytes()).to_bytes())
        pk.timestamp -= 160  # one event: each packet carries its start timestamp
    return out


def test_rtp_from_another_source_is_dropped_and_counted() -> None:
    call, heard = make_call()
    caller, spoof = Packetizer(0), Packetizer(0)
    for i in range(5):
        call.receive(caller.packet(SILENCE).to_bytes(), T0 + i * 20 * MS, CALLER)
    # speech and a key press from another port on the caller's host, and from another host
    for src in [("192.0.2.10", 6002), ("198.51.100.7", 6000)]:
        for i in range(10):
            call.receive(spoof.packet(LOUD).to_bytes(), T0 + (100 + i) * MS, src)
        for data in key_packets(7, Packetizer(101)):
            call.receive(data, T0 + 200 * MS, src)
    assert heard.peak < 100 and heard.keys == []
    assert call.stats.foreign == 2 * (10 + 5) and call.stats.packets_in == 5
    assert call.target == CALLER
    # the caller itself is still heard, keys included
    for i in range(5):
        call.receive(caller.packet(LOUD).to_bytes(), T0 + (300 + 20 * i) * MS, CALLER)
    for data in key_packets(3, Packetizer(101)):
        call.receive(data, T0 + 320 * MS, CALLER)
    assert heard.peak > 1000 and heard.keys == ["3"]


def test_a_new_ssrc_takes_over_only_after_the_old_one_went_quiet() -> None:
    call, heard = make_call()
    caller, intruder = Packetizer(0), Packetizer(0)
    t = T0
    for _ in range(10):
        call.receive(caller.packet(SILENCE).to_bytes(), t, CALLER)
        call.receive(intruder.packet(LOUD).to_bytes(), t, CALLER)  # same source, new SSRC
        t += 20 * MS
    assert heard.peak < 100 and call.stats.stray_ssrc == 10 and call.stats.ssrc_changes == 0
    # the caller's stream stops (a transfer): after SSRC_QUIET_NS the new stream is taken
    t += SSRC_QUIET_NS
    for _ in range(5):
        call.receive(intruder.packet(LOUD).to_bytes(), t, CALLER)
        t += 20 * MS
    assert call.stats.ssrc_changes == 1 and heard.peak > 1000
    # now the old SSRC is the stranger
    call.receive(caller.packet(SILENCE).to_bytes(), t, CALLER)
    assert call.stats.stray_ssrc == 11


def test_latching_nat_port_sdp_source_wins_and_port_zero() -> None:
    latch = PeerLatch(CALLER)
    nat = ("192.0.2.10", 31000)
    assert latch.admits(nat) and not latch.admits(("192.0.2.11", 6000))
    latch.seen(nat)  # the first packet from the SDP's host: its port was rewritten by NAT
    assert latch.target == nat
    assert not latch.admits(("192.0.2.10", 31002)) and latch.admits(nat)
    assert latch.admits(("192.0.2.10", 0))  # raw-socket senders (sipp's pcap replay)
    latch.seen(("192.0.2.10", 0))
    assert latch.target == nat  # never a target
    # the exact address the SDP named takes the latch back (and stays it)
    assert latch.admits(CALLER) and latch.seen(CALLER) and latch.target == CALLER
    assert not latch.admits(nat) and latch.relatched == 1


def test_the_sdp_named_source_takes_over_from_one_that_spoke_first() -> None:
    call, heard = make_call()
    squatter = ("192.0.2.10", 6010)
    call.receive(Packetizer(0).packet(LOUD).to_bytes(), T0, squatter)  # latched first
    assert call.target == squatter
    caller = Packetizer(0)
    for i in range(3):
        call.receive(caller.packet(SILENCE).to_bytes(), T0 + (i + 1) * 20 * MS, CALLER)
    assert call.target == CALLER and call.stats.packets_in == 4
    call.receive(Packetizer(0).packet(LOUD).to_bytes(), T0 + 100 * MS, squatter)
    assert call.stats.foreign == 1


def test_without_a_remote_everything_is_heard_as_before() -> None:
    call = RtpCall(speak_back_session(), PCMU)
    call.receive(Packetizer(0).packet(LOUD).to_bytes(), T0, ("203.0.113.1", 1))
    assert call.stats.packets_in == 1 and call.target is None


def test_a_stream_whose_address_the_socket_cannot_use_still_closes() -> None:
    """uvloop (voxline's loop) raises ValueError from ``sendto`` for an address of the other
    family or a name; before the fix the send loop died of it and ``close()`` re-raised it,
    so the call's session was never closed."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[int, bool]:
        session = speak_back_session()
        await session.start()
        stream = RtpMediaStream(session, PCMU, ("::1", 6000))
        _, port = await stream.open("127.0.0.1", 0)
        stream.start()
        await asyncio.sleep(0.15)
        await stream.close()  # must not raise
        await session.close("bye")
        await asyncio.sleep(0.05)  # a transport closes on the loop's next turn
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", port))  # the RTP socket is closed: its port is free
        return stream.stats.send_errors, session.closed

    errors, closed = uvloop.run(main())
    assert errors >= 2 and closed


def test_close_survives_a_sender_that_died() -> None:
    async def main() -> RtpMediaStream:
        session = speak_back_session()
        stream = RtpMediaStream(session, PCMU, ("127.0.0.1", 9))
        await stream.open("127.0.0.1", 0)

        def broken_tick(now_ns: int) -> list[bytes]:
            raise RuntimeError("a bug in the playout")

        stream.call.tick = broken_tick  # type: ignore[method-assign]
        stream.start()
        await asyncio.sleep(0.05)
        assert isinstance(stream.failed, RuntimeError)
        await stream.close()
        return stream

    stream = asyncio.run(main())
    assert stream.failed is None  # closed: nothing left running


def test_silence_on_the_wire_is_measured_from_the_start_then_the_last_packet() -> None:
    async def main() -> tuple[int, int, int]:
        stream = RtpMediaStream(speak_back_session(), PCMU, CALLER)
        before = stream.silent_ns(T0)  # not started: never silent
        await stream.open("127.0.0.1", 0)
        stream.start()
        t0 = stream.started_ns
        quiet = stream.silent_ns(t0 + 700 * MS)
        stream.call.receive(Packetizer(0).packet(SILENCE).to_bytes(), t0 + 500 * MS, CALLER)
        after = stream.silent_ns(t0 + 700 * MS)
        await stream.close()
        return before, quiet, after

    before, quiet, after = asyncio.run(main())
    assert (before, quiet, after) == (0, 700 * MS, 200 * MS)


def test_a_retargeted_call_hears_only_its_new_source() -> None:
    call, heard = make_call()
    call.receive(Packetizer(0).packet(SILENCE).to_bytes(), T0, CALLER)
    moved = ("192.0.2.20", 7000)  # a re-INVITE: another media server
    call.retarget(moved)
    assert call.target == moved
    call.receive(Packetizer(0).packet(LOUD).to_bytes(), T0 + 20 * MS, CALLER)
    assert call.stats.foreign == 1
    new = Packetizer(0)
    for i in range(5):
        call.receive(new.packet(LOUD).to_bytes(), T0 + (40 + 20 * i) * MS, moved)
    assert call.stats.packets_in == 6 and heard.peak > 1000
