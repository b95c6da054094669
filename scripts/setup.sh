#!/usr/bin/env bash
# Creates .venv with mithril-spec and everything its generated programs and tests need (CPU only).
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch first, pinned: a bare `torch` requirement would pull the multi-GB CUDA build (see PLATFORM_NOTES).
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[jax,torch,mlx,data,tracking,dev]"  # mlx: its CPU build on Linux (pyproject.toml)
# Debian packages the tests need (CI runs as root; elsewhere the tests that need them skip, saying why):
# headless Chromium renders the HTML plan report (tests/test_report.py); slurm-wlm and munge run a one-node
# SLURM cluster on localhost for the launch.sbatch scripts (tests/test_slurm.py, tests/slurm_cluster.py).
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
{ command -v slurmctld || [ -x /usr/sbin/slurmctld ]; } >/dev/null 2>&1 || need+=(slurm-wlm)
{ command -v munged || [ -x /usr/sbin/munged ]; } >/dev/null 2>&1 || need+=(munge)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup.sh: missing ${need[*]}; install them (e.g. apt-get install ${need[*]}) for tests/test_report.py" \
      "and tests/test_slurm.py" >&2
  fi
fi
