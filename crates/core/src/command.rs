//! The journal's command set. Every change to scheduler state is one of these,
//! wrapped in a [`Proposal`] that carries the proposer's clock.

use serde::{Deserialize, Serialize};

use crate::job::JobSpec;

/// One Raft log payload: a command plus the proposer's wall-clock time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Proposer's wall clock, Unix milliseconds. Cluster time becomes
    /// `max(cluster time, now_ms)` before the command takes effect.
    pub now_ms: u64,
    /// What to do.
    pub command: Command,
}

/// Which dead jobs a redrive returns to ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RedriveTarget {
    /// Every dead job of the queue.
    Queue(String),
    /// These jobs, where dead (others are left alone and not counted).
    Ids(Vec<u64>),
}

/// A journal command (SPEC §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Validate, dedup by idempotency key, insert ready.
    Enqueue {
        /// The jobs, in order; ids are assigned in this order.
        jobs: Vec<JobSpec>,
    },
    /// Grant up to `max` ready, due, matching jobs a lease each.
    Claim {
        /// Worker id of the claimant.
        worker: String,
        /// Queue to claim from.
        queue: String,
        /// Most leases to grant (1 ..= max_batch).
        max: u32,
        /// Lease length; `None` = each job's own `lease_ttl_ms`.
        lease_ttl_ms: Option<u64>,
        /// The worker's tags: a job is claimable when all its tags are here.
        selector: Vec<String>,
    },
    /// Extend each lease whose token is exactly the current one.
    Refresh {
        /// Worker id of the holder.
        worker: String,
        /// `(job_id, token)` pairs.
        leases: Vec<(u64, u64)>,
        /// New lease length from now; `None` = each job's own `lease_ttl_ms`.
        lease_ttl_ms: Option<u64>,
    },
    /// Finish a job; only the current token is accepted.
    Ack {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
    },
    /// Fail an attempt: attempts+1, back to ready after backoff, or dead.
    Nack {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
        /// What went wrong (truncated to `max_error_bytes`).
        error: String,
        /// Overrides the backoff delay when set.
        retry_after_ms: Option<u64>,
    },
    /// Return a job to ready now, no attempt charged (drain).
    Release {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
    },
    /// Every lease with `expires_at_ms <= cluster time` returns to ready
    /// (attempts+1) or dead. Idempotent.
    Sweep,
    /// Dead jobs back to ready with attempts reset.
    Redrive {
        /// Which jobs.
        target: RedriveTarget,
    },
    /// Drop acked tombstones older than retention.
    Purge,
}
