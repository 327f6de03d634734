"""Tick-latency tails with and without ``gc.freeze()``.

A long-running voxline process holds a lot of long-lived Python state (model metadata,
tokenizer vocabularies, preallocated slot objects, imported modules). The cyclic GC's full
collections walk all of it, which shows up as multi-millisecond stalls in the event loop. Each
mode runs in a fresh subprocess: build ``--objects`` long-lived objects, warm up, optionally
``gc.freeze()``, then run ``--ticks`` engine-like ticks (make frames and small containers, keep a
sliding window of recent ones, as a streaming pipeline does) and time each one. Prints a table
and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from emit import emit

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, ROOT)
import numpy as np
from agent.frames import AudioIn, Transcript
from stages.asr.slots import SlotPool

objects, ticks, freeze = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
# long-lived state: a slot pool and a vocabulary-like graph of small containers
pool = SlotPool(capacity=64, max_seconds=1.0)
state = [{"id": i, "piece": str(i), "ids": [i, i + 1], "meta": (i, None)} for i in range(objects)]
gc.collect()
if freeze:
    gc.freeze()
full_before = gc.get_stats()[2]["collections"]
# 16 calls, each keeping per-tick records (events, transcripts) for its whole life (a 60 s call
# at 20 ms ticks), then hanging up: the state survives young collections, is promoted, and
# makes the collector run full collections over everything old — the long-lived state too.
CALL_TICKS = 3000
calls = [[] for _ in range(16)]
pcm = np.zeros(320, dtype=np.int16)
lat = np.empty(ticks, dtype=np.int64)
for t in range(ticks):
    t0 = time.perf_counter_ns()
    for k in range(16):
        if (t + k * CALL_TICKS // 16) % CALL_TICKS == 0:
            calls[k] = []  # hang-up: the call's state goes
        f = AudioIn(pcm, offset=t * 320)
        ev = {"type": "transcript", "text": f"w{k}", "words": [k, t]}
        calls[k].append((f, ev, Transcript("x", final=False)))
    lat[t] = time.perf_counter_ns() - t0
print(json.dumps({"p50_us": float(np.percentile(lat, 50)) / 1e3,
                  "p99_us": float(np.percentile(lat, 99)) / 1e3,
                  "p999_us": float(np.percentile(lat, 99.9)) / 1e3,
                  "max_us": float(lat.max()) / 1e3,
                  "gen2_collections": gc.get_stats()[2]["collections"] - full_before}))
"""


def run(mode: bool, objects: int, ticks: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD.replace("ROOT", repr(str(ROOT))),
                        str(objects), str(ticks), "1" if mode else "0"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--objects", type=int, default=2_000_000, help="long-lived objects to hold")
    ap.add_argument("--ticks", type=int, default=200_000)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    res = {"benchmark": "gc_tail", "objects": args.objects, "ticks": args.ticks,
           "python": sys.version.split()[0]}
    print(f"{args.ticks} ticks of 16 frames each, {args.objects:,} long-lived objects "
          "(time.perf_counter_ns per tick, fresh subprocess per mode)")
    print(f"{'mode':<16}{'p50 µs':>10}{'p99 µs':>10}{'p99.9 µs':>11}{'max µs':>11}{'full GCs':>10}")
    for name, mode in (("no freeze", False), ("gc.freeze()", True)):
        r = run(mode, args.objects, args.ticks)
        res[name] = r
        print(f"{name:<16}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}{r['p999_us']:>11.1f}"
              f"{r['max_us']:>11.1f}{r['gen2_collections']:>10}")
    a, b = res["no freeze"], res["gc.freeze()"]
    res["max_ratio"] = a["max_us"] / max(b["max_us"], 1e-9)
    print(f"worst tick: {a['max_us'] / 1000:.1f} ms without freeze vs {b['max_us'] / 1000:.2f} ms with it")
    emit(res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
