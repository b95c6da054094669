#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite; `--fast`: the compiler's tests only (no generated program
# runs and no framework is imported: tests/conftest.py fails a test of that tier that starts one), for every
# change. Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tier=()
if [[ "${1:-}" == --fast ]]; then
  shift
  export MITHRIL_FAST=1
  tier=(-m "not slow and not runs")
fi
# -n 2: two pytest-xdist workers, whole files each (tests/conftest.py), for CI's two cores; --durations: the
# slowest phases (a file's shared runs show as its first test's setup), to keep the suite within CI's budget
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --durations=30 "${tier[@]}" "$@"
