//! One node's simulated disk: a durable image, a volatile image, and the
//! unsynced writes between them.
//!
//! The model is a single ordered write stream, as a log file is: every
//! write is applied at once to the volatile image (what the running process
//! reads) and queued; a sync applies the queue to the durable image. A
//! crash replaces the volatile image by the durable one, after optionally
//! letting an in-order prefix of the queue through, its last write torn.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_raft::{NodeId, TypeConfig};
use openraft::{BasicNode, Entry, LogId, SnapshotMeta, Vote};
use tokio::sync::watch;

use crate::SimDiskError;
use crate::bugs::Bug;
use crate::log_store::SimLogStore;
use crate::state_machine::SimStateMachine;

/// Snapshot meta for leasehold's type config.
pub(crate) type Meta = SnapshotMeta<NodeId, BasicNode>;

/// A persisted snapshot: its meta and its encoded body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: Meta,
    pub(crate) bytes: Vec<u8>,
}

/// Everything a node keeps on disk.
#[derive(Clone, Debug, Default)]
pub(crate) struct Image {
    pub(crate) log: BTreeMap<u64, Entry<TypeConfig>>,
    pub(crate) vote: Option<Vote<NodeId>>,
    pub(crate) committed: Option<LogId<NodeId>>,
    pub(crate) last_purged: Option<LogId<NodeId>>,
    pub(crate) snapshot: Option<StoredSnapshot>,
}

/// One write to the disk.
#[derive(Clone, Debug)]
pub(crate) enum Write {
    /// Log entries, in index order (replacing any at the same index).
    Append(Vec<Entry<TypeConfig>>),
    Vote(Vote<NodeId>),
    Committed(Option<LogId<NodeId>>),
    /// Deletes the entries at this index and after.
    TruncateFrom(u64),
    /// Deletes the entries up to and including this log id.
    PurgeUpTo(LogId<NodeId>),
    Snapshot(StoredSnapshot),
}

impl Image {
    fn apply(&mut self, write: Write) {
        match write {
            Write::Append(entries) => {
                for entry in entries {
                    self.log.insert(entry.log_id.index, entry);
                }
            }
            Write::Vote(vote) => self.vote = Some(vote),
            Write::Committed(committed) => self.committed = committed,
            Write::TruncateFrom(index) => {
                self.log.split_off(&index);
            }
            Write::PurgeUpTo(log_id) => {
                self.log = self.log.split_off(&(log_id.index + 1));
                self.last_purged = Some(log_id);
            }
            Write::Snapshot(snapshot) => self.snapshot = Some(snapshot),
        }
    }
}

/// How a crash treats the writes not yet synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// Every write after the last sync is lost.
    LoseUnsynced,
    /// The first `whole_writes` unsynced writes reached the disk, and of the
    /// one after them, if it is an append, its first `torn_entries` entries
    /// (a write of another kind is atomic: a torn one is lost). The rest is
    /// lost. Counts past the end of the queue keep everything.
    Torn {
        /// Unsynced writes that reached the disk whole.
        whole_writes: usize,
        /// Entries of the next append that reached it.
        torn_entries: usize,
    },
}

#[derive(Debug, Default)]
struct Inner {
    durable: Image,
    volatile: Image,
    /// Unsynced writes with their sequence numbers, oldest first.
    unsynced: VecDeque<(u64, Write)>,
    next_sequence: u64,
    /// Bumped by every open and crash; handles of an older life are stale.
    life: u64,
    /// Never reset, like sled's id generator: snapshot ids stay unique
    /// across lives.
    next_serial: u64,
    sync_delay: Duration,
    syncs: u64,
    /// Bug classes planted in the stores of this disk (see [`Bug`]).
    planted: BTreeSet<Bug>,
}

/// One node's simulated disk. Cheap to clone; clones are the same disk.
#[derive(Clone, Debug)]
pub struct SimDisk {
    inner: Arc<Mutex<Inner>>,
    /// The current life, so that a sync under way ends when its life does.
    lives: Arc<watch::Sender<u64>>,
}

impl Default for SimDisk {
    fn default() -> SimDisk {
        SimDisk { inner: Arc::default(), lives: Arc::new(watch::channel(0).0) }
    }
}

impl SimDisk {
    /// An empty disk whose syncs complete at once.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// An empty disk whose every sync takes `delay` (on the tokio clock, so
    /// a simulation's paused clock decides when it completes). A crash
    /// during the delay loses what the sync would have made durable.
    pub fn with_sync_delay(delay: Duration) -> SimDisk {
        let disk = SimDisk::default();
        disk.lock().sync_delay = delay;
        disk
    }

    /// Starts a new life of the node on this disk: its two stores, reading
    /// what the disk holds now (everything written, if the last life ended
    /// without a crash; what was synced, after [`SimDisk::crash`]). Handles
    /// of earlier lives turn stale. Must be called within a tokio runtime
    /// (the log store's flusher is a task).
    pub fn open(&self) -> (SimLogStore, SimStateMachine) {
        let life = {
            let mut inner = self.lock();
            inner.life += 1;
            self.lives.send_replace(inner.life);
            inner.life
        };
        (SimLogStore::open(self.clone(), life), SimStateMachine::open(self.clone(), life))
    }

