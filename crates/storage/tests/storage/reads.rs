//! Goal: a bounded read (what replication uses) never returns more than its
//! entry and byte budgets, yet always returns at least one entry so a
//! follower far behind still makes progress. Method: append entries sized
//! against the budgets and read them back through `limited_get_log_entries`.

use leasehold_core::{Command, JobSpec, Proposal};
use leasehold_storage::{MAX_READ_BYTES, MAX_READ_ENTRIES};
use openraft::storage::RaftLogStorageExt;
use openraft::{Entry, EntryPayload, RaftLogReader};

use crate::support::{blank, log_id};

/// An entry whose encoding is a little over `payload_bytes`.
fn large(index: u64, payload_bytes: usize) -> Entry<leasehold_raft::TypeConfig> {
    let spec = JobSpec { queue: "q".into(), payload: vec![7; payload_bytes], ..Default::default() };
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(Proposal {
            now_ms: index,
            command: Command::Enqueue { jobs: vec![spec] },
        }),
    }
}

#[tokio::test]
async fn limited_reads_respect_their_budgets() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut log_store, _state_machine) = leasehold_storage::open(dir.path())?;

    // --- the entry budget
    let count = MAX_READ_ENTRIES as u64 + 10;
    log_store.blocking_append((0..count).map(|index| blank(1, index))).await?;
    let read = log_store.limited_get_log_entries(0, count).await?;
    assert_eq!(read.len(), MAX_READ_ENTRIES);
    assert_eq!(read[0].log_id, log_id(1, 0));
    assert_eq!(log_store.try_get_log_entries(..).await?.len() as u64, count);

    // --- the byte budget: a third of it per entry, so two fit and three do not
    let third = MAX_READ_BYTES / 3;
    log_store.blocking_append((count..count + 4).map(|index| large(index, third))).await?;
    let read = log_store.limited_get_log_entries(count, count + 4).await?;
    assert_eq!(read.len(), 2);

    // --- an entry over the whole budget still comes back alone
    let huge = count + 4;
    log_store.blocking_append([large(huge, MAX_READ_BYTES + 1)]).await?;
    let read = log_store.limited_get_log_entries(huge, huge + 1).await?;
    assert_eq!(read.len(), 1);
    Ok(())
}
