//! Goal: everything the stores promised durable comes back identical after a
//! restart, and the state machine comes back from its snapshot rather than
//! from a replay of the whole log. Method: write through the openraft traits,
//! drop every handle (closing the database), reopen the same directory, and
//! compare.

use leasehold_core::Response;
use leasehold_storage::{LogStore, StateMachineStore};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{LogState, RaftLogReader, RaftSnapshotBuilder, StorageHelper, Vote};

use crate::support::{LEADER, blank, enqueue, log_id, membership, reopen};

#[tokio::test]
async fn log_vote_and_committed_survive_reopen() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;

    // --- write a log in two batches, a vote and a committed id
    let before = {
        let (mut log_store, _state_machine) = leasehold_storage::open(dir.path())?;
        log_store
            .blocking_append([membership(1, 0, &[1, 2, 3]), blank(1, 1), enqueue(1, 2, 2)])
            .await?;
        log_store.blocking_append([enqueue(2, 3, 1), enqueue(2, 4, 3), blank(2, 5)]).await?;
        log_store.save_vote(&Vote::new_committed(2, LEADER)).await?;
        log_store.save_committed(Some(log_id(2, 4))).await?;
        Snapshot::of(&mut log_store).await?
    };
    assert_eq!(before.entries.len(), 6);
    assert_eq!(before.log_state.last_log_id, Some(log_id(2, 5)));

    // --- reopen: the same log, vote and committed id
    {
        let (mut log_store, _state_machine) = reopen(dir.path())?;
        assert_eq!(Snapshot::of(&mut log_store).await?, before);

        // --- purge the head and truncate the tail, then reopen again
        log_store.purge(log_id(1, 1)).await?;
        log_store.truncate(log_id(2, 5)).await?;
    }
    let (mut log_store, _state_machine) = reopen(dir.path())?;
    let after = Snapshot::of(&mut log_store).await?;
    assert_eq!(
        after.log_state,
        LogState { last_purged_log_id: Some(log_id(1, 1)), last_log_id: Some(log_id(2, 4)) }
    );
    assert_eq!(after.entries, before.entries[2..5].to_vec());
    assert_eq!(after.vote, before.vote);
    assert_eq!(after.committed, before.committed);
    Ok(())
}

#[tokio::test]
async fn state_machine_comes_back_from_its_snapshot() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;

    // --- apply real proposals, build a snapshot
    let (digest, applied_state, snapshot_meta, last_job_id) = {
        let (_log_store, mut state_machine) = leasehold_storage::open(dir.path())?;
        let responses = state_machine
            .apply([membership(1, 0, &[1]), blank(1, 1), enqueue(1, 2, 3), enqueue(1, 3, 2)])
            .await?;
        assert_eq!(responses.len(), 4, "one response per entry");
        assert_eq!(responses[0], Response::Empty);
        assert_eq!(responses[1], Response::Empty);
        assert!(matches!(&responses[2], Response::Enqueued(outcomes) if outcomes.len() == 3));
        assert_eq!(state_machine.read(|state| state.last_job_id()), 5);

        let snapshot = state_machine.get_snapshot_builder().await.build_snapshot().await?;
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 3)));
        (
            state_machine.digest(),
            state_machine.applied_state().await?,
            snapshot.meta,
            state_machine.read(|state| state.last_job_id()),
        )
    };

    // --- reopen: state, position and membership come from the snapshot
    let (_log_store, mut state_machine) = reopen(dir.path())?;
    assert_eq!(state_machine.digest(), digest);
    assert_eq!(state_machine.last_applied_index(), 3);
    assert_eq!(*state_machine.subscribe().borrow(), 3);
    assert_eq!(state_machine.applied_state().await?, applied_state);
    assert_eq!(state_machine.read(|state| state.last_job_id()), last_job_id);
    let current = state_machine
        .get_current_snapshot()
        .await?
        .ok_or_else(|| anyhow::anyhow!("the snapshot is gone after reopen"))?;
    assert_eq!(current.meta, snapshot_meta);
    Ok(())
}

