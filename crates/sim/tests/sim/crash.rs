//! Goal: the simulated disk keeps the real store's durability contract
//! under crashes: everything openraft was told is durable (an append's
//! callback, a returned `save_vote`, a built snapshot) survives; writes that
//! were never synced are lost, or with a torn crash survive as an in-order
//! prefix; a crashed life's handles can no longer write. Method: drive the
//! stores directly, crash the disk at chosen points, open a new life and
//! compare what it reads with what was acknowledged.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_core::{Command, JobSpec, Proposal, State};
use leasehold_raft::{NodeId, TypeConfig};
use leasehold_sim::{Crash, SimDisk};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, Vote};

const LEADER: NodeId = 1;

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    openraft::testing::log_id(term, LEADER, index)
}

fn membership(term: u64, index: u64) -> Entry<TypeConfig> {
    let voters: BTreeSet<NodeId> = [LEADER].into_iter().collect();
    openraft::testing::membership_ent::<TypeConfig>(term, LEADER, index, vec![voters])
}

fn enqueue(term: u64, index: u64) -> Entry<TypeConfig> {
    let spec = JobSpec {
        queue: "q".into(),
        payload: format!("payload of entry {index}").into_bytes(),
        ..Default::default()
    };
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Proposal {
            now_ms: 1_000 * index,
            command: Command::Enqueue { jobs: vec![spec] },
        }),
    }
}

/// A membership entry, a blank, then enqueues up to `last`.
fn entries(last: u64) -> Vec<Entry<TypeConfig>> {
    let mut entries =
        vec![membership(1, 0), Entry { log_id: log_id(1, 1), payload: EntryPayload::Blank }];
    entries.extend((2..=last).map(|index| enqueue(1, index)));
    entries
}

/// Waits, bounded, until the disk holds `count` unsynced writes.
async fn until_unsynced(disk: &SimDisk, count: usize) {
    for _ in 0..10_000 {
        if disk.unsynced_writes() == count {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the disk never held {count} unsynced writes (it holds {})", disk.unsynced_writes());
}

#[tokio::test]
async fn an_append_reported_flushed_survives_a_crash() -> anyhow::Result<()> {
    // A sync that takes a while: an append reported before its sync
    // completed would be lost by the crash right after the report.
    let disk = SimDisk::with_sync_delay(Duration::from_millis(20));
    let (mut log_store, _) = disk.open();
    log_store.blocking_append(entries(4)).await?;

    // --- crash right after the report
    disk.crash(Crash::LoseUnsynced);
    let (mut log_store, _) = disk.open();
    assert_eq!(log_store.try_get_log_entries(..).await?, entries(4));
    assert_eq!(log_store.get_log_state().await?.last_log_id, Some(log_id(1, 4)));
    Ok(())
}

#[tokio::test]
async fn a_crash_during_the_sync_loses_the_append_and_never_reports_it() -> anyhow::Result<()> {
    let disk = SimDisk::with_sync_delay(Duration::from_secs(3_600));
    let (log_store, _) = disk.open();
    let mut appending = log_store.clone();
    let append = tokio::spawn(async move { appending.blocking_append(entries(3)).await });
    until_unsynced(&disk, 1).await;
    // Readable before it is durable, as openraft requires.
    let mut reader = log_store.clone();
    assert_eq!(reader.try_get_log_entries(..).await?.len(), 4);

    // --- crash while the sync is under way
    disk.crash(Crash::LoseUnsynced);
    let reported = tokio::time::timeout(Duration::from_secs(5), append).await??;
    assert!(reported.is_err(), "an append lost in a crash must not be reported stored");
    let (mut log_store, _) = disk.open();
    assert!(log_store.try_get_log_entries(..).await?.is_empty());
    assert_eq!(log_store.get_log_state().await?.last_log_id, None);
    Ok(())
}

#[tokio::test]
async fn a_torn_crash_keeps_an_in_order_prefix_of_the_unsynced_writes() -> anyhow::Result<()> {
    let disk = SimDisk::with_sync_delay(Duration::from_secs(3_600));
    let (log_store, _) = disk.open();
    let mut appending = log_store.clone();
    let append = tokio::spawn(async move { appending.blocking_append(entries(5)).await });
    until_unsynced(&disk, 1).await;

    // --- the append's first three entries reach the disk, the rest do not
    disk.crash(Crash::Torn { whole_writes: 0, torn_entries: 3 });
    let reported = tokio::time::timeout(Duration::from_secs(5), append).await??;
    assert!(reported.is_err(), "a torn append must not be reported stored");
    let (mut log_store, _) = disk.open();
    assert_eq!(log_store.try_get_log_entries(..).await?, entries(5)[..3].to_vec());
    assert_eq!(log_store.get_log_state().await?.last_log_id, Some(log_id(1, 2)));
    Ok(())
}

#[tokio::test]
async fn the_vote_is_synced_and_the_committed_id_is_not() -> anyhow::Result<()> {
    let disk = SimDisk::new();
    let (mut log_store, _) = disk.open();
    log_store.blocking_append(entries(3)).await?;
    log_store.save_vote(&Vote::new_committed(1, LEADER)).await?;
    log_store.save_committed(Some(log_id(1, 3))).await?;
    assert_eq!(disk.unsynced_writes(), 1, "only the committed id waits for a sync");

    // --- a clean restart keeps everything written
    let (mut log_store, _) = disk.open();
    assert_eq!(log_store.read_committed().await?, Some(log_id(1, 3)));

    // --- a crash loses the unsynced committed id and keeps the vote
    disk.crash(Crash::LoseUnsynced);
    let (mut log_store, _) = disk.open();
    assert_eq!(log_store.read_vote().await?, Some(Vote::new_committed(1, LEADER)));
    assert_eq!(log_store.read_committed().await?, None);
    assert_eq!(log_store.try_get_log_entries(..).await?, entries(3));
    Ok(())
}

#[tokio::test]
async fn truncate_and_purge_are_durable_when_they_return() -> anyhow::Result<()> {
    let disk = SimDisk::new();
    let (mut log_store, _) = disk.open();
    log_store.blocking_append(entries(6)).await?;
    log_store.truncate(log_id(1, 5)).await?;
    log_store.purge(log_id(1, 1)).await?;
    disk.crash(Crash::LoseUnsynced);
    let (mut log_store, _) = disk.open();
    let left: Vec<u64> =
        log_store.try_get_log_entries(..).await?.iter().map(|e| e.log_id.index).collect();
    assert_eq!(left, vec![2, 3, 4]);
    let state = log_store.get_log_state().await?;
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(log_id(1, 1)), Some(log_id(1, 4)))
    );
    Ok(())
}

