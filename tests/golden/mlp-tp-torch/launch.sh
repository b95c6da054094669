#!/usr/bin/env bash
# Starts train.py (mlp-tp, built by mithril-spec for 8 rank(s)) with torchrun.
#
# One machine (8 processes; gloo on CPU, NCCL on GPUs):
#   ./launch.sh [train.py arguments...]
#   ./launch.sh --steps 20 --metrics metrics.jsonl
#
# Several machines: run the same command on every node, with
#   NNODES=<nodes>  MASTER_ADDR=<host of the rendezvous, e.g. node 0>  [MASTER_PORT=29500]  [RDZV_ID=<job id>]
# Each node starts 8 / NNODES processes; torchrun's c10d rendezvous assigns the ranks. The
# checkpoint directory must be on a filesystem every node can reach. Under SLURM, use launch.sbatch.
#
# PYTHON picks the interpreter that runs torchrun (torch.distributed.run; default: python3). When a rank
# fails, this script exits with that rank's code: a rank that refuses what it was asked has said why in
# one line and exits 2 (torchrun's own failure report is left out); any other failure adds one line naming
# the rank. TORCHRUN replaces the launcher as it is (e.g. TORCHRUN=torchrun: its own report, exit code 1).
set -euo pipefail
# SIGUSR1, SLURM's warning before a job's time limit (launch.sbatch), is for train.py to act on: the launchers
# ignore it, and so does a train.py that sets no handler of its own (the ignoring is inherited).
trap '' USR1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
world=8
nnodes="${NNODES:-1}"
if ! [[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || (( world % nnodes )); then
  echo "launch.sh: NNODES=$nnodes must be a positive divisor of the $world ranks this program needs" >&2
  exit 2
fi
# torchrun, whose failure report is the failed rank's exit code (and a line, unless the rank said why)
read -r -d '' run_torchrun <<'EOF' || true
import logging, os, sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run
os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its banner
logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
try:
    run(parse_args(sys.argv[1:]))
except ChildFailedError as e:
    rank, failure = e.get_first_failure()
    code = failure.exitcode
    if code != 2:  # 2: the rank said why
        print(f"launch.sh: rank {rank} failed with exit code {code}", file=sys.stderr)
    sys.exit(code if 0 < code < 256 else 128 - code if code < 0 else 1)
EOF
if [[ -n "${TORCHRUN:-}" ]]; then
  read -r -a torchrun <<< "$TORCHRUN"
else
  torchrun=("${PYTHON:-python3}" -c "$run_torchrun")
fi
if (( nnodes == 1 )); then
  exec "${torchrun[@]}" --standalone --nproc-per-node "$world" "$here/train.py" "$@"
fi
exec "${torchrun[@]}" \
  --nnodes "$nnodes" \
  --nproc-per-node "$(( world / nnodes ))" \
  --rdzv-backend c10d \
  --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR to the rendezvous host}:${MASTER_PORT:-29500}" \
  --rdzv-id "${RDZV_ID:-mlp-tp}" \
  "$here/train.py" "$@"
