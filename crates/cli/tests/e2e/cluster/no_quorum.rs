//! Goal: with two of three nodes gone, calls that need a quorum fail with
//! UNAVAILABLE within the node's quorum timeout instead of hanging, local
//! reads still answer, and once the nodes are back the cluster serves again
//! (issue 3, "With no quorum…"; SPEC §6 error codes).
//!
//! Method: keep the leader and take both followers away, two different ways:
//! one is SIGSTOPped (its connections stay open and silent, the harder case
//! for a deadline) and the other is SIGKILLed (its port refuses). A write
//! and a linearizable read sent to the leader — raw stubs whose own deadline
//! is far beyond the bound, so the code is the server's — must come back
//! UNAVAILABLE in under 10 s (the quorum timeout is 5 s). A stale read must
//! answer. Then SIGCONT the one, restart the other, and a write must
//! succeed and be readable from the node that was paused.
//!
//! Before the quorum goes, with only the killed follower down: removing
//! the other follower is refused (FAILED_PRECONDITION), since the voters
//! left, the leader and the dead node, could never commit the change, and
//! until it committed no write could; a write then still succeeds.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::queue_client::QueueClient;
use nix::sys::signal::Signal;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, Sandbox, deadline_in, job, phase, wait_until,
};
use super::cluster_slot;

const QUEUE: &str = "quorum";
/// The bound the issue asks for: the node's 5 s quorum timeout plus slack.
const UNAVAILABLE_WITHIN: Duration = Duration::from_secs(10);
/// The test's own deadline on those calls, well past the bound, so a hang
/// shows up as a slow answer rather than as the client giving up.
const PATIENT_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_quorum_is_unavailable_within_the_deadline() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-no-quorum")?;
    sandbox.run(Duration::from_secs(120), story(&sandbox)).await
}

/// A Queue stub of `addr` whose calls wait up to [`PATIENT_DEADLINE`].
fn patient_stub(addr: &str) -> Result<QueueClient<Channel>> {
    let channel = Endpoint::from_shared(addr.to_string())
        .context("endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(PATIENT_DEADLINE)
        .connect_lazy();
    Ok(QueueClient::new(channel))
}

/// Checks that `call` failed with UNAVAILABLE within the bound.
fn expect_unavailable<T: std::fmt::Debug>(
    what: &str,
    outcome: std::result::Result<T, tonic::Status>,
    took: Duration,
) -> Result<()> {
    eprintln!("{what} without a quorum: {:.2} s, {outcome:?}", took.as_secs_f64());
    let status = match outcome {
        Ok(answer) => bail!("{what} succeeded without a quorum: {answer:?}"),
        Err(status) => status,
    };
    ensure!(status.code() == tonic::Code::Unavailable, "{what}: {status:?}, expected UNAVAILABLE");
    ensure!(
        took < UNAVAILABLE_WITHIN,
        "{what} took {:.1} s to fail, more than {} s",
        took.as_secs_f64(),
        UNAVAILABLE_WITHIN.as_secs()
    );
    Ok(())
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let leader = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?.leader;
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    let [paused, killed] = followers[..] else { bail!("followers {followers:?}") };
    eprintln!("leader {leader} stays; node {paused} is paused, node {killed} is killed");
    let mut survivor = patient_stub(&cluster.node(leader)?.addr())?;
    let before = survivor
        .enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, b"before")] })
        .await
        .context("enqueue with all three up")?
        .into_inner()
        .results;
    ensure!(before.len() == 1, "one job enqueued, results {before:?}");

    phase(
        "SIGKILL one follower; once the leader no longer hears it, removing the other is refused",
    );
    cluster.node_mut(killed)?.kill()?;
    let leader_node = cluster.node(leader)?;
    wait_until(
        &format!("leader {leader} to stop hearing node {killed}"),
        deadline_in(Duration::from_secs(15)),
        || async {
            let status = leader_node.local_status().await?;
            let heard = status.adverts.iter().any(|a| a.node_id == killed && a.online);
            Ok(if heard { Check::NotYet("still online".into()) } else { Check::Done(()) })
        },
    )
    .await?;
    // Voters {leader, killed} could not commit the change, and until it
    // did no write could: the leader refuses it rather than wedge.
    let removal = leader_node.cluster_stub()?.remove(v1::RemoveRequest { id: paused }).await;
    match removal {
        Err(status)
            if status.code() == tonic::Code::FailedPrecondition
                && status.message().contains("bring them back") => {}
        other => bail!("removing node {paused} with node {killed} down: {other:?}"),
    }
    survivor
        .enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, b"two of three")] })
        .await
        .context("a write with two of three after the refused removal")?;
    // (All three converging at the end shows the membership unchanged.)

    phase("SIGSTOP the other follower too");
    cluster.node(paused)?.signal(Signal::SIGSTOP)?;

    phase("a write to the surviving leader is UNAVAILABLE within 10 s");
    let started = Instant::now();
    let write = survivor.enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, b"alone")] }).await;
    expect_unavailable("enqueue", write.map(|r| r.into_inner()), started.elapsed())?;

    phase("so is a linearizable read; a stale read answers");
    let started = Instant::now();
    let read =
        survivor.stats(v1::StatsRequest { queue: Some(QUEUE.to_string()), stale: false }).await;
    expect_unavailable("linearizable stats", read.map(|r| r.into_inner()), started.elapsed())?;
    let stale = survivor
        .stats(v1::StatsRequest { queue: Some(QUEUE.to_string()), stale: true })
        .await
        .context("a stale read without a quorum")?
        .into_inner();
    ensure!(
        stale.last_job_id >= before[0].job_id,
        "the stale read lost a committed job: {stale:?}"
    );

    phase("SIGCONT the paused node, restart the killed one");
    cluster.node(paused)?.signal(Signal::SIGCONT)?;
    cluster.restart(sandbox, killed).await?;
    cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;

    phase("the cluster serves again: a write, read back from the node that was paused");
    let results = cluster.client()?.enqueue(vec![job(QUEUE, b"after")]).await?;
    let [result] = results.as_slice() else { bail!("one job enqueued, results {results:?}") };
    let read = cluster
        .node(paused)?
        .client()?
        .get_job(result.job_id, false)
        .await
        .context("reading the new job from the node that was paused")?;
    ensure!(read.payload == b"after", "read back {read:?}");
    cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    Ok(())
}
