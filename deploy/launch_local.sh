#!/usr/bin/env bash
# Starts N ranks of a loraplex program on this host, the way torchrun does:
# each gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
#
#   deploy/launch_local.sh N PROGRAM [ARGS...]
#   deploy/launch_local.sh 2 build/bin/loraplex-bench-dist --slots 4
#
# MASTER_PORT (default 29500) and MASTER_ADDR (default 127.0.0.1) may be
# set. Rank 0's output is shown as is; the others' lines are prefixed with
# their rank. When one rank fails, the others are stopped and the script
# exits with that rank's status.
set -uo pipefail

if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N PROGRAM [ARGS...]   (N >= 1 ranks on this host)" >&2
  exit 2
fi
world=$1
shift
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-29500}
export WORLD_SIZE=$world

pids=()
# A signal is passed on to every rank; the script then exits as they do (a
# loraplex-server whose rank 0 shuts down cleanly exits 0).
forward() {
  for pid in "${pids[@]}"; do kill -s "$1" "$pid" 2>/dev/null; done
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward TERM' HUP  # A hang-up stops the run cleanly too.

for ((rank = 0; rank < world; rank++)); do
  if ((rank == 0)); then
    RANK=0 LOCAL_RANK=0 "$@" &
  else
    RANK=$rank LOCAL_RANK=$rank "$@" > >(sed -u "s/^/[rank $rank] /") 2>&1 &
  fi
  pids+=($!)
done

# The first rank to fail decides the status; the others are stopped then:
# SIGTERM, and SIGKILL for any still running after
# LAUNCH_LOCAL_GRACE_SECONDS (default 30; e.g. ranks still waiting for a
# rank 0 that is gone).
grace=${LAUNCH_LOCAL_GRACE_SECONDS:-30}
killer=
status=0
left=$world
while ((left > 0)); do
  done_pid=
  wait -n -p done_pid "${pids[@]}"
  code=$?
  [[ -z ${done_pid:-} ]] && continue  # A signal interrupted the wait.
  ((left--))
  running=()
  for pid in "${pids[@]}"; do
    [[ $pid != "$done_pid" ]] && running+=("$pid")
  done
  pids=("${running[@]}")
  if ((code != 0 && status == 0)); then
    status=$code
    echo "launch_local: a rank (pid $done_pid) exited with status $code;" \
      "stopping the others" >&2
    forward TERM
    (
      sleep "$grace"
      for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    ) >/dev/null 2>&1 &
    killer=$!
  fi
done
[[ -n $killer ]] && kill "$killer" 2>/dev/null
wait  # The output prefixers, so no line comes after the launcher exits.
exit $status
