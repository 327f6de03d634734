"""The file transport: plays a recording into a session as a live call, 20 ms at a time, and
records the call in stereo (left: caller, right: agent, time-aligned on the media clock).

Agent audio is pulled from the session's playout one frame per input frame, exactly as a sound
card would play it, so barge-in and latency show in the recording as a caller would hear them.
``fast`` skips only the quiet stretches (nobody speaking and nothing pending); speech and every
turn still run in real time, so the latencies measured in fast mode stay honest. The call stops
early when the agent hangs up (``Session.hangup_due``, checked on the media clock).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame, Interrupt, PausePlayout, ResumePlayout
from agent.session import Session

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


@dataclass(slots=True)
class CallRecording:
    caller: np.ndarray
    agent: np.ndarray
    interrupts_at: list[int] = field(default_factory=list)  # media samples
    pauses_at: list[int] = field(default_factory=list)  # tentative barge-ins (PausePlayout)
    resumes_at: list[int] = field(default_factory=list)  # ... that turned out false
    fast_forwarded_s: float = 0.0
    hung_up: str = ""  # the agent's reason when it ended the call ("idle", "agent")

    def stereo(self) -> np.ndarray:
        return np.stack([self.caller, self.agent], axis=1)


class FileCall:
    """Feeds ``pcm`` (int16 mono 16 kHz) into a session; ``tail_s`` bounds how long the call goes
    on after the recording ends while the agent still answers."""

    def __init__(
        self, pcm: np.ndarray, fast: bool = False, tail_s: float = 20.0, settle_s: float = 1.5
    ) -> None:
        self.pcm = pcm
        self.fast = fast
        self.tail_frames = int(tail_s / FRAME_S)
        self.settle_frames = int(settle_s / FRAME_S)

    async def run(self, session: Session) -> CallRecording:
        n_in = -(-len(self.pcm) // FRAME_SAMPLES)
        caller: list[np.ndarray] = []
        agent: list[np.ndarray] = []
        interrupts: list[int] = []
        silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)

        pauses: list[int] = []
        resumes: list[int] = []

        def watch(frame: Frame) -> None:
            if isinstance(frame, Interrupt):
                interrupts.append(session.offset)
            elif isinstance(frame, PausePlayout):
                pauses.append(session.offset)
            elif isinstance(frame, ResumePlayout):
                resumes.append(session.offset)

        session.listen(watch, frozenset({Interrupt, PausePlayout, ResumePlayout}))
        loop = asyncio.get_running_loop()
        t_next = loop.time()
        busy_until = 0  # frame index until which the call is paced even when quiet
        skipped = 0
        k = 0
        hung_up = ""
        while True:
            if session.hangup_due:  # the agent's last words have played out
                hung_up = session.hangup_reason
                break
            if k < n_in:
                chunk = self.pcm[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]
                if len(chunk) < FRAME_SAMPLES:
                    chunk = np.concatenate([chunk, silence[: FRAME_SAMPLES - len(chunk)]])
            else:
                chunk = silence
                if (session.quiet and k >= busy_until) or k >= n_in + self.tail_frames:
                    break
            session.send_audio(chunk, t_ns=time.monotonic_ns())
            out = session.playout.pull()
            if out is not None:
                session.playout.sent()
            caller.append(chunk)
            agent.append(out if out is not None else silence)
            k += 1
            paced = not self.fast
            if self.fast:
                if not session.quiet:
                    busy_until = k + self.settle_frames
                paced = k < busy_until
            if paced:
                t_next += FRAME_S
                delay = t_next - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)
            else:
                skipped += 1
                t_next = loop.time()
                await asyncio.sleep(0)
        return CallRecording(
            caller=np.concatenate(caller) if caller else np.zeros(0, np.int16),
            agent=np.concatenate(agent) if agent else np.zeros(0, np.int16),
            interrupts_at=interrupts,
            pauses_at=pauses,
            resumes_at=resumes,
            fast_forwarded_s=skipped * FRAME_S,
            hung_up=hung_up,
        )
