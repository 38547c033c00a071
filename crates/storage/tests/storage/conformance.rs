//! Goal: the sled stores satisfy openraft's storage contract as openraft
//! itself states it. Method: `Suite::test_all`, each case on stores over a
//! fresh temporary directory that lives as long as the case.

use leasehold_raft::{NodeId, TypeConfig};
use leasehold_storage::{LogStore, StateMachineStore};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use tempfile::TempDir;

struct SledStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for SledStoreBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|error| StorageIOError::write(&error))?;
        let (log_store, state_machine) =
            leasehold_storage::open(dir.path()).map_err(|error| StorageIOError::write(&error))?;
        Ok((dir, log_store, state_machine))
    }
}

// Not a tokio test: the suite builds its own runtime per case.
#[test]
fn openraft_storage_suite() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(SledStoreBuilder)
}
