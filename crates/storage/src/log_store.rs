//! The Raft log and vote on sled: [`LogStore`] implements openraft's
//! [`RaftLogStorage`] (and is its own [`RaftLogReader`]).
//!
//! Durability rules, from openraft's contract and our fsync budget (about
//! 3 ms each, so never one per entry):
//! - `append` writes the whole batch atomically, flushes once, and only then
//!   reports the entries persisted through the callback;
//! - `save_vote`, `truncate` and `purge` flush before returning;
//! - `save_committed` is not flushed: the next append's flush (or sled's
//!   background flush) carries it, and losing it only means openraft re-applies
//!   a little less on restart and catches up from the leader.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use leasehold_raft::{NodeId, TypeConfig};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError as RaftStorageError,
    StorageIOError, Vote,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::StorageError;
use crate::codec::{decode, encode};
use crate::durable::BlobSync;
use crate::failpoint::Failpoint;
use crate::layout::{
    COMMITTED_KEY, LAST_PURGED_KEY, LOG_TREE, META_TREE, PROBE_KEY, PROBE_TREE, VOTE_KEY,
    log_index, log_key,
};

/// Most entries one `limited_get_log_entries` call returns, so a replication
/// message to a far-behind follower stays bounded.
pub const MAX_READ_ENTRIES: usize = 1_024;
/// Most encoded entry bytes one `limited_get_log_entries` call returns; the
/// first entry is returned whatever its size, so replication never stalls.
/// Kept well below gRPC's default 4 MiB message limit, since the network
/// layer's envelope adds its own overhead.
pub const MAX_READ_BYTES: usize = 2 * 1024 * 1024;

/// The sled-backed Raft log store. Cheap to clone: clones share the database.
///
/// openraft serializes every write to it (one Raft core drives it), so the
/// store keeps no lock of its own for those; readers clone it freely. Only
/// readiness probes, which anyone may ask for at any time, take turns.
#[derive(Clone, Debug)]
pub struct LogStore {
    /// The database's data file and blob files, fsynced after each flush
    /// (see [`LogStore::durable_flush`]); `None` for stores built on a
    /// database a test opened itself.
    data_file: Option<std::sync::Arc<(std::fs::File, BlobSync)>>,
    db: sled::Db,
    logs: sled::Tree,
    meta: sled::Tree,
    probe: sled::Tree,
    /// Held through one probe's write, flush and read-back: two probes at
    /// once (two health checkers polling the node) would otherwise read
    /// each other's nonce and fail a healthy store.
    probe_turn: std::sync::Arc<tokio::sync::Mutex<()>>,
    failpoint: Failpoint,
}

impl LogStore {
    /// Opens (or creates) the log trees of `db`.
    pub(crate) fn open_db(db: sled::Db, failpoint: Failpoint) -> Result<Self, StorageError> {
        Ok(LogStore {
            logs: db.open_tree(LOG_TREE)?,
            meta: db.open_tree(META_TREE)?,
            probe: db.open_tree(PROBE_TREE)?,
            probe_turn: std::sync::Arc::default(),
            data_file: None,
            db,
            failpoint,
        })
    }

    /// The bus's claim table, in the same database (local, unreplicated).
    pub fn bus_table(&self) -> Result<crate::local::BusTable, StorageError> {
        crate::local::BusTable::open(&self.db)
    }

    /// The adverts kept of peers, in the same database (local, unreplicated).
    pub fn peer_store(&self) -> Result<crate::local::PeerStore, StorageError> {
        crate::local::PeerStore::open(&self.db)
    }

    /// Makes every flush also fsync `file` (sled's data file) and the blob
    /// files of the database in `dir`.
    pub(crate) fn with_data_file(mut self, file: std::fs::File, dir: &std::path::Path) -> Self {
        self.data_file = Some(std::sync::Arc::new((file, BlobSync::new(dir))));
        self
    }

