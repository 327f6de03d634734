#!/usr/bin/env bash
# The lent-GPU check as one command, for the device tool's `run` (benchmarks/RESULTS.md):
#
#     run  command: "bash scripts/device_check.sh"  timeout_s: 330
#
# Installs nothing: the device image's python3 already holds torch, numpy and cuda-bindings, and
# nothing can be fetched there. Runs scripts/gpu_probe.py (about 30 s), the GPU unit tests when
# pytest is there (seconds), then benchmarks/parakeet_gpu.py, which stops itself inside
# 4 minutes on one H200, warm-up included (budget 210 s, watchdog 230 s), and leaves under $OUT
# its JSON (parakeet_gpu.json), its log (parakeet_gpu.log) and nvidia-smi's view of the card
# (nvidia_smi.csv). The JSON is the last line printed. $OUT defaults to ./out (git ignores it).
# Arguments go to the benchmark: e.g. --smoke (tiny model, seconds) or --budget-s 120.
# Without a CUDA device it prints {"status": "skipped", "skipped": "no CUDA device", ...}, exit 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"

echo "== $(date -u +%FT%TZ) $(uname -m) $("$PY" --version 2>&1) in $PWD, OUT=$OUT"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --format=csv \
    --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    2>&1 | tee "$OUT/nvidia_smi.csv"
else
  echo "nvidia-smi: not found"
fi

# Probes first, each in a process of its own (a crash ends one probe, not the check): where a
# CUDA-graph WHILE node breaks, if it does. Their log: $OUT/gpu_probe.log.
"$PY" scripts/gpu_probe.py 2>&1 | tee "$OUT/gpu_probe.log" | grep -E '^== |^probes:|result ok'

# The GPU unit tests next (tiny models, seconds), when the image has pytest: every decoder mode
# against the eager loop and a pure-Python reference. Their log: $OUT/gpu_tests.log.
tests_rc=skipped
if "$PY" -c 'import pytest' >/dev/null 2>&1; then
  timeout -k 5 "${DEVICE_TESTS_LIMIT_S:-60}" "$PY" -m pytest -q -p no:cacheprovider -o addopts= \
    tests/stages/parakeet/test_cuda_graphs.py 2>&1 | tee "$OUT/gpu_tests.log"
  tests_rc=${PIPESTATUS[0]}
else
  echo "pytest: not in this image; GPU unit tests not run" | tee "$OUT/gpu_tests.log"
fi
echo "== GPU unit tests exit code $tests_rc"

# The benchmark ends itself; `timeout` is the backstop for a GPU call that never returns.
backstop=()
if command -v timeout >/dev/null 2>&1; then
  backstop=(timeout -k 5 "${DEVICE_CHECK_LIMIT_S:-240}")
fi
${backstop[@]+"${backstop[@]}"} "$PY" benchmarks/parakeet_gpu.py \
  --json-out "$OUT/parakeet_gpu.json" "$@" 2>&1 | tee "$OUT/parakeet_gpu.log"
rc=${PIPESTATUS[0]}
echo "== parakeet_gpu exit code $rc (0: complete, partial or skipped; 1: a part failed; 3: its watchdog)"
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "stopped by the ${DEVICE_CHECK_LIMIT_S:-240}-s backstop (exit 4); the last state it saved:"
  "$PY" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' \
    "$OUT/parakeet_gpu.json"
  exit 4  # not 124/137: the device tool reads those as its own time limit
fi
exit "$rc"
