#!/usr/bin/env bash
# The main job: a small GPT learns from this project's own docs and sources. Tokenise them (byte-level BPE),
# validate and plan the spec, build its JAX program for a data x tensor mesh (4 simulated CPU devices),
# train it with held-out evaluation, then sample from the checkpoint. About 3 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ms=.venv/bin/mithril-spec
spec=examples/gpt-docs/gpt-docs.yaml
$ms validate specs/
$ms data prepare docs README.md mithril_spec templates --vocab 1024 -o examples/gpt-docs/data
$ms validate "$spec"
$ms plan "$spec"
rm -rf out/gpt-docs-jax  # a fresh program and checkpoint directory on every run
$ms build "$spec" --target jax -o out/gpt-docs-jax
cd out/gpt-docs-jax
../../.venv/bin/python train.py --metrics metrics.jsonl
../../.venv/bin/python - <<'PY'
import json
rows = [json.loads(line) for line in open("metrics.jsonl")]
evals = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
print(f"training loss: {rows[0]['loss']:.3f} at step 1 -> {rows[-1]['loss']:.3f} at step {rows[-1]['step']}")
print("validation loss: " + ", ".join(f"{v:.3f} (step {s})" for s, v in evals))
PY
echo "--- a sample from the trained model (generate.py, KV cache, temperature 0.8, top-k 40):"
../../.venv/bin/python generate.py --resume checkpoints --prompt "A spec describes" --max-new-tokens 80 \
  --temperature 0.8 --top-k 40
