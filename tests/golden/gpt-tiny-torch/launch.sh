#!/usr/bin/env bash
# Starts train.py (gpt-tiny, built by mithril-spec for 8 rank(s)) with torchrun.
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
# MAX_RESTARTS=N: restart the ranks up to N times after a rank dies, each restart continuing from the newest
# checkpoint (pass --checkpoint-every to bound what a restart repeats). SIGTERM or SIGUSR1 to this script
# (or to its process group, as SLURM sends it, or to a rank alone): the ranks save a checkpoint and it exits 3.
set -euo pipefail
# SIGUSR1, SLURM's warning before a job's time limit (launch.sbatch), is for train.py to act on (it saves a
# checkpoint and exits 3): the launchers ignore it where they do not pass it on themselves (the ignoring is
# inherited: mlx.launch, which SLURM signals with the rest of the process group, does not die of it).
trap '' USR1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
world=8
nnodes="${NNODES:-1}"
if ! [[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || (( world % nnodes )); then
  echo "launch.sh: NNODES=$nnodes must be a positive divisor of the $world ranks this program needs" >&2
  exit 2
fi
# torchrun, whose failure report is the failed rank's exit code (and a line, unless the rank said why).
# SIGTERM / SIGUSR1 (SLURM's end of a job) goes to every rank, which finishes its step, saves its checkpoint
# and exits 3 (train.py's PREEMPTED): torchrun waits for them, restarts nothing, and exits with their code.
read -r -d '' run_torchrun <<'EOF' || true
import logging, os, signal, sys
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run
os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its banner
logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
codes, default = [], api._terminate_process_handler
def ranks():  # this process's children (Linux)
    tasks = os.listdir("/proc/self/task")
    return {int(p) for t in tasks for p in open(f"/proc/self/task/{t}/children").read().split()}
def preempted(signum, frame):
    if signum not in (signal.SIGTERM, signal.SIGUSR1) or codes or not os.path.isdir("/proc/self/task"):
        return default(signum, frame)
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.ERROR)
    for pid in (pids := ranks()):
        os.kill(pid, signum)
    codes.extend(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids)
    raise api.SignalException(f"got signal {signum}", sigval=signal.Signals(signum))
api._terminate_process_handler = preempted  # (torchrun installs it for SIGTERM when it starts the ranks)
signal.signal(signal.SIGUSR1, preempted)
# When a rank fails, torchrun stops the others (before restarting them all, or giving up) with SIGTERM,
# which asks a rank to finish its step and save: with a peer gone, that step's collectives never finish,
# and torchrun waits 30 s before it kills. Those ranks are killed at once (a restart continues from the
# newest complete checkpoint; a save cut short is never one). A rank that exited 2 (it refused what it
# was asked) or 3 (stopped by a signal, saved) ends the run: nothing restarts, and the others get torchrun's
# SIGTERM (a preempted run's other ranks finish their saves).
monitor, stop = LocalElasticAgent._monitor_workers, LocalElasticAgent._stop_workers
def monitor_workers(self, group):
    result = monitor(self, group)
    ends = {f.exitcode for f in result.failures.values()} & {2, 3}
    self._remaining_restarts = 0 if ends else self._remaining_restarts
    self.kill = result.is_failed() and not ends
    return result
def stop_workers(self, group, *args, **kwargs):
    return self._shutdown(signal.SIGKILL) if getattr(self, "kill", False) else stop(self, group, *args, **kwargs)
LocalElasticAgent._monitor_workers, LocalElasticAgent._stop_workers = monitor_workers, stop_workers
# Every rendezvous round (the first, each restart) gets a new store. torchrun hosts one TCPStore for all its
# rounds and points every attempt's ranks at it, where the keys of the attempt before are still set: a
# restarted rank read the gloo address of a rank that had been killed and was refused (connectFullMesh), or
# waited for a connection that never came (a hang until the process group's timeout). A new store, hosted
# by torchrun (unlike TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1's, by rank 0, gone when rank 0 exits), on a port
# of the round's, which every node reads from the round.
rendezvous = DynamicRendezvousHandler.next_rendezvous
def next_rendezvous(self):
    self._bootstrap_store_info = self._shared_tcp_store_server = None
    return rendezvous(self)
DynamicRendezvousHandler.next_rendezvous = next_rendezvous
def exit_code(code):
    return code if 0 < code < 256 else 128 - code if code < 0 else 1
try:
    run(parse_args(sys.argv[1:]))
except ChildFailedError as e:
    rank, failure = e.get_first_failure()
    code = failure.exitcode
    if code not in (2, 3):  # 2: the rank said why; 3: a signal to some ranks stopped them all, saved (said)
        print(f"launch.sh: rank {rank} failed with exit code {code}", file=sys.stderr)
    sys.exit(exit_code(code))
except api.SignalException as e:
    failed = [c for c in codes if c]
    sys.exit(exit_code(failed[0]) if failed else 0 if codes else 128 + int(e.sigval))
EOF
if [[ -n "${TORCHRUN:-}" ]]; then
  read -r -a torchrun <<< "$TORCHRUN"
else
  torchrun=("${PYTHON:-python3}" -c "$run_torchrun")
fi
# MAX_RESTARTS: torchrun restarts every rank after a failure up to that many times; a restarted rank continues
# from the newest checkpoint of its checkpoint directory (as with --resume auto)
restarts="${MAX_RESTARTS:-0}"
if ! [[ "$restarts" =~ ^[0-9]+$ ]]; then
  echo "launch.sh: MAX_RESTARTS=$restarts must be a number of restarts (0 or more)" >&2
  exit 2
fi
torchrun+=(--max-restarts "$restarts")
if (( nnodes == 1 )); then
  exec "${torchrun[@]}" --standalone --nproc-per-node "$world" "$here/train.py" "$@"
fi
exec "${torchrun[@]}" \
  --nnodes "$nnodes" \
  --nproc-per-node "$(( world / nnodes ))" \
  --rdzv-backend c10d \
  --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR to the rendezvous host}:${MASTER_PORT:-29500}" \
  --rdzv-id "${RDZV_ID:-gpt-tiny}" \
  "$here/train.py" "$@"
