"""The echo guard (stages/echo.py): real speech as the agent's voice, played back into the
caller's channel through a synthetic room (tests/echo_line.py: 0.2 s of decaying noise, 40–150
ms late, 6 dB under the agent). The canceller takes the echo out and keeps the caller's voice;
through a real session with the real Silero VAD, the agent's echo alone no longer barges in
(and does without the guard), while the caller talking over it still does."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
from echo_line import EchoLine, room_response, to_int16

from agent.audio import read_wav
from agent.config import (
    Config,
    EchoConfig,
    TurnConfig,
    VADConfig,
    add_config_flags,
    config_from_args,
)
from agent.errors import ConfigError, MissingExtraError
from agent.frames import FRAME_SAMPLES, Interrupt, SpeechStarted
from agent.pipeline import Pipeline
from agent.playout import Playout
from agent.session import Session
from stages.echo import AEC_LAG, BYPASS_AFTER, EchoGuard

DATA = Path(__file__).resolve().parents[1] / "data" / "echo"
SR = 16_000


def _clip(name: str) -> np.ndarray:
    pcm, _ = read_wav(DATA / name)
    return pcm[:, 0] if pcm.ndim > 1 else pcm


AGENT = _clip("ls-test-clean-1089-134686-0002.wav")  # 6.6 s, the agent's voice
CALLER = _clip("ls-dev-clean-1988-24833-0000.wav")  # 3.3 s, another speaker


def _db(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(a * a) / max(np.sum(b * b), 1.0)))


def _envelope(x: np.ndarray) -> np.ndarray:
    """Log energy per 20 ms: whether the caller's syllables are still there, and how loud."""
    frames = x[: len(x) // 320 * 320].reshape(-1, 320)
    return 10 * np.log10(np.mean(frames * frames, axis=1) + 1.0)


def play(
    delay_ms: float, *, seed: int = 0, caller_at: float | None = None, seconds: float | None = None,
    near: int = FRAME_SAMPLES, pull: int = FRAME_SAMPLES, guard: EchoGuard | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, EchoGuard]:
    """The agent's clip played from 0 s, its echo (and the caller from ``caller_at``) in the
    caller's channel, sent in ``near``-sample frames while the agent's audio is pulled in
    ``pull``-sample frames, each when its time has come: (input, output, clean caller, guard)."""
    total = int((seconds or len(AGENT) / SR + 1.0) * SR)
    far = np.zeros(total, np.int16)
    far[: min(len(AGENT), total)] = AGENT[:total]
    clean = np.zeros(total)
    if caller_at is not None:
        at = int(caller_at * SR)
        part = CALLER[: max(0, total - at)]
        clean[at : at + len(part)] = part
    line = EchoLine(delay_ms, room_response(seed))
    guard = guard or EchoGuard()
    rng = np.random.default_rng(seed)
    ins, outs = [], []
    sent = pulled = 0
    while sent + near <= total:
        if pulled <= sent:  # the playout clock is due first: one frame goes out
            frame = far[pulled : pulled + pull]
            line.played(frame, len(frame))
            guard.played(frame if frame.any() else None, len(frame))
            pulled += len(frame)
            continue
        x = to_int16(clean[sent : sent + near] + line.echo(near) + rng.standard_normal(near) * 3)
        out = guard.process(x)
        assert len(out) == near and out.dtype == np.int16
        ins.append(x)
        outs.append(out)
        sent += near
    return np.concatenate(ins).astype(float), np.concatenate(outs).astype(float), clean, guard


# --- the canceller on its own --------------------------------------------------------------------


@pytest.mark.parametrize("delay_ms", [40, 150])
def test_the_echo_goes_and_the_running_erle_reports_it(delay_ms):
    x, y, _, guard = play(delay_ms, seconds=len(AGENT) / SR)
    converged = slice(2 * SR, len(x))
    assert _db(x[converged], y[converged]) >= 15.0  # measured 25–45 dB over rooms and delays
    assert guard.erle_db is not None and guard.erle_db >= 15.0
    assert guard.realigns == 0 and guard.frames + guard.bypassed == len(x) // 160


def test_the_callers_voice_over_the_echo_is_kept():
    # the caller talks 2 s into the agent's clip, as loud as its echo (double talk) ...
    x, y, clean, _ = play(40, caller_at=2.0)
    s, e = 2 * SR, 2 * SR + len(CALLER)
    out, heard, said = y[s + AEC_LAG : e + AEC_LAG], x[s:e], clean[s:e]
    # ... AEC3 holds the caller back a few dB while both talk (measured -3 to -5.5 dB, waveform
    # correlation 0.57-0.74), but the caller's syllables stand out better than in its input
    assert _db(out, said) > -7.0
    env_out = np.corrcoef(_envelope(out), _envelope(said))[0, 1]
    env_in = np.corrcoef(_envelope(heard), _envelope(said))[0, 1]
    assert env_out >= 0.5 and env_out > env_in  # measured 0.74 against 0.40 here
    # ... and once the agent is done, the caller comes through intact (through the canceller,
    # then past it once the agent has been silent for a second)
    x, y, clean, guard = play(40, caller_at=6.8, seconds=6.8 + 3.4)
    s, e = int(7.0 * SR), int(6.8 * SR) + len(CALLER) - 2 * SR // 10
    out, said = y[s + AEC_LAG : e + AEC_LAG], clean[s:e]
    assert np.corrcoef(out, said)[0, 1] >= 0.9  # measured 0.93 (AEC3's high-pass filter)
    assert abs(_db(out, said)) < 1.0


@pytest.mark.parametrize(("near", "pull"), [(160, 320), (480, 320), (250, 320), (320, 960)])
def test_other_cadences_stay_aligned(near, pull):
    """Caller audio in 10 or 30 ms frames, or odd sizes, against 20 or 60 ms pulls: the pairing
    holds sample for sample (at most a re-anchor at the start), the echo still goes."""
    x, y, _, guard = play(80, near=near, pull=pull, seconds=len(AGENT) / SR)
    converged = slice(2 * SR, len(x) - 2 * SR // 10)
    assert _db(x[converged], y[converged]) >= 15.0
    assert guard.realigns <= 1


def test_a_silent_agent_is_bypassed_seamlessly_and_odd_sizes_keep_a_constant_lag():
    """The reference silent for a second: the canceller is skipped, the audio only delayed as
    AEC3 would (so switching does not click); sizes that are no multiple of 10 ms cost at most
    one more 10 ms frame of lag, constant after."""
    guard = EchoGuard()
    rng = np.random.default_rng(3)
    x = to_int16(rng.standard_normal(3 * SR) * 3000)
    sizes = [320] * 10 + [100, 257, 33, 480, 7, 160, 1000] * 20
    outs, i = [], 0
    for n in sizes:
        outs.append(guard.process(x[i : i + n]))
        i += n
    y = np.concatenate(outs)
    assert len(y) == i
    assert np.array_equal(y[AEC_LAG : 3200], x[: 3200 - AEC_LAG])  # 320-sample frames: AEC3's lag
    lag = next(d for d in range(AEC_LAG, AEC_LAG + 160) if np.array_equal(y[-2000:], x[i - 2000 - d : i - d]))
    assert AEC_LAG <= lag < AEC_LAG + 160
    assert guard.frames == 0 and guard.bypassed * 160 <= i


def test_the_canceller_resumes_when_the_agent_speaks_again():
    guard = EchoGuard()
    x, y, _, _ = play(40, seconds=len(AGENT) / SR + 2.0, guard=guard)  # 3 s of silence at the end
    ran = guard.frames
    assert guard.bypassed > 0  # the second after the echo died down went by the canceller
    assert ran < len(x) // 160
    assert BYPASS_AFTER == SR
    # the agent speaks again: the canceller runs, the echo goes at once (its filter kept)
    x2, y2, _, _ = play(40, seconds=3.0, guard=guard, seed=0)
    assert guard.frames > ran
    assert _db(x2[SR // 2 :], y2[SR // 2 :]) >= 15.0


def test_the_reference_is_realigned_after_a_stall_and_the_echo_goes_again():
    """The playout stalls 300 ms (the pacer gave up deadlines): the caller's audio runs ahead of
    the played audio, the guard steps back once and cancels again."""
    guard = EchoGuard()
    line = EchoLine(60, room_response(1))
    far = np.zeros(8 * SR, np.int16)
    far[: len(AGENT)] = AGENT
    xs, ys = [], []
    pulled = 0
    for k in range(len(far) // 320):
        x = to_int16(line.echo(320))
        xs.append(x)
        ys.append(guard.process(x))
        if not 100 <= k < 115:  # 2.0–2.3 s: nothing pulled, nothing played
            frame = far[pulled : pulled + 320]
            line.played(frame, 320)
            guard.played(frame, 320)
            pulled += 320
    x, y = np.concatenate(xs).astype(float), np.concatenate(ys).astype(float)
    assert guard.realigns >= 1
    assert _db(x[4 * SR : 6 * SR], y[4 * SR : 6 * SR]) >= 15.0


def test_the_playout_reports_every_pull_silence_included():
    played: list[tuple[bool, int]] = []

    class Recorder:
        def played(self, pcm, samples):  # noqa: ANN001
            played.append((pcm is not None, samples))

        def process(self, pcm):  # noqa: ANN001
            return pcm

    playout = Playout(lambda f: None, echo=Recorder())
    assert playout.pull() is None
    playout.write(np.ones(800, np.int16), last=True)
    assert playout.pull() is not None
    playout.pause()
    assert playout.pull(np.zeros(160, np.int16)) is None  # paused: the line carries silence
    playout.resume()
    playout.pull()
    playout.flush()  # barge-in: what was cut never plays
    playout.pull()
    assert played == [(False, 320), (True, 320), (False, 160), (True, 320), (False, 320)]


def test_configuration_and_a_missing_package(monkeypatch):
    assert EchoConfig().active(telephony=True) and not EchoConfig().active(telephony=False)
    assert EchoConfig(enabled="on").active(False) and not EchoConfig(enabled="off").active(True)
    with pytest.raises(ConfigError, match="echo.enabled"):
        EchoConfig(enabled="yes please").active(True)
    import argparse

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    cfg = config_from_args(parser.parse_args(["--echo-enabled", "on", "--echo-delay-ms", "120"]))
    assert cfg.echo == EchoConfig(enabled="on", delay_ms=120)
    from agent.presets import new_echo_guard

    assert new_echo_guard(Config(), telephony=False) is None
    assert isinstance(new_echo_guard(Config(), telephony=True), EchoGuard)
    with pytest.raises(ConfigError, match="delay_ms"):
        EchoGuard(EchoConfig(delay_ms=5000))
    monkeypatch.setitem(sys.modules, "pywebrtc_audio", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pywebrtc-audio.*voxline\[embedded\]"):
        EchoGuard()


# --- through a session, with the real VAD ------------------------------------------------------


@pytest.fixture(scope="module")
def silero():
    from stages.vad import SileroModel

    return SileroModel(VADConfig())


def call(silero, guarded: bool, caller_at: float | None = None, seconds: float = 7.0):
    """A session (Silero VAD → turn detector, barge-in at once) whose agent plays its clip
    from 0 s, on a line that brings it back 60 ms late through the room; what left it."""
    from stages.turn import TurnDetector
    from stages.vad import VADStage

    async def run() -> list:
        stages = [VADStage(VADConfig(), model=silero.fork()),
                  TurnDetector(TurnConfig(mode="vad", resume_false_interrupts=False))]
        session = Session(Pipeline(stages), echo=EchoGuard() if guarded else None)
        seen: list = []
        session.listen(seen.append, frozenset({SpeechStarted, Interrupt}))
        line = EchoLine(60, room_response(2))
        rng = np.random.default_rng(2)
        clean = np.zeros(int(seconds * SR))
        if caller_at is not None:
            at = int(caller_at * SR)
            clean[at : at + len(CALLER)] = CALLER[: len(clean) - at]
        async with session:
            session.playout.write(AGENT, last=True)  # what the TTS would have queued
            for k in range(len(clean) // FRAME_SAMPLES):
                chunk = clean[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES]
                noise = rng.standard_normal(FRAME_SAMPLES) * 3
                session.send_audio(to_int16(chunk + line.echo(FRAME_SAMPLES) + noise))
                out = session.playout.pull()  # one frame per caller frame, as transports/file.py
                line.played(out, FRAME_SAMPLES)
                if k % 25 == 0:
                    await asyncio.sleep(0)
        return [(type(f).__name__, f.at / SR) for f in seen
                if isinstance(f, (SpeechStarted, Interrupt))]

    return asyncio.run(run())


def test_the_agents_echo_alone_barges_in_without_the_guard_and_not_with_it(silero):
    unguarded = call(silero, guarded=False)
    assert ("Interrupt" in {kind for kind, _ in unguarded}), unguarded  # the test can fail
    assert call(silero, guarded=True) == []


def test_the_caller_talking_over_the_echo_still_barges_in(silero):
    events = call(silero, guarded=True, caller_at=2.0, seconds=4.0)
    interrupts = [at for kind, at in events if kind == "Interrupt"]
    assert len(interrupts) == 1 and 2.0 <= interrupts[0] < 3.0, events


def test_the_end_of_the_call_releases_aec3_at_once() -> None:
    """Session.close closes its guard: AEC3's native state (~400 KB) goes with the call, not
    whenever the garbage collector frees the session; audio after it passes through."""
    guard = EchoGuard()

    async def run() -> None:
        from agent.stage import Stage

        async with Session(Pipeline([Stage("listener")]), echo=guard) as session:
            session.playout.write(AGENT[: 20 * FRAME_SAMPLES], last=True)
            for _ in range(20):
                session.send_audio(to_int16(np.ones(FRAME_SAMPLES) * 100))
                session.playout.pull()
            assert guard.frames > 0  # AEC3 ran while the agent spoke

    asyncio.run(run())
    assert guard._aec is None  # noqa: SLF001 - what close released
    pcm = to_int16(np.ones(FRAME_SAMPLES) * 7)
    assert guard.process(pcm) is pcm
    guard.played(pcm, FRAME_SAMPLES)  # a pull after the end: nothing to record, no error
