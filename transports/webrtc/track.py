"""The agent's voice as an aiortc audio track, and the Opus encoder that sends it.

aiortc encodes every track the same way: Opus in its "voip" mode, whose 6.5 ms of encoder
look-ahead a voice agent's first word waits for, stereo, resampled to its own frame size. A
call's sender gets :class:`LowDelayOpusEncoder` instead: CELT-only "lowdelay" mode (2.5 ms of
look-ahead), mono, one packet per frame of ``ptime_ms``. The track paces its frames at that
packet time, and every frame leaves as one packet the moment it is due.

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
    """The playout's 16 kHz frames as 48 kHz mono frames of ``ptime_ms``, one per ``recv``, paced
    in real time (aiortc's sender asks as fast as it can encode). Silence is sent while the
    agent is quiet, so the browser's jitter buffer stays primed."""

    kind = "audio"

    def __init__(self, playout: Playout, ptime_ms: int = PTIME_MS) -> None:
        super().__init__()
        self.playout = playout
        self.ptime_ms = _check_ptime(ptime_ms)
        self.frame_s = ptime_ms / 1000
        self.frame_samples = OPUS_RATE * ptime_ms // 1000
        # silence goes out one packet at a time, so agent audio that turns up waits at most one
        self._silence = np.zeros((1, SAMPLE_RATE * ptime_ms // 1000), dtype=np.int16)
        self._up = AlignedResampler("mono", OPUS_RATE, self.frame_samples)
        # 48 kHz packets waiting to go, each with whether it opens a frame of agent audio
        self._ready: deque[tuple[np.ndarray, bool]] = deque()
        self._pts = 0
        self._due = 0.0
        self.frames_out = 0

    def _refill(self) -> None:
        """Pull the playout's next frame (or one packet of silence) and cut it into packets."""
        pcm = self.playout.pull()
        mono = av.AudioFrame.from_ndarray(
            self._silence if pcm is None else pcm.reshape(1, -1), format="s16", layout="mono")
        mono.sample_rate = SAMPLE_RATE
        first = pcm is not None
        for chunk in self._up.feed(mono):
            self._ready.append((chunk, first))
            first = False
        if not self._ready:  # never after the very first frame (the resampler is aligned)
            self._ready.append((np.zeros(self.frame_samples, np.int16), first))

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._due == 0.0 or now - self._due > 5 * self.frame_s:
            self._due = now  # first frame, or the loop stalled: resync instead of a burst
        elif self._due > now:
            await asyncio.sleep(self._due - now)
        self._due += self.frame_s
        if not self._ready:
            self._refill()
        samples, opens_frame = self._ready.popleft()
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = TIME_BASE
        self._pts += self.frame_samples
        if opens_frame:
            # aiortc encodes and sends this frame as soon as recv returns
            self.playout.sent(time.monotonic_ns())
            self.frames_out += 1
        return frame
