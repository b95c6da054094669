#!/usr/bin/env bash
# Activation offload on a GPU (training.offload; docs/cost-model.md "Activation offload"): builds a small MLP
# with and without offload for torch (jax refuses offload: E049), runs 4 steps of each on the GPU with --profile, and prints the
# bytes each step sends to host memory next to the plan's, and the peak device memory with and without
# offload next to the plan's peak. Needs a CUDA GPU and torch with CUDA; about a minute.
#
#   benchmarks/offload_gpu_check.sh            # from the repository root
#   BATCH=64 THRESHOLD=100 benchmarks/offload_gpu_check.sh   # a quick run on the CPU
set -euo pipefail
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
MITHRIL=${MITHRIL:-$PWD/.venv/bin/mithril-spec}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# specs/mlp-dp.yaml with gelu activations (each saves its input, as the plan counts), wider, 4,096 samples per
# step: each [4096, 4096] activation is 64 MiB in float32
spec() {  # spec FILE OFFLOAD_LINE
    sed -e 's/op: relu/op: gelu/' -e 's/features: 64, hidden: 256, classes: 10/features: 1024, hidden: 4096, classes: 1000/' \
        -e "s/batch_size: 64/batch_size: ${BATCH:-4096}/" -e "s/  seed: 0/  seed: 0\n$2/" specs/mlp-dp.yaml > "$1"
}
spec "$WORK/plain.yaml" ""
spec "$WORK/offload.yaml" "  offload: {activations: true, threshold: ${THRESHOLD:-1000000}}"

for target in torch; do
    for variant in plain offload; do
        out="$WORK/$target-$variant"
        $MITHRIL build "$WORK/$variant.yaml" --target "$target" --mesh single -o "$out" > /dev/null
        (cd "$out" && $PYTHON train.py --steps 4 --metrics metrics.jsonl --profile prof --profile-steps 2:3 \
            --checkpoint-dir '' > run.log 2>&1) || { cat "$out/run.log"; exit 1; }
    done
    "$PYTHON" - "$WORK" "$target" <<'EOF'
import json, sys
from pathlib import Path

work, target = Path(sys.argv[1]), sys.argv[2]
runs = {v: work / f"{target}-{v}" for v in ("plain", "offload")}
plan = json.loads((runs["offload"] / "plan.json").read_text())["costs"]
acts = plan["stages"][0]["activations"]
peaks = {v: max(json.loads((d / "prof" / "summary.json").read_text())["peak_bytes"]) for v, d in runs.items()}
log = (runs["offload"] / "run.log").read_text()
line = next((ln for ln in log.splitlines() if ln.startswith("offload ")), "offload {}")
rows = [json.loads(r) for r in (runs["offload"] / "metrics.jsonl").read_text().splitlines()]
measured = rows[-1].get("offloaded_bytes", json.loads(line[len("offload "):]).get("device0"))
plain_losses = [json.loads(r)["loss"] for r in (runs["plain"] / "metrics.jsonl").read_text().splitlines()]
print(f"{target}: offloaded per step {measured:,} B measured | {acts['offload_per_step']:,} B planned")
print(f"{target}: peak device memory {peaks['plain']:,} B without offload, {peaks['offload']:,} B with "
      f"(saved {peaks['plain'] - peaks['offload']:,} B) | planned peak {plan['peak_bytes']:,} B, of which "
      f"{acts['offloaded']:,} B of activations in host memory")
print(f"{target}: losses without {plain_losses} | with {[r['loss'] for r in rows]}")
EOF
done
