"""benchmarks/parakeet_gpu.py's plumbing, on the CPU: the no-CUDA answer, the tiny-model path
through every measurement, the budget that skips parts, the watchdog that stops the run, and a
part that raises. Each runs the script in its own process with CUDA hidden and $OUT set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "parakeet_gpu.py"
DRIVER = ROOT / "scripts" / "device_check.sh"


def _run(tmp_path: Path, *args: str, code: str | None = None) -> tuple[int, dict, list[str]]:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(SCRIPT), *args] if code is None else [sys.executable, "-c", code]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert sorted(p.name for p in out.iterdir()) == ["parakeet_gpu.json"], proc.stderr
    result = json.loads((out / "parakeet_gpu.json").read_text())
    lines = proc.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == result, "the last line printed is the JSON written"
    return proc.returncode, result, lines


def test_without_cuda_it_measures_nothing_and_exits_0(tmp_path: Path) -> None:
    rc, result, lines = _run(tmp_path)
    assert rc == 0
    assert result["status"] == "skipped"
    assert result["skipped"] == "no CUDA device"
    assert any("no CUDA device" in line for line in lines[:-1])
    assert "decoder" not in result


def test_smoke_runs_every_measurement_on_the_cpu(tmp_path: Path) -> None:
    rc, result, lines = _run(tmp_path, "--smoke", "--target-s", "0.02")
    assert rc == 0, lines
    assert result["status"] == "complete"
    assert result["skipped"] == [] and result["failures"] == []
    assert result["checks"] == {"decoder_no_graphs_equals_eager": True}
    assert result["checks_pass"] is True
    assert [(r["mode"], r["batch"]) for r in result["decoder"]] == [
        ("no_graphs", 1),
        ("no_graphs", 4),
    ]
    assert [r["profile"] for r in result["encoder"]] == ["stream", "utterance", "window"]
    assert [r["pass"] for r in result["end_to_end"]] == [1, 2]
    for row in result["decoder"] + result["encoder"] + result["end_to_end"]:
        assert row["rtfx"] > 0
    for row in result["decoder"] + result["encoder"]:
        assert row["reps"] >= 3 and row["ms_min"] <= row["ms"] <= row["ms_max"]
    assert all(r["tokens"] > 0 for r in result["end_to_end"])
    assert result["tensorrt"].startswith("not requested")
    assert result["total_s"] < result["budget_s"]
    assert any(line.startswith("[") and "decoder no_graphs batch 1" in line for line in lines)


def test_a_spent_budget_skips_every_part_and_says_which(tmp_path: Path) -> None:
    rc, result, _ = _run(tmp_path, "--smoke", "--budget-s", "0")
    assert rc == 0
    assert result["status"] == "partial"
    parts = [s["part"] for s in result["skipped"]]
    assert "check no_graphs" in parts and "end to end torch pass 1" in parts
    assert {"encoder torch stream", "encoder torch utterance", "encoder torch window"} <= set(parts)
    assert result["decoder"] == result["encoder"] == result["end_to_end"] == []
    assert result["checks_pass"] is False


def test_the_watchdog_stops_the_run_and_keeps_the_json(tmp_path: Path) -> None:
    rc, result, _ = _run(tmp_path, "--smoke", "--hard-s", "0.05")
    assert rc == 3
    assert result["status"] == "timed_out"
    assert result["timed_out"].startswith("hard limit of 0.05 s reached in")


def test_a_part_that_raises_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    code = f"""
import sys
sys.path.insert(0, {str(SCRIPT.parent)!r})
import parakeet_gpu as bench
def broken(*args, **kwargs):
    raise RuntimeError("boom")
bench.timed = broken
sys.exit(bench.main(["--smoke"]))
"""
    rc, result, _ = _run(tmp_path, code=code)
    assert rc == 1
    assert result["status"] == "failed"
    failed = {f["part"] for f in result["failures"]}
    assert {"decoder no_graphs batch 1", "encoder torch window"} <= failed
    assert all(f["error"] == "RuntimeError: boom" for f in result["failures"])
    assert [r["pass"] for r in result["end_to_end"]] == [1, 2]  # the parts after still ran


def _driver(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, Path]:
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(DRIVER), *args],
        env={**os.environ, "OUT": str(out), "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
        | env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc.returncode, proc.stdout, out


def test_the_device_driver_leaves_the_json_and_the_log_in_out(tmp_path: Path) -> None:
    rc, stdout, out = _driver(tmp_path)  # exactly what a session passes to the device tool
    assert rc == 0, stdout
    result = json.loads((out / "parakeet_gpu.json").read_text())
    assert result["status"] == "skipped"  # no CUDA here
    assert "no CUDA device" in (out / "parakeet_gpu.log").read_text()
    assert json.dumps(result) in stdout


def test_the_device_driver_backstop_keeps_the_last_saved_state(tmp_path: Path) -> None:
    rc, stdout, out = _driver(
        tmp_path, "--smoke", "--target-s", "30", "--hard-s", "100", DEVICE_CHECK_LIMIT_S="1"
    )
    assert rc == 4, stdout
    assert "backstop" in stdout
    assert json.loads(stdout.strip().splitlines()[-1])["status"] == "running"