#[tokio::test]
async fn a_restart_recovers_the_state_from_the_last_synced_snapshot() -> anyhow::Result<()> {
    let disk = SimDisk::new();
    let (_, mut state_machine) = disk.open();
    state_machine.apply(entries(4)).await?;
    let built = state_machine.get_snapshot_builder().await.build_snapshot().await?;
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 4)));
    // Applied after the snapshot: in memory only, gone with the crash.
    state_machine.apply(vec![enqueue(1, 5)]).await?;
    assert_eq!(state_machine.last_applied_index(), 5);

    disk.crash(Crash::LoseUnsynced);
    let (_, mut state_machine) = disk.open();
    // The state is exactly that of the real apply path over entries 0..=4.
    let mut expected = State::new();
    for entry in entries(4) {
        if let EntryPayload::Normal(proposal) = &entry.payload {
            expected.apply(entry.log_id.leader_id.term, proposal);
        }
    }
    assert_eq!(state_machine.read(|state| state.clone()), expected);
    assert_eq!(state_machine.applied_state().await?.0, Some(log_id(1, 4)));
    let current = state_machine.get_current_snapshot().await?.map(|s| s.meta);
    assert_eq!(current, Some(built.meta));
    Ok(())
}

#[tokio::test]
async fn a_crashed_life_can_no_longer_write() -> anyhow::Result<()> {
    let disk = SimDisk::new();
    let (mut old_log, mut old_state_machine) = disk.open();
    old_log.save_vote(&Vote::new_committed(1, LEADER)).await?;
    disk.crash(Crash::LoseUnsynced);
    let (mut log_store, _) = disk.open();

    assert!(old_log.save_vote(&Vote::new_committed(7, 3)).await.is_err());
    assert!(old_log.blocking_append(entries(2)).await.is_err());
    assert!(old_state_machine.get_snapshot_builder().await.build_snapshot().await.is_err());
    assert_eq!(log_store.read_vote().await?, Some(Vote::new_committed(1, LEADER)));
    assert!(log_store.try_get_log_entries(..).await?.is_empty());
    Ok(())
}
