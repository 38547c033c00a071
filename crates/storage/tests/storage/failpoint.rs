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

/// Goal: readiness probes asked for at once (two health checkers polling
/// one node) all pass, promptly, on a healthy store. Before probes took
/// turns, one probe could read back another's nonce and report the store
/// broken, and concurrent flushes could hang the probes for good — so the
/// probes run on a runtime of their own, watched from this thread.
#[test]
fn probes_at_once_all_pass() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (log_store, state_machine) = leasehold_storage::open(dir.path())?;
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let probe_all = || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut probes = tokio::task::JoinSet::new();
                for _ in 0..16 {
                    let store = log_store.clone();
                    probes.spawn(async move { store.probe().await });
                }
                while let Some(outcome) = probes.join_next().await {
                    outcome??;
                }
                anyhow::Ok(())
            })
        };
        let _ = done.send(probe_all());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(outcome) => outcome,
        Err(_) => {
            // Dropping the stores would wait on the hung flushes.
            std::mem::forget((state_machine, dir));
            anyhow::bail!("16 probes at once did not finish within 20 s")
        }
    }
}
