#!/usr/bin/env bash
# Starts train.py (mlp-dp, built by mithril-spec for 8 process(es)) with mlx.launch: the
# ring backend, 8 processes on this machine, or one per host with MLX_HOSTS.
#
#   ./launch.sh [train.py arguments...]
#   ./launch.sh --steps 20 --metrics metrics.jsonl
#   MLX_HOSTS=mac1,mac2 ./launch.sh --steps 20     # one process per host (ssh; same paths on every host)
#
# PYTHON picks the interpreter (default: python3), MLX_LAUNCH the launcher (default: mlx.launch beside
# it), MLX_PORT the ring's first port (default: a free one). mlx.launch itself exits 0 whatever its processes
# do: this script returns the first failure's code
# (2 when the processes refuse what they were asked: the first one says why, in one line), and leaves out
# mlx.launch's own lines about which process exited how.
set -euo pipefail
# SIGUSR1, SLURM's warning before a job's time limit (launch.sbatch), is for train.py to act on: the launchers
# ignore it, and so does a train.py that sets no handler of its own (the ignoring is inherited).
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
if (( 8 == 1 )) && [[ -z "${MLX_HOSTS:-}" ]]; then
  exec "$python" "$here/train.py" "$@"
fi
if [[ -n "${MLX_HOSTS:-}" ]]; then
  where=(--hosts "$MLX_HOSTS")
else
  where=(-n 8)
fi
# the ring's ports: MLX_PORT and the ports after it (one per process), else a free one the system picks (mlx.launch's
# fixed default would join two jobs started at once on this machine into one ring, which then hangs)
port="${MLX_PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}"
status_dir="$(mktemp -d)"
trap 'rm -rf "$status_dir"' EXIT
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
(( rc == 0 )) || exit "$rc"  # mlx.launch itself failed
for f in "$status_dir"/*; do
  [[ -e "$f" ]] && exit "$(cat "$f")"
done
exit 0
