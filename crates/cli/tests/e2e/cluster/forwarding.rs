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
//! The follower's answers name the leader (the leader hint).
//!
//! The nodes time the stages of those writes' commit rounds
//! (`leasehold_commit_stage_seconds{stage}`, docs/operations.md): after
//! the story the follower has timed its forwards, its queue and the
//! AppendEntries it served, and the leader its queue, its Raft writes and
//! its replication round trips, each a count of at least the three writes.
//!
//! A second story gives the stock client every address, a follower's
//! first: the follower's first answer names the leader, and the client's
//! later calls go to the leader directly. Each node's RPC counters show
//! where the calls went.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;

use leasehold_client::Client;

use super::super::lifecycle::{Scrape, scrape};
use super::super::support::{CLUSTER_CONVERGE_TIMEOUT, Cluster, Sandbox, http_get, job, phase};
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

    phase("enqueue through the follower only; its answer names the leader");
    let answer = through_follower
        .enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, PAYLOAD)] })
        .await
        .context("enqueue through the follower")?;
    let hint = answer.metadata().get(leasehold_proto::LEADER_HINT_HEADER);
    let leader_addr = cluster.node(leader)?.grpc.to_string();
    ensure!(
        hint.and_then(|value| value.to_str().ok()) == Some(leader_addr.as_str()),
        "the follower's answer names the leader {leader_addr}: {hint:?}"
    );
    let results = answer.into_inner().results;
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

    phase("both nodes timed the stages of the three writes");
    let writes = 3;
    let follower_http = cluster.node(follower)?.http;
    let leader_http = cluster.node(leader)?.http;
    for (who, http, stages) in [
        ("follower", follower_http, &["queue", "forward", "follower_append", "log_sync"][..]),
        ("leader", leader_http, &["queue", "write", "replicate", "log_sync"][..]),
    ] {
        for stage in stages {
            let timed = stage_count(http, stage).await?;
            ensure!(
                timed >= writes,
                "the {who} timed the {stage} stage {timed} times for {writes} writes"
            );
        }
    }
    Ok(())
}

/// How many times the node at `http` timed `stage` of a commit round.
async fn stage_count(http: std::net::SocketAddr, stage: &str) -> Result<u64> {
    let metrics = http_get(http, "/metrics").await?;
    let series = format!("leasehold_commit_stage_seconds_count{{stage=\"{stage}\"}} ");
    let Some(line) = metrics.body.lines().find(|line| line.starts_with(&series)) else {
        return Ok(0);
    };
    line[series.len()..].trim().parse().with_context(|| format!("metric line {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_every_address_moves_to_the_leader() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-leader-hint")?;
    sandbox.run(Duration::from_secs(60), follow_story(&sandbox)).await
}

/// Cycles of enqueue, claim, ack the client makes.
const CYCLES: u64 = 10;

/// A node's count of `method` calls answered OK.
fn ok_calls(scrape: &Scrape, method: &str) -> Result<f64> {
    scrape.counter("leasehold_rpc_requests_total", &[("method", method), ("code", "ok")])
}

async fn follow_story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster; a client gets a follower's address first");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let before = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let leader = before.leader;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).context("no follower")?;
    let client = Client::connect(&cluster.addrs_of(&[follower, leader])?)?;
    let (leader_http, follower_http) = (cluster.node(leader)?.http, cluster.node(follower)?.http);
    let (leader_before, follower_before) =
        (scrape(leader_http).await?, scrape(follower_http).await?);

    phase("enqueue, claim and ack through the client");
    for n in 0..CYCLES {
        let enqueued = client.enqueue(vec![job(QUEUE, format!("cycle {n}").as_bytes())]).await?;
        ensure!(enqueued.len() == 1, "one job enqueued, results {enqueued:?}");
        let grants = client
            .claim(v1::ClaimRequest {
                worker: "leader-hint-test".to_string(),
                queue: QUEUE.to_string(),
                max: 1,
                wait_ms: 0,
                ..Default::default()
            })
            .await?;
        let Some(lease) = grants.first().and_then(|grant| grant.lease.clone()) else {
            bail!("cycle {n}: the claim granted nothing");
        };
        client.ack(lease.job_id, lease.token).await?;
    }

    phase("only the first call went to the follower; the rest to the leader");
    let (leader_after, follower_after) = (scrape(leader_http).await?, scrape(follower_http).await?);
    let cycles = CYCLES as f64;
    for (method, at_follower, at_leader) in
        [("enqueue", 1.0, cycles - 1.0), ("claim", 0.0, cycles), ("ack", 0.0, cycles)]
    {
        let follower_moved =
            ok_calls(&follower_after, method)? - ok_calls(&follower_before, method)?;
        let leader_moved = ok_calls(&leader_after, method)? - ok_calls(&leader_before, method)?;
        ensure!(
            follower_moved == at_follower && leader_moved == at_leader,
            "{method}: follower served {follower_moved} (expected {at_follower}), \
             leader {leader_moved} (expected {at_leader})"
        );
    }

    phase("leadership did not move during the story");
    let after = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(
        after.leader == leader && after.term == before.term,
        "leadership moved from {before:?} to {after:?}"
    );
    Ok(())
}
