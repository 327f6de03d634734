"""``[runtime] blas_threads``: NumPy's BLAS held to that many threads, and given back; the
commands that load no agent (asr-serve, transcribe) hold it too."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("threadpoolctl")

# In a fresh interpreter: the limit is process-wide, and the test process's own must not move.
PROBE = r'''
import json, threadpoolctl
import numpy as np
from agent.config import RuntimeConfig
from agent.runtime import limit_blas_threads

def blas():
    return [d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"]

a = np.ones((300, 300), np.float32)
out = {"before": blas()}
out["set1"] = limit_blas_threads(RuntimeConfig(blas_threads=1))
a @ a
out["one"] = blas()
out["set3"] = limit_blas_threads(RuntimeConfig(blas_threads=3))
out["three"] = blas()
out["set0"] = limit_blas_threads(RuntimeConfig(blas_threads=0))
out["after"] = blas()
print(json.dumps(out))
'''


def test_limit_is_set_replaced_and_undone():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, env=env, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["before"] == [2]  # NumPy ships one BLAS; $OPENBLAS_NUM_THREADS set its start
    assert (out["set1"], out["one"]) == (1, [1])
    assert (out["set3"], out["three"]) == (3, [3])  # a new setting replaces the last
    assert (out["set0"], out["after"]) == (0, [2])  # 0 gives back what it found


ROOT = Path(__file__).resolve().parents[2]
CLIP = ROOT / "tests" / "data" / "ls-dev-clean-1272-128104-0000.wav"

# `voxline transcribe` run in a fresh interpreter, then what NumPy's BLAS uses after it.
TRANSCRIBE = r'''
import json, sys, threadpoolctl
from agent.cli import main
rc = main(["transcribe", *sys.argv[1:]])
print(json.dumps({"rc": rc, "blas": [d["num_threads"] for d in threadpoolctl.threadpool_info()
                                     if d["user_api"] == "blas"]}))
'''


@pytest.mark.parametrize(("flags", "threads"), [([], 1), (["--runtime-blas-threads", "0"], 2)])
def test_transcribe_holds_blas_to_the_setting(flags, threads):
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", TRANSCRIBE, "--json", "--no-write", str(CLIP), *flags],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"rc": 0, "blas": [threads]}
    assert "quilter" in run.stdout.lower()  # it did transcribe the clip


@pytest.mark.parametrize(("flags", "said"), [
    ((), "NumPy's BLAS on 1 thread,"), (("--runtime-blas-threads", "0"), "NumPy's BLAS on 2 threads,")])
def test_asr_serve_holds_blas_to_the_setting(tmp_path, flags, said):
    from asr_serve import Served

    served = Served(tmp_path, "--asr-slots", "1", *flags, env={"OPENBLAS_NUM_THREADS": "2"})
    try:
        assert said in served.ready_line  # read back from threadpoolctl once the model is up
    finally:
        served.stop()