    /// Flushes sled, then fsyncs the blob files it wrote and its data file.
    /// sled 0.34 makes a flush stable with sync_file_range, which survives a
    /// process crash but does not flush the device cache or the file's
    /// metadata, and never syncs a blob file (a page over 128 KiB: a large
    /// entry, or a leaf of several); the fsyncs make an acknowledged entry
    /// survive a power loss too. Blobs go first, so the main file never
    /// durably points at a blob that is not. Appends are batched above
    /// Raft, so this costs one sync per batch (and a directory read).
    ///
    /// Both run on one blocking thread, one hand-off per flush: this is on
    /// the commit path of every entry, and on a small host each wake-up of
    /// another thread costs about as much as the work.
    async fn durable_flush(&self) -> Result<(), StorageError> {
        let db = self.db.clone();
        let file = self.data_file.clone();
        tokio::task::spawn_blocking(move || -> Result<(), StorageError> {
            db.flush()?;
            if let Some(durable) = file {
                let (file, blobs) = &*durable;
                blobs.sync_new()?;
                file.sync_data().map_err(|e| StorageError::Sled(sled::Error::Io(e)))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| StorageError::Sled(sled::Error::Io(std::io::Error::other(e))))?
    }

    /// Readiness check: writes a fresh nonce to the probe tree, flushes it to
    /// disk and reads it back. Fails when the disk refuses writes, fsync
    /// fails, or the record does not come back as written.
    pub async fn probe(&self) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let _turn = self.probe_turn.lock().await;
        // A nonce that changes every call proves this probe's write landed,
        // rather than an old record still sitting there.
        let nonce = self.db.generate_id()?.to_be_bytes();
        self.probe.insert(PROBE_KEY, &nonce[..])?;
        self.db.flush_async().await?;
        let found = self.probe.get(PROBE_KEY)?;
        if found.as_deref() != Some(&nonce[..]) {
            return Err(StorageError::ProbeMismatch {
                wrote: nonce.to_vec(),
                found: found.map(|bytes| bytes.to_vec()),
            });
        }
        Ok(())
    }

    /// Failpoint for tests: while `on`, [`LogStore::probe`] and every durable
    /// log write (append, vote, truncate, purge) fail as a broken disk would,
    /// and so do snapshot writes of the paired [`crate::StateMachineStore`],
    /// which shares the flag.
    pub fn set_fault(&self, on: bool) {
        self.failpoint.set(on);
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &'static str) -> Result<Option<T>, StorageError> {
        match self.meta.get(key)? {
            Some(bytes) => Ok(Some(decode(META_TREE, key, &bytes)?)),
            None => Ok(None),
        }
    }

    fn write_meta<T: Serialize>(&self, key: &'static str, value: &T) -> Result<(), StorageError> {
        self.meta.insert(key, encode(key, value)?)?;
        Ok(())
    }

    /// Entries with index in `range`, ascending, stopping after `max_entries`
    /// entries or once `max_bytes` of values were read (always at least one).
    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let Some((start, end)) = key_range(range) else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::new();
        let mut bytes_read = 0_usize;
        for item in self.logs.range((start, end)) {
            let (key, value) = item?;
            bytes_read = bytes_read.saturating_add(value.len());
            // The first entry always goes out, however large, so replication
            // makes progress; later ones only while the budget holds.
            if !entries.is_empty() && (entries.len() >= max_entries || bytes_read > max_bytes) {
                break;
            }
            entries.push(decode_entry(&key, &value)?);
        }
        Ok(entries)
    }

    /// The id of the newest stored entry, if any.
    fn last_stored_log_id(&self) -> Result<Option<LogId<NodeId>>, StorageError> {
        match self.logs.last()? {
            Some((key, value)) => Ok(Some(decode_entry(&key, &value)?.log_id)),
            None => Ok(None),
        }
    }

    async fn append_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(), StorageError> {
        self.failpoint.check()?;
        // One atomic batch for the whole append: a crash leaves either all of
        // it or none, never a hole in the middle.
        let mut batch = sled::Batch::default();
        let mut previous: Option<u64> = None;
        let mut count = 0_usize;
        for entry in entries {
            let index = entry.log_id.index;
            if let Some(previous) = previous
                && previous.checked_add(1) != Some(index)
            {
                return Err(StorageError::Inconsistent {
                    tree: LOG_TREE,
                    key: index.to_string(),
                    detail: format!("append batch jumps from index {previous} to {index}"),
                });
            }
            batch.insert(&log_key(index)[..], encode("log entry", &entry)?);
            previous = Some(index);
            count += 1;
        }
        self.logs.apply_batch(batch)?;
        // One fsync per batch, not per entry: this is where the throughput of
        // the whole cluster is decided.
        self.durable_flush().await?;
        tracing::trace!(count, last_index = ?previous, "log entries appended and flushed");
        Ok(())
    }

    async fn save_vote_durably(&self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.failpoint.check()?;
        self.write_meta(VOTE_KEY, vote)?;
        // A vote forgotten after a crash could let this node vote twice in
        // one term: it must be on disk before anyone hears about it.
        self.durable_flush().await?;
        Ok(())
    }

    async fn truncate_since(&self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let mut batch = sled::Batch::default();
        for key in self.logs.range(&log_key(log_id.index)[..]..).keys() {
            batch.remove(key?);
        }
        self.logs.apply_batch(batch)?;
        // Conflicting entries must not come back after a crash and be taken
        // for this leader's entries; truncation is rare, so flush now.
        self.durable_flush().await?;
        tracing::debug!(since = %log_id, "log truncated");
        Ok(())
    }

