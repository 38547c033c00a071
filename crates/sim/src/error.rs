//! The simulated disk's errors.

/// Why a simulated disk operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimDiskError {
    /// The handle belongs to a life of the node that ended in a crash or a
    /// restart; the process it stood for is gone.
    #[error("simulated disk handle of life {handle} used after the disk moved on to life {disk}")]
    Stale {
        /// The life the handle was opened in.
        handle: u64,
        /// The disk's current life.
        disk: u64,
    },
    /// A value could not be encoded or decoded.
    #[error("{what}: {source}")]
    Codec {
        /// What was being encoded or decoded.
        what: &'static str,
        /// The codec's error.
        #[source]
        source: bincode::Error,
    },
    /// A snapshot's body does not describe the log position its meta names.
    #[error("snapshot {snapshot_id}: {detail}")]
    Inconsistent {
        /// The snapshot.
        snapshot_id: String,
        /// What disagrees.
        detail: String,
    },
    /// Entries were applied at or below the last applied index.
    #[error("apply out of order: entry {index} after {last_applied}")]
    ApplyOutOfOrder {
        /// The entry's index.
        index: u64,
        /// The last applied index.
        last_applied: u64,
    },
    /// The appends' flusher task is gone (its runtime shut down).
    #[error("the log flusher stopped")]
    FlusherStopped,
}
