#!/usr/bin/env bash
# The main job: build the GPT example for JAX and train it on a simulated 8-device CPU mesh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/mithril-spec validate specs/
.venv/bin/mithril-spec plan specs/gpt-tiny.yaml
rm -rf out/gpt-tiny-jax  # a fresh program and checkpoint directory on every run
.venv/bin/mithril-spec build specs/gpt-tiny.yaml --target jax -o out/gpt-tiny-jax
.venv/bin/python out/gpt-tiny-jax/train.py --steps 20 --metrics out/gpt-tiny-jax/metrics.jsonl \
  --checkpoint-dir out/gpt-tiny-jax/checkpoints
