//! The Raft log and vote on raft-log's write-ahead log: [`LogStore`]
//! implements openraft's [`RaftLogStorage`] (and is its own
//! [`RaftLogReader`]).
//!
//! Entries, the vote, the committed and the last purged log id are records
//! of one append-only stream in `<data>/raft-log/`, so the vote and the log
//! share one durable path: a sync covers every record before it.
//! Durability rules, from openraft's contract and our fsync budget (about
//! 3 ms each, so never one per entry):
//! - `append` hands the batch to raft-log's flush worker and returns; the
//!   worker writes it with whatever else is queued, fdatasyncs once, and
//!   only then reports the entries persisted through openraft's callback;
//! - `save_vote`, `truncate` and `purge` wait for their sync before
//!   returning;
//! - `save_committed` is written without a sync of its own: the next sync
//!   carries it, and losing it only means openraft re-applies a little less
//!   on restart and catches up from the leader.
//!
//! A write or fsync that fails (a full disk) fails the waiting call or
//! openraft's callback with the I/O error, and raft-log's worker stops: the
//! store then refuses every write with [`StorageError::LogStopped`] and the
//! readiness probe fails, until a restart reopens the log.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use leasehold_raft::ahead::AppendObserver;
use leasehold_raft::{NodeId, TypeConfig};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError as RaftStorageError,
    StorageIOError, Vote,
};
use raft_log::RaftLog;
use raft_log::api::raft_log_writer::RaftLogWriter;

use crate::StorageError;
use crate::failpoint::Failpoint;
use crate::layout::{PROBE_FILE, RAFT_LOG_DIR};
use crate::wal::{Flushed, Health, LogTypes, Stored, StoredEntry};

/// Most entries one `limited_get_log_entries` call returns, so a replication
/// message to a far-behind follower stays bounded.
pub const MAX_READ_ENTRIES: usize = 1_024;
/// Most encoded entry bytes one `limited_get_log_entries` call returns; the
/// first entry is returned whatever its size, so replication never stalls.
/// Kept well below gRPC's default 4 MiB message limit, since the network
/// layer's envelope adds its own overhead.
pub const MAX_READ_BYTES: usize = 2 * 1024 * 1024;