    /// The node's process dies: handles of the current life turn stale and
    /// the unsynced writes are treated as `crash` says.
    pub fn crash(&self, crash: Crash) {
        let mut inner = self.lock();
        inner.life += 1;
        self.lives.send_replace(inner.life);
        let unsynced = std::mem::take(&mut inner.unsynced);
        if let Crash::Torn { whole_writes, torn_entries } = crash {
            let mut writes = unsynced.into_iter().map(|(_, write)| write);
            for write in writes.by_ref().take(whole_writes) {
                inner.durable.apply(write);
            }
            if let Some(Write::Append(mut entries)) = writes.next() {
                entries.truncate(torn_entries);
                inner.durable.apply(Write::Append(entries));
            }
        }
        inner.volatile = inner.durable.clone();
        tracing::debug!(life = inner.life, ?crash, "simulated disk crashed");
    }

    /// Plants `bug` in the stores of every life of this disk from their
    /// next call on; only the store-level bugs ([`Bug::FlushBeforeSync`],
    /// [`Bug::AckWithoutTokenCheck`]) act here.
    pub fn plant(&self, bug: Bug) {
        self.lock().planted.insert(bug);
    }

    /// Whether `bug` is planted.
    pub(crate) fn planted(&self, bug: Bug) -> bool {
        self.lock().planted.contains(&bug)
    }

    /// How many writes are not yet synced.
    pub fn unsynced_writes(&self) -> usize {
        self.lock().unsynced.len()
    }

    /// How many syncs completed, over every life.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Poisoning cannot leave the disk half-updated (every mutation is
    /// complete before a panic could unwind past it), so a poisoned lock is
    /// taken as is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_life<'a>(
        inner: &'a mut MutexGuard<'_, Inner>,
        life: u64,
    ) -> Result<&'a mut Inner, SimDiskError> {
        if inner.life == life {
            Ok(&mut **inner)
        } else {
            Err(SimDiskError::Stale { handle: life, disk: inner.life })
        }
    }

    /// Reads the volatile image (what the process of `life` sees).
    pub(crate) fn read<T>(
        &self,
        life: u64,
        f: impl FnOnce(&Image) -> T,
    ) -> Result<T, SimDiskError> {
        let mut inner = self.lock();
        let inner = Self::check_life(&mut inner, life)?;
        Ok(f(&inner.volatile))
    }

    /// Writes without syncing; returns the write's sequence number.
    pub(crate) fn write(&self, life: u64, write: Write) -> Result<u64, SimDiskError> {
        let mut inner = self.lock();
        let inner = Self::check_life(&mut inner, life)?;
        inner.volatile.apply(write.clone());
        let sequence = inner.next_sequence;
        inner.next_sequence += 1;
        inner.unsynced.push_back((sequence, write));
        Ok(sequence)
    }

    /// A new snapshot serial.
    pub(crate) fn next_serial(&self, life: u64) -> Result<u64, SimDiskError> {
        let mut inner = self.lock();
        let inner = Self::check_life(&mut inner, life)?;
        inner.next_serial += 1;
        Ok(inner.next_serial)
    }

    /// Makes every write up to and including `sequence` durable, after the
    /// disk's sync delay. Fails, making nothing durable, if the life ended
    /// meanwhile.
    pub(crate) async fn sync_through(&self, life: u64, sequence: u64) -> Result<(), SimDiskError> {
        let mut lives = self.lives.subscribe();
        let delay = {
            let mut inner = self.lock();
            Self::check_life(&mut inner, life)?.sync_delay
        };
        if !delay.is_zero() {
            // A crash during the delay ends the sync at once, unfinished.
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = lives.wait_for(|current| *current != life) => {}
            }
        }
        let mut inner = self.lock();
        let inner = Self::check_life(&mut inner, life)?;
        while inner.unsynced.front().is_some_and(|(s, _)| *s <= sequence) {
            if let Some((_, write)) = inner.unsynced.pop_front() {
                inner.durable.apply(write);
            }
        }
        inner.syncs += 1;
        Ok(())
    }

    /// Syncs every write made so far in `life` (the readiness probe's
    /// sync, as the real store's probe has its log writer sync).
    pub(crate) async fn sync_all(&self, life: u64) -> Result<(), SimDiskError> {
        let last = {
            let mut inner = self.lock();
            Self::check_life(&mut inner, life)?.next_sequence.checked_sub(1)
        };
        match last {
            Some(sequence) => self.sync_through(life, sequence).await,
            None => Ok(()),
        }
    }

    /// Writes and syncs: returns once `write` (and every write before it)
    /// is durable.
    pub(crate) async fn write_durably(&self, life: u64, write: Write) -> Result<(), SimDiskError> {
        let sequence = self.write(life, write)?;
        self.sync_through(life, sequence).await
    }
}
