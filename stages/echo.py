"""The echo guard: WebRTC AEC3 (``pywebrtc-audio``) on the caller's audio with the agent's
played-out audio as the far-end reference, so a speakerphone or a line without echo cancelling
does not make the agent barge in on itself. Sans-I/O: the playout calls ``played``, the session
calls ``process``; one guard per call.

Alignment — the rule. The guard keeps the played-out audio on its own timeline (a ring; every
pull counts, silence included) and pairs the caller's audio with it sample for sample: the
reference cursor advances by exactly as many samples as the caller sent, so AEC3 sees one
continuous reference at a steady delay, which its delay estimator locks onto (it finds echoes
up to ~0.5 s late). When caller audio arrives or agent audio is pulled at another cadence
(10 ms frames against 20 ms pulls, network jitter, a websocket client's odd chunk sizes)
nothing moves; the cursor is re-anchored (counted in ``realigns``) only when pairing sample for
sample cannot hold:

- on the first caller audio, the reference window ends ``delay_ms`` before the newest played
  sample (the echo of audio not yet played cannot be in the caller's audio yet);
- *underrun*: the window would reach audio not yet played (the caller's audio ran ahead of the
  playout clock: a burst after a stall, a stalled pacer) — it steps back to end one playout
  frame (``PAD``) before the newest played sample;
- *surplus*: if over the last ``TIGHTEN_EVERY`` of caller audio the window never came closer
  than ``2 * PAD`` to the newest played sample (the caller's audio went missing, a stall was
  caught up, or clocks drifted), it steps forward to keep one ``PAD`` of spare — a reference
  staler than the echo would be useless (AEC3 cannot cancel what it has not yet seen);
- caller audio gone for long (past ``MAX_SLACK``) re-anchors at once.

AEC3 works on 10 ms frames; input of other lengths keeps its remainder for the next call, and
the output is as long as the input (once a remainder shows up, the output lags by at most one
more 10 ms frame, constant after). Its output lags its input by ``AEC_LAG`` samples (8 ms);
while bypassed the guard delays the audio by as much, so switching is seamless.

Bypass: after ``BYPASS_AFTER`` of a silent reference the canceller is skipped until the agent
speaks again (measured on speech through a 0.2 s room response with 40 and 150 ms delays: the
first second after each resumption loses ~0.5 dB of ERLE against running throughout, at 40+ dB).

Cost: ~0.1 ms of CPU per 20 ms of caller audio while the agent speaks (AEC3 releases the GIL
but runs on the calling thread — the event loop — as it is well under a millisecond).

What it costs the caller: while the agent speaks, AEC3 holds the caller's voice back (measured
-3 to -5 dB in double talk; -4 to -10 dB in the first seconds of a line with no echo at all,
~0 dB once it has heard ~10 s of the agent there), so words spoken over the agent early in a
call come out less clear (benchmarks/echo_guard.py: the caller's barge-in WER 18-19% with the
guard, 0% without it on a line without echo). Once the agent is silent the caller is untouched.
"""

from __future__ import annotations

import numpy as np

from agent.config import EchoConfig
from agent.errors import ConfigError, require
from agent.frames import SAMPLE_RATE

AEC_FRAME = 160  # 10 ms at 16 kHz: AEC3's frame
AEC_LAG = 128  # samples AEC3's output lags its input (measured with an impulse)
RING = 1 << 15  # reference samples kept: 2.05 s
MAX_BLOCK = 8000  # caller samples aligned at once (0.5 s); longer input is taken in pieces
PAD = 320  # spare reference kept after an underrun: one 20 ms playout frame
TIGHTEN_EVERY = 3 * SAMPLE_RATE  # caller samples between surplus checks
MAX_SLACK = SAMPLE_RATE // 2  # played audio this far ahead of the caller's re-anchors at once
MAX_DELAY_MS = 1000
BYPASS_AFTER = SAMPLE_RATE  # 1 s of silent reference: longer than any echo tail AEC3 follows
FAR_ACTIVE_RMS = 30.0  # int16 RMS (-61 dBFS) above which the reference counts as the agent speaking
_FAR_ACTIVE_MS = FAR_ACTIVE_RMS**2


