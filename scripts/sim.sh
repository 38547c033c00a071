#!/usr/bin/env bash
# Deterministic simulation runs (crates/sim, docs/simulation.md): short
# seeded plans of a three-node cluster on a simulated network and disk,
# each judged by the chaos harness's checkers.
#
#   scripts/sim.sh                    the default sweep (1,000 seeds from 0)
#   scripts/sim.sh --seeds N [--first S]
#                                     N seeds starting at S (default 0),
#                                     on up to two threads
#   scripts/sim.sh --seed S           replay seed S alone
#   ... --bug NAME                    plant a known bug class in every seed
#                                     (ack-without-token-check,
#                                     follower-stamps-time, flush-before-sync,
#                                     sweep-ignores-bound)
#                                     and watch the sweep find it
#
# A failing seed prints the command that replays it and keeps its plan,
# history (history.txt, history.jsonl for the checkers) and failures under
# target/tmp/sim-failures/seed-S/. Exits non-zero when any seed failed.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: scripts/sim.sh [--seeds N [--first S] | --seed S] [--bug NAME]" >&2
  exit 2
}

is_number() {
  [[ "${1:-}" =~ ^[0-9]+$ ]]
}

while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) is_number "${2:-}" || usage; export LEASEHOLD_SIM_SEEDS="$2"; shift 2 ;;
    --first) is_number "${2:-}" || usage; export LEASEHOLD_SIM_FIRST_SEED="$2"; shift 2 ;;
    --seed) is_number "${2:-}" || usage; export LEASEHOLD_SIM_SEED="$2"; shift 2 ;;
    --bug) [ -n "${2:-}" ] || usage; export LEASEHOLD_SIM_BUG="$2"; shift 2 ;;
    *) usage ;;
  esac
done

exec cargo test -p leasehold-sim --test sim sweep -- --nocapture
