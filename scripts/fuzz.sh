#!/usr/bin/env bash
# Coverage-guided fuzzing with AFL++ (through cargo-afl, on the stable
# toolchain). The targets live in fuzz/ (package leasehold-fuzz); see
# docs/fuzzing.md for what each checks and how findings become regression
# inputs.
#
#   scripts/fuzz.sh --list            the targets, one per line
#   scripts/fuzz.sh TARGET SECONDS    fuzz TARGET for SECONDS, starting from
#                                     the committed seeds in fuzz/corpus/TARGET/
#   scripts/fuzz.sh --replay          replay every corpus input (no fuzzer needed)
#
# A run builds what it needs (instrumented, with overflow checks on), prints
# a summary (execs, corpus paths, coverage, findings) and exits non-zero,
# naming each input's path, when it found a crash or a hang.
# Environment: LEASEHOLD_FUZZ_TIMEOUT_MS (per-input hang limit, default 1000),
# LEASEHOLD_FUZZ_OUT (output directory, default target/afl/TARGET).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

usage() {
  echo "usage: scripts/fuzz.sh --list | --replay | TARGET SECONDS" >&2
  exit 2
}

list() {
  for path in fuzz_targets/*.rs; do
    basename "$path" .rs
  done
}

case "${1:-}" in
  --list) list; exit 0 ;;
  --replay) exec cargo test --locked -p leasehold-fuzz ;;
  ""|-*) usage ;;
esac
[ $# -eq 2 ] || usage
target=$1
seconds=$2
grep -qx "$target" <<<"$(list)" || { echo "unknown target: $target (see --list)" >&2; exit 2; }
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "SECONDS must be a positive integer" >&2; exit 2; }
if ! cargo afl --version >/dev/null 2>&1; then
  echo "cargo-afl is missing: cargo install cargo-afl --locked (builds AFL++ from its bundled source)" >&2
  exit 2
fi

cargo afl build --locked --quiet --profile fuzz -p leasehold-fuzz --features afl --bin "$target"

out=${LEASEHOLD_FUZZ_OUT:-../target/afl/$target}
rm -rf "$out"
mkdir -p "$(dirname "$out")"
# No UI (logs instead), no CPU binding (the machine is shared), and no
# complaint about a core_pattern that pipes crashes elsewhere: the harness
# panics, which AFL++ sees as a crash whatever the kernel does with it.
export AFL_NO_UI=1 AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
cargo afl fuzz -V "$seconds" -t "${LEASEHOLD_FUZZ_TIMEOUT_MS:-1000}" \
  -i "corpus/$target" -o "$out" -- "../target/fuzz/$target" >"$out.log" 2>&1 || {
  tail -n 40 "$out.log" >&2
  echo "afl-fuzz failed; its log: $out.log (from fuzz/)" >&2
  exit 1
}

stats="$out/default/fuzzer_stats"
stat() { awk -F' *: *' -v key="$1" '$1 == key { print $2 }' "$stats"; }
printf '%s: %s s, %s execs (%s/s), %s corpus paths, %s of the map covered, %s crashes, %s hangs\n' \
  "$target" "$(stat run_time)" "$(stat execs_done)" "$(stat execs_per_sec)" \
  "$(stat corpus_count)" "$(stat bitmap_cvg)" "$(stat saved_crashes)" "$(stat saved_hangs)"

findings=$(find "$out/default/crashes" "$out/default/hangs" -type f -name 'id:*' 2>/dev/null | sort)
if [ -n "$findings" ]; then
  echo "findings (replay one with: target/fuzz/$target < FILE):" >&2
  sed 's|^\.\./||; s|^|  |' <<<"$findings" >&2
  exit 1
fi
