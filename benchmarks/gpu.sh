#!/usr/bin/env bash
# GPT-2 small (124M) in bfloat16 on this machine's GPUs: the generated torch (--compile) and jax programs, and
# the torch program with FP8 linear layers (precision.float8), next to the hand-written nanoGPT-style torch GPT,
# on the same tokens; one table (tokens/s, MFU, peak memory per
# GPU against the plan), with a 2-GPU row when there are two. Under 8 minutes on one H100 or H200.
# Without a GPU the same path runs on CPU for a few steps (gpt-tiny's shape), and the table says so.
#
#   bash benchmarks/gpu.sh                 # then benchmarks/gpu_bench.py's options: --steps 60, --batch 8, ...
#
# The Python: PYTHON, else .venv/bin/python, else a python3 that has torch and jax (a GPU machine's image),
# else scripts/setup.sh makes .venv (CPU). A GPU machine without network access lacks mithril-spec's own
# dependencies: `bash benchmarks/gpu_wheels.sh` (here, where pip reaches PyPI) puts them in .whl/, and this
# script installs them from there into /tmp/site when .whl/ is present.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
  elif python3 -c "import torch, jax" 2>/dev/null; then
    py=python3
  else
    bash scripts/setup.sh
    py=.venv/bin/python
  fi
fi
if [[ -d .whl ]] && ! "$py" -c "import pydantic, ruff" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
if ! "$py" -c "import mithril_spec.cli" 2>/dev/null; then
  echo "gpu.sh: $py cannot import mithril_spec (its dependencies: pydantic, pyyaml, jinja2, ruff); run" \
       "bash benchmarks/gpu_wheels.sh where pip works and bring .whl/ along, or set PYTHON" >&2
  exit 2
fi
exec "$py" benchmarks/gpu_bench.py "$@"
