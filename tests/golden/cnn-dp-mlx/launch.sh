#!/usr/bin/env bash
# Starts train.py (cnn-dp, built by mithril-spec for 4 process(es)) with mlx.launch: the
# ring backend, 4 processes on this machine, or one per host with MLX_HOSTS.
#
#   ./launch.sh [train.py arguments...]
#   ./launch.sh --steps 20 --metrics metrics.jsonl
#   MLX_HOSTS=mac1,mac2 ./launch.sh --steps 20     # one process per host (ssh; same paths on every host)
#
# PYTHON picks the interpreter (default: python3), MLX_LAUNCH the launcher (default: mlx.launch beside
# it), MLX_PORT the ring's first port (default: a free one). mlx.launch itself exits 0 whatever its processes
# do: this script returns the first failure's code
# (2 when the processes refuse what they were asked: the first one says why, in one line), and leaves out
# mlx.launch's own lines about which process exited how. MAX_RESTARTS=N runs the processes again after a
# failure (not after exit 2 or 3), up to N times, each time from the newest checkpoint; SIGTERM / SIGUSR1
# has train.py save a checkpoint and exit 3.
set -euo pipefail
# SIGUSR1, SLURM's warning before a job's time limit (launch.sbatch), is for train.py to act on (it saves a
# checkpoint and exits 3): the launchers ignore it where they do not pass it on themselves (the ignoring is
# inherited: mlx.launch, which SLURM signals with the rest of the process group, does not die of it).
trap '' USR1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="$(command -v "${PYTHON:-python3}")"
launcher="${MLX_LAUNCH:-$(dirname "$python")/mlx.launch}"
if [[ -n "${MITHRIL_STATUS_DIR:-}" ]]; then  # one process under mlx.launch: run it, note a failure
  rc=0
  "$python" "$here/train.py" "$@" || rc=$?
  if (( rc != 0 )); then
    echo "$rc" > "$MITHRIL_STATUS_DIR/$$"
    # mlx.launch stops every process at the first failure: the others wait a moment before they exit, so
    # that rank 0, which reaches the same verdict and alone says why, is not stopped before it has said it
    [[ "${MLX_RANK:-0}" == 0 ]] || sleep 3
  fi
  exit "$rc"
fi
restarts="${MAX_RESTARTS:-0}"
if ! [[ "$restarts" =~ ^[0-9]+$ ]]; then
  echo "launch.sh: MAX_RESTARTS=$restarts must be a number of restarts (0 or more)" >&2
  exit 2
fi
status_dir="$(mktemp -d)"
trap 'rm -rf "$status_dir"' EXIT

# Runs the processes once; returns the first failure's code.
run_once() {
  if (( 4 == 1 )) && [[ -z "${MLX_HOSTS:-}" ]]; then
    # SIGTERM / SIGUSR1 goes on to train.py, which saves a checkpoint and exits 3 (a wait that the signal
    # interrupted is waited again)
    "$python" "$here/train.py" "$@" &
    local pid=$! rc
    trap 'signalled=1; kill -TERM "$pid" 2>/dev/null || true' TERM
    trap 'signalled=1; kill -USR1 "$pid" 2>/dev/null || true' USR1
    while :; do
      signalled=0
      rc=0
      wait "$pid" || rc=$?
      (( signalled && rc > 128 )) || return "$rc"
    done
  fi
  rm -f "$status_dir"/*
  if [[ -n "${MLX_HOSTS:-}" ]]; then
    where=(--hosts "$MLX_HOSTS")
  else
    where=(-n 4)
  fi
  # the ring's ports: MLX_PORT and the ports after it (one per process), else a free run of them starting where
  # the system picks (mlx.launch's fixed default would join two jobs started at once on this machine into one
  # ring, which then hangs; a port after the picked one may be taken: "Couldn't bind socket")
  port="${MLX_PORT:-$("$python" -c '
import socket
while True:
    held = [socket.socket()]
    held[0].bind(("", 0))
    start = held[0].getsockname()[1]
    try:
        for k in range(1, 4):
            held.append(socket.socket())
            held[-1].bind(("", start + k))
    except OSError:
        continue
    finally:
        for s in held:
            s.close()
    print(start)
    break
')}"
  # every process runs this script again (bash), which runs train.py and notes its exit code; mlx.launch's
  # stderr passes through a filter that drops its "[WARN] Node with rank N exited with code C / was killed"
  # lines. Their coloured "[WARN]" tag can be written before a process's own line and the rest of the warning
  # after it, so a line starting with the tag loses it (and is dropped when nothing else is left).
  rc=0
  { "$launcher" --backend ring --starting-port "$port" "${where[@]}" --python "$(command -v bash)" --env "MITHRIL_STATUS_DIR=$status_dir" \
      --env "PYTHON=$python" "$here/launch.sh" "$@" 2>&1 1>&3 3>&- |
      awk '{ tag = sub(/^\033\[[0-9;]*m\[WARN\](\033\[[0-9;]*m)?/, "") }
           /Node with rank [0-9]+ (exited with code|was killed)/ || (tag && /^[ \t]*$/) { next }
           { print; fflush() }' >&2
  } 3>&1 || rc=$?
  (( rc == 0 )) || return "$rc"  # mlx.launch itself failed
  for f in "$status_dir"/*; do
    [[ -e "$f" ]] && return "$(cat "$f")"
  done
  return 0
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
