//! The replicated scheduler state as openraft's state machine:
//! [`StateMachineStore`] implements [`RaftStateMachine`] and builds its own
//! snapshots.
//!
//! The live [`State`] is in memory; only snapshots reach the disk. That keeps
//! `apply` free of IO (it is on the commit path of every command) and relies
//! on openraft's restart rule instead: on open the state comes back from the
//! last persisted snapshot, and openraft re-applies the log from there up to
//! the committed log id the log store saved. So a snapshot must be durable
//! before openraft may purge the entries it covers: `build_snapshot` and
//! `install_snapshot` return only once it is on stable storage.
//!
//! A snapshot is one file beside sled's, [`SNAPSHOT_FILE`] in the data
//! directory, replaced whole (temporary file, fsync, rename, directory
//! fsync), so a power cut leaves the old snapshot or the new one. Data
//! directories from before kept it in sled's [`SNAPSHOT_TREE`]: it is read
//! from there until the first snapshot file replaces it.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use leasehold_core::state::FrozenViewLost;
use leasehold_core::{Response, State};
use leasehold_raft::{NodeId, Received, ReceivedFile, SnapshotData, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError as RaftStorageError, StorageIOError, StoredMembership,
};
use serde::Deserialize;
#[cfg(test)]
use serde::Serialize;
use tokio::sync::watch;

use crate::StorageError;
use crate::codec::{Fnv1a64, decode, decode_from, digest, encode, encode_into};
use crate::durable;
use crate::failpoint::Failpoint;
use crate::layout::{SNAPSHOT_DATA_KEY, SNAPSHOT_FILE, SNAPSHOT_META_KEY, SNAPSHOT_TREE};

/// Snapshot meta as openraft describes it for this type config.
type Meta = SnapshotMeta<NodeId, BasicNode>;
/// Membership as recorded by the state machine.
type Membership = StoredMembership<NodeId, BasicNode>;

/// Everything apply changes, kept under one lock so readers never see a
/// state without the log position it belongs to.
#[derive(Debug, Default)]
struct Applied {
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
    state: State,
}

/// The snapshot body as one value: field for field the same bincode as
/// [`SnapshotBody`], but borrowing. A build streams these bytes piece by
/// piece instead (a test checks they are the same).
#[cfg(test)]
#[derive(Serialize)]
struct SnapshotBodyRef<'a> {
    last_applied: &'a Option<LogId<NodeId>>,
    last_membership: &'a Membership,
    state: &'a State,
}

/// The snapshot body as read back.
#[derive(Deserialize)]
struct SnapshotBody {
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
    state: State,
}

/// A snapshot body in the layout before the state's request log.
#[derive(Deserialize)]
struct SnapshotBodyBeforeRequests {
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
    state: leasehold_core::state::StateBeforeRequests,
}

impl SnapshotBody {
    /// Decodes snapshot bytes and checks they describe the same log position
    /// and membership as `meta`, so a body is never installed under the wrong
    /// label.
    fn decode_for(meta: &Meta, bytes: &[u8]) -> Result<Self, StorageError> {
        // The current layout, or the one before the state's request log
        // (a data dir, or a snapshot sent by a node, of the version before).
        let body: SnapshotBody = match decode(SNAPSHOT_TREE, SNAPSHOT_DATA_KEY, bytes) {
            Ok(body) => body,
            Err(current) => {
                match decode::<SnapshotBodyBeforeRequests>(SNAPSHOT_TREE, SNAPSHOT_DATA_KEY, bytes)
                {
                    Ok(old) => old.into(),
                    Err(_) => return Err(current),
                }
            }
        };
        body.check_for(meta)
    }

    /// Decodes the body in `file` from its current position to its end
    /// (`len` bytes) as a stream, never holding its bytes whole, and checks
    /// it against `meta` as [`SnapshotBody::decode_for`] does.
    fn read_for(meta: &Meta, file: &mut File, len: u64) -> Result<Self, StorageError> {
        let io =
            |source| StorageError::Io { what: "read", path: PathBuf::from(SNAPSHOT_FILE), source };
        let start = file.stream_position().map_err(io)?;
        let body: SnapshotBody =
            match decode_from(SNAPSHOT_TREE, SNAPSHOT_DATA_KEY, &mut buffered(file), len) {
                Ok(body) => body,
                Err(current) => {
                    file.seek(SeekFrom::Start(start)).map_err(io)?;
                    match decode_from::<SnapshotBodyBeforeRequests>(
                        SNAPSHOT_TREE,
                        SNAPSHOT_DATA_KEY,
                        &mut buffered(file),
                        len,
                    ) {
                        Ok(old) => old.into(),
                        Err(_) => return Err(current),
                    }
                }
            };
        body.check_for(meta)
    }

    /// The body, if it describes the same log position and membership as
    /// `meta`.
    fn check_for(self, meta: &Meta) -> Result<Self, StorageError> {
        if self.last_applied != meta.last_log_id || self.last_membership != meta.last_membership {
            return Err(StorageError::Inconsistent {
                tree: SNAPSHOT_TREE,
                key: SNAPSHOT_DATA_KEY.to_string(),
                detail: format!(
                    "body is at {:?} with membership {:?}, meta {} says {:?} with {:?}",
                    self.last_applied,
                    self.last_membership,
                    meta.snapshot_id,
                    meta.last_log_id,
                    meta.last_membership
                ),
            });
        }
        Ok(self)
    }
}

impl From<SnapshotBodyBeforeRequests> for SnapshotBody {
    fn from(old: SnapshotBodyBeforeRequests) -> Self {
        SnapshotBody {
            last_applied: old.last_applied,
            last_membership: old.last_membership,
            state: State::from(old.state),
        }
    }
}

/// `file` read through a buffer (snapshot bodies are decoded a value at a
/// time).
fn buffered(file: &mut File) -> BufReader<&mut File> {
    BufReader::with_capacity(1 << 20, file)
}

/// A persisted snapshot's body, where it is.
enum StoredBody {
    /// In the snapshot file, from `base` to its end (`len` bytes).
    File { file: File, base: u64, len: u64 },
    /// In sled, where an older version kept it.
    Legacy(Vec<u8>),
}

/// What a received snapshot's body is persisted from.
enum ReceivedBody {
    Bytes(Vec<u8>),
    File(ReceivedFile),
}

/// Jobs encoded per hold of the state lock while a snapshot is written: a
/// chunk of small jobs encodes in well under a millisecond, and apply waits
/// at most that long for it.
const SNAPSHOT_CHUNK_JOBS: usize = 1_024;

/// A chunk also ends once its encoding passes this many bytes, so a chunk
/// of large payloads neither holds the lock long nor grows a large buffer.
const SNAPSHOT_CHUNK_BYTES: usize = 512 * 1024;

/// How long a digest waits for a snapshot write in progress before it
/// answers with the digest it took last (see
/// [`StateMachineStore::recent_digest`]).
const DIGEST_LOCK_WAIT: Duration = Duration::from_millis(200);

/// After taking a digest, a store takes no other for this many times as
/// long as that one took (unless the applied index is where it was, when
/// the one taken is current): a state of a million jobs takes under half
/// a second to hash, so a status page polling every second costs
/// a node at most a tenth of one core.
const DIGEST_COOLDOWN_FACTOR: u32 = 9;

