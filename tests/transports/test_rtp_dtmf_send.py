"""RFC 4733 digits out: the DtmfSender's packets decode back to the same digits through the
DtmfReceiver, with the shape the RFC asks for; and the RTP call core plays them in its own
stream, holding the agent's audio (never sending voice over a digit) until they are done."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from speak_back import MS, T0, speak_back_session

from agent.control import CallControlError, NotSupported
from agent.frames import TTSAudio
from transports.g711 import PCMU, ulaw_decode
from transports.rtp.call import RtpCall
from transports.rtp.dtmf import (
    EVENT_CODES,
    DtmfReceiver,
    DtmfSender,
    parse_telephone_event,
)
from transports.rtp.packet import Packetizer, RtpPacket, parse_rtp


def play(sender: DtmfSender, packetizer: Packetizer) -> list[RtpPacket | None]:
    """One entry per packet time until the sender is done (None: a gap, the clock skipped)."""
    out: list[RtpPacket | None] = []
    while not sender.done:
        data = sender.next(packetizer)
        if data is None:
            packetizer.skip()
        out.append(parse_rtp(data) if data is not None else None)
        assert len(out) < 10_000
    return out


def decode(packets) -> str:
    rx = DtmfReceiver()
    return "".join(k.digit for p in packets if p is not None and p.payload_type != 0
                   for k in rx.feed(p.timestamp, p.payload))


def test_one_digit_has_the_rfc_4733_shape() -> None:
    stream = Packetizer(0, ssrc=1234)
    seq0, ts0 = stream.sequence, stream.timestamp
    slots = play(DtmfSender("5", 101, duration_ms=100, gap_ms=80), stream)
    packets = [p for p in slots if p is not None]
    events = [parse_telephone_event(p.payload) for p in packets]
    # 100 ms = five packet times of tone, the last with E; then two more end packets
    assert len(packets) == 7 and len(slots) == 7
    assert all(p.payload_type == 101 and p.ssrc == 1234 for p in packets)
    assert [p.marker for p in packets] == [True] + [False] * 6
    assert {p.timestamp for p in packets} == {ts0}  # one event: its start time throughout
    assert [e.duration for e in events] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in events] == [False] * 4 + [True] * 3
    assert all(e.event == 5 and e.volume == 10 for e in events)
    assert [p.sequence for p in packets] == [(seq0 + i) & 0xFFFF for i in range(7)]
    # the stream's clock moved on one packet time per packet time
    assert (stream.timestamp - ts0) & 0xFFFFFFFF == 7 * 160


def test_digits_get_new_timestamps_and_gaps_between_them() -> None:
    stream = Packetizer(0)
    slots = play(DtmfSender("12#", 101, duration_ms=60, gap_ms=100), stream)
    # per digit 3 tone + 5 gap packet times (the gap holds the two end repeats), the last
    # digit ends with its repeats
    assert len(slots) == 8 + 8 + 5
    packets = [p for p in slots if p is not None]
    stamps = sorted({p.timestamp for p in packets})
    assert len(stamps) == 3 and all(b - a == 8 * 160 for a, b in pairwise(stamps))
    assert sum(p.marker for p in packets) == 3
    assert decode(slots) == "12#"


@given(st.text(alphabet=EVENT_CODES, min_size=1, max_size=12), st.integers(40, 400),
       st.integers(0, 300), st.integers(0, 2**32 - 1))
def test_any_digits_round_trip_through_the_receiver(digits, duration, gap, start) -> None:
    stream = Packetizer(0)
    stream.timestamp = start  # wrap-around of the RTP clock included
    sender = DtmfSender(digits, 96, duration, gap)
    slots = play(sender, stream)
    assert decode(slots) == digits and sender.sent == digits
    rx = DtmfReceiver()
    keys = [k for p in slots if p is not None for k in rx.feed(p.timestamp, p.payload)]
    assert {k.duration_ms for k in keys} == {-(-duration // 20) * 20}


def test_bad_digits_and_lengths_are_refused() -> None:
    for digits in ("", "12x", "1 2"):
        with pytest.raises(ValueError):
            DtmfSender(digits, 101)
    with pytest.raises(ValueError):
        DtmfSender("1", 101, duration_ms=10)
    with pytest.raises(ValueError):
        DtmfSender("1", 101, gap_ms=-1)


def test_stop_ends_the_digit_under_way_and_presses_no_more() -> None:
    stream = Packetizer(0)
    sender = DtmfSender("123", 101)
    first = [sender.next(stream) for _ in range(2)]
    sender.stop()
    rest = play(sender, stream)
    assert decode([parse_rtp(d) for d in first] + rest) == "1" and sender.sent == "1"


def agent_says(call: RtpCall, ms: int) -> None:
    t = np.arange(16 * ms) / 16000
    pcm = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    call.session.playout.on_frame(TTSAudio(pcm, last=True))


def test_the_call_plays_digits_in_its_stream_and_holds_the_agent_audio_meanwhile() -> None:
    call = RtpCall(speak_back_session(), PCMU, dtmf_payload_type=101)
    agent_says(call, 400)  # the agent is talking: 400 ms queued
    out = [parse_rtp(d) for at in range(0, 100, 20) for d in call.tick(T0 + at * MS)]
    sender = call.send_dtmf("1#", duration_ms=100, gap_ms=80)
    queued = call.session.playout.queued_samples
    at = 100
    while not sender.done:
        out += [parse_rtp(d) for d in call.tick(T0 + at * MS)]
        at += 20
    during = out[5:]
    # the digits' packet times carry events or silence, never the agent's voice, and the
    # agent's audio waited where it was
    assert call.session.playout.queued_samples == queued
    assert all(p.payload_type == 101 or not np.abs(ulaw_decode(p.payload)).max() > 1000
               for p in during)
    assert decode(during) == "1#" and call.stats.dtmf_sent == "1#"
    assert call.stats.dtmf_packets_out == 14
    # then the agent's audio goes on, a new talkspurt
    after = [parse_rtp(d) for t in range(at, at + 300, 20) for d in call.tick(T0 + t * MS)]
    assert after[0].marker and after[0].payload_type == 0
    assert sum(np.abs(ulaw_decode(p.payload)).max() > 1000 for p in after) >= 10
    # one stream: sequence numbers go on by one and the clock by one packet time, all along
    every = out + after
    assert all((b.sequence - a.sequence) & 0xFFFF == 1 for a, b in pairwise(every))
    # one packet per packet time: an audio packet's timestamp, and an event's start, is its
    # packet time; an event's later packets keep their start
    first = every[0]
    on_time = [p for p in every if p.payload_type == 0 or p.marker]
    assert all((p.timestamp - first.timestamp) & 0xFFFFFFFF
               == 160 * ((p.sequence - first.sequence) & 0xFFFF) for p in on_time)
    assert len({p.ssrc for p in every}) == 1


def test_a_call_without_telephone_event_cannot_send_digits() -> None:
    call = RtpCall(speak_back_session(), PCMU, dtmf_payload_type=None)
    with pytest.raises(NotSupported):
        call.send_dtmf("1")


def test_the_stream_shell_waits_for_the_digits_and_fails_them_when_the_call_ends() -> None:
    from transports.rtp.stream import RtpMediaStream

    async def run() -> None:
        import socket

        peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        peer.bind(("127.0.0.1", 0))
        peer.setblocking(False)
        media = RtpMediaStream(speak_back_session(), PCMU, peer.getsockname(),
                               dtmf_payload_type=101)
        await media.open("127.0.0.1", 0)
        media.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.wait_for(media.send_dtmf("9", duration_ms=60), 5)
        took = loop.time() - t0
        got = []
        while True:
            try:
                got.append(parse_rtp(peer.recv(2048)))
            except BlockingIOError:
                break
        assert decode([p for p in got if p.payload_type == 101]) == "9"
        assert 0.06 <= took < 2.0  # 3 packet times of tone and 2 of end repeats, paced
        pending = asyncio.ensure_future(media.send_dtmf("123"))
        await asyncio.sleep(0.05)
        await media.close()
        with pytest.raises(CallControlError):
            await pending
        peer.close()

    asyncio.run(run())
