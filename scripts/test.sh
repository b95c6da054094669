#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# -n 2: two pytest-xdist workers, whole files each (tests/conftest.py), for CI's two cores; --durations: the
# slowest phases (a file's shared runs show as its first test's setup), to keep the suite within CI's budget
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --durations=30 "$@"
