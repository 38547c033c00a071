//! Goal: a write whose proposer gave up while it waited in the journal's
//! queue (its call was cancelled, or its deadline passed) is not written
//! when its turn comes: written later, a keyless enqueue its client sent
//! again would be a second copy, and a claim would grant leases nobody
//! holds.
//!
//! Method: one node in this process, its log store reporting every
//! append synced [`SYNC_DELAY`] late (a slow disk), so a first enqueue
//! holds the journal's one write in flight and a second waits in the
//! queue behind it. The second's proposer gives up after
//! [`GIVE_UP_AFTER`]. Once the first is written and the journal idle, the
//! state must hold the first job only, and the node must count one write
//! abandoned. A journal that writes every queued proposal holds both
//! (checked).

use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use leasehold_core::{Command, JobSpec, Response};
use support::phase;

mod support;

/// How late the node's appends are reported synced.
const SYNC_DELAY: Duration = Duration::from_millis(1_500);
/// When the second proposer gives up: while the first write still syncs.
const GIVE_UP_AFTER: Duration = Duration::from_millis(400);

fn enqueue(payload: &[u8]) -> Command {
    let spec = JobSpec { queue: "q".into(), payload: payload.to_vec(), ..Default::default() };
    Command::Enqueue { jobs: vec![spec] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_proposer_gave_up_in_the_queue_is_not_written() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(60), story()).await.context("story timed out")?
}

async fn story() -> Result<()> {
    let dir = tempfile::tempdir()?;
    phase("start node 1 on a slow disk");
    let node = support::start_alone(dir.path()).await?;
    let journal = node.journal().clone();
    support::wait_for("node 1 leads", Duration::from_secs(20), || journal.is_leader()).await?;
    node.log_store().set_sync_delay(SYNC_DELAY);

    phase("a first enqueue syncs; a second waits behind it, and its proposer gives up");
    let first = tokio::spawn({
        let journal = journal.clone();
        async move { journal.propose(enqueue(b"first")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::time::timeout(GIVE_UP_AFTER, journal.propose(enqueue(b"second"))).await;
    ensure!(second.is_err(), "the second enqueue was answered while the first synced: {second:?}");
    let first = first.await?.map_err(|e| anyhow!("first enqueue: {e}"))?;
    ensure!(matches!(first, Response::Enqueued(_)), "first enqueue answered {first:?}");

    phase("once the journal is idle, only the first job is in the state");
    node.log_store().set_sync_delay(Duration::ZERO);
    // A write after both: answered once everything queued before it is.
    journal.propose(Command::Purge).await.map_err(|e| anyhow!("purge: {e}"))?;
    let payloads: Vec<Vec<u8>> = journal.read_stale(|state| {
        (1..=state.last_job_id()).filter_map(|id| state.job(id)).map(|job| job.payload).collect()
    });
    ensure!(
        payloads == vec![b"first".to_vec()],
        "jobs written: {:?}",
        payloads.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect::<Vec<_>>()
    );
    let abandoned = journal.metrics().writes_abandoned.get();
    ensure!(abandoned == 1, "writes counted abandoned: {abandoned}");
    node.shutdown(Duration::from_secs(10)).await.map_err(|e| anyhow!("shutdown: {e}"))?;
    Ok(())
}
