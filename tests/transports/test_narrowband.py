"""8 kHz G.711 ↔ 16 kHz PCM through the streaming resamplers: whole packets out from the first
frame, no agent audio lost at an utterance's end, and a tone that survives the round trip."""

from __future__ import annotations

import numpy as np

from transports.g711 import PCMA, PCMU
from transports.narrowband import NarrowbandDecoder, NarrowbandEncoder


def tone(rate: int, hz: float, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def test_first_frame_fills_a_packet_and_the_tail_is_drained() -> None:
    enc = NarrowbandEncoder(PCMU)
    assert enc.pending == 0 and enc.drain() is None  # priming silence is not agent audio
    x = tone(16000, 440, 0.1)
    packets = [p for k in range(5) for p in enc.encode(x[k * 320:(k + 1) * 320])]
    assert len(packets) == 5 and all(len(p) == 160 for p in packets)
    tail = enc.drain()
    assert tail is not None and len(tail) == 160 and enc.drain() is None


def test_round_trip_keeps_a_telephone_band_tone() -> None:
    for codec in (PCMU, PCMA):
        enc, dec = NarrowbandEncoder(codec), NarrowbandDecoder(codec)
        x = tone(16000, 1000, 1.0)
        out = np.concatenate([dec.decode(p) for k in range(50)
                              for p in enc.encode(x[k * 320:(k + 1) * 320])])
        assert len(out) == 16000
        mid = out[4000:12000].astype(float)
        spectrum = np.abs(np.fft.rfft(mid))
        assert abs(np.argmax(spectrum) * 16000 / len(mid) - 1000) < 5
        assert 0.8 < np.sqrt((mid**2).mean()) / np.sqrt((x[4000:12000].astype(float) ** 2).mean()) < 1.2


def test_agent_audio_above_4khz_is_filtered_not_aliased() -> None:
    enc = NarrowbandEncoder(PCMU)
    x = tone(16000, 6000, 1.0)
    narrow = np.concatenate([PCMU.decode(p) for k in range(50)
                             for p in enc.encode(x[k * 320:(k + 1) * 320])])
    assert np.sqrt((narrow[800:].astype(float) ** 2).mean()) < 50  # 8000 peak in, near silence out


def test_conceal_keeps_the_clock() -> None:
    dec = NarrowbandDecoder(PCMU)
    n = sum(len(dec.conceal()) for _ in range(50))
    assert n == 16000
