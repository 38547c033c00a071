#!/usr/bin/env bash
# Chaos runs against real leasehold nodes: faults injected into processes,
# links, clocks and disks; every client operation recorded; one checker per
# guarantee of SPEC §7. See docs/reliability.md.
#
#   scripts/chaos.sh quick [FLAGS]      about 6 minutes after the build; also replays cluster-tests/regressions/
#   scripts/chaos.sh soak [FLAGS]       60 minutes: 55 of faults (--soak-minutes M for a shorter one)
#   scripts/chaos.sh replay PLAN.json   one saved plan again
#   scripts/chaos.sh check RUN_DIR      re-check a finished run's history
#
# FLAGS go to `leasehold-chaos run`: --mode safety-liveness|safety-only,
# --seed N, --bin PATH, --runs-dir DIR, --ip-base N, --plaintext (no TLS or
# tokens; by default nodes and clients use mutual TLS and role tokens from
# `leasehold dev-certs`), --only KIND,... (keep only those fault rounds of
# the seed's plan: a focused run). The last line printed is "N passed, N
# failed" over the checkers; the exit status is 0 only if none failed. Runs
# land in target/chaos/<profile>-<seed>-<time>/.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
}

what=${1:-}
[ $# -gt 0 ] && shift
case "$what" in
  quick | soak | replay | check) ;;
  *) usage; exit 2 ;;
esac

# Debug builds: one profile for everything, and usually already built.
# The whole workspace with every target resolves dependency features as
# `cargo test --workspace` does, so after the tests nothing compiles again
# (building just the two packages would rebuild tonic, openraft and the
# rest with other features: two minutes on two cores).
cargo build --workspace --all-targets >&2
target_dir=${CARGO_TARGET_DIR:-target}
chaos=$target_dir/debug/leasehold-chaos

case "$what" in
  quick) exec "$chaos" run --profile quick --regressions --bin "$target_dir/debug/leasehold" "$@" ;;
  soak) exec "$chaos" run --profile soak --bin "$target_dir/debug/leasehold" "$@" ;;
  replay)
    [ $# -ge 1 ] || { usage; exit 2; }
    plan=$1; shift
    exec "$chaos" run --replay "$plan" "$@"
    ;;
  check)
    [ $# -ge 1 ] || { usage; exit 2; }
    exec "$chaos" check "$@"
    ;;
esac
