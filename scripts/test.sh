#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# -n 2: two pytest-xdist workers, whole files each (tests/conftest.py), for CI's two cores
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 "$@"
