//! Goal: the simulated stores satisfy openraft's storage contract exactly as
//! the sled stores do. Method: `Suite::test_all`, each case on a fresh disk.

use leasehold_raft::{NodeId, TypeConfig};
use leasehold_sim::{SimDisk, SimLogStore, SimStateMachine};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

struct SimStoreBuilder;

impl StoreBuilder<TypeConfig, SimLogStore, SimStateMachine, SimDisk> for SimStoreBuilder {
    async fn build(&self) -> Result<(SimDisk, SimLogStore, SimStateMachine), StorageError<NodeId>> {
        let disk = SimDisk::new();
        let (log_store, state_machine) = disk.open();
        Ok((disk, log_store, state_machine))
    }
}

// Not a tokio test: the suite builds its own runtime per case.
#[test]
fn openraft_storage_suite() -> Result<(), StorageError<NodeId>> {
    Suite::test_all(SimStoreBuilder)
}
