"""Coverage-guided fuzzing of every sans-I/O parser: atheris (libFuzzer for Python) drives each
target of ``fuzz_targets.py`` in its own subprocess, so a dying target cannot stop the others.

A target's parser modules are imported under atheris' coverage instrumentation; libFuzzer starts
from the seed corpus in ``tests/data/fuzz_seeds/<target>/`` (captured real traffic, see its
README) and mutates towards new coverage for ``--runs`` inputs. A finding is an exception the
parser's module does not document (a crash), an input that costs more than ``--hang-s``
seconds of CPU (a hang; libFuzzer's own ``-timeout`` kills one that never returns), or a
broken invariant (a parsed message that does not re-parse the same, an incremental parser
that parses a split stream differently). Each distinct finding is saved under ``--crash-dir``
(``benchmarks/results/fuzz/<target>/``) with its traceback, and shrunk to a minimal input.

    nice -n 19 python benchmarks/fuzz.py               # 1,000,000 inputs per parser
    python benchmarks/fuzz.py --targets sip,sdp --runs 50000 --json-out /tmp/fuzz.json

Prints a table per parser (inputs, crashes, hangs, broken invariants, coverage, corpus,
seconds) and one JSON line; writes benchmarks/results/fuzz.json.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402
from fuzz_targets import TARGETS, Check, Target, Violation  # noqa: E402

SEEDS = ROOT / "tests" / "data" / "fuzz_seeds"
RESULT = ROOT / "benchmarks" / "results" / "fuzz.json"
CRASH_DIR = ROOT / "benchmarks" / "results" / "fuzz"
MAX_RESTARTS = 3  # a target whose process dies (libFuzzer's timeout, out of memory) restarts
MUTATE_SHARE = 1 / 3  # of mutated inputs, those that also get a target's structure-aware mutation

Finding = tuple[str, str, str]  # (kind, signature, traceback or detail)


# --- what an input does ------------------------------------------------------------------------


def signature(exc: BaseException) -> str:
    """One name per distinct finding: the invariant, or the exception type and the innermost
    line of the repository's code it came from (the parser's line, not the harness's)."""
    if isinstance(exc, Violation):
        return f"invariant: {exc.key}"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(str(ROOT))] or frames
    where = ours[-1] if ours else None
    at = f"{Path(where.filename).resolve().relative_to(ROOT)}:{where.lineno}" if (
        where and where.filename.startswith(str(ROOT))) else "?"
    return f"crash: {type(exc).__name__} at {at}"


def classify(check: Check, data: bytes) -> Finding | None:
    """Run one input; the finding it makes (kind, signature, traceback), or None."""
    try:
        check(data)
    except Violation as exc:
        return "invariant", signature(exc), str(exc)
    except Exception as exc:  # a crash: anything the module does not document
        return "crash", signature(exc), "".join(traceback.format_exception(exc))
    return None


def seed_files(name: str) -> list[Path]:
    folder = SEEDS / name
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def seed_inputs(target: Target) -> list[bytes]:
    return [x for p in seed_files(target.name) for x in target.seed_inputs(p.read_bytes())]


