//! Goal: a write sent to a follower succeeds — the follower forwards it to
//! the leader, and the client never sees that (SPEC §6 "Any node serves any
//! call"; issue 3).
//!
//! Method: in a formed three-node cluster, talk to one follower only (raw
//! stubs, no retries, no other address to fall back on): enqueue, claim and
//! ack through it. The leader must read the job back with the payload sent
//! and the token the follower's claim answered, and the follower's own
//! linearizable read must see the ack too. Leadership must not have moved
//! meanwhile, or the follower might have been the leader for part of it.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;

use super::super::support::{CLUSTER_CONVERGE_TIMEOUT, Cluster, Sandbox, job, phase};
use super::cluster_slot;

const QUEUE: &str = "forwarded";
const PAYLOAD: &[u8] = b"sent to a follower";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_to_a_follower_is_forwarded() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-forwarding")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

async fn get_job(
    stub: &mut v1::queue_client::QueueClient<tonic::transport::Channel>,
    job_id: u64,
) -> Result<v1::Job> {
    stub.get_job(v1::GetJobRequest { job_id, stale: false })
        .await
        .with_context(|| format!("get job {job_id}"))?
        .into_inner()
        .job
        .context("reply carried no job")
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster and pick a follower");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let before = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let leader = before.leader;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).context("no follower")?;
    eprintln!("leader {leader}, writing through follower {follower}");
    let mut through_follower = cluster.node(follower)?.stub()?;
    let mut at_leader = cluster.node(leader)?.stub()?;

    phase("enqueue through the follower only");
    let results = through_follower
        .enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, PAYLOAD)] })
        .await
        .context("enqueue through the follower")?
        .into_inner()
        .results;
    let [result] = results.as_slice() else { bail!("one job enqueued, results {results:?}") };
    let job_id = result.job_id;

    phase("the leader reads the job back");
    let read = get_job(&mut at_leader, job_id).await?;
    ensure!(read.payload == PAYLOAD, "payload at the leader: {:?}", read.payload);
    ensure!(read.state == v1::JobState::Ready as i32, "state at the leader: {read:?}");

    phase("claim and ack through the follower too");
    let grants = through_follower
        .claim(v1::ClaimRequest {
            worker: "forwarding-test".to_string(),
            queue: QUEUE.to_string(),
            max: 1,
            wait_ms: 0,
            ..Default::default()
        })
        .await
        .context("claim through the follower")?
        .into_inner()
        .grants;
    let token = match grants.as_slice() {
        [v1::Grant { job: Some(granted), lease: Some(lease) }] if granted.id == job_id => {
            lease.token
        }
        other => bail!("claim through the follower answered {other:?}, expected job {job_id}"),
    };
    through_follower
        .ack(v1::AckRequest { job_id, token, ..Default::default() })
        .await
        .context("ack through the follower")?;

    phase("the leader and the follower both read the ack");
    for (who, stub) in [("leader", &mut at_leader), ("follower", &mut through_follower)] {
        let read = get_job(stub, job_id).await?;
        let kept = read.lease.as_ref().map(|lease| lease.token);
        ensure!(
            read.state == v1::JobState::Acked as i32 && kept == Some(token),
            "{who} reads job {job_id} as {read:?}, expected acked with token {token}"
        );
    }

    phase("leadership did not move during the story");
    let after = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(
        after.leader == leader && after.term == before.term,
        "leadership moved from {before:?} to {after:?}; the follower may have led meanwhile"
    );
    Ok(())
}
