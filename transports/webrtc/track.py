"""The agent's voice as an aiortc audio track, and the Opus encoder that sends it.

aiortc encodes every track the same way: Opus in its "voip" mode, whose 6.5 ms of encoder
look-ahead a voice agent's first word waits for, stereo, resampled to its own frame size. A
call's sender gets :class:`LowDelayOpusEncoder` instead: CELT-only "lowdelay" mode (2.5 ms of
look-ahead), mono, one packet per frame of ``ptime_ms``. The track's :class:`~agent.pacer.Pacer`
releases one frame per packet time, and every frame leaves as one packet the moment it is due.

20-ms packets are the default: measured against Chromium on 2 shared cores, 10-ms packets made
its jitter buffer aim higher (32 vs 22 ms) and cost the page more time, not less
(benchmarks/browser_latency.py, ``webrtc@10``); they stay available for a quieter machine.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections import deque

import av
import numpy as np
from aiortc import RTCRtpSender
from aiortc.codecs.base import Encoder
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from agent.frames import SAMPLE_RATE
from agent.pacer import Pacer
from agent.playout import Playout
from transports.webrtc.inbound import AlignedResampler

log = logging.getLogger("voxline.webrtc")

OPUS_RATE = 48_000
TIME_BASE = fractions.Fraction(1, OPUS_RATE)
PTIME_MS = 20
PTIMES_MS = (10, 20)
OPUS_BITRATE = 48_000  # mono speech at 48 kHz in CELT mode


def _check_ptime(ptime_ms: int) -> int:
    if ptime_ms not in PTIMES_MS:
        raise ValueError(f"ptime_ms must be one of {PTIMES_MS}, not {ptime_ms!r}")
    return ptime_ms


class LowDelayOpusEncoder(Encoder):
    """Opus for a live voice: "lowdelay" application (CELT only, 2.5 ms look-ahead instead of
    voip's 6.5), mono (any Opus decoder plays mono packets on an opus/48000/2 stream), one
    packet per frame of exactly ``ptime_ms``, returned at once. Fed the frames of
    :class:`PlayoutTrack`; the RTP timestamp is the frame's own ``pts``."""

    def __init__(self, ptime_ms: int = PTIME_MS, bitrate: int = OPUS_BITRATE) -> None:
        self.frame_samples = OPUS_RATE * _check_ptime(ptime_ms) // 1000
        self.codec = av.CodecContext.create("libopus", "w")
        self.codec.bit_rate = bitrate
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.sample_rate = OPUS_RATE
        self.codec.time_base = TIME_BASE
        self.codec.options = {"application": "lowdelay", "frame_duration": str(ptime_ms)}

    def encode(self, frame: av.AudioFrame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        if (frame.samples != self.frame_samples or frame.sample_rate != OPUS_RATE
                or frame.layout.name != "mono" or frame.format.name != "s16"):
            raise ValueError(
                f"LowDelayOpusEncoder takes s16 mono {OPUS_RATE} Hz frames of "
                f"{self.frame_samples} samples, got {frame.format.name} {frame.layout.name} "
                f"{frame.sample_rate} Hz x {frame.samples}")
        packets = self.codec.encode(frame)
        return [bytes(p) for p in packets], int(frame.pts)

    def pack(self, packet: av.Packet) -> tuple[list[bytes], int]:
        raise NotImplementedError("LowDelayOpusEncoder encodes frames; it does not repack")


def use_low_delay_opus(sender: RTCRtpSender, codec_mime: str, ptime_ms: int) -> bool:
    """Give ``sender`` a :class:`LowDelayOpusEncoder` where Opus was negotiated. aiortc makes
    its own encoder on the first frame unless one is there already; False (aiortc's kept, with
    a warning) where this aiortc version keeps it elsewhere or another codec was chosen."""
    if codec_mime.lower() != "audio/opus":
        log.warning("the browser chose %s, not Opus: agent audio uses aiortc's encoder", codec_mime)
        return False
    attr = "_RTCRtpSender__encoder"
    if getattr(sender, attr, "missing") is not None:
        log.warning("aiortc's sender encoder was not found: agent audio uses aiortc's encoder")
        return False
    setattr(sender, attr, LowDelayOpusEncoder(ptime_ms))
    return True


class PlayoutTrack(MediaStreamTrack):
    """The playout as 48 kHz mono frames of ``ptime_ms``, one per ``recv``, released by the
    pacer in real time (aiortc's sender asks as fast as it can encode). Each packet time takes
    ``ptime_ms`` of the playout, or silence while the agent is quiet, so the browser's jitter
    buffer stays primed and agent audio that turns up leaves on the next packet."""

    kind = "audio"

    def __init__(self, playout: Playout, ptime_ms: int = PTIME_MS) -> None:
        super().__init__()
        self.playout = playout
        self.ptime_ms = _check_ptime(ptime_ms)
        self.pacer = Pacer(playout, ptime_ms)
        self.frame_samples = OPUS_RATE * ptime_ms // 1000
        self._silence = np.zeros((1, self.pacer.frame_samples), dtype=np.int16)
        self._up = AlignedResampler("mono", OPUS_RATE, self.frame_samples)
        # 48 kHz packets due now (a late tick catches up), each with whether it is agent audio
        self._ready: deque[tuple[np.ndarray, bool]] = deque()
        self._pts = 0
        self.frames_out = 0

    def _queue(self, pcm: np.ndarray | None) -> None:
        """One packet time of the pacer (None: silence) as one 48 kHz packet."""
        mono = av.AudioFrame.from_ndarray(
            self._silence if pcm is None else pcm.reshape(1, -1), format="s16", layout="mono")
        mono.sample_rate = SAMPLE_RATE
        agent = pcm is not None
        waiting = len(self._ready)
        for chunk in self._up.feed(mono):
            self._ready.append((chunk, agent))
            agent = False
        if len(self._ready) == waiting:  # never after the very first (the resampler is aligned)
            self._ready.append((np.zeros(self.frame_samples, np.int16), agent))

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        while not self._ready:
            delay = self.pacer.delay(time.monotonic_ns())
            if delay > 0:
                await asyncio.sleep(delay)
            for pcm in self.pacer.tick(time.monotonic_ns()):
                self._queue(pcm)
        samples, agent = self._ready.popleft()
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = TIME_BASE
        self._pts += self.frame_samples
        if agent:
            # aiortc encodes and sends this frame as soon as recv returns
            self.playout.sent(time.monotonic_ns())
            self.frames_out += 1
        return frame
