#!/usr/bin/env bash
# deploy/launch_local.sh running loraplex-server on two ranks of this host:
# `loraplex quickstart` trains and exports its three adapters through it,
# and SIGTERM to the launcher stops both ranks cleanly (status 0).
#
#   launch_local_server_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1
bin=$2
dir=$(mktemp -d)
launcher=
cleanup() {
  [[ -n $launcher ]] && kill -KILL "$launcher" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  cat "$dir/log" >&2
  exit 1
}

# Below the kernel's ephemeral range (32768 and up), so no outgoing
# connection holds it.
export MASTER_PORT=$((20000 + RANDOM % 12000))
export LORAPLEX_DIST_TIMEOUT_SECONDS=60
"$src/deploy/launch_local.sh" 2 "$bin/loraplex-server" --threads 1 \
  --state-dir "$dir/state" --listen 127.0.0.1:0 --ready-file "$dir/ready" \
  >"$dir/log" 2>&1 &
launcher=$!
for _ in $(seq 600); do
  [[ -s $dir/ready ]] && break
  kill -0 "$launcher" 2>/dev/null || fail "the launcher exited early"
  sleep 0.1
done
[[ -s $dir/ready ]] || fail "no rank 0 serving after 60 s"
address=$(cat "$dir/ready")

"$bin/loraplex" --server "$address" quickstart --dir "$dir/quickstart" \
  --steps 20 || fail "quickstart failed"
count=$(find "$dir/quickstart" -name adapter_model.safetensors | wc -l)
((count == 3)) || fail "quickstart exported $count adapters, not 3"

kill -TERM "$launcher"
status=0
wait "$launcher" || status=$?
launcher=
((status == 0)) || fail "the launcher exited with status $status"
grep -q "data parallel over 2 ranks" "$dir/log" || fail "rank 0 not parallel"
# Rank 1's lines reach the log through its prefixer (a sed the launcher's
# final wait need not wait for): look again for up to 5 s.
stopped=0
for _ in $(seq 50); do
  if grep -q "^\[rank 1\] .*rank 1: rank 0 stopped; stopped" "$dir/log"; then
    stopped=1
    break
  fi
  sleep 0.1
done
((stopped == 1)) || fail "rank 1 did not stop with rank 0"
echo "PASS: two ranks served quickstart and stopped cleanly"
