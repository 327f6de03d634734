"""The RTP call core without sockets or an event loop: datagrams and times in, datagrams out.
A small agent repeats what it hears, so every caller packet becomes agent audio."""

from __future__ import annotations

import numpy as np
from speak_back import MS, T0, TONE, speak_back_session

from transports.g711 import PCMU, ulaw_decode, ulaw_encode
from transports.rtp.call import RtpCall
from transports.rtp.packet import Packetizer, parse_rtp


def make_call(**options) -> tuple[RtpCall, Packetizer]:
    return RtpCall(speak_back_session(), PCMU, **options), Packetizer(0)


def speech(packets):
    return [np.abs(ulaw_decode(p.payload)).max() > 1000 for p in packets]


def test_agent_audio_then_comfort_silence_one_packet_per_packet_time() -> None:
    call, caller = make_call()
    for _ in range(3):
        call.receive(caller.packet(ulaw_encode(TONE)).to_bytes(), T0)
    out = [parse_rtp(d) for at in range(0, 120, 20) for d in call.tick(T0 + at * MS)]
    assert len(out) == 6 and all(len(p.payload) == 160 and p.payload_type == 0 for p in out)
    # three frames and the tail of agent audio (the tone, behind both resamplers' delay),
    # then comfort silence
    loud = speech(out)
    assert any(loud[:4]) and not any(loud[4:])
    assert not any(ulaw_decode(p.payload).any() for p in out[4:])
    assert [p.marker for p in out] == [True] + [False] * 5
    pairs = list(zip(out, out[1:], strict=False))
    assert all((b.sequence - a.sequence) & 0xFFFF == 1 for a, b in pairs)
    assert all((b.timestamp - a.timestamp) & 0xFFFFFFFF == 160 for a, b in pairs)
    assert call.stats.agent_packets_out == 4 and call.stats.packets_out == 6


def test_a_stall_resyncs_and_the_rtp_clock_skips_what_was_given_up() -> None:
    call, caller = make_call()
    for _ in range(20):
        call.receive(caller.packet(ulaw_encode(TONE)).to_bytes(), T0)
    (a,) = [parse_rtp(d) for d in call.tick(T0)]
    caught_up = [parse_rtp(d) for d in call.tick(T0 + 100 * MS)]
    assert len(caught_up) == 5 and call.stats.late_ticks == 1 and call.stats.resyncs == 0
    (b,) = [parse_rtp(d) for d in call.tick(T0 + 500 * MS)]
    assert call.stats.resyncs == 1 and call.pacer.dropped == 19
    # one packet after the stall: the sequence goes on, the timestamp keeps the wall clock
    assert (b.sequence - caught_up[-1].sequence) & 0xFFFF == 1
    assert (b.timestamp - a.timestamp) & 0xFFFFFFFF == 500 // 20 * 160
    assert [parse_rtp(d).timestamp for d in call.tick(T0 + 520 * MS)] == [b.timestamp + 160]


def test_without_comfort_silence_quiet_packet_times_only_advance_the_clock() -> None:
    call, caller = make_call(send_silence=False)
    call.receive(caller.packet(ulaw_encode(TONE)).to_bytes(), T0)
    out = [(at, parse_rtp(d)) for at in range(0, 100, 20) for d in call.tick(T0 + at * MS)]
    assert [at for at, _ in out] == [0, 20]  # the frame and its tail; nothing while quiet
    call.receive(caller.packet(ulaw_encode(TONE)).to_bytes(), T0 + 100 * MS)
    (p,) = [parse_rtp(d) for d in call.tick(T0 + 100 * MS)]
    assert p.marker and (p.timestamp - out[0][1].timestamp) & 0xFFFFFFFF == 5 * 160


def test_bad_datagrams_are_counted_and_a_quiet_caller_is_filled_with_silence() -> None:
    call, caller = make_call()
    for junk in (b"", b"\x00" * 5, b"\x80" + b"\x00" * 3):
        call.receive(junk, T0)
    call.receive(caller.packet(ulaw_encode(TONE)).to_bytes(), T0)
    assert call.stats.malformed == 3 and call.stats.packets_in == 1
    heard = call.session.offset
    for at in range(0, 300, 20):
        call.tick(T0 + at * MS)
    # no caller audio since T0: after 100 ms each packet time feeds 20 ms of silence
    assert call.stats.silence_filled == 9 and call.session.offset > heard
