"""The bounded fuzzing run of every sans-I/O parser: ``benchmarks/fuzz.py`` (atheris, coverage
guided) gives each target 3,000 inputs or about 3 s, whichever comes first, and finds no crash,
no hang and no broken invariant; every seed of ``tests/data/fuzz_seeds/`` replays clean; and
the harness itself counts what it should. The long run (1,000,000 inputs per parser) is the
benchmark's, not CI's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.append(str(BENCH))  # fuzz.py and fuzz_targets.py (and emit.py, which fuzz.py uses)

import fuzz  # noqa: E402
from fuzz_targets import TARGETS  # noqa: E402

RUNS, SECONDS = 3000, 3

# Targets with a finding whose fix has not landed yet: each test fails until it does (strict),
# then the mark goes. The finding's minimal input is a seed, so the failure is deterministic.
KNOWN: dict[str, str] = {}


def _known(name: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(strict=True, reason=KNOWN[name])] if name in KNOWN else []


def _require_atheris() -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        msg = "atheris is not installed (pip install atheris; it is in voxline[test])"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def _fuzz(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp / "fuzz.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "fuzz.py"), "--json-out", str(out),
         "--crash-dir", str(tmp / "findings"), *args],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert out.exists(), f"fuzz.py wrote no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads(out.read_text())


@pytest.mark.parametrize("name", [pytest.param(n, marks=_known(n)) for n in TARGETS])
def test_bounded_fuzz_run_finds_nothing(name: str, tmp_path: Path) -> None:
    _require_atheris()
    proc, res = _fuzz(tmp_path, "--targets", name, "--runs", str(RUNS),
                      "--max-time", str(SECONDS))
    r = res["targets"][name]
    found = {sig: (f["count"], f.get("minimal")) for sig, f in r["findings"].items()}
    assert (r["crashes"], r["hangs"], r["invariant_failures"]) == (0, 0, 0), found
    assert proc.returncode == 0, proc.stdout[-2000:]
    # it fuzzed: every seed ran, mutations followed, and the parser's code gave coverage
    assert r["seeds"] > 0 and r["inputs"] > r["seeds"]
    assert r["coverage_edges"] > 10


@pytest.mark.parametrize("name", [pytest.param(n, marks=_known(n)) for n in TARGETS])
def test_seeds_replay_clean(name: str) -> None:
    target = TARGETS[name]
    check = target.build()
    inputs = fuzz.seed_inputs(target)
    assert inputs, f"no seeds in tests/data/fuzz_seeds/{name}/"
    found = {}
    for data in inputs:
        finding = fuzz.classify(check, data)
        if finding is not None:
            found[finding[1]] = data[:200]
    assert not found


def test_an_undocumented_exception_is_a_crash_and_is_shrunk(monkeypatch) -> None:
    from transports.rtp import packet

    check = TARGETS["rtp"].build()
    real = packet.parse_rtp

    def buggy(data: bytes) -> packet.RtpPacket:
        if b"\xff\xfe" in data:
            raise IndexError("a bug in the parser")
        return real(data)

    monkeypatch.setattr(packet, "parse_rtp", buggy)
    seed = (ROOT / "tests/data/fuzz_seeds/rtp/sipp-pcmu-first.rtp").read_bytes()
    assert fuzz.classify(check, seed) is None  # parses
    assert fuzz.classify(check, b"\x00" * 5) is None  # RtpParseError: documented, no finding
    kind, sig, trace = fuzz.classify(check, seed + b"\xff\xfe")
    assert kind == "crash" and sig.startswith("crash: IndexError at tests/test_parser_fuzz.py:")
    assert "a bug in the parser" in trace
    assert fuzz.minimize(check, seed + b"\xff\xfe" + seed, sig) == b"\xff\xfe"


def test_a_broken_invariant_is_a_finding(monkeypatch) -> None:
    from transports.rtp import packet

    check = TARGETS["rtp"].build()
    real = packet.parse_rtp

    def lossy(data: bytes) -> packet.RtpPacket:
        pkt = real(data)
        return packet.RtpPacket(pkt.payload_type, pkt.sequence, pkt.timestamp, pkt.ssrc,
                                pkt.payload[1:], pkt.marker, pkt.csrcs)  # drops a byte

    monkeypatch.setattr(packet, "parse_rtp", lossy)
    seed = (ROOT / "tests/data/fuzz_seeds/rtp/sipp-pcmu-first.rtp").read_bytes()
    kind, sig, _ = fuzz.classify(check, seed)
    assert (kind, sig) == ("invariant", "invariant: a plain packet does not re-serialize to its bytes")


def test_the_runner_reports_and_saves_a_finding(tmp_path: Path) -> None:
    """End to end through the subprocess: with a hang limit of 0 s every input is a "hang", so
    the table, the JSON, the exit status and the saved input all show the finding."""
    _require_atheris()
    proc, res = _fuzz(tmp_path, "--targets", "rtp", "--runs", "300", "--hang-s", "0")
    r = res["targets"]["rtp"]
    assert proc.returncode == 1 and not res["clean"]
    assert r["inputs"] == 300 and r["hangs"] > 0 and r["crashes"] == 0
    (sig, finding), = r["findings"].items()
    assert sig == "hang: over 0 s" and finding["kind"] == "hang"
    assert Path(finding["input_file"]).is_file()
    assert Path(finding["input_file"]).parent == tmp_path / "findings" / "rtp"
    row = next(line for line in proc.stdout.splitlines() if line.startswith("rtp "))
    assert row.split()[1:5] == ["300", "0", str(r["hangs"]), "0"]
