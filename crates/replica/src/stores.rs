//! What the replica runtime uses of a node's stores, as traits: the
//! journal and the services above it read the state, wait on the applied
//! index, ask for the committed index and probe the log's disk, and need
//! nothing else of them; the bus and the peer registry keep their local,
//! unreplicated tables through two more. openraft drives the stores themselves through its
//! own storage traits; these are the other side, the node's reads.
//!
//! The node's stores (`leasehold_storage`) are the implementation every
//! shipped node runs, in this module; the simulation implements the same
//! traits on its simulated disk, so the real [`Journal`](crate::Journal)
//! runs there too.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_core::State;
use leasehold_core::bus::BusRecord;
use leasehold_raft::NodeId;
pub use leasehold_storage::StateDigest;
pub use leasehold_storage::local::KeptAdvert;
use leasehold_storage::local::{BusTable, PeerStore};
use openraft::LogId;
use openraft::storage::RaftLogStorage;
use tokio::sync::watch;

/// Told how long each log append took from its hand-over until synced.
pub type SyncObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// The state under a store's read lock; apply waits while it lives.
pub type StateGuard<'a> = Box<dyn Deref<Target = State> + 'a>;

/// A store's failure as the replica runtime sees it: the store's own error,
/// printed as the store prints it.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(Box<dyn std::error::Error + Send + Sync>);

impl StoreError {
    /// Wraps a store's own error.
    pub fn new(source: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError(Box::new(source))
    }
}

/// FNV-1a 64 over the encoding of `state`: what every store's digest is.
pub fn digest_of(state: &State) -> u64 {
    leasehold_storage::digest(state)
}

/// The Raft log store as the replica runtime uses it: the committed index,
/// the readiness probe, and the timing of its syncs.
pub trait ReplicaLogStore: Send + Sync + 'static {
    /// The committed log id this store last recorded (`None` before any).
    fn read_committed(&self) -> BoxFuture<'_, Result<Option<LogId<NodeId>>, StoreError>>;

    /// Checks that the log's disk and writer still work (the readiness
    /// probe's `store` check); fails as a broken or full disk would.
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Sets who hears how long each append took until synced (the
    /// `log_sync` commit stage); a store that does not time its syncs
    /// ignores it.
    fn observe_syncs(&self, observer: SyncObserver);
}

/// The state machine as the replica runtime reads it.
pub trait ReplicaStateMachine: Send + Sync + 'static {
    /// The current state, under the store's read lock while the guard
    /// lives. Drop it soon: apply waits meanwhile.
    fn state(&self) -> StateGuard<'_>;

    /// A receiver of the last applied log index, updated after every
    /// applied batch and installed snapshot (`0`: nothing applied).
    fn subscribe(&self) -> watch::Receiver<u64>;

    /// The longest single hold of the state lock during the last snapshot
    /// build of this process (`None` before the first, or when the store
    /// does not measure it).
    fn snapshot_lock_hold_longest(&self) -> Option<Duration>;

    /// The most CPU time the building thread spent inside one hold during
    /// that build: the hold without the time the thread was descheduled
    /// (`None` when not measured).
    fn snapshot_lock_hold_longest_cpu(&self) -> Option<Duration> {
        None
    }

    /// FNV-1a 64 over the encoding of the current state: equal on every
    /// replica that applied the same log prefix.
    fn digest(&self) -> u64 {
        digest_of(&self.state())
    }

    /// A digest of the state and the applied index it was taken at, as
    /// `Status` reports it: a store whose state may be large takes it
    /// without holding the state for the whole hash, and may answer one
    /// taken a moment before (its index says which).
    fn recent_digest(&self) -> BoxFuture<'_, Result<Option<StateDigest>, StoreError>>;
}

impl ReplicaLogStore for leasehold_storage::LogStore {
    fn read_committed(&self) -> BoxFuture<'_, Result<Option<LogId<NodeId>>, StoreError>> {
        // openraft's reads take the store mutably; clones share the log.
        let mut log = self.clone();
        Box::pin(
            async move { RaftLogStorage::read_committed(&mut log).await.map_err(StoreError::new) },
        )
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(
            async move { leasehold_storage::LogStore::probe(self).await.map_err(StoreError::new) },
        )
    }

    fn observe_syncs(&self, observer: SyncObserver) {
        leasehold_storage::LogStore::observe_syncs(self, observer);
    }
}

