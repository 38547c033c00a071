//! Storage for leasehold's Raft group: the log store and the state machine
//! openraft drives, in one data directory per node.
//!
//! - [`LogStore`] keeps the Raft log, the vote, the committed and the last
//!   purged log id in raft-log's write-ahead log (`<data>/raft-log/`), and
//!   answers the readiness [`LogStore::probe`].
//! - [`StateMachineStore`] applies committed proposals to the in-memory
//!   [`leasehold_core::State`], serves reads of it, and persists snapshots.
//! - [`local`] keeps what a node keeps for itself, unreplicated, in sled:
//!   the bus table and the peer adverts.
//! - [`layout`] names the files, trees and keys on disk.
//!
//! Nothing else in leasehold touches sled or the raft log: everything goes
//! through these stores and one codec (bincode, trailing bytes refused).
//! A data directory written by a version that kept the log in sled is
//! migrated into the raft log on open (see `migrate`).
//!
//! Durability in one paragraph: appended entries are fdatasynced once per
//! flushed batch (raft-log's worker syncs whatever is queued, in one go)
//! before openraft hears they are stored; the vote travels the same path
//! and is synced before `save_vote` returns; snapshots are written to a
//! temporary file, fsynced, renamed and the directory fsynced before they
//! are reported built or installed. The live state is never written on its
//! own: a restart loads the last snapshot and openraft re-applies the log
//! from there to the saved committed log id.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold_storage::StorageError> {
//! let (log_store, state_machine) = leasehold_storage::open(std::path::Path::new("/var/lib/leasehold"))?;
//! log_store.probe().await?;
//! let jobs = state_machine.read(|state| state.last_job_id());
//! # let _ = jobs;
//! # Ok(()) }
//! ```

mod codec;
mod durable;
mod error;
mod failpoint;
pub mod layout;
pub mod local;
mod log_store;
mod migrate;
mod state_machine;
mod wal;

use std::path::Path;

pub use codec::digest;
pub use error::StorageError;
pub use log_store::{LogStore, MAX_READ_BYTES, MAX_READ_ENTRIES};
pub use state_machine::{SnapshotBuildStats, StateDigest, StateMachineStore};
pub use wal::SyncObserver;

use failpoint::Failpoint;

/// Opens (creating it and its parent directories if needed) the data
/// directory at `path` — sled's database, the raft log in
/// [`layout::RAFT_LOG_DIR`], the snapshot file — and returns its two
/// stores. Blocks while it replays the log (and, once, while it migrates
/// an older version's log out of sled): call it off the async threads.
pub fn open(path: &Path) -> Result<(LogStore, StateMachineStore), StorageError> {
    durable::create_dir_all_durably(path)?;
    let db = sled::Config::new().path(path).open()?;
    // sled creates its files without syncing the directory that names them.
    durable::sync_dir(path)?;
    open_db(db, path)
}

/// Refuses stores whose log is purged past the state their snapshot holds
/// ([`StorageError::PurgedPastSnapshot`]): call it on stores just opened,
/// before Raft replays anything. openraft 0.9 purges the log a received
/// snapshot covers as soon as it hands the install to the state machine,
/// without waiting for the snapshot to be on disk, so a node that stopped
/// in between has lost the entries between the two and cannot rebuild its
/// state. Deferring that purge is no way out: openraft marks the log
/// purged at once and never asks again, and the log then refuses the next
/// append as leaving a gap.
pub fn check_purged_within_snapshot(
    log_store: &LogStore,
    state_machine: &StateMachineStore,
    path: &Path,
) -> Result<(), StorageError> {
    let purged = log_store.last_purged_index()?;
    let snapshot = state_machine.last_applied_index();
    if purged > snapshot {
        return Err(StorageError::PurgedPastSnapshot {
            path: path.to_path_buf(),
            purged,
            snapshot,
        });
    }
    Ok(())
}

/// Builds both stores on an already open sled database, with the raft log
/// and the snapshot file in `dir`. They share one failpoint, so a test that
/// breaks "the disk" breaks it for both. Tests use this to reach the raw
/// trees next to the stores.
pub fn open_db(db: sled::Db, dir: &Path) -> Result<(LogStore, StateMachineStore), StorageError> {
    let failpoint = Failpoint::default();
    let log_store = LogStore::open(dir, db.clone(), failpoint.clone())?;
    let state_machine = StateMachineStore::open_db(db, dir, failpoint)?;
    Ok((log_store, state_machine))
}
