//! Goal: what the stores report durable survives the process dying without
//! any cleanup — no destructor, no sled flush on close. Method: this test
//! binary re-runs itself as a child that opens the database with sled's
//! background flusher off (so only the stores' own flushes reach the disk),
//! appends, votes and snapshots, then calls `process::exit`. The parent
//! reopens the directory and checks everything is there.

use std::path::Path;
use std::process::Command;

use leasehold_core::State;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder, Vote};

use crate::support::{LEADER, blank, enqueue, log_id, membership, reopen};

/// Where the child finds its data directory; unset in a normal test run.
const CHILD_DIR_VAR: &str = "LEASEHOLD_STORAGE_CRASH_CHILD_DIR";

fn entries() -> Vec<openraft::Entry<leasehold_raft::TypeConfig>> {
    vec![membership(1, 0, &[1]), blank(1, 1), enqueue(1, 2, 3), enqueue(1, 3, 1), enqueue(1, 4, 2)]
}

#[test]
fn durable_writes_survive_an_abrupt_exit() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;

    // --- the child writes and dies
    let status = Command::new(std::env::current_exe()?)
        .args(["--exact", "crash::child_writes_then_exits", "--nocapture"])
        .env(CHILD_DIR_VAR, dir.path())
        .status()?;
    assert!(status.success(), "child failed: {status}");

    // --- what it was told is durable is there
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let (mut log_store, state_machine) = reopen(dir.path())?;
        assert_eq!(log_store.try_get_log_entries(..).await?, entries());
        // Read back uncommitted: a restarted node does not lead its old term.
        assert_eq!(log_store.read_vote().await?, Some(Vote::new(1, LEADER)));
        // The snapshot covered entries 0..=3; the state is exactly theirs.
        let mut state = State::new();
        for entry in &entries()[..=3] {
            if let EntryPayload::Normal(proposal) = &entry.payload {
                state.apply(entry.log_id.leader_id.term, proposal);
            }
        }
        assert_eq!(state_machine.last_applied_index(), 3);
        assert_eq!(state_machine.digest(), leasehold_storage::digest(&state));
        anyhow::Ok(())
    })
}

/// Runs only as the child of the test above.
#[test]
fn child_writes_then_exits() -> anyhow::Result<()> {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return Ok(());
    };
    let db = sled::Config::new().path(Path::new(&dir)).flush_every_ms(None).open()?;
    let (mut log_store, mut state_machine) = leasehold_storage::open_db(db, Path::new(&dir))?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        log_store.blocking_append(entries()[..2].to_vec()).await?;
        log_store.save_vote(&Vote::new_committed(1, LEADER)).await?;
        state_machine.apply(entries()[..=3].to_vec()).await?;
        let snapshot = state_machine.get_snapshot_builder().await.build_snapshot().await?;
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 3)));
        // Last, so that nothing after it flushes on its behalf: these entries
        // are on disk only if append itself made them durable.
        log_store.blocking_append(entries()[2..].to_vec()).await?;
        anyhow::Ok(())
    })?;
    // No destructors, no flush on close: only what was already synced stays.
    std::process::exit(0);
}
