"""One pacer for every transport: each call's agent audio goes through an ``agent.pacer.Pacer``
on its session's playout, and a running call's playout allocates nothing per frame."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from speak_back import MS, TONE, speak_back_session

import agent.pacer
import agent.playout
from agent.pacer import Pacer
from transports.g711 import PCMU, ulaw_encode
from transports.rtp.call import RtpCall
from transports.rtp.packet import Packetizer
from transports.rtp.stream import RtpMediaStream
from transports.twilio.call import TwilioCall
from transports.twilio.messages import Media, Start
from transports.webrtc.track import PlayoutTrack
from transports.websocket.call import LEAD_FRAMES, WebSocketCall


def test_every_transport_paces_its_playout_with_the_one_pacer() -> None:
    s = speak_back_session()
    paced = {
        "websocket": (WebSocketCall(object(), s).pacer, 20, LEAD_FRAMES),  # type: ignore[arg-type]
        "twilio": (TwilioCall(s, Start("MZ1")).pacer, 20, 1),
        "rtp": (RtpMediaStream(s, PCMU, ("127.0.0.1", 9)).pacer, 20, 1),
        "webrtc@20": (PlayoutTrack(s.playout).pacer, 20, 1),
        "webrtc@10": (PlayoutTrack(s.playout, ptime_ms=10).pacer, 10, 1),
    }
    for transport, (pacer, ptime_ms, lead) in paced.items():
        assert type(pacer) is Pacer, transport
        assert pacer.playout is s.playout, transport
        assert (pacer.ptime_ns, pacer.lead) == (ptime_ms * MS, lead), transport


def _keep_frames(call: object) -> list[np.ndarray]:
    """Every frame the pacer hands the call's encoder, kept alive: a frame that were a new
    allocation would then stay counted against the pacer's or the playout's file."""
    kept: list[np.ndarray] = []
    encoder = call._outbound.encoder  # type: ignore[attr-defined]
    encode = encoder.encode

    def keep(frame: np.ndarray) -> list[bytes]:
        kept.append(frame)
        return encode(frame)

    encoder.encode = keep
    return kept


def _twilio_call() -> tuple[object, object]:
    call = TwilioCall(speak_back_session(), Start("MZ1"), heard_from_marks=False)
    _keep_frames(call)
    seq = iter(range(2, 10**9))
    payload = ulaw_encode(TONE)

    def frame(now: int) -> None:
        call.receive(Media("MZ1", payload, sequence=next(seq)), now)
        call.tick(now)

    return call, frame


def _rtp_call() -> tuple[object, object]:
    call = RtpCall(speak_back_session(), PCMU)
    _keep_frames(call)
    caller = Packetizer(0)
    payload = ulaw_encode(TONE)

    def frame(now: int) -> None:
        call.receive(caller.packet(payload).to_bytes(), now)
        call.tick(now)

    return call, frame


def _blocks(snapshot: tracemalloc.Snapshot) -> int:
    files = [tracemalloc.Filter(True, str(Path(m.__file__))) for m in (agent.pacer, agent.playout)]
    return sum(s.count for s in snapshot.filter_traces(files).statistics("filename"))


@pytest.mark.parametrize("make", [_twilio_call, _rtp_call], ids=["twilio", "rtp"])
def test_a_running_calls_playout_allocates_nothing_per_frame(make) -> None:
    """10,000 frames of a call (caller packet in, spoken back, one packet time out), every
    frame kept: the blocks alive that the pacer and the playout allocated are as many after
    10,000 frames as after 1,000 — their frames are written into buffers made when the call
    started."""
    tracemalloc.start()
    try:
        call, frame = make()
        now = 10**12
        for k in range(10_000):
            frame(now)
            now += 20 * MS
            if k + 1 == 1_000:
                warm = _blocks(tracemalloc.take_snapshot())
        done = _blocks(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    pacer = call.pacer  # type: ignore[attr-defined]
    assert pacer.ticks == 10_000 and pacer.playout.frames_out >= 9_990
    assert done <= warm, f"{warm} blocks after 1,000 frames, {done} after 10,000"
