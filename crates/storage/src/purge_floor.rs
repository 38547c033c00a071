//! What the log store must know of snapshots before it purges.
//!
//! openraft 0.9, installing a snapshot a leader sent, hands the install to
//! the state machine's worker and then purges the log the snapshot covers
//! at once, without waiting for the install. Writing a large snapshot to
//! disk takes seconds, the purge milliseconds: a crash in between would
//! leave a node with its log purged up to a snapshot it never persisted,
//! and it could not start again. So while a received snapshot is on its way
//! to disk, a purge goes no further than the snapshot already persisted;
//! the rest is purged by the next purge after it (openraft purges after
//! every snapshot), so only the purge is late, never a log entry lost.

use std::sync::{Arc, Mutex, PoisonError};

use leasehold_raft::NodeId;
use openraft::LogId;

/// Shared by a node's two stores.
#[derive(Clone, Debug, Default)]
pub(crate) struct PurgeFloor {
    inner: Arc<Mutex<Floor>>,
}

#[derive(Debug, Default)]
struct Floor {
    /// The last log id the persisted snapshot covers.
    persisted: Option<LogId<NodeId>>,
    /// Received snapshots begun and not yet through their install.
    receiving: usize,
}

impl PurgeFloor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Floor> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the snapshot now on stable storage.
    pub(crate) fn persisted(&self, last_log_id: Option<LogId<NodeId>>) {
        self.lock().persisted = last_log_id;
    }

    /// Counts a received snapshot from its first chunk: openraft purges
    /// the log it covers as soon as it hands the install over.
    pub(crate) fn begin_receiving(&self) {
        self.lock().receiving += 1;
    }

    /// A received snapshot's install ended, whichever way. A receive that
    /// is never installed (the sender gave up) leaves the count up, which
    /// only keeps purges to the snapshot on disk, as openraft asks for
    /// them anyway outside an install.
    pub(crate) fn end_receiving(&self) {
        let mut floor = self.lock();
        floor.receiving = floor.receiving.saturating_sub(1);
    }

    /// How far a purge asked up to `upto` may go now: all the way, or no
    /// further than the persisted snapshot while a received one is still
    /// being installed (`None`: not at all).
    pub(crate) fn purge_target(&self, upto: LogId<NodeId>) -> Option<LogId<NodeId>> {
        let floor = self.lock();
        if floor.receiving == 0 {
            return Some(upto);
        }
        match floor.persisted {
            Some(persisted) if persisted.index >= upto.index => Some(upto),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    #[test]
    fn a_purge_waits_for_a_received_snapshot_only_past_the_persisted_one() {
        let floor = PurgeFloor::default();
        assert_eq!(floor.purge_target(log_id(9)), Some(log_id(9)), "nothing received");
        floor.begin_receiving();
        assert_eq!(floor.purge_target(log_id(9)), None, "no snapshot on disk yet");
        floor.persisted(Some(log_id(5)));
        assert_eq!(floor.purge_target(log_id(9)), Some(log_id(5)), "up to the one on disk");
        assert_eq!(floor.purge_target(log_id(4)), Some(log_id(4)), "covered already");
        floor.persisted(Some(log_id(9)));
        assert_eq!(floor.purge_target(log_id(9)), Some(log_id(9)));
        floor.persisted(Some(log_id(5)));
        floor.end_receiving();
        assert_eq!(floor.purge_target(log_id(9)), Some(log_id(9)), "install over");
    }
}