def minimize(check: Check, data: bytes, sig: str, budget_s: float = 20.0) -> bytes:
    """The shortest input found by deleting ever smaller chunks while ``sig`` still holds."""
    deadline = time.monotonic() + budget_s
    best, parts = data, 2
    while best and time.monotonic() < deadline:
        size = max(1, len(best) // parts)
        for i in range(0, len(best), size):
            cand = best[:i] + best[i + size :]
            found = classify(check, cand)
            if found is not None and found[1] == sig:
                best = cand
                parts = max(parts - 1, 2)
                break
        else:
            if size == 1:
                break
            parts = min(parts * 2, len(best))
    return best


# --- the child: one target under libFuzzer -----------------------------------------------------


class Recorder:
    """The child's findings, written to ``findings.json`` as each new one appears (so a process
    that dies keeps them) and at exit, with the first input of each saved in ``crash_dir``."""

    def __init__(self, path: Path, crash_dir: Path) -> None:
        self.path, self.crash_dir = path, crash_dir
        self.inputs = 0
        self.findings: dict[str, dict[str, Any]] = {}

    def add(self, kind: str, sig: str, detail: str, data: bytes, cpu_s: float) -> None:
        entry = self.findings.get(sig)
        if entry is not None:
            entry["count"] += 1
            return
        self.crash_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{kind}-{hashlib.sha1(sig.encode()).hexdigest()[:10]}"
        (self.crash_dir / f"{stem}.bin").write_bytes(data)
        (self.crash_dir / f"{stem}.txt").write_text(f"{sig}\n\n{detail}\n\ninput: {data!r}\n")
        self.findings[sig] = {"kind": kind, "count": 1, "detail": detail[-2000:],
                              "input_file": str(self.crash_dir / f"{stem}.bin"),
                              "cpu_s": round(cpu_s, 3)}
        self.flush()

    def flush(self, *_: Any) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inputs": self.inputs, "findings": self.findings}))
        tmp.replace(self.path)


def child(name: str, work: Path, crash_dir: Path, hang_s: float, libfuzzer: list[str]) -> None:
    import atheris

    target = TARGETS[name]
    with atheris.instrument_imports(include=list(target.instrument)):
        for module in target.imports:
            importlib.import_module(module)
    check = target.build()
    rec = Recorder(work / "findings.json", crash_dir)
    clock = time.process_time  # CPU time: a loaded machine's scheduling is no hang

    def one(data: bytes) -> None:
        t0 = clock()
        found = classify(check, data)
        cpu = clock() - t0
        rec.inputs += 1
        if found is not None:
            rec.add(*found, data, cpu)
        if cpu > hang_s:
            rec.add("hang", f"hang: over {hang_s:g} s", f"{cpu:.2f} s of CPU", data, cpu)

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        data = atheris.Mutate(data, max_size)  # libFuzzer's own mutations
        rnd = random.Random(seed)
        if target.mutations and rnd.random() < MUTATE_SHARE:
            data = target.mutate(data, rnd, max_size)
        return data

    # libFuzzer ends a run with exit(), which skips Python's atexit: register with the C one
    at_exit = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(rec.flush)
    ctypes.CDLL("libc.so.6").__cxa_atexit(at_exit, None, None)
    rec.flush()
    atheris.Setup([sys.argv[0], *libfuzzer], one,
                  custom_mutator=mutator if target.mutations else None)
    atheris.Fuzz()


# --- the parent: run, restart, read the results ------------------------------------------------

_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\d+)(b|Kb|Mb)")
_UNITS = {"b": 1, "Kb": 1 << 10, "Mb": 1 << 20}


