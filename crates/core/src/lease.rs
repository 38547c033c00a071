//! Leases: a worker's time-bounded, fenced hold on one job.

use serde::{Deserialize, Serialize};

/// A worker's hold on a job. The `token` is a fencing token from a
/// state-machine counter, strictly increasing across the whole cluster and
/// never reused; a worker presents it to refresh, ack, nack or release, and
/// should pass it on to whatever it writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The job held.
    pub job_id: u64,
    /// Worker id of the holder.
    pub holder: String,
    /// Fencing token.
    pub token: u64,
    /// Raft term of the leader that committed the claim.
    pub epoch: u64,
    /// Cluster time of the grant (or last refresh).
    pub granted_at_ms: u64,
    /// Cluster time at which the lease lapses.
    pub expires_at_ms: u64,
}
