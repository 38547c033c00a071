//! sled-backed storage for leasehold's Raft group: the log store and the
//! state machine openraft drives, in one sled database per node.
//!
//! - [`LogStore`] keeps the Raft log, the vote, the committed and the last
//!   purged log id, and answers the readiness [`LogStore::probe`].
//! - [`StateMachineStore`] applies committed proposals to the in-memory
//!   [`leasehold_core::State`], serves reads of it, and persists snapshots.
//! - [`local`] keeps what a node keeps for itself, unreplicated: the bus
//!   table and the peer adverts.
//! - [`layout`] names the trees and keys on disk.
//!
//! Nothing else in leasehold touches sled: every tree goes through these
//! stores and one codec (bincode, trailing bytes refused).
//!
//! Durability in one paragraph: appended entries are fsynced once per batch
//! before openraft hears they are stored; the vote is fsynced before
//! `save_vote` returns; snapshots are written to a temporary file, fsynced,
//! renamed and the directory fsynced before they are reported built or
//! installed. "Fsynced" covers sled's blob files too (sled writes a large
//! page to a file of its own and never syncs it; see `durable`). The live
//! state is never written on its own: a restart loads the last snapshot and
//! openraft re-applies the log from there to the saved committed log id.
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
mod state_machine;

use std::path::Path;

pub use codec::digest;
pub use error::StorageError;
pub use log_store::{LogStore, MAX_READ_BYTES, MAX_READ_ENTRIES};
pub use state_machine::{SnapshotBuildStats, StateMachineStore};

use failpoint::Failpoint;

/// Opens (creating it and its parent directories if needed) the sled database
/// at `path` and returns its two stores; the snapshot file lives there too.
pub fn open(path: &Path) -> Result<(LogStore, StateMachineStore), StorageError> {
    std::fs::create_dir_all(path)
        .map_err(|source| StorageError::CreateDir { path: path.to_path_buf(), source })?;
    let db = sled::Config::new().path(path).open()?;
    // sled creates its files without syncing the directory that names them.
    durable::sync_dir(path)?;
    let (log_store, state_machine) = open_db(db, path)?;
    let data_file = std::fs::File::open(path.join("db")).map_err(sled::Error::Io)?;
    Ok((log_store.with_data_file(data_file, path), state_machine))
}

/// Builds both stores on an already open sled database, with the snapshot
/// file in `dir`. They share one failpoint, so a test that breaks "the
/// disk" breaks it for both. Tests use this to reach the raw trees next to
/// the stores; the log store's flushes then do not fsync sled's files
/// (sled's own flush only), which [`open`] adds.
pub fn open_db(db: sled::Db, dir: &Path) -> Result<(LogStore, StateMachineStore), StorageError> {
    let failpoint = Failpoint::default();
    let log_store = LogStore::open_db(db.clone(), failpoint.clone())?;
    let state_machine = StateMachineStore::open_db(db, dir, failpoint)?;
    Ok((log_store, state_machine))
}