/// A chunk file of the log is closed and a new one begun past this size.
/// Entries of the open chunk stay in memory until it closes (raft-log
/// evicts only what a closed, synced chunk holds, even past a purge), so
/// this bounds the log's resident entries with the cache below; a purge
/// removes whole closed chunks. One entry larger than this (a batch of
/// large payloads can reach about 20 MiB) makes its chunk that much larger,
/// no more.
///
/// Both bounds count encoded bytes, and an entry in memory is several
/// times its encoding when its commands are small: an ack is about 30
/// bytes encoded and 200 as a command, an enqueued 64-byte job about 110
/// and 250. With 16 MiB chunks and a 16 MiB cache the log kept more than
/// 100 MB of entries resident under load, as much as the jobs of a 300,000
/// job backlog (docs/benchmarks.md, "Where a node's memory per job goes").
pub const CHUNK_MAX_BYTES: usize = 1024 * 1024;
/// A chunk is also closed after this many records (entries, votes,
/// committed marks), bounding the per-record offsets raft-log keeps.
pub const CHUNK_MAX_RECORDS: usize = 65_536;
/// Bytes of entries (encoded) the cache keeps in memory for readers besides
/// the open chunk's. Apply and a follower that keeps up read an entry
/// moments after its append, while it is still in the open chunk or here;
/// a follower further behind, or the state machine catching up on start,
/// reads older entries back from their chunk file (the page cache, usually).
pub const CACHE_MAX_BYTES: usize = 1024 * 1024;
/// Entries the cache keeps at most, whatever their size.
pub const CACHE_MAX_ENTRIES: usize = 1_024;
/// How long the flush worker waits for more writes after the first one
/// before it syncs: not at all. openraft 0.9's core waits for each append's
/// sync before it appends again, so no second append can arrive during the
/// wait, and any wait was pure latency on every commit round (100 µs on the
/// leader and again on the follower; a timed wait this short costs the
/// kernel's timer slack on top). A write queued behind another (a committed
/// mark, a probe) is taken right after it.
pub const FLUSH_BATCH_WAIT: Duration = Duration::ZERO;
/// Bytes of writes queued for the flush worker before a writer waits for it
/// (one larger write is still taken alone).
pub const FLUSH_QUEUE_MAX_BYTES: usize = 32 * 1024 * 1024;
/// Buffer of the sequential read that replays one chunk on open.
const REPLAY_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// The Raft log store. Cheap to clone: clones share the log and the sled
/// database of the node's local tables.
///
/// openraft serializes every write to it (one Raft core drives it);
/// readers (replication, the state machine catching up) share the log
/// under a read lock. Only readiness probes, which anyone may ask for at
/// any time, take turns.
#[derive(Clone)]
pub struct LogStore {
    log: Arc<RwLock<RaftLog<LogTypes>>>,
    /// The worker's first failure, if any (see the module docs).
    health: Arc<Health>,
    /// The raft log's directory, `<data>/raft-log`.
    dir: PathBuf,
    /// The node's sled database: its local tables live there.
    db: sled::Db,
    /// Held through one probe, so two probes at once (two health checkers
    /// polling the node) do not trip over each other's probe file.
    probe_turn: Arc<tokio::sync::Mutex<()>>,
    failpoint: Failpoint,
    /// Told of every batch appended, before its sync (see
    /// [`LogStore::observe_appends`]); set once, shared by clones.
    appends: Arc<OnceLock<Arc<dyn AppendObserver>>>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// raft-log's settings for a log in `dir` (see the constants above and
/// docs/decisions.md, "The Raft log on raft-log").
pub(crate) fn log_config(dir: &Path) -> Result<raft_log::Config, StorageError> {
    let Some(dir_text) = dir.to_str() else {
        return Err(StorageError::Io {
            what: "use (the path is not UTF-8)",
            path: dir.to_path_buf(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        });
    };
    let mut config = raft_log::Config::new(dir_text);
    config.log_cache_max_items = Some(CACHE_MAX_ENTRIES);
    config.log_cache_capacity = Some(CACHE_MAX_BYTES);
    config.wal.chunk_max_size = Some(CHUNK_MAX_BYTES);
    config.wal.chunk_max_records = Some(CHUNK_MAX_RECORDS);
    config.wal.read_buffer_size = Some(REPLAY_BUFFER_BYTES);
    // A torn last record (power cut mid-write) was never acknowledged:
    // recovery drops it. A damaged record anywhere else stops the open.
    config.wal.truncate_incomplete_record = Some(true);
    config.wal.flush_batch_wait = Some(FLUSH_BATCH_WAIT);
    config.wal.flush_queue_max_bytes = Some(FLUSH_QUEUE_MAX_BYTES);
    Ok(config)
}

/// The vote a node starts with, given the one it stored: the same term and
/// candidate, never committed.
///
/// openraft reads the vote only when a node starts (`get_initial_state`),
/// and a node whose stored vote is its own committed one starts as the
/// leader of that term again, with its log as it was synced. That is safe
/// only if no peer holds an entry of that term which this node's log lost.
/// A leader that replicates ahead of its own sync (`crate` docs of
/// `leasehold_raft::ahead`) breaks that: the entry reaches the followers,
/// the leader's sync fails (a full disk) and it restarts without it; as
/// the same term's leader it then makes a different entry under the same
/// log id, which the followers take for the one they hold, and the
/// replicas diverge. Started with the vote uncommitted, a node never leads
/// again in a term it led before it stopped: it starts as a follower and
/// leads again only by winning a later term. For a follower nothing
/// changes: its leader's next message carries the committed vote (equal
/// to the stored one, so storing it again is allowed), and a candidate of
/// the same term is refused as before.
fn restarted_vote(stored: Vote<NodeId>) -> Vote<NodeId> {
    Vote { committed: false, ..stored }
}

impl LogStore {
    /// Opens (creating, or migrating from an older version's sled trees)
    /// the raft log in `data_dir`, beside the sled database `db`.
    pub(crate) fn open(
        data_dir: &Path,
        db: sled::Db,
        failpoint: Failpoint,
    ) -> Result<Self, StorageError> {
        let dir = data_dir.join(RAFT_LOG_DIR);
        let health = Arc::new(Health::default());
        let log = crate::migrate::open_log(&db, data_dir, &dir, &health)?;
        Ok(LogStore {
            log: Arc::new(RwLock::new(log)),
            health,
            dir,
            db,
            probe_turn: Arc::default(),
            failpoint,
            appends: Arc::default(),
        })
    }

    /// Sets who hears how long each append took from its hand-over to the
    /// flush worker until synced, on this store and every clone of it; the
    /// first call wins.
    pub fn observe_syncs(&self, observer: crate::wal::SyncObserver) {
        self.health.syncs.set(observer);
    }

    /// Sets who hears of every batch of entries this store (and every
    /// clone of it) accepts, as soon as it is handed to the flush worker and
    /// before it is synced: a leader sends the batch to its followers from
    /// there, so their syncs overlap its own (`leasehold_raft::ahead`).
    /// The first call wins.
    pub fn observe_appends(&self, observer: Arc<dyn AppendObserver>) {
        let _ = self.appends.set(observer);
    }

    /// The bus's claim table, in the sled database (local, unreplicated).
    pub fn bus_table(&self) -> Result<crate::local::BusTable, StorageError> {
        crate::local::BusTable::open(&self.db)
    }

    /// The adverts kept of peers, in the sled database (local, unreplicated).
    pub fn peer_store(&self) -> Result<crate::local::PeerStore, StorageError> {
        crate::local::PeerStore::open(&self.db)
    }

    /// Readiness check of the log's disk and writer: writes a fresh nonce
    /// to a new file in the log's directory, fdatasyncs it and reads it
    /// back (a full disk fails here: the file needs new space), then has
    /// the log's own flush worker fdatasync its open chunk (a stopped or
    /// failing writer fails here).
    pub async fn probe(&self) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let _turn = self.probe_turn.lock().await;
        self.check_running()?;
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || probe_file(&dir))
            .await
            .map_err(|error| self.log_error("probe", io::Error::other(error)))??;
        self.write_durably("sync for the probe", |_| Ok(())).await
    }