    async fn purge_upto(&self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let previous: Option<LogId<NodeId>> = self.read_meta(LAST_PURGED_KEY)?;
        if previous.as_ref().is_some_and(|previous| previous >= &log_id) {
            return Ok(());
        }
        // The purge mark goes first: sled recovers writes in order, so after
        // a crash the mark is never behind the entries actually removed, and
        // `get_log_state` never reports a log that starts in a hole.
        self.write_meta(LAST_PURGED_KEY, &log_id)?;
        let mut batch = sled::Batch::default();
        for key in self.logs.range(..=&log_key(log_id.index)[..]).keys() {
            batch.remove(key?);
        }
        self.logs.apply_batch(batch)?;
        self.durable_flush().await?;
        tracing::debug!(upto = %log_id, "log purged");
        Ok(())
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.read_meta(LAST_PURGED_KEY)?;
        let last_stored = self.last_stored_log_id()?;
        // With every entry purged, the last log id is the purge mark.
        let last_log_id = std::cmp::max(last_stored, last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }
}

/// Decodes a log record and checks it is stored under its own index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
    let Some(index) = log_index(key) else {
        return Err(StorageError::Inconsistent {
            tree: LOG_TREE,
            key: format!("{key:02x?}"),
            detail: "log key is not an 8-byte index".to_string(),
        });
    };
    let entry: Entry<TypeConfig> = decode(LOG_TREE, index, value)?;
    if entry.log_id.index != index {
        return Err(StorageError::Inconsistent {
            tree: LOG_TREE,
            key: index.to_string(),
            detail: format!("holds the entry of index {}", entry.log_id.index),
        });
    }
    Ok(entry)
}

/// Bounds of a sled key range over [`LOG_TREE`].
type KeyRange = (Bound<[u8; 8]>, Bound<[u8; 8]>);

/// The sled key range for a range of log indexes, or `None` when it is empty.
fn key_range(range: impl RangeBounds<u64>) -> Option<KeyRange> {
    let start = match range.start_bound() {
        Bound::Included(index) => *index,
        Bound::Excluded(index) => index.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(index) => Some(*index),
        Bound::Excluded(index) => Some(index.checked_sub(1)?),
        Bound::Unbounded => None,
    };
    if end.is_some_and(|end| end < start) {
        return None;
    }
    let end = match end {
        Some(end) => Bound::Included(log_key(end)),
        None => Bound::Unbounded,
    };
    Some((Bound::Included(log_key(start)), end))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftStorageError<NodeId>> {
        self.read_entries(range, usize::MAX, usize::MAX)
            .map_err(|error| StorageIOError::read_logs(&error).into())
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftStorageError<NodeId>> {
        self.read_entries(start..end, MAX_READ_ENTRIES, MAX_READ_BYTES)
            .map_err(|error| StorageIOError::read_logs(&error).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError<NodeId>> {
        self.log_state().map_err(|error| StorageIOError::read_logs(&error).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftStorageError<NodeId>> {
        self.save_vote_durably(vote)
            .await
            .map_err(|error| StorageIOError::write_vote(&error).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftStorageError<NodeId>> {
        self.read_meta(VOTE_KEY).map_err(|error| StorageIOError::read_vote(&error).into())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), RaftStorageError<NodeId>> {
        // Not flushed on purpose (see the module docs): it is advisory, and
        // openraft calls it on every commit advance.
        let result = match committed {
            Some(log_id) => self.write_meta(COMMITTED_KEY, &log_id),
            None => self.meta.remove(COMMITTED_KEY).map(|_| ()).map_err(StorageError::from),
        };
        result.map_err(|error| StorageIOError::write(&error).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, RaftStorageError<NodeId>> {
        self.read_meta(COMMITTED_KEY).map_err(|error| StorageIOError::read(&error).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.append_entries(entries)
            .await
            .map_err(|error| RaftStorageError::from(StorageIOError::write_logs(&error)))?;
        // Only now, with the batch fsynced, may openraft count these entries
        // towards a quorum.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftStorageError<NodeId>> {
        self.truncate_since(log_id).await.map_err(|error| StorageIOError::write_logs(&error).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftStorageError<NodeId>> {
        self.purge_upto(log_id).await.map_err(|error| StorageIOError::write_logs(&error).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_range_normalizes_every_bound() {
        assert_eq!(
            key_range(3..7),
            Some((Bound::Included(log_key(3)), Bound::Included(log_key(6))))
        );
        assert_eq!(
            key_range(3..=7),
            Some((Bound::Included(log_key(3)), Bound::Included(log_key(7))))
        );
        assert_eq!(key_range(..), Some((Bound::Included(log_key(0)), Bound::Unbounded)));
        assert_eq!(key_range(5..5), None);
        assert_eq!(key_range((Bound::Included(6), Bound::Excluded(5))), None);
        assert_eq!(key_range(..0), None);
        assert_eq!(key_range((Bound::Excluded(u64::MAX), Bound::Unbounded)), None);
    }
}