class EchoGuard:
    """One call's echo canceller: ``played`` the agent's audio, ``process`` the caller's."""

    def __init__(self, cfg: EchoConfig | None = None) -> None:
        cfg = cfg or EchoConfig()
        if not 0 <= cfg.delay_ms <= MAX_DELAY_MS:
            raise ConfigError(f"echo.delay_ms must be 0 to {MAX_DELAY_MS}, not {cfg.delay_ms}")
        webrtc = require("pywebrtc_audio", what="the echo guard", extra="embedded",
                         package="pywebrtc-audio")
        self._aec = webrtc.EchoCanceller(sample_rate=SAMPLE_RATE, num_channels=1, stream_delay_ms=0)
        self._delay = cfg.delay_ms * SAMPLE_RATE // 1000
        # the reference timeline: sample i of the call's playout lives at _ring[i % RING]
        self._ring = np.zeros(RING, np.int16)
        self._written = 0
        self._read = 0  # next reference sample to pair (negative: before the call, silence)
        self._anchored = False
        self._min_spare = RING  # closest the window came to the newest played sample lately
        self._since_check = 0
        # input remainders and the output owed for them
        self._carry = np.zeros(AEC_FRAME, np.int16)
        self._carried = 0
        self._owed = np.zeros(AEC_FRAME, np.int16)
        self._owing = 0
        self._tail = np.zeros(AEC_LAG, np.int16)  # the last AEC_LAG caller samples seen
        self._quiet = BYPASS_AFTER  # caller samples since the reference last had the agent
        self._bypassing = True
        self._near = np.zeros(0, np.int16)  # scratch, grown once to the largest input
        self._far = np.zeros(0, np.int16)
        self._f32 = np.zeros(0, np.float32)
        # counters
        self.frames = 0  # 10 ms frames through AEC3
        self.bypassed = 0  # 10 ms frames passed by while the agent was silent
        self.realigns = 0
        self.far_active_frames = 0
        self.echo_in_energy = 0.0  # caller energy in and out while the agent's audio was live
        self.echo_out_energy = 0.0

    # --- far end -----------------------------------------------------------------------------
    def played(self, pcm: np.ndarray | None, samples: int) -> None:
        """Record ``samples`` of played-out agent audio (None: silence) on the reference."""
        if self._aec is None:
            return  # closed
        if pcm is not None:
            samples = len(pcm)
        start = self._written % RING
        first = min(samples, RING - start)
        if pcm is None:
            self._ring[start : start + first] = 0
            self._ring[: samples - first] = 0
        else:
            self._ring[start : start + first] = pcm[:first]
            self._ring[: samples - first] = pcm[first:]
        self._written += samples

    def close(self) -> None:
        """Release AEC3 and the reference ring (~410 KB a call, most of it AEC3's native state)
        as the call ends, rather than whenever the garbage collector frees the session."""
        self._aec = None
        self._ring = np.zeros(0, np.int16)
        self._near = self._far = np.zeros(0, np.int16)
        self._f32 = np.zeros(0, np.float32)

    # --- near end ----------------------------------------------------------------------------
    def process(self, pcm: np.ndarray) -> np.ndarray:
        """The caller's ``pcm`` (int16) cleaned of the agent's echo: an array of the same length
        (after ``close``: ``pcm`` itself)."""
        if self._aec is None:
            return pcm
        n = len(pcm)
        if not self._carried and not self._owing and n % AEC_FRAME == 0:
            return self._clean(pcm) if n else pcm  # the usual case: whole 10 ms frames
        total = self._carried + n
        k = total - total % AEC_FRAME
        near = self._scratch_near(total)
        near[: self._carried] = self._carry[: self._carried]
        near[self._carried : total] = pcm
        self._carried = total - k
        self._carry[: self._carried] = near[k:total]
        cleaned = self._clean(near[:k]) if k else near[:0]
        out = np.empty(n, np.int16)
        have = self._owing + k
        gap = max(n - have, 0)  # the output falls behind by this much, once
        out[:gap] = 0
        took = min(self._owing, n - gap)
        out[gap : gap + took] = self._owed[:took]
        rest = self._owing - took  # owed samples still not due
        from_cleaned = n - gap - took
        out[gap + took :] = cleaned[:from_cleaned]
        self._owed[:rest] = self._owed[took : self._owing]
        left = k - from_cleaned
        self._owed[rest : rest + left] = cleaned[from_cleaned:]
        self._owing = rest + left
        return out

    def _clean(self, near: np.ndarray) -> np.ndarray:
        if len(near) <= MAX_BLOCK:
            return self._clean_block(near)
        return np.concatenate([self._clean_block(near[i : i + MAX_BLOCK])
                               for i in range(0, len(near), MAX_BLOCK)])

    def _clean_block(self, near: np.ndarray) -> np.ndarray:
        k = len(near)
        far = self._reference(k)
        far_ms = self._mean_square(far)
        frames = k // AEC_FRAME
        if far_ms > _FAR_ACTIVE_MS:
            self._quiet = 0
        else:
            self._quiet += k
        if self._quiet >= BYPASS_AFTER:
            out = np.empty(k, np.int16)
            out[:AEC_LAG] = self._tail
            out[AEC_LAG:] = near[: k - AEC_LAG]
            self._bypassing = True
            self.bypassed += frames
        else:
            out = self._aec.process(np.ascontiguousarray(near, np.int16), far)
            if self._bypassing:  # AEC3 still holds caller audio from before the bypass
                out[:AEC_LAG] = self._tail
                self._bypassing = False
            self.frames += frames
            if far_ms > _FAR_ACTIVE_MS:
                self.far_active_frames += frames
                self.echo_in_energy += self._mean_square(near) * k
                self.echo_out_energy += self._mean_square(out) * k
        self._tail[:] = near[k - AEC_LAG :]
        return out

    # --- alignment ---------------------------------------------------------------------------
    def _reference(self, k: int) -> np.ndarray:
        """The next ``k`` reference samples (see the module docstring for the rule)."""
        newest = self._written
        if not self._anchored:
            self._anchored = True
            self._read = newest - k - self._delay
        spare = newest - (self._read + k)  # played samples newer than the window
        if spare < 0 or spare > self._delay + MAX_SLACK:
            self._read = newest - k - self._delay - (PAD if spare < 0 else 0)
            self._realigned()
        elif self._since_check >= TIGHTEN_EVERY:
            closest = min(self._min_spare, spare)
            if closest > self._delay + 2 * PAD:
                self._read += closest - self._delay - PAD
                self._realigned()
            else:
                self._since_check = 0
                self._min_spare = RING
        else:
            self._min_spare = min(self._min_spare, spare)
        self._since_check += k
        start = self._read
        self._read += k
        if start < 0:  # before the call's first played sample: silence
            far = self._scratch_far(k)
            lead = min(-start, k)
            far[:lead] = 0
            far[lead:] = self._ring[: k - lead]
            return far
        i = start % RING
        if i + k <= RING:
            return self._ring[i : i + k]
        far = self._scratch_far(k)
        first = RING - i
        far[:first] = self._ring[i:]
        far[first:] = self._ring[: k - first]
        return far

    def _realigned(self) -> None:
        self.realigns += 1
        self._since_check = 0
        self._min_spare = RING

    # --- numbers -----------------------------------------------------------------------------
    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement over the call so far: caller energy in vs out while the
        agent's audio was live on the reference (None before it was). Caller speech over the
        agent (double talk) counts too, so this is a floor on the canceller's real ERLE."""
        if not self.far_active_frames or self.echo_in_energy <= 0.0:
            return None
        return float(10.0 * np.log10(self.echo_in_energy / max(self.echo_out_energy, 1.0)))

    def _mean_square(self, pcm: np.ndarray) -> float:
        k = len(pcm)
        if len(self._f32) < k:
            self._f32 = np.zeros(k, np.float32)
        buf = self._f32[:k]
        np.copyto(buf, pcm, casting="unsafe")
        return float(np.dot(buf, buf)) / k

    def _scratch_near(self, k: int) -> np.ndarray:
        if len(self._near) < k:
            self._near = np.zeros(k, np.int16)
        return self._near

    def _scratch_far(self, k: int) -> np.ndarray:
        if len(self._far) < k:
            self._far = np.zeros(k, np.int16)
        return self._far[:k]