def run_target(target: Target, args: argparse.Namespace, crash_dir: Path,
               corpus_root: Path | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"voxline-fuzz-{target.name}-"))
    corpus = (corpus_root / target.name) if corpus_root else work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    seeds = seed_inputs(target)
    for data in seeds:
        (corpus / f"seed-{hashlib.sha1(data).hexdigest()[:16]}").write_bytes(data)
    for old in crash_dir.glob("*-*.*"):  # findings of an earlier run of this target
        if old.suffix in (".bin", ".txt"):
            old.unlink()
    inputs, findings, status, restarts, died, cpu = 0, {}, None, 0, [], 0.0
    t0 = time.monotonic()
    while True:
        left = args.runs - inputs
        fuzz_args = [str(corpus), f"-runs={left}", f"-max_len={target.max_len}",
                     f"-timeout={args.kill_s}", f"-artifact_prefix={work}/",
                     "-print_final_stats=1", "-rss_limit_mb=2048", f"-seed={args.seed}"]
        if args.max_time:
            spent = time.monotonic() - t0
            fuzz_args.append(f"-max_total_time={max(1, int(args.max_time - spent))}")
        dictionary = SEEDS / f"{target.name}.dict"
        if dictionary.exists():
            fuzz_args.append(f"-dict={dictionary}")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", target.name,
               "--work", str(work), "--crash-dir", str(crash_dir), "--hang-s", str(args.hang_s),
               "--", *fuzz_args]
        log_path = work / f"libfuzzer-{restarts}.log"
        (work / "findings.json").unlink(missing_ok=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(log_path, "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONHASHSEED": "0"}).returncode
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        text = log_path.read_text(errors="replace")
        state = json.loads((work / "findings.json").read_text()) if (
            work / "findings.json").exists() else {"inputs": 0, "findings": {}}
        for sig, entry in state["findings"].items():
            if sig in findings:
                findings[sig]["count"] += entry["count"]
            else:
                findings[sig] = entry
        statuses = _STATUS.findall(text)
        if statuses:
            status = statuses[-1]
        ran = state["inputs"]
        if rc == 0:
            inputs += ran
            break
        # the process died: libFuzzer's timeout, out of memory, or the interpreter itself
        ran = max(ran, int(status[0]) if status else 0)
        inputs += ran
        kind, sig = _death(text)
        died.append(sig)
        art = sorted(work.glob("timeout-*")) + sorted(work.glob("oom-*")) + sorted(
            work.glob("crash-*"))
        entry = findings.setdefault(sig, {"kind": kind, "count": 0, "detail": text[-2000:],
                                          "input_file": ""})
        entry["count"] += 1
        if art:
            crash_dir.mkdir(parents=True, exist_ok=True)
            dest = crash_dir / f"{kind}-died-{art[-1].name}.bin"
            shutil.copy(art[-1], dest)
            entry["input_file"] = str(dest)
            for a in art:
                a.unlink()
        restarts += 1
        if restarts > MAX_RESTARTS or inputs >= args.runs or (
                args.max_time and time.monotonic() - t0 >= args.max_time):
            break
    seconds = time.monotonic() - t0
    if findings:
        check = target.build()  # not instrumented: the shrinking runs in this process
        for sig, entry in findings.items():
            if entry["kind"] == "hang" or not entry.get("input_file"):
                continue
            data = Path(entry["input_file"]).read_bytes()
            small = minimize(check, data, sig)
            Path(entry["input_file"]).with_suffix(".min.bin").write_bytes(small)
            entry["minimal"] = repr(small)
    for entry in findings.values():
        if entry.get("input_file", "").startswith(f"{ROOT}/"):
            entry["input_file"] = str(Path(entry["input_file"]).relative_to(ROOT))
    if corpus_root is None:
        shutil.rmtree(work, ignore_errors=True)
    counts = {k: sum(e["count"] for e in findings.values() if e["kind"] == k)
              for k in ("crash", "hang", "invariant")}
    cov = ft = units = size = 0
    if status:
        cov, ft, units = int(status[1]), int(status[2]), int(status[3])
        size = int(status[4]) * _UNITS[status[5]]
    return {
        "parser": target.parser, "documented_errors": list(target.documented),
        "inputs": inputs, "seeds": len(seeds), "crashes": counts["crash"],
        "hangs": counts["hang"], "invariant_failures": counts["invariant"],
        "coverage_edges": cov, "features": ft, "corpus_units": units, "corpus_bytes": size,
        "seconds": round(seconds, 1), "inputs_per_s": round(inputs / max(seconds, 1e-9)),
        "cpu_s": round(cpu, 1), "inputs_per_cpu_s": round(inputs / max(cpu, 1e-9)),
        "restarts": restarts, "process_deaths": died, "findings": findings,
    }


