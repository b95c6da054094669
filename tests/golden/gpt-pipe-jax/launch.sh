#!/usr/bin/env bash
# Starts train.py (gpt-pipe, built by mithril-spec for 8 device(s)) as N JAX processes on
# this machine, joined by jax.distributed. Every process contributes 8 / N devices to the
# mesh (simulated CPU devices when there is no accelerator) and reads only its part of each batch.
#
#   ./launch.sh [--nproc N] [--port PORT] [--] [train.py arguments...]
#   ./launch.sh --nproc 2 --steps 20 --metrics metrics.jsonl
#
# N defaults to $NPROC or 1 (then this is just `python train.py`) and must divide 8. PYTHON picks the
# interpreter (default: python3). If any process fails, the script returns the first failure's code and
# stops the others within 5 s: a refusal that every process reaches (exit 2) is said by process 0 in one
# line, before it exits too. MAX_RESTARTS=N runs them again after a failure (not after exit 2 or 3), up to N
# times, each time from the newest checkpoint; SIGTERM / SIGUSR1 has every process save one and exit 3.
#
# Several hosts: run train.py once per host with
#   MITHRIL_COORDINATOR=<host of process 0>:<port> MITHRIL_NUM_PROCESSES=<N> MITHRIL_PROCESS_ID=<0..N-1>
# (under SLURM: MITHRIL_PROCESS_ID=$SLURM_PROCID MITHRIL_NUM_PROCESSES=$SLURM_NTASKS), and a checkpoint
# directory on a filesystem that every host shares.
set -euo pipefail
# SIGUSR1, SLURM's warning before a job's time limit (launch.sbatch), is for train.py to act on (it saves a
# checkpoint and exits 3): the launchers ignore it where they do not pass it on themselves (the ignoring is
# inherited: mlx.launch, which SLURM signals with the rest of the process group, does not die of it).
trap '' USR1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
nproc="${NPROC:-1}"
port="${MITHRIL_PORT:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nproc) nproc="$2"; shift 2 ;;
    --nproc=*) nproc="${1#*=}"; shift ;;
    --port) port="$2"; shift 2 ;;
    --port=*) port="${1#*=}"; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if ! [[ "$nproc" =~ ^[1-9][0-9]*$ ]] || (( 8 % nproc )); then
  echo "launch.sh: --nproc must divide the 8 devices of this program's mesh, got '$nproc'" >&2
  exit 2
fi
restarts="${MAX_RESTARTS:-0}"
if ! [[ "$restarts" =~ ^[0-9]+$ ]]; then
  echo "launch.sh: MAX_RESTARTS=$restarts must be a number of restarts (0 or more)" >&2
  exit 2
fi
if [[ -z "$port" ]] && (( nproc > 1 )); then  # a free port for the coordinator (process 0)
  port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi

# SIGTERM / SIGUSR1 to this script goes on to every process: each finishes its step, they save a checkpoint
# and exit 3 (train.py's PREEMPTED). A wait that the signal interrupted is waited again.
pids=()
signalled=0
trap 'signalled=1; kill -TERM "${pids[@]}" 2>/dev/null || true' TERM
trap 'signalled=1; kill -USR1 "${pids[@]}" 2>/dev/null || true' USR1
wait_next() {
  while :; do
    signalled=0
    rc=0
    wait -n || rc=$?
    (( signalled && rc > 128 )) || return 0
  done
}

# Runs the processes once; returns the first failure's code (0 when every process succeeded).
run_once() {
  pids=()
  if (( nproc == 1 )); then
    "$python" "$here/train.py" "$@" &
    pids+=("$!")
  else
    for (( i = 0; i < nproc; i++ )); do
      MITHRIL_COORDINATOR="127.0.0.1:$port" MITHRIL_NUM_PROCESSES="$nproc" MITHRIL_PROCESS_ID="$i" \
        "$python" "$here/train.py" "$@" &
      pids+=("$!")
    done
  fi
  # One process failing leaves the others waiting in a collective: stop them, once those that reach the
  # same verdict have had the time to exit by themselves (process 0 says why). SIGKILL: a process waiting in
  # a collective only notes a SIGTERM (it would save once its step is done, which never comes), and would
  # wait for jax.distributed's heartbeat timeout (minutes); the restart goes on from the newest complete
  # checkpoint.
  status=0
  for (( i = 0; i < nproc; i++ )); do
    wait_next
    if (( rc != 0 )); then
      status=$rc
      break
    fi
  done
  if (( status != 0 )); then
    for (( t = 0; t < 50; t++ )); do  # up to 5 s
      [[ -n "$(jobs -rp)" ]] || break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  return "$status"
}

# MAX_RESTARTS=N: after a failure, run the processes again (up to N times), each time continuing from the
# newest checkpoint (MITHRIL_RESTART tells train.py, which then resumes as with --resume auto); not after
# exit 2 (what it was asked is refused: a restart would be refused too) nor 3 (stopped by a signal, saved).
attempt=0
while :; do
  status=0
  MITHRIL_RESTART="$attempt" run_once "$@" || status=$?
  if (( status == 0 || status == 2 || status == 3 || attempt >= restarts )); then
    exit "$status"
  fi
  attempt=$(( attempt + 1 ))
  echo "launch.sh: a process failed with exit code $status: restart $attempt of $restarts, from the newest checkpoint" >&2
done
