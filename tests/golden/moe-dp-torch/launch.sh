#!/usr/bin/env bash
# Starts train.py (moe-dp, built by mithril-spec for 8 rank(s)) with torchrun.
#
# One machine (8 processes; gloo on CPU, NCCL on GPUs):
#   ./launch.sh [train.py arguments...]
#   ./launch.sh --steps 10 --metrics metrics.jsonl
#
# Several machines: run the same command on every node, with
#   NNODES=<nodes>  MASTER_ADDR=<host of the rendezvous, e.g. node 0>  [MASTER_PORT=29500]  [RDZV_ID=<job id>]
# Each node starts 8 / NNODES processes; torchrun's c10d rendezvous assigns the ranks. The
# checkpoint directory must be on a filesystem every node can reach. Under SLURM, use launch.sbatch.
#
# TORCHRUN picks the launcher (default: torchrun; e.g. TORCHRUN="python -m torch.distributed.run").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
world=8
nnodes="${NNODES:-1}"
read -r -a torchrun <<< "${TORCHRUN:-torchrun}"
if ! [[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || (( world % nnodes )); then
  echo "launch.sh: NNODES=$nnodes must be a positive divisor of the $world ranks this program needs" >&2
  exit 2
fi
if (( nnodes == 1 )); then
  exec "${torchrun[@]}" --standalone --nproc-per-node "$world" "$here/train.py" "$@"
fi
exec "${torchrun[@]}" \
  --nnodes "$nnodes" \
  --nproc-per-node "$(( world / nnodes ))" \
  --rdzv-backend c10d \
  --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR to the rendezvous host}:${MASTER_PORT:-29500}" \
  --rdzv-id "${RDZV_ID:-moe-dp}" \
  "$here/train.py" "$@"
