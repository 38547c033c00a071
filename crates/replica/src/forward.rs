//! Leader forwarding: a follower that receives a write (or a linearizable
//! read) sends it to the leader over the internal `Raft.Forward` call, so
//! clients may talk to any node.

use leasehold_core::{Proposal, Response};
use serde::{Deserialize, Serialize};

/// What a follower asks of the leader.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardRequest {
    /// Commit this proposal and answer its response.
    Write(Box<Proposal>),
    /// Confirm leadership with a quorum and answer the index a read must wait for.
    ReadIndex,
    /// The leader is draining and asks the receiver to start an election
    /// now (leadership handover).
    Campaign,
}

/// The leader's answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardResponse {
    /// The applied response of a forwarded write.
    Written(Response),
    /// Reads are linearizable once the asker has applied up to this index.
    ReadIndex(u64),
    /// The receiver started an election.
    Campaigning,
    /// The receiver could not serve it; `retryable` maps to UNAVAILABLE.
    Failed {
        /// Whether the caller may retry (no quorum, leadership moved).
        retryable: bool,
        /// What went wrong.
        message: String,
    },
}
