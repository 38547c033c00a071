//! Goal: a drain's writes are bounded, so a node on a slow disk (or one
//! that lost its quorum) still stops within its supervisor's patience: the
//! leases its executor holds are released in one write, not one write per
//! lease, each waiting its turn.
//!
//! Method: one node in this process with its executor on and a short drain
//! grace runs four 100-second commands; then its log store reports every
//! append synced [`SYNC_DELAY`] late (a slow disk) and the node drains.
//! The drain waits for the mark, the grace, the releases and the stop: with
//! one write for the four releases it is done well within [`DRAINS_WITHIN`];
//! with a write per release (checked once) it took four more syncs, past
//! that bound. Every job the commands held is ready again afterwards.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use leasehold_core::{Command, JobSpec, JobState};
use leasehold_node::config::{Config, SecretText};
use support::phase;

mod support;

/// How late the node's appends are reported synced.
const SYNC_DELAY: Duration = Duration::from_secs(3);
/// The mark (one sync), the grace and the executor's wind-up (up to 4.5 s),
/// one sync for the releases and the stop: about 10.5 s. Four syncs for
/// the releases would make it about 19.5 s.
const DRAINS_WITHIN: Duration = Duration::from_secs(15);
/// Commands the executor runs at once (its default) and the story starts.
const COMMANDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_releases_what_its_executor_holds_in_one_write() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(90), story()).await.context("story timed out")?
}

async fn story() -> Result<()> {
    let dir = tempfile::tempdir()?;
    phase("start node 1 with its executor and a 500 ms drain grace");
    let config = Config {
        id: 1,
        grpc: "127.0.0.1:0".into(),
        http: "127.0.0.1:0".into(),
        data: dir.path().join("node-1"),
        executor: true,
        executor_concurrency: COMMANDS,
        drain_grace_ms: 500,
        sweep_interval_ms: 3_600_000,
        purge_interval_ms: 3_600_000,
        cluster_secret: Some(SecretText("drain-bounded-test-secret-0123456789".into())),
        ..Config::default()
    };
    let node = support::start(config).await?;
    let journal = node.journal().clone();
    support::wait_for("node 1 leads", Duration::from_secs(20), || journal.is_leader()).await?;

    phase("four 100-second commands run on its executor");
    let command = |n: usize| JobSpec {
        queue: leasehold_core::schedule::DEFAULT_COMMAND_QUEUE.into(),
        payload: format!("sleep 100 # {n}").into_bytes(),
        ..Default::default()
    };
    let jobs = (0..COMMANDS).map(command).collect();
    journal.propose(Command::Enqueue { jobs }).await.map_err(|e| anyhow!("enqueue: {e}"))?;
    let held = || journal.read_stale(|state| state.leases_held_by("node-1", None));
    support::wait_for("the executor to hold all four", Duration::from_secs(30), || {
        held().len() == COMMANDS
    })
    .await?;
    let jobs: Vec<u64> = held().iter().map(|(job_id, _)| *job_id).collect();

    phase("the disk turns slow, and the node drains");
    node.log_store().set_sync_delay(SYNC_DELAY);
    let started = Instant::now();
    node.drain().await.map_err(|e| anyhow!("drain: {e}"))?;
    let took = started.elapsed();
    eprintln!("drained in {took:?}");
    ensure!(took < DRAINS_WITHIN, "the drain took {took:?}");

    phase("every job its commands held is ready again");
    let states: Vec<Option<JobState>> = journal
        .read_stale(|state| jobs.iter().map(|id| state.job(*id).map(|job| job.state)).collect());
    ensure!(
        states.iter().all(|state| *state == Some(JobState::Ready)),
        "after the drain: {states:?}"
    );
    Ok(())
}
