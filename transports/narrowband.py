"""Telephone audio ↔ pipeline audio: 8 kHz G.711 packets to 16 kHz int16 PCM and back, through
streaming soxr resamplers that keep their filter state across 20 ms packets; and a session's
playout as G.711 packets on the pacer's clock, what the Twilio and RTP call cores both send.

soxr's default (fixed-rate) mode releases output in ~100 ms blocks, which would add that much
to every turn; its variable-rate mode (``vr=True``) hands back every packet's worth within one
packet, with the same anti-aliasing (a 6 kHz tone at 16 kHz comes out ~-80 dB at 8 kHz).
"""

from __future__ import annotations

import numpy as np

from agent.frames import Frame, Interrupt
from agent.pacer import Pacer
from agent.playout import Playout
from transports.g711 import G711Codec

NARROWBAND_RATE = 8_000
PIPELINE_RATE = 16_000
PACKET_SAMPLES = 160  # 20 ms at 8 kHz: one RTP packet or one Twilio media chunk


def _stream(in_rate: int, out_rate: int) -> object:
    from agent.errors import require

    soxr = require("soxr", what="telephone audio resampling", extra="web")
    return soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality="HQ", vr=True)


class NarrowbandDecoder:
    """G.711 payloads in, 16 kHz int16 PCM out: twice as many samples as bytes in, from the first
    packet on (the resampler is primed with silence, so it never withholds a packet's worth)."""

    def __init__(self, codec: G711Codec) -> None:
        self.codec = codec
        self._up = _stream(NARROWBAND_RATE, PIPELINE_RATE)
        for _ in range(2):
            self._up.resample_chunk(np.zeros(PACKET_SAMPLES, np.int16))  # type: ignore[attr-defined]

    def decode(self, payload: bytes) -> np.ndarray:
        return self._up.resample_chunk(self.codec.decode(payload))  # type: ignore[attr-defined]

    def conceal(self, samples: int = PACKET_SAMPLES) -> np.ndarray:
        """A lost packet: silence of the same length keeps the media clock honest."""
        return self._up.resample_chunk(np.zeros(samples, np.int16))  # type: ignore[attr-defined]


class NarrowbandEncoder:
    """16 kHz int16 PCM in, whole 160-byte G.711 packets out.

    The resampler's output does not line up with 20 ms boundaries (it holds a few ms back), so
    leftover 8 kHz samples wait in a small FIFO for the next frame; ``drain`` pads the tail of an
    utterance with silence so no agent audio is left behind. The resampler is primed with one
    frame of silence, so the first frame of agent audio already fills a packet instead of
    waiting a packet time for the filter's delay.
    """

    def __init__(self, codec: G711Codec) -> None:
        self.codec = codec
        self._fifo: np.ndarray = np.zeros(0, np.int16)
        self._primed_only = True
        self.reset()

    def encode(self, pcm16k: np.ndarray) -> list[bytes]:
        self._primed_only = False
        narrow = self._down.resample_chunk(pcm16k)  # type: ignore[attr-defined]
        self._fifo = np.concatenate([self._fifo, narrow]) if len(self._fifo) else narrow
        out: list[bytes] = []
        while len(self._fifo) >= PACKET_SAMPLES:
            out.append(self.codec.encode(self._fifo[:PACKET_SAMPLES]))
            self._fifo = self._fifo[PACKET_SAMPLES:]
        return out

    @property
    def pending(self) -> int:
        return 0 if self._primed_only else len(self._fifo)

    def drain(self) -> bytes | None:
        """The leftover samples as one packet padded with silence, or None when there are none
        (the priming silence alone is no agent audio)."""
        if self._primed_only or not len(self._fifo):
            return None
        pad = np.zeros(PACKET_SAMPLES, np.int16)
        pad[: len(self._fifo)] = self._fifo
        self._fifo = np.zeros(0, np.int16)
        return self.codec.encode(pad)

    def reset(self) -> None:
        """A fresh, primed resampler (also on barge-in: forget the flushed audio's tail)."""
        self._down = _stream(PIPELINE_RATE, NARROWBAND_RATE)
        self._fifo = self._down.resample_chunk(np.zeros(2 * PACKET_SAMPLES, np.int16))  # type: ignore[attr-defined]
        self._primed_only = True


class NarrowbandPlayout:
    """A session's playout as G.711 packets on the pacer's 20 ms clock: what Twilio's and RTP's
    call cores both send. ``tick(now_ns)`` gives, per packet time due, the payloads of agent
    audio for it (usually one; none while the agent is quiet). When the agent stops, the
    encoder's tail goes out padded in the next quiet packet time; ``reset`` (barge-in) forgets
    it instead."""

    def __init__(self, playout: Playout, codec: G711Codec) -> None:
        self.pacer = Pacer(playout)
        self.encoder = NarrowbandEncoder(codec)

    def tick(self, now_ns: int) -> list[list[bytes]]:
        slots: list[list[bytes]] = []
        for frame in self.pacer.tick(now_ns):
            if frame is not None:
                slots.append(self.encoder.encode(frame))
            else:
                tail = self.encoder.drain()
                slots.append([tail] if tail is not None else [])
        return slots

    def reset(self) -> None:
        self.encoder.reset()


class NarrowbandCall:
    """What Twilio's and RTP's sans-I/O call cores share: the session's playout as G.711 packets
    on the one pacer (``_outbound``), and a barge-in that forgets the encoder's tail."""

    _outbound: NarrowbandPlayout

    @property
    def pacer(self) -> Pacer:
        return self._outbound.pacer

    def delay(self, now_ns: int) -> float:
        """Seconds until the next packet time is due."""
        return self._outbound.pacer.delay(now_ns)

    def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, Interrupt):
            self._interrupted()

    def _interrupted(self) -> None:
        self._outbound.reset()
