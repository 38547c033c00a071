#!/usr/bin/env bash
# The read-only gate: formatting, lints, tests (the fuzz targets' corpus
# replay among them), docs, core purity, and the chaos harness's quick
# profile; a short fuzzing run of each target when LEASEHOLD_FUZZ_SECONDS
# is set.
# This is the README's test command and what CI runs. It changes no file.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "core purity: leasehold-core depends on no IO crate and reads no clock, file, thread or randomness"
impure=$(cargo tree -q -p leasehold-core -e normal --prefix none \
  | awk '{print $1}' | grep -xE 'tokio|sled|tonic|openraft|prost|tracing|rand|getrandom' | sort -u || true)
if [ -n "$impure" ]; then
  echo "leasehold-core must stay pure, but depends on: $impure" >&2
  exit 1
fi
# cargo tree cannot see std: a clock, a file, a thread, the environment or
# randomness would pass it. crates/core/clippy.toml makes clippy refuse the
# same calls and types; this grep also catches them in code clippy would
# not reach (a cfg that is off, a macro).
core_hits=$(grep -rnE 'SystemTime|Instant::|std::fs|std::thread|thread::spawn|thread_rng|rand::|getrandom|std::env::|std::net::|std::process::|tokio::' \
  crates/core/src crates/core/tests || true)
if [ -n "$core_hits" ]; then
  echo "leasehold-core must stay pure (time and input enter as data), but:" >&2
  echo "$core_hits" >&2
  exit 1
fi
echo "ok"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "the other build, for the mixed-version test"
# The replay tool with another build's compiled-in limits (leasehold-core's
# `older-build` feature), kept apart from the normal build of it. Only the
# core, storage and replay crates compile again for it.
cargo build -p leasehold-replay --features older-build --locked
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir/older-build"
cp "$target_dir/debug/leasehold-replay" "$target_dir/older-build/leasehold-replay"
export LEASEHOLD_REQUIRE_OLDER_BUILD=1

step "cargo test"
# A failing story's message scrolls far above the end of a long run; it
# is repeated last, where a log's tail shows it.
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
if ! cargo test --workspace --locked 2>&1 | tee "$test_log"; then
  echo "what failed (repeated from above):" >&2
  grep -E ': FAILED: |panicked at|^Error: ' "$test_log" | tail -n 8 >&2 || true
  exit 1
fi

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "fuzz targets: a short coverage-guided run of each (AFL++), when asked"
# The corpus replay ran with cargo test above. A coverage-guided run needs
# every dependency built again with AFL++'s instrumentation (7.5 minutes on
# two cores, measured), which does not fit CI's budget beside the rest; it
# runs when LEASEHOLD_FUZZ_SECONDS is set (see docs/fuzzing.md).
fuzz_seconds=${LEASEHOLD_FUZZ_SECONDS:-0}
if [ "$fuzz_seconds" = 0 ]; then
  echo "skipped (set LEASEHOLD_FUZZ_SECONDS=20 to run each target that long)"
elif cargo afl --version >/dev/null 2>&1; then
  for target in $(scripts/fuzz.sh --list); do
    scripts/fuzz.sh "$target" "$fuzz_seconds"
  done
else
  echo "cargo-afl is missing: cargo install cargo-afl --locked (and Debian's afl++ for its C toolchain)" >&2
  exit 1
fi

step "chaos harness, quick profile (real nodes, injected faults, every checker)"
scripts/chaos.sh quick