/// A digest of the state (FNV-1a 64 over its encoding, as
/// [`crate::digest`]) and the applied log index it describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateDigest {
    /// The last applied log index the digest was taken at (`0`: none).
    pub index: u64,
    /// The digest.
    pub digest: u64,
}

/// The last digest a store took, and what it cost.
#[derive(Clone, Copy, Debug)]
struct DigestMemo {
    taken: StateDigest,
    finished: Instant,
    took: Duration,
}

/// The state under the store's read lock (see [`StateMachineStore::state`]).
struct StateRead<'a>(RwLockReadGuard<'a, Applied>);

impl Deref for StateRead<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0.state
    }
}

/// How the last snapshot build went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotBuildStats {
    /// The longest single hold of the state lock during the build.
    pub longest_lock_hold: Duration,
    /// The most CPU time the building thread spent inside one hold: the
    /// build's own work, without the time it was descheduled while holding
    /// the lock. `None` where the platform does not say.
    pub longest_lock_hold_cpu: Option<Duration>,
    /// Jobs written.
    pub jobs: u64,
    /// Bytes of the snapshot body (without the file's header and meta).
    pub bytes: u64,
}

/// One hold of the state lock, timed from when it was taken: on the wall
/// clock, and on this thread's CPU clock (which stops while the thread is
/// descheduled, so the two differ by the time the holder was preempted).
struct Hold {
    wall: Instant,
    cpu: Option<Duration>,
}

impl Hold {
    fn start() -> Hold {
        Hold { wall: Instant::now(), cpu: thread_cpu_time() }
    }
}

/// The longest holds of a build: by wall time, and by CPU time (either
/// may come from a different hold).
#[derive(Default)]
struct HoldTimes {
    wall: Duration,
    cpu: Option<Duration>,
}

impl HoldTimes {
    fn add(&mut self, hold: Hold) {
        self.wall = self.wall.max(hold.wall.elapsed());
        let cpu = hold.cpu.zip(thread_cpu_time()).map(|(from, to)| to.saturating_sub(from));
        // `None` orders below every `Some`: an unmeasured hold never hides
        // a measured one.
        self.cpu = self.cpu.max(cpu);
    }

