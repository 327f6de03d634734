#!/usr/bin/env bash
# The README's test command: install the test dependencies, then run the whole suite.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test || exit 1
# A pytest-xdist worker per core, two at most: much of the suite waits (calls played in real
# time, servers starting, subprocesses), so on 2 cores two workers take ~22 min where one
# process took ~35 (a first-generation Zen EPYC). VOXLINE_TEST_WORKERS sets the count; 0 runs
# the suite in this one process. The arguments go to pytest after these ("-n 0" works too).
cpus=$(nproc 2>/dev/null || echo 1)
workers=${VOXLINE_TEST_WORKERS:-$(( cpus < 2 ? 0 : 2 ))}
xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadgroup)
${PYTHON:-python3} -m pytest ${xdist[@]+"${xdist[@]}"} "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
