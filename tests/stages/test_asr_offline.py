import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from agent.config import VADConfig
from stages.asr.offline import (
    RATE,
    WINDOW,
    chunk_regions,
    speech_regions,
    vad_probs,
    vad_probs_many,
)
from stages.asr.wer import wer
from agent.audio import read_wav, write_wav

DATA = Path(__file__).resolve().parents[1] / "data"
REFS = {
    "ls-dev-clean-1988-24833-0000": "THE TWO STRAY KITTENS GRADUALLY MAKE THEMSELVES AT HOME",
    "ls-dev-clean-1272-128104-0000": "MISTER QUILTER IS THE APOSTLE OF THE MIDDLE CLASSES AND WE ARE GLAD TO WELCOME HIS GOSPEL",
    "ls-test-clean-4507-16021-0012": "WHY SHOULD ONE HALT ON THE WAY",
}


def test_regions_with_hysteresis_and_short_pauses_kept():
    p = np.array([0, 0.9, 0.9, 0.4, 0.9, 0, 0, 0, 0, 0, 0, 0, 0, 0.8, 0.8, 0], dtype=np.float32)
    r = speech_regions(p, min_silence_windows=4, pad_windows=0)
    assert r == [(1 * WINDOW, 5 * WINDOW), (13 * WINDOW, 15 * WINDOW)]


def test_chunks_cut_only_at_pauses_and_respect_the_limit():
    s = RATE
    regions = [(0, 5 * s), (6 * s, 12 * s), (13 * s, 20 * s), (21 * s, 70 * s)]
    chunks = chunk_regions(regions, max_chunk_s=15, total=80 * s)
    assert chunks[0] == (0, 12 * s) and chunks[1] == (13 * s, 20 * s)
    long = chunks[2:]
    assert all(b - a <= 15 * s for a, b in long) and long[0][0] == 21 * s and long[-1][1] == 70 * s
    assert all(b - a <= 15 * s for a, b in chunks)


def test_batched_vad_of_many_files_and_long_pieces_matches_one_file_at_a_time():
    from stages.vad import SileroModel

    vad = SileroModel(VADConfig())
    clips = [read_wav(DATA / f"{name}.wav")[0][:, 0].astype(np.float32) / 32768 for name in REFS]
    gap = np.zeros(RATE // 2, np.float32)
    # 70 s: longer than one 60-s piece, so it is split and the second piece warms up first.
    long = np.concatenate([np.concatenate([c, gap]) for c in clips] * 5)[: 70 * RATE]
    files = [*clips, long]
    alone = [vad_probs(a, vad) for a in files]
    for threads in (1, 2):
        many = vad_probs_many(files, vad, threads=threads)
        assert [len(m) for m in many] == [len(a) for a in alone]
        for a, m in zip(alone, many, strict=True):
            np.testing.assert_allclose(m, a, atol=0.25)  # only where a piece starts
            assert np.mean(np.abs(m - a) > 0.05) < 0.01
            # The cuts agree to within one 32-ms window at each end.
            ra, rm = speech_regions(a), speech_regions(m)
            assert len(ra) == len(rm)
            assert all(abs(x - y) <= WINDOW for p, q in zip(ra, rm, strict=True) for x, y in zip(p, q, strict=True))


def test_transcribe_cli_writes_json_per_file(tmp_path):
    # a "long" file: three utterances with pauses between them, and a silence-only file
    parts = []
    for name in REFS:
        parts += [read_wav(DATA / f"{name}.wav")[0][:, 0], np.zeros(RATE, np.int16)]
    long = np.concatenate(parts)
    write_wav(tmp_path / "long.wav", long)
    write_wav(tmp_path / "quiet.wav", np.zeros(RATE * 2, np.int16))
    r = subprocess.run([sys.executable, "-m", "agent.cli", "transcribe", str(tmp_path / "long.wav"),
                        str(tmp_path / "quiet.wav"), "--max-chunk", "8", "--batch-size", "4"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "RTFx" in r.stdout
    out = json.loads((tmp_path / "long.json").read_text())
    assert out["duration_s"] == round(len(long) / RATE, 3)
    assert len(out["segments"]) >= 2  # cut at the pauses: no 8 s chunk holds all three
    assert all(0 <= s["start"] < s["end"] <= out["duration_s"] for s in out["segments"])
    assert wer(" ".join(REFS.values()), out["text"]) <= 0.2
    quiet = json.loads((tmp_path / "quiet.json").read_text())
    assert quiet["text"] == "" and quiet["segments"] == []


def test_transcribe_bad_input(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"nope")
    r = subprocess.run([sys.executable, "-m", "agent.cli", "transcribe", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no readable audio" in r.stderr and "Traceback" not in r.stderr
