//! Fuzz targets for leasehold: each is a function from arbitrary bytes to
//! "no panic, every invariant holds", so the same code runs under AFL++
//! (`fuzz_targets/`, built by `scripts/fuzz.sh`) and in a plain
//! `cargo test` that replays the committed corpus (`tests/replay.rs`).
//!
//! | target | input | what it checks |
//! | --- | --- | --- |
//! | [`apply`] | a command sequence built with `arbitrary` | `State::apply` never panics; the structural invariants, fencing, one live lease per job, acked jobs never reclaimed, fire marks, cluster time, replicas and snapshots agreeing |
//! | [`cron`] | a cron expression, a timezone and instants | parsing never panics and agrees with validation; ticks are whole seconds, ascending, inside their range and agree with `next_after`; tick plans never go back |
//! | [`envelope`] | a message kind and envelope bytes | decoding every Raft message and forwarded payload never panics, a decoded message re-encodes to itself, and every proposal it carries applies cleanly |
//! | [`proto`] | a request kind and protobuf bytes | decoding every public request never panics and round-trips; the wire → core conversion, validation and `apply` agree |
//!
//! A check panics (through `assert!`) on a violation: that is how the
//! fuzzer sees a finding. Input that does not decode is not a finding; it
//! is simply skipped.

pub mod apply;
pub mod cron;
pub mod envelope;
pub mod pick;
pub mod proto;
pub mod seeds;

/// A fuzz target: its name (the directory under `corpus/`) and its check.
#[derive(Clone, Copy)]
pub struct Target {
    /// The name `scripts/fuzz.sh` and the corpus directory use.
    pub name: &'static str,
    /// Panics when the input breaks an invariant.
    pub check: fn(&[u8]),
}

/// Every target, in the order `scripts/fuzz.sh --list` prints them.
pub const TARGETS: [Target; 4] = [
    Target { name: "apply", check: apply::check },
    Target { name: "cron", check: cron::check },
    Target { name: "envelope", check: envelope::check },
    Target { name: "proto", check: proto::check },
];

/// The target with this name.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.into_iter().find(|target| target.name == name)
}
