//! What the journal can fail with. Callers branch on [`Unavailable`]'s
//! variants (retry elsewhere, wait, give up); the edge maps all of them to
//! UNAVAILABLE, and [`JournalError::Internal`] and
//! [`JournalError::PeerRefused`] to INTERNAL. Refusals are not
//! errors: they come back as `Response::Refused` values.

/// Why a write or a read cannot be served now; retryable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// A write or a read barrier did not reach a quorum in time.
    #[error("no quorum: not committed within {timeout_ms} ms")]
    NoQuorum {
        /// The quorum timeout waited.
        timeout_ms: u64,
    },
    /// openraft reports the quorum lost (a leader that cannot reach one).
    #[error("no quorum: {0}")]
    QuorumLost(String),
    /// No leader is known yet (an election is running).
    #[error("no leader is known yet")]
    NoLeader,
    /// This node stopped leading while serving a forwarded write, or
    /// leadership is moving.
    #[error("leadership is changing")]
    LeadershipChanging,
    /// This node drains and takes no new claims.
    #[error("draining: this node takes no new claims")]
    Draining,
    /// The node is stopping.
    #[error("the journal is shutting down")]
    ShuttingDown,
    /// The Raft core stopped on a fatal error.
    #[error("raft stopped: {0}")]
    RaftStopped(String),
    /// This node has not applied what a read must see within the timeout.
    #[error("this node has not applied index {index} within {timeout_ms} ms")]
    NotApplied {
        /// The index the read waits for.
        index: u64,
        /// How long it waited.
        timeout_ms: u64,
    },
    /// The leader (or another peer) could not be reached, or answered that
    /// it cannot serve; the message says which and why.
    #[error("{0}")]
    Peer(String),
    /// This node's clock is not agreed by a majority of the voters, so it
    /// may not stamp time (lead) or campaign now.
    #[error("clock: {0}")]
    ClockUnverified(String),
    /// A membership change cannot proceed now.
    #[error("membership change: {0}")]
    Membership(String),
}

/// A journal call's failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Retryable; see [`Unavailable`].
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A bug or a storage failure.
    #[error("internal error: {0}")]
    Internal(String),
    /// A peer refused a forwarded request as invalid: a bug here, or a
    /// peer of an earlier build that does not know the request.
    #[error("refused by a peer: {0}")]
    PeerRefused(String),
}
