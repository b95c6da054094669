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
# Headless Chromium renders the HTML plan report in tests/test_report.py (Debian package; CI runs as root).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -q && apt-get install -y -q chromium
  else
    echo "setup.sh: chromium is missing; install it (e.g. apt-get install chromium) for tests/test_report.py" >&2
  fi
fi