    /// Failpoint for tests: while `on`, [`LogStore::probe`] and every durable
    /// log write (append, vote, truncate, purge) fail as a broken disk would,
    /// and so do snapshot writes of the paired [`crate::StateMachineStore`],
    /// which shares the flag.
    pub fn set_fault(&self, on: bool) {
        self.failpoint.set(on);
    }

    /// Test-only: from now on every append is reported synced `delay`
    /// after its sync, as on a disk whose syncs take that much longer
    /// (zero: as soon as synced). Durability is unchanged: the report only
    /// comes later. Shared by every clone of this store.
    pub fn set_sync_delay(&self, delay: Duration) {
        let delay_us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.health.sync_delay_us.store(delay_us, std::sync::atomic::Ordering::Relaxed);
    }

    /// An error of the log in this store's directory; an I/O failure (not
    /// a write raft-log refused) also stops the store's writes.
    fn log_error(&self, what: &'static str, source: io::Error) -> StorageError {
        if source.kind() != io::ErrorKind::InvalidInput {
            self.health.fail(&source);
        }
        StorageError::Log { what, path: self.dir.clone(), source }
    }

    /// [`LogStore::log_error`] for a request `log` refused, naming the
    /// flush worker's own failure when the worker had stopped: a request
    /// sent to a stopped worker fails with "sending on a closed channel",
    /// which names the channel and not the cause (a full disk, say). A
    /// chunk closes within a write, so the write after the worker's
    /// failure can be the first to see it, before any callback has.
    fn write_error(
        &self,
        log: &RaftLog<LogTypes>,
        what: &'static str,
        source: io::Error,
    ) -> StorageError {
        if source.kind() == io::ErrorKind::InvalidInput {
            return self.log_error(what, source);
        }
        // Returns at once once the worker has failed; a worker still
        // running is waited for (one sync) on this error path only.
        match log.wait_worker_idle() {
            Err(cause) => self.log_error(what, cause),
            Ok(()) => self.log_error(what, source),
        }
    }

