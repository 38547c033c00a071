//! The Raft log and vote on the simulated disk: [`SimLogStore`] implements
//! openraft's [`RaftLogStorage`] (and is its own [`RaftLogReader`]).
//!
//! The same durability rules as the sled store:
//! - `append` writes the batch at once (readable when it returns) and hands
//!   the sync to the flusher task, which reports the entries persisted only
//!   after the sync completed — so a crash between the two loses entries
//!   openraft was never told about, and nothing it was told about;
//! - `save_vote`, `truncate` and `purge` sync before returning;
//! - `save_committed` is written but not synced (the next sync carries it).
//!
//! It is also the replica runtime's log store
//! ([`leasehold_replica::ReplicaLogStore`]), so the real journal runs on
//! it: the committed log id, and a probe that fails on a stale life and
//! otherwise syncs what was written, as the real probe has its log writer
//! sync. Its syncs are not timed (the journal's `log_sync` stage stays
//! empty).

use std::fmt::Debug;
use std::ops::RangeBounds;

use futures::future::BoxFuture;
use leasehold_raft::{NodeId, TypeConfig};
use leasehold_replica::stores::{ReplicaLogStore, StoreError, SyncObserver};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use tokio::sync::mpsc;

use crate::SimDiskError;
use crate::bugs::Bug;
use crate::disk::{SimDisk, Write};

/// Appends whose sync is pending, at most: openraft keeps few in flight,
/// and a full queue only makes `append` wait.
const FLUSH_QUEUE: usize = 256;

/// One append waiting for its sync.
struct Flush {
    sequence: u64,
    /// `None` when the append was already reported (a planted bug).
    callback: Option<LogFlushed<TypeConfig>>,
}

/// The simulated log store of one life of a node. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SimLogStore {
    disk: SimDisk,
    life: u64,
    /// To the flusher task; it ends when the last clone is dropped.
    flushes: mpsc::Sender<Flush>,
}

impl std::fmt::Debug for Flush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flush").field("sequence", &self.sequence).finish_non_exhaustive()
    }
}

fn to_io(error: SimDiskError) -> std::io::Error {
    std::io::Error::other(error)
}

impl SimLogStore {
    pub(crate) fn open(disk: SimDisk, life: u64) -> SimLogStore {
        let (flushes, mut pending) = mpsc::channel::<Flush>(FLUSH_QUEUE);
        let flusher_disk = disk.clone();
        // The flusher's owner is the channel: it runs until every clone of
        // this store is gone, then drains and ends.
        tokio::spawn(async move {
            while let Some(flush) = pending.recv().await {
                let synced = flusher_disk.sync_through(life, flush.sequence).await;
                if let Some(callback) = flush.callback {
                    callback.log_io_completed(synced.map_err(to_io));
                }
            }
        });
        SimLogStore { disk, life, flushes }
    }

    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<Entry<TypeConfig>>, SimDiskError> {
        self.disk.read(self.life, |image| image.log.range(range).map(|(_, e)| e.clone()).collect())
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, SimDiskError> {
        self.disk.read(self.life, |image| {
            let last_log_id =
                image.log.last_key_value().map(|(_, e)| e.log_id).or(image.last_purged);
            LogState { last_purged_log_id: image.last_purged, last_log_id }
        })
    }

    async fn append_entries(
        &self,
        entries: Vec<Entry<TypeConfig>>,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), SimDiskError> {
        let sequence = self.disk.write(self.life, Write::Append(entries))?;
        let callback = if self.disk.planted(Bug::FlushBeforeSync) {
            // The planted bug: persisted, says the store, before any sync.
            callback.log_io_completed(Ok(()));
            None
        } else {
            Some(callback)
        };
        self.flushes
            .send(Flush { sequence, callback })
            .await
            .map_err(|_| SimDiskError::FlusherStopped)
    }
}

impl ReplicaLogStore for SimLogStore {
    fn read_committed(&self) -> BoxFuture<'_, Result<Option<LogId<NodeId>>, StoreError>> {
        let committed = self.disk.read(self.life, |image| image.committed);
        Box::pin(async move { committed.map_err(StoreError::new) })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { self.disk.sync_all(self.life).await.map_err(StoreError::new) })
    }

    fn observe_syncs(&self, _observer: SyncObserver) {
        // Not timed: a simulated sync's duration is the configured delay.
    }
}

impl RaftLogReader<TypeConfig> for SimLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        self.read_entries(range).map_err(|error| StorageIOError::read_logs(&error).into())
    }
}

impl RaftLogStorage<TypeConfig> for SimLogStore {
    type LogReader = SimLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        self.log_state().map_err(|error| StorageIOError::read_logs(&error).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.disk
            .write_durably(self.life, Write::Vote(*vote))
            .await
            .map_err(|error| StorageIOError::write_vote(&error).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.disk
            .read(self.life, |image| image.vote)
            .map_err(|error| StorageIOError::read_vote(&error).into())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.disk
            .write(self.life, Write::Committed(committed))
            .map(|_| ())
            .map_err(|error| StorageIOError::write(&error).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        self.disk
            .read(self.life, |image| image.committed)
            .map_err(|error| StorageIOError::read(&error).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.append_entries(entries.into_iter().collect(), callback)
            .await
            .map_err(|error| StorageIOError::write_logs(&error).into())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.disk
            .write_durably(self.life, Write::TruncateFrom(log_id.index))
            .await
            .map_err(|error| StorageIOError::write_logs(&error).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.disk
            .write_durably(self.life, Write::PurgeUpTo(log_id))
            .await
            .map_err(|error| StorageIOError::write_logs(&error).into())
    }
}
