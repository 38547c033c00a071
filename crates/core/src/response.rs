//! What [`crate::State::apply`] answers. Refusals are values, not errors.

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobState};
use crate::lease::Lease;
use crate::schedule::TickOutcome;
use crate::validate::ValidationError;

/// Result of one enqueued spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnqueueOutcome {
    /// The job's id (the first job's id when deduplicated).
    pub job_id: u64,
    /// True when the idempotency key matched an existing job or tombstone.
    pub duplicate: bool,
}

/// One lease granted by a claim, with the job it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The job as of the grant (state `Claimed`).
    pub job: Job,
    /// The new lease.
    pub lease: Lease,
}

/// Why a command did nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The token is not the job's current one (superseded, or the job is no
    /// longer claimed by it).
    StaleToken {
        /// The job.
        job_id: u64,
        /// The token presented.
        presented: u64,
    },
    /// No such job (never existed, or purged).
    NotFound {
        /// The job.
        job_id: u64,
    },
    /// The command failed validation; nothing changed.
    Invalid(ValidationError),
    /// No such schedule.
    ScheduleNotFound {
        /// The name asked for.
        name: String,
    },
}

/// Counts per queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Ready and due now.
    pub ready: u64,
    /// Ready but `not_before_ms` in the future.
    pub delayed: u64,
    /// Claimed (in flight).
    pub claimed: u64,
    /// Acked tombstones still retained.
    pub acked: u64,
    /// Dead.
    pub dead: u64,
}

/// The answer to one applied proposal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to Raft-internal entries (blank, membership) that carry no command.
    Empty,
    /// One outcome per enqueued spec, in order.
    Enqueued(Vec<EnqueueOutcome>),
    /// The leases granted (possibly none).
    Claimed(Vec<Grant>),
    /// Leases renewed, and jobs whose lease the worker no longer holds.
    Refreshed {
        /// The renewed leases.
        renewed: Vec<Lease>,
        /// Job ids whose presented token was not current (or unknown job).
        lost: Vec<u64>,
    },
    /// The job is acked.
    Acked,
    /// The attempt failed; the job is now `Ready` (at `not_before_ms`) or `Dead`.
    Nacked {
        /// `Ready` or `Dead`.
        state: JobState,
        /// When it is claimable again (for `Ready`; 0 for `Dead`).
        not_before_ms: u64,
    },
    /// The job is ready again.
    Released,
    /// Leases that lapsed: jobs returned to ready and jobs that died.
    Swept {
        /// Jobs returned to ready.
        requeued: Vec<u64>,
        /// Jobs that reached max_attempts.
        dead: Vec<u64>,
    },
    /// How many dead jobs went back to ready.
    Redriven(u64),
    /// How many tombstones were dropped.
    Purged(u64),
    /// A schedule was put, deleted, paused or resumed.
    ScheduleChanged,
    /// What a Fire, Skip or Trigger did; `None` when the bucket was already
    /// fired or skipped (nothing changed).
    Tick(Option<TickOutcome>),
    /// A node's registration or draining mark was recorded.
    NodeChanged,
    /// One response per command of a batch, in order.
    Batch(#[serde(deserialize_with = "crate::nesting::nested")] Vec<Response>),
    /// Nothing changed, for this reason.
    Refused(Refusal),
}
