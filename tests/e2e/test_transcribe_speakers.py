"""``voxline transcribe`` with speakers, end to end through the CLI: a call recording made by
``voxline run --output`` split by channel into caller and agent, and a mono recording of two
real speakers diarized; the files it writes read back with real SRT, WebVTT and RTTM parsers."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import speech
import srt
import webvtt

from agent.audio import write_wav
from stages.asr.wer import normalize, wer

pytestmark = pytest.mark.slow


def voxline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.fixture(scope="module")
def call(tmp_path_factory):
    """A call played by ``voxline run``: its stereo recording, what the agent said, and every
    text it began to speak (a reply cut off by a barge-in included)."""
    tmp = tmp_path_factory.mktemp("call")
    src = tmp / "in.wav"
    write_wav(src, np.concatenate([np.zeros(8000, np.int16), speech.load("kittens"),
                                   np.zeros(16000, np.int16)]))
    r = voxline("run", "--input", str(src), "--output", str(tmp / "call.wav"), "--fast", "--json",
                "--tail", "8")
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    texts = [e for e in events if e["type"] == "agent_text"]
    said = " ".join(e["text"] for e in texts if not e["cancelled"])
    assert said.strip(), "the agent said nothing"
    return tmp / "call.wav", said, " ".join(e["text"] for e in texts)


def test_a_call_recording_split_by_channel_puts_each_side_on_its_speaker(call):
    path, said, spoken = call
    r = voxline("transcribe", str(path), "--channels", "split", "--speaker-names", "caller,agent",
                "--format", "json,srt,vtt,rttm")
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.with_suffix(".json").read_text())
    by = {who: " ".join(s["text"] for s in doc["segments"] if s["speaker"] == who)
          for who in ("caller", "agent")}
    assert set(doc["speakers"]) == {"caller", "agent"}
    assert wer(speech.text("kittens"), by["caller"]) <= 0.15, by
    # the agent's side is its TTS voice read back by the ASR: most of its words
    agent_words, said_words = set(normalize(by["agent"])), set(normalize(said))
    assert len(agent_words & said_words) >= 0.6 * len(said_words), (by["agent"], said)
    # and no side's words leak onto the other's channel: words only the agent spoke are not
    # on the caller's, words only the caller spoke not on the agent's (SmolLM2 sometimes
    # repeats the caller's sentence, so "only" is counted against everything it spoke)
    caller_said, agent_spoke = set(normalize(speech.text("kittens"))), set(normalize(spoken))
    assert not (agent_spoke - caller_said) & set(normalize(by["caller"])), by["caller"]
    assert not (caller_said - agent_spoke) & agent_words, (by["agent"], spoken)
    starts = [s["start"] for s in doc["segments"]]
    assert starts == sorted(starts)
    # the subtitle files parse with real parsers and carry the same speakers and times
    cues = list(srt.parse(path.with_suffix(".srt").read_text()))
    assert cues and {c.content.split(":", 1)[0] for c in cues} == {"caller", "agent"}
    vtt = webvtt.read(str(path.with_suffix(".vtt")))
    assert len(vtt.captions) == len(cues)
    assert {c.voice for c in vtt.captions} == {"caller", "agent"}
    rttm = [line.split() for line in path.with_suffix(".rttm").read_text().splitlines()]
    assert {f[7] for f in rttm} == {"caller", "agent"} and all(f[0] == "SPEAKER" for f in rttm)
    caller_turn = next(f for f in rttm if f[7] == "caller")
    assert abs(float(caller_turn[3]) - 0.5) < 0.6  # the caller spoke 0.5 s in


def test_speaker_flags_that_do_not_fit_are_refused(call):
    path = call[0]
    r = voxline("transcribe", str(path), "--channels", "split", "--diarize")
    assert r.returncode == 2 and "use one of them" in r.stderr
    r = voxline("transcribe", str(path), "--speakers", "2")
    assert r.returncode == 2 and "go with --diarize" in r.stderr
    r = voxline("transcribe", str(path), "--format", "json,docx")
    assert r.returncode == 2 and "docx" in r.stderr


def test_two_real_speakers_in_mono_are_told_apart(tmp_path):
    from agent.audio import read_audio
    from stages.speaker import der

    other = speech.DATA / "speaker"
    parts = [("A", speech.load("kittens")), ("B", speech.load("honest")),
             ("A", read_audio(other / "ls-dev-clean-1988-24833-0003.wav")),
             ("B", read_audio(other / "ls-dev-clean-2412-153948-0000.wav"))]
    gap = np.zeros(int(0.8 * 16_000), np.int16)
    pcm, ref, at = [gap], [], len(gap)
    for who, clip in parts:
        pcm += [clip, gap]
        ref.append((at / 16_000, (at + len(clip)) / 16_000, who))
        at += len(clip) + len(gap)
    path = tmp_path / "two.wav"
    write_wav(path, np.concatenate(pcm))
    r = voxline("transcribe", str(path), "--diarize", "--format", "json,rttm")
    assert r.returncode == 0, r.stderr
    assert "diarized" in r.stdout
    doc = json.loads(path.with_suffix(".json").read_text())
    assert doc["speakers"] == ["speaker_1", "speaker_2"]
    hyp = [(float(f[3]), float(f[3]) + float(f[4]), f[7]) for f in
           (line.split() for line in path.with_suffix(".rttm").read_text().splitlines())]
    scored = der(ref, hyp, collar=0.25)
    print(f"DER {scored.der:.3f} (miss {scored.miss:.3f}, false alarm {scored.false_alarm:.3f}, "
          f"confusion {scored.confusion:.3f})")
    assert scored.der <= 0.15 and scored.confusion <= 0.05, scored
    # each clip's words are on one speaker: the kittens on the first, the honest man on the other
    first_a = doc["segments"][0]
    first_b = next(s for s in doc["segments"] if s["speaker"] == "speaker_2")
    assert first_a["speaker"] == "speaker_1"
    assert wer(speech.text("kittens"), first_a["text"]) <= 0.15, doc["segments"]
    assert wer(speech.text("honest"), first_b["text"]) <= 0.15, doc["segments"]
    assert all(w["start"] <= w["end"] for s in doc["segments"] for w in s["words"])