def _death(log: str) -> tuple[str, str]:
    if "libFuzzer: timeout" in log:
        return "hang", "hang: killed by libFuzzer's -timeout"
    if "out-of-memory" in log:
        return "crash", "crash: out of memory (libFuzzer's -rss_limit_mb)"
    tail = [ln for ln in log.splitlines() if ln.strip()][-1:] or ["?"]
    return "crash", f"crash: the fuzzing process died ({tail[0][:120]})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help=f"comma-separated, of {', '.join(TARGETS)} (default: all)")
    ap.add_argument("--runs", type=int, default=1_000_000, help="inputs per target")
    ap.add_argument("--max-time", type=float, default=0.0,
                    help="also stop a target after this many seconds (0: no limit)")
    ap.add_argument("--hang-s", type=float, default=1.0,
                    help="an input that costs more CPU seconds than this is a hang")
    ap.add_argument("--kill-s", type=int, default=10,
                    help="libFuzzer's -timeout: wall seconds after which it kills a stuck input")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (0: random)")
    ap.add_argument("--crash-dir", default=str(CRASH_DIR),
                    help="where findings go, one folder per target")
    ap.add_argument("--corpus-dir", help="keep the grown corpus here (default: a temp folder)")
    ap.add_argument("--json-out", default=str(RESULT))
    ap.add_argument("--jobs", type=int, default=1,
                    help="targets fuzzed at once (each is its own process; one per core)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("libfuzzer", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, Path(args.work), Path(args.crash_dir), args.hang_s,
              [a for a in args.libfuzzer if a != "--"])
        return 0
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed: pip install atheris (or voxline[test])", file=sys.stderr)
        return 2
    from importlib.metadata import version

    res: dict[str, Any] = {
        "benchmark": "fuzz", "engine": f"atheris {version('atheris')} (libFuzzer)",
        "python": sys.version.split()[0], "runs_per_target": args.runs,
        "max_time_s": args.max_time, "hang_s": args.hang_s, "seed": args.seed, "targets": {},
    }
    print(f"coverage-guided fuzzing, {args.runs:,} inputs per parser"
          f"{f' or {args.max_time:g} s' if args.max_time else ''}; a hang is > {args.hang_s:g} s"
          " of CPU for one input")
    head = (f"{'parser':<9}{'inputs':>11}{'crashes':>9}{'hangs':>7}{'invariant':>11}"
            f"{'cov':>6}{'ft':>7}{'corpus':>14}{'seconds':>9}{'inputs/s':>10}{'/CPU-s':>9}")
    print(head)
    crash_root = Path(args.crash_dir)
    corpus_root = Path(args.corpus_dir) if args.corpus_dir else None
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # (threads that wait on processes)
        done = pool.map(lambda n: (n, run_target(TARGETS[n], args, crash_root / n, corpus_root)),
                        names)
        for name, r in done:  # in the order asked, as each is ready
            res["targets"][name] = r
            corpus = f"{r['corpus_units']}/{r['corpus_bytes'] / 1024:.1f}KiB"
            print(f"{name:<9}{r['inputs']:>11,}{r['crashes']:>9}{r['hangs']:>7}"
                  f"{r['invariant_failures']:>11}{r['coverage_edges']:>6}{r['features']:>7}"
                  f"{corpus:>14}{r['seconds']:>9.1f}{r['inputs_per_s']:>10,}"
                  f"{r['inputs_per_cpu_s']:>9,}", flush=True)
    print("cov: edges of the parser's instrumented code reached; ft: libFuzzer's features (edges "
          "and hit-count buckets); corpus: inputs kept/their size; /CPU-s: inputs per CPU second")
    rows = res["targets"].values()
    res["total_inputs"] = sum(r["inputs"] for r in rows)
    res["total_crashes"] = sum(r["crashes"] for r in rows)
    res["total_hangs"] = sum(r["hangs"] for r in rows)
    res["total_invariant_failures"] = sum(r["invariant_failures"] for r in rows)
    res["clean"] = not (res["total_crashes"] or res["total_hangs"]
                        or res["total_invariant_failures"])
    for name, r in res["targets"].items():
        for sig, f in r["findings"].items():
            print(f"  {name}: {sig} ×{f['count']}; minimal input {f.get('minimal', '-')[:160]}"
                  f" ({f['input_file'] or 'no input saved'})")
    line = {"benchmark": "fuzz", "clean": res["clean"], "runs_per_target": args.runs,
            **{n: {"inputs": r["inputs"], "crashes": r["crashes"], "hangs": r["hangs"],
                   "invariant_failures": r["invariant_failures"],
                   "cov": r["coverage_edges"]} for n, r in res["targets"].items()}}
    emit(res, args.json_out, line)
    return 0 if res["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
