//! Jobs: what a producer enqueues ([`JobSpec`]) and what the journal keeps
//! ([`Job`]).

use serde::{Deserialize, Serialize};

use crate::lease::Lease;

/// Where a job is in its life: `Ready → Claimed → Acked`, `Claimed → Ready`
/// (nack with retry, lease expiry, release), and `→ Dead` once attempts reach
/// `max_attempts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting to be claimed (possibly not yet due: see `not_before_ms`).
    Ready,
    /// Held by one worker under a lease.
    Claimed,
    /// Done; kept as a tombstone until retention passes.
    Acked,
    /// Failed `max_attempts` times; waits for a redrive.
    Dead,
}

impl JobState {
    /// Lower-case name used on the wire and in the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Claimed => "claimed",
            JobState::Acked => "acked",
            JobState::Dead => "dead",
        }
    }
}

/// Exponential retry delay, jitter-free so `apply` stays deterministic:
/// the n-th failed attempt (1-based) waits `min(cap_ms, base_ms * 2^(n-1))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base_ms: u64,
    /// Upper bound of any delay.
    pub cap_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base_ms: 1_000, cap_ms: 300_000 }
    }
}

impl Backoff {
    /// Delay before the retry that follows failed attempt number `attempt`
    /// (1-based): `min(cap_ms, base_ms * 2^(attempt-1))`, saturating, so a
    /// job with a thousand attempts waits `cap_ms` rather than overflowing.
    /// Attempt 0 is treated as attempt 1.
    pub fn delay_ms(&self, attempt: u32) -> u64 {
        let doublings = attempt.saturating_sub(1);
        // 2^64 and beyond saturate: shifting by 64 or more is not defined.
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        self.base_ms.saturating_mul(factor).min(self.cap_ms)
    }
}

/// What a producer asks to enqueue. Optional fields take the defaults of
/// [`crate::Limits`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Queue name: `[a-z0-9][a-z0-9._-]{0,63}`.
    pub queue: String,
    /// Opaque bytes handed to the worker.
    pub payload: Vec<u8>,
    /// Higher is claimed first.
    pub priority: i32,
    /// Cluster time before which the job is not claimable; `None` = now.
    pub not_before_ms: Option<u64>,
    /// Attempts before the job is dead; `None` = default (5).
    pub max_attempts: Option<u32>,
    /// Retry delay; `None` = default.
    pub backoff: Option<Backoff>,
    /// Lease length for claims that do not name one; `None` = default (30 s).
    pub lease_ttl_ms: Option<u64>,
    /// Dedup key within the queue.
    pub idempotency_key: Option<String>,
    /// Only workers whose selector includes every tag may claim the job.
    pub tags: Vec<String>,
}

/// A job as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Assigned by the state machine, strictly increasing.
    pub id: u64,
    /// Queue name.
    pub queue: String,
    /// Opaque bytes handed to the worker.
    pub payload: Vec<u8>,
    /// Higher is claimed first.
    pub priority: i32,
    /// Cluster time before which the job is not claimable.
    pub not_before_ms: u64,
    /// Attempts before the job is dead.
    pub max_attempts: u32,
    /// Retry delay.
    pub backoff: Backoff,
    /// Default lease length for this job.
    pub lease_ttl_ms: u64,
    /// Dedup key within the queue.
    pub idempotency_key: Option<String>,
    /// Tags a worker's selector must include (sorted, deduplicated).
    pub tags: Vec<String>,
    /// Failed attempts so far (nacks and lease expiries).
    pub attempts: u32,
    /// Error text of the last failed attempt.
    pub last_error: Option<String>,
    /// Where the job is in its life.
    pub state: JobState,
    /// The current lease while `Claimed`; kept after expiry until swept or
    /// re-granted, so an ack with that token still counts.
    pub lease: Option<Lease>,
    /// Cluster time of the enqueue.
    pub enqueued_at_ms: u64,
    /// Cluster time the job became acked or dead.
    pub finished_at_ms: Option<u64>,
    /// What the ack that finished the job reported (a command's output).
    pub result: Option<Vec<u8>>,
}