    fn check_running(&self) -> Result<(), StorageError> {
        match self.health.failure() {
            Some(first) => Err(StorageError::LogStopped { path: self.dir.clone(), first }),
            None => Ok(()),
        }
    }

    fn reader(&self) -> Result<RwLockReadGuard<'_, RaftLog<LogTypes>>, StorageError> {
        self.log.read().map_err(|_| StorageError::LogPoisoned)
    }

    fn writer(&self) -> Result<RwLockWriteGuard<'_, RaftLog<LogTypes>>, StorageError> {
        self.check_running()?;
        self.log.write().map_err(|_| StorageError::LogPoisoned)
    }

    /// Runs `change` on the log, then waits until it and everything written
    /// before it are fdatasynced.
    async fn write_durably(
        &self,
        what: &'static str,
        change: impl FnOnce(&mut RaftLog<LogTypes>) -> io::Result<()>,
    ) -> Result<(), StorageError> {
        let synced = {
            let mut log = self.writer()?;
            change(&mut log).map_err(|source| self.write_error(&log, what, source))?;
            let (callback, synced) = Flushed::done(self.health.clone());
            log.flush(true, Some(callback))
                .map_err(|source| self.write_error(&log, what, source))?;
            synced
        };
        // The lock is released while the sync runs: readers go on meanwhile.
        match synced.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(self.log_error(what, source)),
            Err(_) => {
                Err(self.log_error(what, io::Error::other("the flush worker dropped the request")))
            }
        }
    }

    /// Entries with index in `range`, ascending, stopping after `max_entries`
    /// entries or once `max_bytes` of encoded entries were read (always at
    /// least one).
    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let Some((start, end)) = index_range(range) else {
            return Ok(Vec::new());
        };
        let log = self.reader()?;
        let mut entries = Vec::new();
        let mut bytes_read = 0_usize;
        for item in log.read(start, end) {
            let (log_id, stored) = item.map_err(|source| StorageError::Log {
                what: "read",
                path: self.dir.clone(),
                source,
            })?;
            bytes_read = bytes_read.saturating_add(stored.encoded_bytes as usize);
            // The first entry always goes out, however large, so replication
            // makes progress; later ones only while the budget holds.
            if !entries.is_empty() && (entries.len() >= max_entries || bytes_read > max_bytes) {
                break;
            }
            if stored.entry.log_id != log_id.0 {
                return Err(StorageError::Inconsistent {
                    tree: RAFT_LOG_DIR,
                    key: log_id.0.index.to_string(),
                    detail: format!("holds the entry of {}", stored.entry.log_id),
                });
            }
            entries.push(Entry::clone(&stored.entry));
        }
        Ok(entries)
    }

    async fn append_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let mut batch = Vec::new();
        let mut previous: Option<u64> = None;
        for entry in entries {
            let index = entry.log_id.index;
            // Checked before anything reaches the log, so a bad batch
            // leaves none of itself behind.
            if let Some(previous) = previous
                && previous.checked_add(1) != Some(index)
            {
                return Err(StorageError::Inconsistent {
                    tree: RAFT_LOG_DIR,
                    key: index.to_string(),
                    detail: format!("append batch jumps from index {previous} to {index}"),
                });
            }
            previous = Some(index);
            batch.push((Stored(entry.log_id), StoredEntry::new(entry)?));
        }
        let mut log = self.writer()?;
        // An entry at or below the purge mark is covered by the snapshot the
        // purge followed: it is purged as it arrives (openraft's storage
        // suite appends such entries after `get_initial_state` purged up to
        // the state machine; a Raft core never does). raft-log would refuse
        // it as a log id going backwards.
        if let Some(purged) = log.log_state().purged().map(|purged| purged.0.index) {
            batch.retain(|(log_id, _)| log_id.0.index > purged);
        }
        let count = batch.len();
        let prev = log.log_state().last().map(|last| last.0);
        // Shared handles, taken only when someone listens (a leader sends
        // the batch ahead to its followers; see `observe_appends`).
        let appended: Option<Vec<Arc<Entry<TypeConfig>>>> = self
            .appends
            .get()
            .map(|_| batch.iter().map(|(_, stored)| stored.entry.clone()).collect());
        log.append(batch).map_err(|source| self.write_error(&log, "append", source))?;
        // One fdatasync for this batch and whatever else is queued, never one
        // per entry: this is where the throughput of the whole cluster is
        // decided. openraft counts the entries towards a quorum only once
        // the worker calls back, after the sync.
        log.flush(true, Some(Flushed::append(callback, self.health.clone())))
            .map_err(|source| self.write_error(&log, "append", source))?;
        drop(log);
        // After the hand-over to the flush worker, so the leader's sync is
        // under way while the followers are sent the batch. It does not
        // change when openraft hears of this store's own sync.
        if let (Some(observer), Some(entries)) = (self.appends.get(), appended)
            && !entries.is_empty()
        {
            observer.appended(prev, &entries);
        }
        tracing::trace!(count, last_index = ?previous, "log entries appended");
        Ok(())
    }

    async fn save_vote_durably(&self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.failpoint.check()?;
        // A vote forgotten after a crash could let this node vote twice in
        // one term: it must be on disk before anyone hears about it.
        let vote = Stored(*vote);
        self.write_durably("save the vote", move |log| log.save_vote(vote).map(drop)).await
    }

    fn save_committed_lazily(&self, committed: Option<LogId<NodeId>>) -> Result<(), StorageError> {
        // openraft never moves the committed log id back.
        let Some(committed) = committed else { return Ok(()) };
        let mut log = self.writer()?;
        let state = log.log_state();
        // Nothing to record when it did not move; and a committed id past
        // this log's last entry (a snapshot installed ahead of the log) is
        // one raft-log refuses to name, so the last recorded one stays:
        // an older committed id only means re-applying less on restart.
        if state.committed().is_some_and(|known| known.0 >= committed)
            || state.last().is_none_or(|last| last.0 < committed)
        {
            return Ok(());
        }
        log.commit(Stored(committed))
            .map_err(|source| self.write_error(&log, "save committed", source))?;
        // Written out without a sync of its own: it survives a process
        // crash, and the next sync carries it through a power cut.
        log.flush(false, None)
            .map_err(|source| self.write_error(&log, "save committed", source))?;
        Ok(())
    }

    async fn truncate_since(&self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let past_the_end = {
            let log = self.reader()?;
            log.log_state().last().is_none_or(|last| last.0.index < log_id.index)
        };
        if past_the_end {
            return Ok(());
        }
        // Conflicting entries must not come back after a crash and be taken
        // for this leader's entries; truncation is rare, so sync now.
        self.write_durably("truncate", |log| log.truncate(log_id.index).map(drop)).await?;
        tracing::debug!(since = %log_id, "log truncated");
        Ok(())
    }

    async fn purge_upto(&self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        self.failpoint.check()?;
        let done = {
            let log = self.reader()?;
            log.log_state().purged().is_some_and(|purged| purged.0.index >= log_id.index)
        };
        if done {
            return Ok(());
        }
        // raft-log unlinks the chunk files the purge covers only after this
        // sync has made the purge record durable.
        self.write_durably("purge", |log| log.purge(Stored(log_id)).map(drop)).await?;
        tracing::debug!(upto = %log_id, "log purged");
        Ok(())
    }

    /// The index of the last purged entry, 0 when none was.
    pub fn last_purged_index(&self) -> Result<u64, StorageError> {
        Ok(self.log_state()?.last_purged_log_id.map_or(0, |purged| purged.index))
    }

    fn log_state(&self) -> Result<LogState<TypeConfig>, StorageError> {
        let log = self.reader()?;
        let state = log.log_state();
        // raft-log moves `last` up to the purge mark when a purge passes
        // every entry, which is the last log id openraft expects then.
        Ok(LogState {
            last_purged_log_id: state.purged().map(|purged| purged.0),
            last_log_id: state.last().map(|last| last.0),
        })
    }
}