#[tokio::test]
async fn restart_replays_only_the_committed_log_after_the_snapshot() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let entries = vec![
        membership(1, 0, &[1]),
        blank(1, 1),
        enqueue(1, 2, 2),
        enqueue(1, 3, 1),
        enqueue(1, 4, 4),
        enqueue(1, 5, 1),
        enqueue(1, 6, 2),
    ];

    // --- log 0..=6, apply 0..=3, snapshot, apply 4..=5, commit up to 5
    let (digest_at_snapshot, digest_at_commit) = {
        let (mut log_store, mut state_machine) = leasehold_storage::open(dir.path())?;
        log_store.blocking_append(entries.clone()).await?;
        state_machine.apply(entries[..=3].to_vec()).await?;
        state_machine.get_snapshot_builder().await.build_snapshot().await?;
        let digest_at_snapshot = state_machine.digest();
        state_machine.apply(entries[4..=5].to_vec()).await?;
        log_store.save_committed(Some(log_id(1, 5))).await?;
        (digest_at_snapshot, state_machine.digest())
    };
    assert_ne!(digest_at_snapshot, digest_at_commit);

    // --- reopen: the state machine is at the snapshot, not at the commit
    let (mut log_store, mut state_machine) = reopen(dir.path())?;
    assert_eq!(state_machine.last_applied_index(), 3);
    assert_eq!(state_machine.digest(), digest_at_snapshot);

    // --- openraft's startup re-applies 4..=5 (the committed part) and no more
    let initial =
        StorageHelper::new(&mut log_store, &mut state_machine).get_initial_state().await?;
    assert_eq!(initial.committed, Some(log_id(1, 5)));
    assert_eq!(state_machine.last_applied_index(), 5);
    assert_eq!(state_machine.digest(), digest_at_commit);
    Ok(())
}

#[tokio::test]
async fn apply_refuses_an_entry_it_already_applied() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (_log_store, mut state_machine) = leasehold_storage::open(dir.path())?;
    let mut applied_index = state_machine.subscribe();
    state_machine.apply([blank(1, 1), enqueue(1, 2, 1)]).await?;
    assert!(applied_index.has_changed()?);
    assert_eq!(*applied_index.borrow_and_update(), 2);

    // Applying index 2 again would enqueue its job twice.
    let digest = state_machine.digest();
    let refused = state_machine.apply([enqueue(1, 2, 1)]).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(state_machine.digest(), digest);
    Ok(())
}

/// Everything the log store reports, for comparing before and after a reopen.
#[derive(Debug, PartialEq)]
struct Snapshot {
    entries: Vec<openraft::Entry<leasehold_raft::TypeConfig>>,
    log_state: LogState<leasehold_raft::TypeConfig>,
    vote: Option<Vote<u64>>,
    committed: Option<openraft::LogId<u64>>,
}

impl Snapshot {
    async fn of(log_store: &mut LogStore) -> anyhow::Result<Snapshot> {
        Ok(Snapshot {
            entries: log_store.try_get_log_entries(..).await?,
            log_state: log_store.get_log_state().await?,
            vote: log_store.read_vote().await?,
            committed: log_store.read_committed().await?,
        })
    }
}

// `StateMachineStore` must stay cloneable and shareable for the node.
const _: fn() = || {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<LogStore>();
    shareable::<StateMachineStore>();
};

/// A leader's stored vote is its own, committed. openraft starts a node
/// with such a vote as that term's leader again, with its log as synced;
/// if a follower holds an entry of that term the leader's log lost (sent
/// ahead of a sync that then failed), the leader would make another entry
/// under the same log id and the replicas would diverge. So the store
/// reports the vote uncommitted, and a restarted node leads only after
/// winning a later term.
#[tokio::test]
async fn a_restarted_leader_does_not_lead_its_old_term_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut log_store, _state_machine) = leasehold_storage::open(dir.path())?;
        log_store.blocking_append([membership(1, 0, &[1, 2, 3]), blank(1, 1)]).await?;
        log_store.save_vote(&Vote::new_committed(1, LEADER)).await?;
        log_store.save_committed(Some(log_id(1, 1))).await?;
    }

    // --- the store reads back the term and candidate, uncommitted, and
    //     takes the committed vote again when the leader's message brings it
    {
        let (mut log_store, _state_machine) = reopen(dir.path())?;
        assert_eq!(log_store.read_vote().await?, Some(Vote::new(1, LEADER)));
        log_store.save_vote(&Vote::new_committed(1, LEADER)).await?;
    }

    // --- a Raft node started on it (its peers unreachable) is no leader
    let (log_store, state_machine) = reopen(dir.path())?;
    let config = std::sync::Arc::new(openraft::Config::default().validate()?);
    let raft = leasehold_raft::Raft::new(
        LEADER,
        config,
        leasehold_raft::network::NetworkFactory::new(),
        log_store,
        state_machine,
    )
    .await?;
    let led = raft
        .wait(Some(std::time::Duration::from_millis(500)))
        .state(openraft::ServerState::Leader, "a restarted leader")
        .await;
    let metrics = raft.metrics().borrow().clone();
    raft.shutdown().await?;
    assert!(led.is_err(), "the restarted node led again: {metrics:?}");
    assert!(!metrics.vote.is_committed(), "it leads no term: {metrics:?}");
    Ok(())
}
