#!/usr/bin/env bash
# Starts a three-node leasehold cluster on this machine: gRPC 7070-7072,
# HTTP 7080-7082, data under ./dev-cluster (kept between runs). Node 1
# bootstraps; nodes 2 and 3 join it. Ctrl-C stops all three.
#
#   --fresh    wipe ./dev-cluster first
#   --secure   mutual TLS and tokens: `leasehold dev-certs dev-cluster/certs`
#              writes a throwaway CA, node and client certificates and a
#              token per role, and every node runs with them
#   --debug    use the debug build (quicker to build; what the tests use)
#   --no-wait  start the nodes, print how to use them and exit, leaving them
#              running (their pids are in dev-cluster/pids)
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0 secure=0 profile=release wait_for_nodes=1
for arg in "$@"; do
  case "$arg" in
    --fresh) fresh=1 ;;
    --secure) secure=1 ;;
    --debug) profile=debug ;;
    --no-wait) wait_for_nodes=0 ;;
    *) echo "usage: $0 [--fresh] [--secure] [--debug] [--no-wait]" >&2; exit 2 ;;
  esac
done

if [ $profile = release ]; then
  cargo build --release -p leasehold-cli
else
  cargo build -p leasehold-cli
fi
bin=target/$profile/leasehold
root=dev-cluster
[ $fresh = 1 ] && rm -rf "$root"
mkdir -p "$root"

# One cluster secret for all three nodes (adverts, bus claims and, without
# TLS, each node's proof that it is one are keyed by it), made once and kept
# with the data.
secret="$root/cluster-secret"
if [ ! -s "$secret" ]; then
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret")
fi

certs="$root/certs"
scheme=http
if [ $secure = 1 ]; then
  [ -s "$certs/ca.pem" ] || "$bin" dev-certs "$certs" --nodes 3 >/dev/null
  scheme=https
fi

pids=()
stop() {
  trap - INT TERM EXIT
  echo
  echo "stopping nodes: ${pids[*]}"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
[ $wait_for_nodes = 1 ] && trap stop INT TERM EXIT

start() {
  local id=$1; shift
  local tls=()
  if [ $secure = 1 ]; then
    tls=(--tls-ca "$certs/ca.pem" --tls-cert "$certs/node-$id.pem" --tls-key "$certs/node-$id.key"
      --tokens "$certs/tokens.toml")
  fi
  "$bin" serve --id "$id" --grpc "127.0.0.1:707$((id - 1))" --http "127.0.0.1:708$((id - 1))" \
    --data "$root/node$id" --cluster-secret-file "$secret" "${tls[@]}" "$@" \
    >"$root/node$id.log" 2>&1 &
  pids+=($!)
}

start 1
# Node 1 must be serving before the others ask it to add them.
for _ in $(seq 1 100); do
  curl -sf 127.0.0.1:7080/livez >/dev/null 2>&1 && break
  sleep 0.2
done
start 2 --join 127.0.0.1:7070
start 3 --join 127.0.0.1:7070
echo "${pids[*]}" >"$root/pids"

addrs="$scheme://127.0.0.1:7070,$scheme://127.0.0.1:7071,$scheme://127.0.0.1:7072"
cat <<TXT
three nodes starting (logs in $root/node*.log):
  node 1  grpc $scheme://127.0.0.1:7070  http 127.0.0.1:7080
  node 2  grpc $scheme://127.0.0.1:7071  http 127.0.0.1:7081
  node 3  grpc $scheme://127.0.0.1:7072  http 127.0.0.1:7082

try:
  export LEASEHOLD_ADDR=$addrs
TXT
if [ $secure = 1 ]; then
  cat <<TXT
  export LEASEHOLD_TLS_CA=$certs/ca.pem LEASEHOLD_TLS_CERT=$certs/client.pem LEASEHOLD_TLS_KEY=$certs/client.key
  export LEASEHOLD_TOKEN=\$(cat $certs/token-admin)   # or token-producer, -worker, -reader
TXT
fi
cat <<TXT
  $bin cluster status
  $bin job enqueue --queue demo --payload hi
  $bin job claim --queue demo
TXT
if [ $wait_for_nodes = 0 ]; then
  echo "the nodes keep running; stop them with: kill \$(cat $root/pids)"
  exit 0
fi
echo "Ctrl-C stops the cluster."
wait
