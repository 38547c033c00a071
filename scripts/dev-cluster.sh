#!/usr/bin/env bash
# Starts a three-node leasehold cluster on this machine: gRPC 7070-7072,
# HTTP 7080-7082, data under ./dev-cluster (kept between runs; pass --fresh to
# wipe it). Node 1 bootstraps; nodes 2 and 3 join it. Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
[ "${1:-}" = "--fresh" ] && fresh=1

cargo build --release -p leasehold-cli
bin=target/release/leasehold
root=dev-cluster
[ $fresh = 1 ] && rm -rf "$root"
mkdir -p "$root"

# One cluster secret for all three nodes (adverts and bus claims are signed
# with it), made once and kept with the data.
secret="$root/cluster-secret"
if [ ! -s "$secret" ]; then
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret")
fi

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping nodes: ${pids[*]}"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop INT TERM EXIT

start() {
  local id=$1; shift
  "$bin" serve --id "$id" --grpc "127.0.0.1:707$((id - 1))" --http "127.0.0.1:708$((id - 1))" \
    --data "$root/node$id" --cluster-secret-file "$secret" "$@" >"$root/node$id.log" 2>&1 &
  pids+=($!)
}

start 1
# Node 1 must be serving before the others ask it to add them.
for _ in $(seq 1 50); do
  curl -sf 127.0.0.1:7080/livez >/dev/null 2>&1 && break
  sleep 0.2
done
start 2 --join 127.0.0.1:7070
start 3 --join 127.0.0.1:7070

cat <<TXT
three nodes starting (logs in $root/node*.log):
  node 1  grpc 127.0.0.1:7070  http 127.0.0.1:7080
  node 2  grpc 127.0.0.1:7071  http 127.0.0.1:7081
  node 3  grpc 127.0.0.1:7072  http 127.0.0.1:7082

try:
  export LEASEHOLD_ADDR=http://127.0.0.1:7070,http://127.0.0.1:7071,http://127.0.0.1:7072
  $bin cluster status
  $bin job enqueue --queue demo --payload hi
  $bin job claim --queue demo

Ctrl-C stops the cluster.
TXT
wait