/// The half-open index range `[start, end)` raft-log reads for `range`, or
/// `None` when it is empty.
fn index_range(range: impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(index) => *index,
        Bound::Excluded(index) => index.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        // Index u64::MAX itself is never reached by a log.
        Bound::Included(index) => index.saturating_add(1),
        Bound::Excluded(index) => *index,
        Bound::Unbounded => u64::MAX,
    };
    (start < end).then_some((start, end))
}

/// The file half of the probe: a new file (so a full disk refuses it) with a
/// fresh nonce, fdatasynced, read back, removed.
fn probe_file(dir: &Path) -> Result<(), StorageError> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(PROBE_FILE);
    let io = |what: &'static str| {
        let path = path.clone();
        move |source| StorageError::Io { what, path, source }
    };
    // A nonce that changes every call proves this probe's write landed.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos())
        .to_be_bytes();
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(io("remove")(source)),
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io("create"))?;
    file.write_all(&nonce).map_err(io("write"))?;
    file.sync_data().map_err(io("fdatasync"))?;
    file.rewind().map_err(io("read"))?;
    let mut found = Vec::with_capacity(nonce.len());
    file.read_to_end(&mut found).map_err(io("read"))?;
    drop(file);
    std::fs::remove_file(&path).map_err(io("remove"))?;
    if found != nonce {
        return Err(StorageError::ProbeMismatch { wrote: nonce.to_vec(), found: Some(found) });
    }
    Ok(())
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

    /// The vote as stored, but never committed (see `restarted_vote`).
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftStorageError<NodeId>> {
        let log = self.reader().map_err(|error| StorageIOError::read_vote(&error))?;
        Ok(log.log_state().vote().map(|vote| restarted_vote(vote.0)))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), RaftStorageError<NodeId>> {
        self.save_committed_lazily(committed).map_err(|error| StorageIOError::write(&error).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, RaftStorageError<NodeId>> {
        let log = self.reader().map_err(|error| StorageIOError::read(&error))?;
        Ok(log.log_state().committed().map(|committed| committed.0))
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
        self.append_entries(entries, callback)
            .await
            .map_err(|error| RaftStorageError::from(StorageIOError::write_logs(&error)))
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
    fn index_range_normalizes_every_bound() {
        assert_eq!(index_range(3..7), Some((3, 7)));
        assert_eq!(index_range(3..=7), Some((3, 8)));
        assert_eq!(index_range(..), Some((0, u64::MAX)));
        assert_eq!(index_range(5..5), None);
        assert_eq!(index_range((Bound::Included(6), Bound::Excluded(5))), None);
        assert_eq!(index_range(..0), None);
        assert_eq!(index_range((Bound::Excluded(u64::MAX), Bound::Unbounded)), None);
    }

    #[test]
    fn the_probe_file_is_gone_after_a_probe() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        probe_file(dir.path())?;
        probe_file(dir.path())?;
        assert!(!dir.path().join(PROBE_FILE).exists());
        Ok(())
    }
}
