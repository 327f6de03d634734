#!/usr/bin/env bash
# The README's test command: install the test dependencies, then run the whole suite.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test || exit 1
${PYTHON:-python3} -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
