"""``voxline transcribe --ray``: the same files through Ray Data's pool of engine actors give the
same transcripts, and write the same files, as the plain path."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import speech

from stages.asr.wer import wer

# each starts a local Ray cluster: under pytest-xdist, one worker runs them one after another
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
pytest.importorskip("ray.data", reason="--ray needs the ray extra (pip install 'voxline[ray]')")

CLIPS = ("kittens", "honest", "quilter")


def voxline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_transcribe_on_ray_gives_the_plain_paths_text(tmp_path):
    files = [str(speech.DATA / speech.CLIPS[c].file) for c in CLIPS]
    plain_dir, ray_dir = tmp_path / "plain", tmp_path / "ray"
    plain_dir.mkdir()
    ray_dir.mkdir()
    plain = voxline("transcribe", *files, "--json", "--asr-threads", "1",
                    "--output-dir", str(plain_dir))
    assert plain.returncode == 0, plain.stderr
    on_ray = voxline("transcribe", *files, "--json", "--asr-threads", "1", "--ray",
                     "--ray-actors", "2", "--ray-files", "2", "--output-dir", str(ray_dir))
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    assert "on Ray Data with 2 engine actors" in on_ray.stderr
    a, b = ([d for d in map(json.loads, r.stdout.splitlines()) if d["type"] == "transcript"]
            for r in (plain, on_ray))
    assert [d["file"] for d in b] == files  # in the inputs' order
    assert [d["text"] for d in b] == [d["text"] for d in a]
    for clip, d in zip(CLIPS, b, strict=True):
        assert wer(speech.text(clip), d["text"]) == 0, d["text"]
    # the files written are the plain path's, byte for byte
    for f in sorted(plain_dir.iterdir()):
        assert (ray_dir / f.name).read_text() == f.read_text()


def test_transcribe_help_imports_no_ray():
    code = ("import sys, time; t = time.perf_counter(); sys.argv = ['voxline', 'transcribe', '--help']\n"
            "from agent import cli\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print('RAY' if 'ray' in sys.modules else 'NORAY', time.perf_counter() - t)")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--ray" in r.stdout and "NORAY" in r.stdout, (r.stdout[-500:], r.stderr[-500:])
    assert time.perf_counter() - t < 10  # (the CLI's own start-up budget is tested elsewhere)