    /// Takes in the longest holds of another part of the same build.
    fn merge(&mut self, other: HoldTimes) {
        self.wall = self.wall.max(other.wall);
        self.cpu = self.cpu.max(other.cpu);
    }
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`), or
/// `None` where the platform cannot tell.
fn thread_cpu_time() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok().map(Duration::from)
}

/// The state machine: live [`State`] in memory, snapshots in a file. Cheap to
/// clone; clones share the state, so the node can keep one for reads while
/// openraft owns another.
#[derive(Clone, Debug)]
pub struct StateMachineStore {
    applied: Arc<RwLock<Applied>>,
    /// Carries the last applied log index to long-poll waiters.
    applied_index: Arc<watch::Sender<u64>>,
    /// The persisted snapshot's meta. Its lock serializes snapshot writes,
    /// so an older snapshot never overwrites a newer one that finished first.
    snapshot_write: Arc<tokio::sync::Mutex<Option<Meta>>>,
    db: sled::Db,
    /// The tree where data directories from before kept the snapshot.
    legacy_snapshots: sled::Tree,
    /// Where the snapshot file lives (the data directory).
    dir: PathBuf,
    failpoint: Failpoint,
    /// How the last snapshot build (in this process) went.
    last_build: Arc<Mutex<Option<SnapshotBuildStats>>>,
    /// The last digest taken by [`StateMachineStore::recent_digest`].
    digest_memo: Arc<Mutex<Option<DigestMemo>>>,
}

impl StateMachineStore {
    /// Opens the state machine of `db`, keeping its snapshot in `dir`, and
    /// starts from the persisted snapshot when there is one (openraft then
    /// re-applies the log after it).
    pub(crate) fn open_db(
        db: sled::Db,
        dir: &Path,
        failpoint: Failpoint,
    ) -> Result<Self, StorageError> {
        let legacy_snapshots = db.open_tree(SNAPSHOT_TREE)?;
        remove_received_files(dir)?;
        let (applied, meta) = match read_stored_snapshot(dir, &legacy_snapshots, None)? {
            Some((meta, stored)) => {
                let body = match stored {
                    StoredBody::File { mut file, len, .. } => {
                        SnapshotBody::read_for(&meta, &mut file, len)?
                    }
                    StoredBody::Legacy(bytes) => SnapshotBody::decode_for(&meta, &bytes)?,
                };
                tracing::info!(snapshot_id = %meta.snapshot_id, last_applied = ?body.last_applied,
                    "state machine loaded from snapshot");
                let applied = Applied {
                    last_applied: body.last_applied,
                    last_membership: body.last_membership,
                    state: body.state,
                };
                (applied, Some(meta))
            }
            None => (Applied::default(), None),
        };
        let (applied_index, _) = watch::channel(index_of(&applied.last_applied));
        Ok(StateMachineStore {
            applied: Arc::new(RwLock::new(applied)),
            applied_index: Arc::new(applied_index),
            snapshot_write: Arc::new(tokio::sync::Mutex::new(meta)),
            db,
            legacy_snapshots,
            dir: dir.to_path_buf(),
            failpoint,
            last_build: Arc::new(Mutex::new(None)),
            digest_memo: Arc::new(Mutex::new(None)),
        })
    }

    /// Runs `f` on the current state under the read lock. Keep `f` brief:
    /// apply waits while it runs.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state())
    }

    /// The current state, read-locked while the returned guard lives: drop
    /// it soon, apply waits meanwhile. What [`StateMachineStore::read`]
    /// does, for callers that hold the store behind a trait object and so
    /// cannot pass a generic closure.
    pub fn state(&self) -> impl Deref<Target = State> + '_ {
        StateRead(self.lock_read())
    }

    /// A receiver of the last applied log index, updated after every applied
    /// batch and every installed snapshot; long-poll claims wait on it.
    ///
    /// `0` stands both for "nothing applied" and for "entry 0 applied": a
    /// waiter only ever asks whether the index moved past one it saw.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    /// FNV-1a 64 over the bincode encoding of the current state: equal on
    /// every replica that applied the same log prefix.
    pub fn digest(&self) -> u64 {
        self.read(digest)
    }

    /// A digest of the state at the last applied index, taken a chunk of
    /// jobs at a time (the same bytes as [`StateMachineStore::digest`]):
    /// the state is frozen, as for a snapshot, and the lock is held for one
    /// chunk of 1,024 jobs at a time, so apply never waits for the whole
    /// state to be hashed. What `Status` reports.
    ///
    /// The digest taken last is answered again, with the index it was taken
    /// at, while the applied index has not moved, while the store cools down
    /// after taking one (nine times as long as that one took), and when a
    /// snapshot write holds the state's freeze for longer than 200 ms.
    /// `None` when no digest could be taken yet.
    pub async fn recent_digest(&self) -> Result<Option<StateDigest>, StorageError> {
        let memo = |store: &Self| *store.digest_memo.lock().unwrap_or_else(PoisonError::into_inner);
        let reusable = |memo: &DigestMemo, applied: u64| {
            memo.taken.index == applied
                || memo.finished.elapsed() < memo.took.saturating_mul(DIGEST_COOLDOWN_FACTOR)
        };
        if let Some(last) = memo(self)
            && reusable(&last, self.last_applied_index())
        {
            return Ok(Some(last.taken));
        }
        // One freeze at a time: a digest waits for a snapshot write (and
        // a snapshot write for a digest) on the writer's lock.
        let Ok(_writer) = tokio::time::timeout(DIGEST_LOCK_WAIT, self.snapshot_write.lock()).await
        else {
            return Ok(memo(self).map(|last| last.taken));
        };
        // Another caller may have taken one while this one waited.
        if let Some(last) = memo(self)
            && reusable(&last, self.last_applied_index())
        {
            return Ok(Some(last.taken));
        }
        let started = Instant::now();
        let store = self.clone();
        let taken = tokio::task::spawn_blocking(move || store.digest_in_chunks())
            .await
            .map_err(|e| StorageError::Sled(sled::Error::Io(std::io::Error::other(e))))??;
        let Some(taken) = taken else {
            // The state was replaced under the freeze (a snapshot was
            // installed): the next call digests the new one.
            return Ok(memo(self).map(|last| last.taken));
        };
        let took = started.elapsed();
        *self.digest_memo.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(DigestMemo { taken, finished: Instant::now(), took });
        Ok(Some(taken))
    }

    /// The blocking half of [`StateMachineStore::recent_digest`]: freezes
    /// the state and hashes its encoding a chunk at a time. `None` when the
    /// freeze was lost to a state installed meanwhile.
    fn digest_in_chunks(&self) -> Result<Option<StateDigest>, StorageError> {
        let (index, head, tail) = {
            let mut applied = self.applied.write().map_err(|_| StorageError::Poisoned)?;
            let (head, tail) = applied.state.freeze();
            (index_of(&applied.last_applied), head, tail)
        };
        let _thaw = Thaw { applied: &self.applied, ticket: head.ticket };
        // The state's encoding, field by field: its counters, the job
        // table's length and entries, then the fields after it. Each chunk
        // is hashed after the lock is let go (the hash, a byte at a time,
        // is the larger part of the work).
        let mut hasher = Fnv1a64::new();
        encode_into("digest", &mut hasher, &(&head.counters, &head.job_count))?;
        let streamed = self.stream_frozen_jobs("digest", head.ticket, |chunk| {
            hasher.update(chunk);
            Ok(())
        })?;
        if streamed.is_err() {
            return Ok(None);
        }
        encode_into("digest", &mut hasher, &tail)?;
        Ok(Some(StateDigest { index, digest: hasher.finish() }))
    }

    /// Encodes the jobs of the frozen view `ticket` in chunks of up to
    /// [`SNAPSHOT_CHUNK_JOBS`] jobs and about [`SNAPSHOT_CHUNK_BYTES`]
    /// bytes, taking the state lock for each chunk and handing the chunk's
    /// bytes to `sink` once the lock is let go, so apply goes on between
    /// chunks. The bytes, one after another, are the job table's entries
    /// as the state's encoding writes them. Returns how many jobs were
    /// read and the longest holds of the lock, or how the view was lost.
    fn stream_frozen_jobs(
        &self,
        what: &'static str,
        ticket: u64,
        mut sink: impl FnMut(&[u8]) -> Result<(), StorageError>,
    ) -> Result<Result<(u64, HoldTimes), FrozenViewLost>, StorageError> {
        let mut longest = HoldTimes::default();
        let mut jobs = 0u64;
        let mut chunk = Vec::with_capacity(2 * SNAPSHOT_CHUNK_BYTES);
        loop {
            chunk.clear();
            let read = {
                let mut applied = self.applied.write().map_err(|_| StorageError::Poisoned)?;
                // A hold is timed from when the lock is taken, not from
                // when it was asked for: waiting for an apply is no hold.
                let hold = Hold::start();
                let read = applied.state.read_frozen_jobs(ticket, SNAPSHOT_CHUNK_JOBS, |job| {
                    jobs = jobs.saturating_add(1);
                    encode_into(what, &mut chunk, &job).map(|()| chunk.len() < SNAPSHOT_CHUNK_BYTES)
                });
                longest.add(hold);
                read
            };
            let exhausted = match read {
                Ok(encoded) => encoded?,
                Err(lost) => return Ok(Err(lost)),
            };
            sink(&chunk)?;
            if exhausted {
                return Ok(Ok((jobs, longest)));
            }
        }
    }

    /// Index of the last applied log entry (`0` when none).
    pub fn last_applied_index(&self) -> u64 {
        index_of(&self.lock_read().last_applied)
    }

    /// Failpoint for tests: the same switch as [`crate::LogStore::set_fault`]
    /// (both stores of one database share it). While on, snapshot writes
    /// fail as a broken disk would; apply, which does no IO, is unaffected.
    pub fn set_fault(&self, on: bool) {
        self.failpoint.set(on);
    }

    /// Reads stay possible after a panicking apply poisoned the lock: the node
    /// is going down anyway (openraft treats the panic as fatal), and health
    /// and debug endpoints should still answer meanwhile.
    fn lock_read(&self) -> RwLockReadGuard<'_, Applied> {
        self.applied.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<Vec<Response>, StorageError> {
        let mut applied = self.applied.write().map_err(|_| StorageError::Poisoned)?;
        let entries = entries.into_iter();
        let mut responses = Vec::with_capacity(entries.size_hint().0);
        let mut outcome = Ok(());
        for entry in entries {
            if let Some(last) = &applied.last_applied
                && entry.log_id.index <= last.index
            {
                outcome = Err(StorageError::ApplyOutOfOrder {
                    index: entry.log_id.index,
                    last_applied: last.index,
                });
                break;
            }
            // Exactly one response per entry, Raft-internal ones included.
            let applied = &mut *applied;
            let response = leasehold_raft::apply_entry(
                &mut applied.state,
                &mut applied.last_membership,
                &entry,
            );
            applied.last_applied = Some(entry.log_id);
            responses.push(response);
        }
        let index = index_of(&applied.last_applied);
        drop(applied);
        self.applied_index.send_replace(index);
        outcome.map(|()| responses)
    }

    /// How the last snapshot build of this process went (`None` before
    /// the first).
    pub fn last_snapshot_build(&self) -> Option<SnapshotBuildStats> {
        *self.last_build.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Builds a snapshot of the current state straight into the snapshot
    /// file and returns once it is on stable storage. The state is frozen
    /// under the lock (a copy of the small tables, not of the jobs) and its
    /// jobs are then encoded [`SNAPSHOT_CHUNK_JOBS`] at a time, the lock
    /// taken for each chunk and the bytes written outside it, while apply
    /// goes on; jobs it changes meanwhile are kept in their frozen form
    /// (see [`State::freeze`]). A persisted snapshot further along the log
    /// is left in place (a slow build must not undo a faster one).
    ///
    /// The snapshot returned carries the meta only: openraft 0.9 keeps
    /// nothing else of a built snapshot, and sends followers what
    /// [`RaftStateMachine::get_current_snapshot`] reads from the file.
    async fn build(&self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let mut current = self.snapshot_write.lock().await;
        self.failpoint.check()?;
        let persisted = current.as_ref().and_then(|meta| meta.last_log_id);
        let store = self.clone();
        let (meta, stats) =
            tokio::task::spawn_blocking(move || store.write_snapshot_file(persisted))
                .await
                .map_err(|e| StorageError::Sled(sled::Error::Io(std::io::Error::other(e))))??;
        match stats {
            Some(stats) => {
                *current = Some(meta.clone());
                *self.last_build.lock().unwrap_or_else(PoisonError::into_inner) = Some(stats);
                // The file supersedes a snapshot kept in sled by an older
                // version; dropping that one needs no flush (the file is
                // read first).
                if !self.legacy_snapshots.is_empty() {
                    self.legacy_snapshots.clear()?;
                }
                tracing::info!(snapshot_id = %meta.snapshot_id, bytes = stats.bytes,
                    jobs = stats.jobs,
                    lock_hold_longest_us = stats.longest_lock_hold.as_micros() as u64,
                    lock_hold_longest_cpu_us =
                        stats.longest_lock_hold_cpu.map(|cpu| cpu.as_micros() as u64),
                    "snapshot persisted");
            }
            None => {
                let kept = current.as_ref().map(|meta| meta.snapshot_id.as_str()).unwrap_or("");
                tracing::info!(kept, dropped = %meta.snapshot_id,
                    "a newer snapshot is already persisted");
            }
        }
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::in_memory(Vec::new())) })
    }

    /// The blocking half of [`StateMachineStore::build`]: freezes the
    /// state, and unless `persisted` is further along, streams it into the
    /// snapshot file. Returns the meta, and the build's figures when the
    /// file was written.
    fn write_snapshot_file(
        &self,
        persisted: Option<LogId<NodeId>>,
    ) -> Result<(Meta, Option<SnapshotBuildStats>), StorageError> {
        // A hold is timed from when the lock is taken, not from when it was
        // asked for: waiting for an apply to finish is no hold.
        let mut longest = HoldTimes::default();
        let (last_applied, last_membership, head, tail) = {
            let mut applied = self.applied.write().map_err(|_| StorageError::Poisoned)?;
            let hold = Hold::start();
            let (head, tail) = applied.state.freeze();
            longest.add(hold);
            (applied.last_applied, applied.last_membership.clone(), head, tail)
        };
        // Whatever happens below, the state stops keeping jobs for this view.
        let _thaw = Thaw { applied: &self.applied, ticket: head.ticket };
        // sled's id generator survives restarts, so a snapshot id is never
        // reused even for the same log position.
        let serial = self.db.generate_id()?;
        let position = match &last_applied {
            Some(log_id) => format!("{}-{}", log_id.leader_id.term, log_id.index),
            None => "empty".to_string(),
        };
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: last_membership.clone(),
            snapshot_id: format!("{position}-{serial}"),
        };
        if persisted > meta.last_log_id {
            return Ok((meta, None));
        }
        let meta_bytes = encode("snapshot meta", &meta)?;
        let (jobs, bytes) = durable::replace_file_with(&self.dir, SNAPSHOT_FILE, |file| {
            let io = |source| StorageError::Io {
                what: "write",
                path: self.dir.join(SNAPSHOT_FILE),
                source,
            };
            write_snapshot_file_with(file, &meta_bytes, io, |file| {
                // The body, field by field: what encoding a `SnapshotBodyRef`
                // writes (bincode puts a struct's fields, and a map's length
                // and entries, one after another).
                let head_bytes = encode(
                    "snapshot",
                    &(&last_applied, &last_membership, &head.counters, &head.job_count),
                )?;
                file.write_all(&head_bytes).map_err(io)?;
                let mut bytes = head_bytes.len() as u64;
                let (jobs, holds) =
                    self.stream_frozen_jobs("snapshot", head.ticket, |chunk| {
                        bytes = bytes.saturating_add(chunk.len() as u64);
                        file.write_all(chunk).map_err(io)
                    })??;
                longest.merge(holds);
                if jobs != head.job_count {
                    return Err(StorageError::Inconsistent {
                        tree: SNAPSHOT_FILE,
                        key: SNAPSHOT_DATA_KEY.to_string(),
                        detail: format!("froze {} jobs but read {jobs}", head.job_count),
                    });
                }
                let tail_bytes = encode("snapshot", &tail)?;
                file.write_all(&tail_bytes).map_err(io)?;
                bytes = bytes.saturating_add(tail_bytes.len() as u64);
                Ok((jobs, bytes))
            })
        })?;
        let stats = SnapshotBuildStats {
            longest_lock_hold: longest.wall,
            longest_lock_hold_cpu: longest.cpu,
            jobs,
            bytes,
        };
        Ok((meta, Some(stats)))
    }

    /// Writes a received snapshot (`meta` and its body) as the current
    /// snapshot file and returns once both are on stable storage. A body in
    /// a received file is copied across, never read into memory.
    async fn persist_received(&self, meta: &Meta, body: ReceivedBody) -> Result<(), StorageError> {
        let mut current = self.snapshot_write.lock().await;
        self.failpoint.check()?;
        let meta_bytes = encode("snapshot meta", meta)?;
        let dir = self.dir.clone();
        let length = tokio::task::spawn_blocking(move || {
            let path = dir.join(SNAPSHOT_FILE);
            durable::replace_file_with(&dir, SNAPSHOT_FILE, |file| {
                let io = |source| StorageError::Io { what: "write", path: path.clone(), source };
                write_snapshot_file_with(file, &meta_bytes, io, |file| match body {
                    ReceivedBody::Bytes(bytes) => {
                        file.write_all(&bytes).map_err(io)?;
                        Ok(bytes.len() as u64)
                    }
                    ReceivedBody::File(mut received) => {
                        let from = received
                            .path()
                            .map_or_else(|| dir.join(SNAPSHOT_FILE), std::path::Path::to_path_buf);
                        let read = |source| StorageError::Io { what: "read", path: from, source };
                        let base = received.base();
                        received.file().seek(SeekFrom::Start(base)).map_err(read)?;
                        // In large reads: through the checksum, the copy
                        // no longer takes the file-to-file fast path.
                        let mut reader = BufReader::with_capacity(1 << 20, received.file());
                        std::io::copy(&mut reader, file).map_err(io)
                    }
                })
            })
        })
        .await
        .map_err(|e| StorageError::Sled(sled::Error::Io(std::io::Error::other(e))))??;
        *current = Some(meta.clone());
        if !self.legacy_snapshots.is_empty() {
            self.legacy_snapshots.clear()?;
        }
        tracing::info!(snapshot_id = %meta.snapshot_id, bytes = length, "snapshot persisted");
        Ok(())
    }

    /// Installs a received snapshot: decodes and checks it, persists it,
    /// then replaces the state with it.
    async fn install(&self, meta: &Meta, received: Received) -> Result<(), StorageError> {
        let (body, received) = match received {
            Received::Memory(bytes) => {
                (SnapshotBody::decode_for(meta, &bytes)?, ReceivedBody::Bytes(bytes))
            }
            Received::File(mut file) => {
                let for_meta = meta.clone();
                let path =
                    file.path().map_or_else(|| self.dir.join(SNAPSHOT_FILE), Path::to_path_buf);
                tokio::task::spawn_blocking(move || {
                    let stat = |source| StorageError::Io { what: "stat", path, source };
                    let len = file.file().metadata().map_err(stat)?.len();
                    let len = len.saturating_sub(file.base());
                    let body = SnapshotBody::read_for(&for_meta, file.file(), len)?;
                    Ok::<_, StorageError>((body, ReceivedBody::File(file)))
                })
                .await
                .map_err(|e| StorageError::Sled(sled::Error::Io(std::io::Error::other(e))))??
            }
        };
        // Persist first: once the in-memory state moves, openraft may purge
        // the log the snapshot covers, and a restart must find the snapshot.
        self.persist_received(meta, received).await?;
        let index = index_of(&body.last_applied);
        {
            // The whole state is replaced, so a lock poisoned by an earlier
            // panic holds nothing worth keeping.
            let mut applied = self.applied.write().unwrap_or_else(PoisonError::into_inner);
            *applied = Applied {
                last_applied: body.last_applied,
                last_membership: body.last_membership,
                state: body.state,
            };
            self.applied.clear_poison();
        }
        self.applied_index.send_replace(index);
        tracing::info!(snapshot_id = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }
}

/// Drops a frozen view when the build that made it ends, however it ends.
struct Thaw<'a> {
    applied: &'a RwLock<Applied>,
    ticket: u64,
}

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.applied.write().unwrap_or_else(PoisonError::into_inner).state.thaw(self.ticket);
    }
}

/// The log index of `log_id`, `0` for none.
fn index_of(log_id: &Option<LogId<NodeId>>) -> u64 {
    log_id.as_ref().map_or(0, |log_id| log_id.index)
}

/// The first bytes of a snapshot file (and its format's version): format
/// 2 has a checksum in its header.
const SNAPSHOT_MAGIC: &[u8; 8] = b"LHSNAP02";
/// The first bytes of a snapshot file of format 1, without a checksum
/// (written by earlier versions; still read).
const SNAPSHOT_MAGIC_V1: &[u8; 8] = b"LHSNAP01";
/// Where the checksum is in a format-2 header: after the magic and the
/// meta's length.
const CHECKSUM_AT: u64 = 16;
/// The length of a format-2 header: magic, meta length (`u64`), checksum
/// (`u32`).
const HEADER_V2: u64 = CHECKSUM_AT + 4;

/// Writes a whole snapshot file: its header (the magic, the encoded meta's
/// length as a little-endian `u64`, and a CRC-32 of everything after the
/// header, little-endian `u32`), the encoded meta, then the body, which
/// `body` writes and which runs to the end. The checksum is filled in once
/// the body is written; the caller syncs the file after.
fn write_snapshot_file_with<F, T>(
    file: &mut F,
    meta: &[u8],
    io: impl Fn(std::io::Error) -> StorageError,
    body: impl FnOnce(&mut Checksummed<'_, F>) -> Result<T, StorageError>,
) -> Result<T, StorageError>
where
    F: Write + Seek,
{
    file.write_all(SNAPSHOT_MAGIC).map_err(&io)?;
    file.write_all(&(meta.len() as u64).to_le_bytes()).map_err(&io)?;
    file.write_all(&[0; 4]).map_err(&io)?;
    let mut summed = Checksummed { inner: file, hasher: crc32fast::Hasher::new() };
    summed.write_all(meta).map_err(&io)?;
    let written = body(&mut summed)?;
    let checksum = summed.hasher.finalize();
    let end = file.stream_position().map_err(&io)?;
    file.seek(SeekFrom::Start(CHECKSUM_AT)).map_err(&io)?;
    file.write_all(&checksum.to_le_bytes()).map_err(&io)?;
    file.seek(SeekFrom::Start(end)).map_err(&io)?;
    Ok(written)
}

/// A writer that keeps a CRC-32 of what passes through it.
struct Checksummed<'a, W> {
    inner: &'a mut W,
    hasher: crc32fast::Hasher,
}

impl<W: Write> Write for Checksummed<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The CRC-32 of `file` from `from` to its end.
fn checksum_from(file: &mut File, from: u64) -> std::io::Result<u32> {
    file.seek(SeekFrom::Start(from))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buffer[..read]);
    }
}

/// The persisted snapshot: its meta and where its body is (the snapshot
/// file, else the tree an older version kept it in), if there is one. A
/// file whose snapshot id is `trusted` (this process wrote it, or checked
/// it when it started) is not read whole again for its checksum.
fn read_stored_snapshot(
    dir: &Path,
    legacy: &sled::Tree,
    trusted: Option<&str>,
) -> Result<Option<(Meta, StoredBody)>, StorageError> {
    if let Some((meta, file, base, len)) = open_snapshot_file(dir, trusted)? {
        return Ok(Some((meta, StoredBody::File { file, base, len })));
    }
    Ok(read_legacy_snapshot(legacy)?.map(|(meta, bytes)| (meta, StoredBody::Legacy(bytes))))
}

/// The snapshot file, if one was ever written: its meta, and the file
/// positioned at the body, which starts at `base` and is `len` bytes long.
/// The whole file is read once to check its checksum, unless its snapshot
/// id is `trusted` (a file of format 1 has none: only its header and meta
/// are read). Sending a snapshot asks for the file from openraft's
/// state-machine task, which applies nothing meanwhile: the file this
/// process wrote, or checked at start, is not read whole each time.
fn open_snapshot_file(
    dir: &Path,
    trusted: Option<&str>,
) -> Result<Option<(Meta, File, u64, u64)>, StorageError> {
    let path = dir.join(SNAPSHOT_FILE);
    let mut file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StorageError::Io { what: "open", path, source }),
    };
    let io = |source| StorageError::Io { what: "read", path: path.clone(), source };
    let damaged = |detail: &str| StorageError::Inconsistent {
        tree: SNAPSHOT_FILE,
        key: "header".to_string(),
        detail: detail.to_string(),
    };
    let file_len = file.metadata().map_err(io)?.len();
    let mut head = [0u8; HEADER_V2 as usize];
    let magic = SNAPSHOT_MAGIC.len();
    if file_len < CHECKSUM_AT {
        return Err(damaged("not a snapshot file (bad magic)"));
    }
    file.read_exact(&mut head[..CHECKSUM_AT as usize]).map_err(io)?;
    let checked = if &head[..magic] == SNAPSHOT_MAGIC {
        true
    } else if &head[..magic] == SNAPSHOT_MAGIC_V1 {
        false
    } else {
        return Err(damaged("not a snapshot file (bad magic)"));
    };
    let header = if checked { HEADER_V2 } else { CHECKSUM_AT };
    if file_len < header {
        return Err(damaged("header cut short"));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&head[magic..CHECKSUM_AT as usize]);
    let meta_len = u64::from_le_bytes(length);
    if meta_len > file_len - header {
        return Err(damaged("meta length past the end of the file"));
    }
    if checked {
        file.read_exact(&mut head[CHECKSUM_AT as usize..]).map_err(io)?;
    }
    let meta: Result<Meta, StorageError> =
        decode_from(SNAPSHOT_FILE, "meta", &mut Read::by_ref(&mut file).take(meta_len), meta_len);
    // A meta that does not decode is checked too, so damage is named as
    // such.
    let verify = meta.as_ref().map_or(true, |meta| trusted != Some(meta.snapshot_id.as_str()));
    if checked && verify {
        let mut stored = [0u8; 4];
        stored.copy_from_slice(&head[CHECKSUM_AT as usize..]);
        let stored = u32::from_le_bytes(stored);
        let actual = checksum_from(&mut file, header).map_err(io)?;
        if actual != stored {
            return Err(damaged(&format!(
                "checksum {actual:08x} where the header says {stored:08x}: the file is damaged"
            )));
        }
    }
    let meta = meta?;
    let base = header + meta_len;
    file.seek(SeekFrom::Start(base)).map_err(io)?;
    Ok(Some((meta, file, base, file_len - base)))
}

/// Removes what snapshot receives and builds a process left behind (a
/// receive ends with its file removed, or copied and removed, and a build
/// with its temporary file renamed or removed; a crash leaves them).
fn remove_received_files(dir: &Path) -> Result<(), StorageError> {
    let io = |what| move |source| StorageError::Io { what, path: dir.to_path_buf(), source };
    let built = format!("{SNAPSHOT_FILE}.tmp");
    for entry in std::fs::read_dir(dir).map_err(io("read"))? {
        let entry = entry.map_err(io("read"))?;
        let name = entry.file_name();
        if name.to_str().is_some_and(|name| name.starts_with(RECEIVING_PREFIX) || name == built) {
            std::fs::remove_file(entry.path()).map_err(io("remove"))?;
        }
    }
    Ok(())
}

/// The name of a snapshot being received starts with this, followed by a
/// number never used before in the data directory.
const RECEIVING_PREFIX: &str = "snapshot.receiving.";

/// The snapshot an older version kept in sled, if any.
fn read_legacy_snapshot(snapshots: &sled::Tree) -> Result<Option<(Meta, Vec<u8>)>, StorageError> {
    let meta = snapshots.get(SNAPSHOT_META_KEY)?;
    let bytes = snapshots.get(SNAPSHOT_DATA_KEY)?;
    match (meta, bytes) {
        (None, None) => Ok(None),
        (Some(meta), Some(bytes)) => {
            let meta: Meta = decode(SNAPSHOT_TREE, SNAPSHOT_META_KEY, &meta)?;
            Ok(Some((meta, bytes.to_vec())))
        }
        // Both halves were written in one batch: one without the other
        // means the tree was damaged.
        (meta, _) => Err(StorageError::Inconsistent {
            tree: SNAPSHOT_TREE,
            key: if meta.is_some() { SNAPSHOT_DATA_KEY } else { SNAPSHOT_META_KEY }.to_string(),
            detail: "missing while the other half of the snapshot is present".to_string(),
        }),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, RaftStorageError<NodeId>> {
        self.build().await.map_err(|error| StorageIOError::write_snapshot(None, &error).into())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), RaftStorageError<NodeId>> {
        let applied = self.lock_read();
        Ok((applied.last_applied, applied.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, RaftStorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_entries(entries)
            .map_err(|error| StorageIOError::write_state_machine(&error).into())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<SnapshotData>, RaftStorageError<NodeId>> {
        let receive =
            async {
                let serial = self.db.generate_id()?;
                let path = self.dir.join(format!("{RECEIVING_PREFIX}{serial}"));
                SnapshotData::receive_into_file(path.clone())
                    .await
                    .map_err(|source| StorageError::Io { what: "create", path, source })
            };
        match receive.await {
            Ok(data) => Ok(Box::new(data)),
            Err(error) => Err(StorageIOError::write_snapshot(None, &error).into()),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), RaftStorageError<NodeId>> {
        let install = async {
            let received = snapshot.finish().await.map_err(|source| StorageError::Io {
                what: "write",
                path: self.dir.join(RECEIVING_PREFIX),
                source,
            })?;
            self.install(meta, received).await
        };
        install
            .await
            .map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error).into())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError<NodeId>> {
        // Under the writer's lock, so a write in progress is not read half
        // done (the file is replaced by rename, but the legacy tree is not).
        let writer = self.snapshot_write.lock().await;
        let trusted = writer.as_ref().map(|meta| meta.snapshot_id.clone());
        let dir = self.dir.clone();
        let legacy = self.legacy_snapshots.clone();
        let read = |error: StorageError| {
            RaftStorageError::from(StorageIOError::read_snapshot(None, &error))
        };
        let stored = tokio::task::spawn_blocking(move || {
            read_stored_snapshot(&dir, &legacy, trusted.as_deref())
        })
        .await
        .map_err(|e| StorageError::Sled(sled::Error::Io(std::io::Error::other(e))))
        .and_then(|read| read)
        .map_err(read)?;
        let Some((meta, stored)) = stored else {
            return Ok(None);
        };
        // Sent from the file a chunk at a time: the file is replaced by
        // rename, so a newer snapshot written meanwhile leaves this one's
        // bytes readable to the end.
        let data = match stored {
            StoredBody::File { file, base, .. } => SnapshotData::file_to_send(file, base)
                .await
                .map_err(|source| StorageError::Io {
                    what: "read",
                    path: self.dir.join(SNAPSHOT_FILE),
                    source,
                })
                .map_err(read)?,
            StoredBody::Legacy(bytes) => SnapshotData::in_memory(bytes),
        };
        Ok(Some(Snapshot { meta, snapshot: Box::new(data) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The snapshot file's meta and body bytes, if one was ever written.
    fn read_snapshot_file(dir: &Path) -> Result<Option<(Meta, Vec<u8>)>, StorageError> {
        let Some((meta, mut file, _, len)) = open_snapshot_file(dir, None)? else {
            return Ok(None);
        };
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(|source| StorageError::Io {
            what: "read",
            path: dir.join(SNAPSHOT_FILE),
            source,
        })?;
        Ok(Some((meta, bytes)))
    }

    /// Opens the stores in `dir`, waiting up to ten seconds for a database
    /// this process just dropped: sled's background threads may hold its
    /// file lock a moment after the last handle goes.
    fn open_again(dir: &Path) -> Result<StateMachineStore, StorageError> {
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            match crate::open(dir) {
                Ok((_, store)) => return Ok(store),
                Err(StorageError::Sled(_)) if Instant::now() < give_up => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn write_snapshot_file_parts(
        file: &mut Vec<u8>,
        meta: &[u8],
        bytes: &[u8],
    ) -> Result<(), StorageError> {
        let io = |source| StorageError::Io { what: "write", path: PathBuf::new(), source };
        let mut cursor = std::io::Cursor::new(std::mem::take(file));
        write_snapshot_file_with(&mut cursor, meta, io, |body| body.write_all(bytes).map_err(io))?;
        *file = cursor.into_inner();
        Ok(())
    }

    #[test]
    fn a_snapshot_of_the_layout_before_the_request_log_still_reads() {
        let last_applied = Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 9));
        let last_membership = Membership::default();
        let mut state = State::new();
        let enqueue = leasehold_core::Command::Enqueue {
            jobs: vec![leasehold_core::JobSpec { queue: "q".into(), ..Default::default() }],
        };
        state.apply(1, &leasehold_core::Proposal { now_ms: 1_000, command: enqueue });
        let bytes = encode(
            "snapshot",
            &SnapshotBodyRef {
                last_applied: &last_applied,
                last_membership: &last_membership,
                state: &state,
            },
        )
        .expect("encodes");
        // The request log is the state's last field, and the body's: empty,
        // it is two zero lengths (16 bytes). Without them this is the old
        // layout, byte for byte.
        assert!(bytes.ends_with(&[0u8; 16]));
        let old = &bytes[..bytes.len() - 16];
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: last_membership.clone(),
            snapshot_id: "old".to_string(),
        };
        let body = SnapshotBody::decode_for(&meta, old).expect("the old layout decodes");
        assert_eq!(body.state, state);
        let garbage = [old, &[1, 2, 3]].concat();
        assert!(SnapshotBody::decode_for(&meta, &garbage).is_err(), "neither layout: an error");
    }

    #[test]
    fn borrowed_and_owned_snapshot_bodies_share_one_encoding() {
        let last_applied = Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 9));
        let last_membership = Membership::default();
        let state = State::new();
        let bytes = encode(
            "snapshot",
            &SnapshotBodyRef {
                last_applied: &last_applied,
                last_membership: &last_membership,
                state: &state,
            },
        )
        .expect("encodes");
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: last_membership.clone(),
            snapshot_id: "test".to_string(),
        };
        let body = SnapshotBody::decode_for(&meta, &bytes).expect("decodes");
        assert_eq!(body.last_applied, last_applied);
        assert_eq!(body.last_membership, last_membership);
        assert_eq!(body.state, state);

        let elsewhere = Meta { last_log_id: None, ..meta };
        let err = SnapshotBody::decode_for(&elsewhere, &bytes).err();
        assert!(matches!(err, Some(StorageError::Inconsistent { .. })), "{err:?}");
    }

    /// A state with one job, as a snapshot body at log index 9, and its meta.
    fn one_job_snapshot(id: &str) -> (State, Meta, Vec<u8>) {
        let last_applied = Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 9));
        let last_membership = Membership::default();
        let mut state = State::new();
        let enqueue = leasehold_core::Command::Enqueue {
            jobs: vec![leasehold_core::JobSpec { queue: "q".into(), ..Default::default() }],
        };
        state.apply(1, &leasehold_core::Proposal { now_ms: 1_000, command: enqueue });
        let body = SnapshotBodyRef {
            last_applied: &last_applied,
            last_membership: &last_membership,
            state: &state,
        };
        let bytes = encode("snapshot", &body).expect("encodes");
        let meta = Meta { last_log_id: last_applied, last_membership, snapshot_id: id.into() };
        (state, meta, bytes)
    }

    #[tokio::test]
    async fn a_snapshot_kept_in_sled_by_an_older_version_loads_until_a_file_replaces_it()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (state, meta, bytes) = one_job_snapshot("legacy");
        {
            let db = sled::Config::new().path(dir.path()).open()?;
            let tree = db.open_tree(SNAPSHOT_TREE)?;
            tree.insert(SNAPSHOT_META_KEY, encode("meta", &meta)?)?;
            tree.insert(SNAPSHOT_DATA_KEY, bytes)?;
            // Such a version kept its vote in sled too (migrated on open):
            // a directory holding a snapshot and no log is refused.
            let vote = openraft::Vote::new(1, 1_u64);
            db.open_tree(crate::layout::META_TREE)?
                .insert(crate::layout::VOTE_KEY, encode("vote", &vote)?)?;
            db.flush()?;
        }
        let mut store = open_again(dir.path())?;
        assert_eq!(store.read(|s| s.clone()), state, "loaded from the sled tree");
        let current = store.get_current_snapshot().await?.map(|snapshot| snapshot.meta);
        assert_eq!(current.map(|m| m.snapshot_id), Some("legacy".to_string()));
        assert!(!dir.path().join(SNAPSHOT_FILE).exists());

        let built = store.build().await?;
        assert!(dir.path().join(SNAPSHOT_FILE).exists());
        assert!(store.legacy_snapshots.is_empty(), "the file supersedes the tree");
        drop(store);
        let mut store = open_again(dir.path())?;
        assert_eq!(store.read(|s| s.clone()), state, "loaded from the file");
        let current = store.get_current_snapshot().await?.map(|snapshot| snapshot.meta);
        assert_eq!(current, Some(built.meta));
        Ok(())
    }

    /// Entry `index` of a test log, carrying `command`.
    fn entry(index: u64, command: leasehold_core::Command) -> Entry<TypeConfig> {
        let proposal = leasehold_core::Proposal { now_ms: 1_000 + index, command };
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(proposal),
        }
    }

    /// Enqueues, and claims that change jobs already enqueued.
    fn commands(count: usize) -> Vec<leasehold_core::Command> {
        use leasehold_core::{Command, JobSpec};
        (0..count)
            .map(|i| match i {
                0..5 => Command::Enqueue {
                    jobs: (0..1_000)
                        .map(|n| JobSpec {
                            queue: format!("q{}", n % 3),
                            payload: vec![7; 64],
                            ..JobSpec::default()
                        })
                        .collect(),
                },
                _ if i % 2 == 0 => Command::Claim {
                    worker: "w".into(),
                    queue: format!("q{}", i % 3),
                    max: 40,
                    lease_ttl_ms: None,
                    selector: vec![],
                },
                _ => Command::Enqueue {
                    jobs: vec![JobSpec { queue: "q0".into(), ..JobSpec::default() }],
                },
            })
            .collect()
    }

    #[test]
    fn a_hold_counts_on_cpu_time_apart_from_time_off_the_cpu() -> anyhow::Result<()> {
        let mut times = HoldTimes::default();
        let hold = Hold::start();
        // Off the CPU, as a builder descheduled while it holds the lock.
        std::thread::sleep(Duration::from_millis(50));
        times.add(hold);
        let cpu = times.cpu.ok_or_else(|| anyhow::anyhow!("no CPU time"))?;
        assert!(times.wall >= Duration::from_millis(50), "wall {:?}", times.wall);
        assert!(cpu < Duration::from_millis(10), "{cpu:?} on CPU for a 50 ms sleep");

        // A busy hold: its CPU time is counted (spinning until the thread's
        // own clock has moved 5 ms, however contended the machine is).
        let hold = Hold::start();
        let from = thread_cpu_time().ok_or_else(|| anyhow::anyhow!("no CPU clock"))?;
        let give_up = Instant::now() + Duration::from_secs(10);
        let mut sum = 0u64;
        while thread_cpu_time().is_some_and(|now| now < from + Duration::from_millis(5))
            && Instant::now() < give_up
        {
            sum = std::hint::black_box(sum.wrapping_add(1));
        }
        times.add(hold);
        let cpu = times.cpu.ok_or_else(|| anyhow::anyhow!("no CPU time"))?;
        assert!(cpu >= Duration::from_millis(5), "{cpu:?} on CPU for 5 ms of spinning");
        assert!(times.wall >= Duration::from_millis(50), "the longest wall hold is kept");
        Ok(())
    }

    /// A thread applying entries.
    type Applying = std::thread::JoinHandle<Result<(), StorageError>>;

    /// The test log of [`commands`]`(400)`: its first five entries (5,000
    /// jobs) applied now, the rest one at a time on a thread.
    fn apply_while_reading(
        store: &StateMachineStore,
    ) -> anyhow::Result<(Vec<Entry<TypeConfig>>, Applying)> {
        let entries: Vec<_> =
            commands(400).into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c)).collect();
        store.apply_entries(entries[..5].to_vec())?;
        let applier = store.clone();
        let rest = entries[5..].to_vec();
        let applying = std::thread::spawn(move || {
            for entry in rest {
                applier.apply_entries([entry])?;
            }
            Ok(())
        });
        Ok((entries, applying))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_built_while_entries_apply_is_the_state_at_its_log_id() -> anyhow::Result<()>
    {
        let dir = tempfile::tempdir()?;
        let (_, store) = crate::open(dir.path())?;
        let (entries, applying) = apply_while_reading(&store)?;
        let built = store.build().await?;
        applying.join().map_err(|_| anyhow::anyhow!("the applier panicked"))??;
        let stats = store.last_snapshot_build().ok_or_else(|| anyhow::anyhow!("no stats"))?;
        assert!(stats.jobs >= 5_000, "{stats:?}");
        // The build's CPU time inside a hold is measured on Linux, and one
        // thread cannot spend more CPU than wall time (1 ms of slack for the
        // two clocks' granularity).
        let cpu = stats.longest_lock_hold_cpu.ok_or_else(|| anyhow::anyhow!("no CPU time"))?;
        assert!(
            !cpu.is_zero() && cpu <= stats.longest_lock_hold + Duration::from_millis(1),
            "{stats:?}"
        );

        let (meta, bytes) =
            read_snapshot_file(dir.path())?.ok_or_else(|| anyhow::anyhow!("file"))?;
        assert_eq!(meta, built.meta);
        assert_eq!(stats.bytes, bytes.len() as u64);
        let body = SnapshotBody::decode_for(&meta, &bytes)?;
        let at = index_of(&body.last_applied);
        let mut expected = State::new();
        for entry in &entries[..at as usize] {
            if let openraft::EntryPayload::Normal(proposal) = &entry.payload {
                expected.apply(1, proposal);
            }
        }
        assert_eq!(body.state, expected, "the snapshot is the state at index {at}");
        assert_eq!(body.state.check_invariants(), Ok(()));
        // And byte for byte what encoding that state whole gives.
        let whole = encode(
            "snapshot",
            &SnapshotBodyRef {
                last_applied: &body.last_applied,
                last_membership: &body.last_membership,
                state: &expected,
            },
        )?;
        assert_eq!(whole, bytes);
        assert_eq!(store.read(State::frozen_kept), 0, "the view is dropped after the build");
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_digest_taken_while_entries_apply_is_the_digest_of_the_state_at_its_index()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (_, store) = crate::open(dir.path())?;
        assert_eq!(
            store.recent_digest().await?,
            Some(StateDigest { index: 0, digest: digest(&State::new()) })
        );
        let (entries, applying) = apply_while_reading(&store)?;
        // Taken once the applier is under way, so entries apply during it.
        let give_up = Instant::now() + Duration::from_secs(10);
        while store.last_applied_index() < 10 && Instant::now() < give_up {
            std::thread::yield_now();
        }
        // The first digest's cool-down (nine times what it took, longer on
        // a loaded machine) answers it again for a while: ask until a new
        // one is taken.
        let taken = loop {
            let taken = store.recent_digest().await?.ok_or_else(|| anyhow::anyhow!("no digest"))?;
            if taken.index >= 5 || Instant::now() >= give_up {
                break taken;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        applying.join().map_err(|_| anyhow::anyhow!("the applier panicked"))??;
        let mut expected = State::new();
        for entry in &entries[..usize::try_from(taken.index)?] {
            if let openraft::EntryPayload::Normal(proposal) = &entry.payload {
                expected.apply(1, proposal);
            }
        }
        assert!(taken.index >= 5, "{taken:?}");
        assert_eq!(taken.digest, digest(&expected), "the digest of the state at {}", taken.index);
        assert_eq!(store.read(State::frozen_kept), 0, "the view is dropped after the digest");

        // Every entry applied and the cool-down over: a digest of the
        // whole log, and it is the one taken again while nothing applies.
        let last = entries.len() as u64;
        let give_up = Instant::now() + Duration::from_secs(10);
        let now = loop {
            let now = store.recent_digest().await?.ok_or_else(|| anyhow::anyhow!("no digest"))?;
            if now.index == last || Instant::now() > give_up {
                break now;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(now, StateDigest { index: last, digest: store.digest() });
        assert_eq!(store.recent_digest().await?, Some(now));
        Ok(())
    }

    #[test]
    fn a_damaged_snapshot_file_is_an_error_naming_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (_, meta, bytes) = one_job_snapshot("file");
        let mut file = Vec::new();
        write_snapshot_file_parts(&mut file, &encode("meta", &meta)?, &bytes)?;
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &file)?;
        let read = read_snapshot_file(dir.path())?;
        assert_eq!(read, Some((meta.clone(), bytes)));
        for damaged in [&b"LHSNAP0"[..], &file[1..], &file[..20], &file[..30]] {
            std::fs::write(dir.path().join(SNAPSHOT_FILE), damaged)?;
            let error = read_snapshot_file(dir.path()).expect_err("damaged");
            assert!(error.to_string().contains("`snapshot`"), "{error}");
        }
        // One bit flipped anywhere after the header, in the meta or the
        // body, is caught by the checksum, whether or not it still decodes.
        for at in [HEADER_V2 as usize, file.len() / 2, file.len() - 1] {
            let mut flipped = file.clone();
            flipped[at] ^= 0x10;
            std::fs::write(dir.path().join(SNAPSHOT_FILE), &flipped)?;
            let error = read_snapshot_file(dir.path()).expect_err("a flipped bit");
            assert!(error.to_string().contains("checksum"), "byte {at}: {error}");
        }
        // The file this process wrote or checked (named by its snapshot
        // id) is not read whole again: a flipped body byte goes unseen.
        let mut flipped = file.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x10;
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &flipped)?;
        assert!(open_snapshot_file(dir.path(), Some(&meta.snapshot_id))?.is_some());
        assert!(open_snapshot_file(dir.path(), Some("another")).is_err());
        Ok(())
    }

    /// A snapshot file of format 1 (no checksum), as earlier versions wrote
    /// it, still reads.
    #[test]
    fn a_snapshot_file_without_a_checksum_still_reads() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (_, meta, bytes) = one_job_snapshot("old file");
        let meta_bytes = encode("meta", &meta)?;
        let mut file = SNAPSHOT_MAGIC_V1.to_vec();
        file.extend((meta_bytes.len() as u64).to_le_bytes());
        file.extend(&meta_bytes);
        file.extend(&bytes);
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &file)?;
        assert_eq!(read_snapshot_file(dir.path())?, Some((meta, bytes)));
        Ok(())
    }
}