impl ReplicaStateMachine for leasehold_storage::StateMachineStore {
    fn state(&self) -> StateGuard<'_> {
        Box::new(leasehold_storage::StateMachineStore::state(self))
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        leasehold_storage::StateMachineStore::subscribe(self)
    }

    fn snapshot_lock_hold_longest(&self) -> Option<Duration> {
        self.last_snapshot_build().map(|build| build.longest_lock_hold)
    }

    fn snapshot_lock_hold_longest_cpu(&self) -> Option<Duration> {
        self.last_snapshot_build().and_then(|build| build.longest_lock_hold_cpu)
    }

    fn digest(&self) -> u64 {
        leasehold_storage::StateMachineStore::digest(self)
    }

    fn recent_digest(&self) -> BoxFuture<'_, Result<Option<StateDigest>, StoreError>> {
        Box::pin(async move {
            leasehold_storage::StateMachineStore::recent_digest(self).await.map_err(StoreError::new)
        })
    }
}

/// A node's bus table as the bus uses it: one [`BusRecord`] per claimed
/// key, local to the node and never replicated. The node keeps it in its
/// database (`leasehold_storage::local::BusTable`); the simulation keeps it
/// in memory.
pub trait BusStore: Send + Sync + std::fmt::Debug + 'static {
    /// The record of `key` (an empty one when none is held).
    fn get(&self, key: &str) -> Result<BusRecord, StoreError>;

    /// Changes the record of `key` with `change` and stores it, atomically
    /// against concurrent changes of the same key; answers the record
    /// stored.
    fn update(&self, key: &str, change: &dyn Fn(&mut BusRecord)) -> Result<BusRecord, StoreError>;

    /// The keys that start with `prefix`, in byte order.
    fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StoreError>;

    /// Every record, by key.
    fn records(&self) -> Result<Vec<(String, BusRecord)>, StoreError>;

    /// Drops every record `keep` says no to (and any the store cannot
    /// read); answers how many went.
    fn retain(&self, keep: &dyn Fn(&BusRecord) -> bool) -> Result<usize, StoreError>;
}

/// Where a node keeps its peers' last adverts across restarts (see
/// [`crate::adverts::PeerRegistry`]). The node keeps them in its database
/// (`leasehold_storage::local::PeerStore`); the simulation in memory.
pub trait AdvertStore: Send + Sync + std::fmt::Debug + 'static {
    /// Keeps `advert` as its node's latest, replacing the one before.
    fn keep(&self, advert: &KeptAdvert) -> Result<(), StoreError>;

    /// Every kept advert that reads back, in node order, and how many did
    /// not.
    fn kept(&self) -> Result<(Vec<KeptAdvert>, usize), StoreError>;
}

impl BusStore for BusTable {
    fn get(&self, key: &str) -> Result<BusRecord, StoreError> {
        BusTable::get(self, key).map_err(StoreError::new)
    }

    fn update(&self, key: &str, change: &dyn Fn(&mut BusRecord)) -> Result<BusRecord, StoreError> {
        BusTable::update(self, key, change).map_err(StoreError::new)
    }

    fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        BusTable::keys_with_prefix(self, prefix).map_err(StoreError::new)
    }

    fn records(&self) -> Result<Vec<(String, BusRecord)>, StoreError> {
        BusTable::records(self).map_err(StoreError::new)
    }

    fn retain(&self, keep: &dyn Fn(&BusRecord) -> bool) -> Result<usize, StoreError> {
        BusTable::retain(self, keep).map_err(StoreError::new)
    }
}

impl AdvertStore for PeerStore {
    fn keep(&self, advert: &KeptAdvert) -> Result<(), StoreError> {
        PeerStore::keep(self, advert).map_err(StoreError::new)
    }

    fn kept(&self) -> Result<(Vec<KeptAdvert>, usize), StoreError> {
        PeerStore::kept(self).map_err(StoreError::new)
    }
}
