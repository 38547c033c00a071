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
    /// Start an election now: what an earlier build's draining leader
    /// sends (no leader or term named, so taken on the caller's word).
    Campaign,
    /// Leader `leader` of `term` must stop leading (it drains, or its clock
    /// is beyond the bound) and asks the receiver to start an election now.
    /// The receiver does so only while it still follows that leader in that
    /// term (Raft's "timeout now"), so a deposed leader that never heard of
    /// its successor cannot have a healthy leader deposed in turn. The
    /// service takes it only from `leader` itself.
    HandOver {
        /// The leader asking.
        leader: u64,
        /// Its term.
        term: u64,
    },
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
