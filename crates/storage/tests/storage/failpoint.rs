//! Goal: the test failpoint makes the stores behave like a failing disk for
//! every durable write, on both stores at once, and turning it off restores
//! them. Method: flip the switch on one store, observe both.

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftSnapshotBuilder, Vote};

use crate::support::{LEADER, blank, enqueue};

#[tokio::test]
async fn the_failpoint_breaks_durable_writes_until_cleared() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut log_store, mut state_machine) = leasehold_storage::open(dir.path())?;
    log_store.probe().await?;

    // --- on, switched through the state machine: both stores see it
    state_machine.set_fault(true);
    assert!(log_store.probe().await.is_err());
    assert!(log_store.save_vote(&Vote::new(1, LEADER)).await.is_err());
    assert!(log_store.blocking_append([blank(1, 0)]).await.is_err());
    assert!(state_machine.get_snapshot_builder().await.build_snapshot().await.is_err());
    // Apply touches no disk and keeps working.
    assert_eq!(state_machine.apply([enqueue(1, 1, 1)]).await?.len(), 1);

    // --- off again
    log_store.set_fault(false);
    log_store.probe().await?;
    log_store.save_vote(&Vote::new(1, LEADER)).await?;
    log_store.blocking_append([blank(1, 0)]).await?;
    Ok(())
}
