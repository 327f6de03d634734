"""The call recorder: a stereo WAV on the caller's media clock, written as it goes — readable
(by Python's own ``wave``, an independent reader) before the call ends, and after a process
killed mid-call, up to its last flush."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np

from agent.recording import CallRecorder

ROOT = Path(__file__).resolve().parents[2]
FRAME = 320


def frames(path: Path) -> tuple[np.ndarray, int, int]:
    with wave.open(str(path), "rb") as w:
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels())
        return data, w.getframerate(), w.getnchannels()


def test_caller_left_agent_right_on_the_media_clock(tmp_path):
    rec = CallRecorder(tmp_path / "call.wav", flush_s=3600)
    for k in range(50):  # one second of caller audio, the agent speaking in its second half
        rec.caller(np.full(FRAME, k + 1, np.int16))
        rec.played(np.full(FRAME, -(k + 1), np.int16) if k >= 25 else None, FRAME)
    rec.close()
    data, rate, channels = frames(tmp_path / "call.wav")
    assert (rate, channels, len(data)) == (16000, 2, 50 * FRAME)
    assert data[0, 0] == 1 and data[-1, 0] == 50
    assert not data[: 25 * FRAME, 1].any()
    # each agent frame sits beside the caller frame it was played with
    assert (data[25 * FRAME:, 1] == -data[25 * FRAME:, 0]).all()


def test_agent_audio_after_a_pause_starts_beside_the_callers_latest_packet(tmp_path):
    rec = CallRecorder(tmp_path / "call.wav", flush_s=3600)
    for _ in range(50):  # a second of caller audio while the transport pulled nothing
        rec.caller(np.full(FRAME, 7, np.int16))
    rec.played(np.full(FRAME, 9, np.int16), FRAME)
    rec.close()
    data, _, _ = frames(tmp_path / "call.wav")
    assert len(data) == 50 * FRAME
    assert (data[49 * FRAME:, 1] == 9).all() and not data[: 49 * FRAME, 1].any()


def test_an_agent_channel_that_runs_ahead_is_put_back_in_line(tmp_path):
    rec = CallRecorder(tmp_path / "call.wav", flush_s=3600)
    for _ in range(40):  # the transport pulls twice per caller packet (a clock running fast)
        rec.caller(np.full(FRAME, 7, np.int16))
        rec.played(np.full(FRAME, 9, np.int16), FRAME)
        rec.played(np.full(FRAME, 9, np.int16), FRAME)
    rec.close()
    # 0.25 s ahead at most: back beside the caller's clock each time it got that far
    assert rec.resyncs >= 2
    assert rec.agent_pos - rec.caller_pos <= rec.resync + 2 * FRAME


def test_the_file_is_playable_while_the_call_goes_on(tmp_path):
    rec = CallRecorder(tmp_path / "call.wav", flush_s=0.05)
    for _ in range(10):
        rec.caller(np.full(FRAME, 3, np.int16))
        rec.played(None, FRAME)
    time.sleep(0.06)
    rec.caller(np.full(FRAME, 3, np.int16))  # a flush is due
    rec.played(None, FRAME)
    data, rate, _ = frames(tmp_path / "call.wav")  # read while still open
    assert rate == 16000 and len(data) >= 10 * FRAME and (data[:, 0] == 3).all()
    rec.close()


KILLED = """
import os, signal, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from agent.recording import CallRecorder
rec = CallRecorder(sys.argv[1], flush_s=0.2)
t0 = time.monotonic()
while True:  # real time, as a call runs
    rec.caller(np.full(320, 1000, np.int16))
    rec.played(np.full(320, -1000, np.int16), 320)
    time.sleep(0.02)
    if time.monotonic() - t0 > 1.5:
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit: as the OOM killer does
"""


def test_a_killed_process_leaves_a_playable_file_up_to_its_last_flush(tmp_path):
    path = tmp_path / "killed.wav"
    done = subprocess.run([sys.executable, "-c", KILLED, str(path), str(ROOT)], timeout=60)
    assert done.returncode == -signal.SIGKILL
    data, rate, channels = frames(path)
    assert (rate, channels) == (16000, 2)
    seconds = len(data) / rate
    assert 0.5 < seconds <= 1.6, seconds  # all but the last flush interval or so
    assert (data[:, 0] == 1000).all() and (data[:, 1] == -1000).all()
    assert os.path.getsize(path) == 44 + len(data) * 4  # the header says what is there
