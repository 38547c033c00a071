//! Goal: no mix of concurrent writes makes a log entry larger than a peer
//! accepts (docs/security.md, "Limits"). The journal merges concurrent
//! proposals into one entry; it used to bound that entry by payload bytes
//! alone, so enqueues whose bytes are in tags, not payloads, merged past
//! the 64 MiB Raft envelope. The leader could then never send that entry,
//! and nothing committed again while it led: one producer could freeze the
//! cluster's writes.
//!
//! Method: a three-node cluster; twelve enqueues sent to the leader at
//! once, each of 1,000 jobs with 32 tags of 256 bytes and no payload (about
//! 8.5 MiB each, within every request limit). All twelve must commit, a
//! small write after them too, and the replicas must converge on one
//! digest.
//!
//! Mutation check (run once against a deliberately broken build): with a
//! batch weighed by payload bytes only, the enqueues time out without
//! committing and the story fails.
//!
//! A second story: answers, not only entries, are bounded. A follower
//! forwards a claim and gets its answer back as one message, after every
//! lease in it was granted; a claim of 300 jobs of 250 KB through a
//! follower made an answer past the 64 MiB envelope, so the client was
//! told INTERNAL while 300 leases sat held by no one until they lapsed,
//! each charging its job an attempt. A follower now forwards a claim
//! asking for no more leases than one answer could carry with jobs of the
//! largest size (about 60 by default): the story claims 100 small jobs
//! through a follower and gets that many, every one held by the client,
//! and the leader, which answers its client directly, grants the rest.
//! Without the cap the follower's claim gets all 100 and the story fails.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_core::{Limits, batch};
use leasehold_proto::v1;

use super::super::support::{CLUSTER_CONVERGE_TIMEOUT, Cluster, Sandbox, job, phase};
use super::cluster_slot;

const QUEUE: &str = "tagged";
const CALLS: usize = 12;
const JOBS: usize = 1_000;
/// The most tags a job may carry, each of the longest length.
const TAGS: usize = 32;
const TAG_BYTES: usize = 256;
/// Each call's bound: a commit takes well under a second here; a frozen
/// leader answers no quorum after its quorum timeout, or never.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tag_heavy_enqueues_commit_and_do_not_freeze_the_cluster() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-big-entries")?;
    sandbox.run(Duration::from_secs(240), story(&sandbox)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_through_a_follower_is_answered_whole_or_asks_for_fewer() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-big-claims")?;
    sandbox.run(Duration::from_secs(240), claim_story(&sandbox)).await
}

async fn claim_story(sandbox: &Sandbox) -> Result<()> {
    const BIG: &str = "big-claims";
    const JOBS: u32 = 100;
    let cap = batch::max_forwarded_leases(Limits::default().grant_bytes_bound());
    ensure!((1..JOBS).contains(&cap), "the cap of a forwarded claim is {cap}");
    phase("a three-node cluster holding 100 jobs");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let mut at_leader = cluster.node(converged.leader)?.stub()?;
    let jobs = (0..JOBS).map(|_| job(BIG, b"small")).collect();
    at_leader.enqueue(v1::EnqueueRequest { jobs }).await.context("enqueue")?;
    let follower_id =
        cluster.ids().into_iter().find(|id| *id != converged.leader).context("no follower")?;
    // Its copy holds the jobs: a claim there proposes only what it sees.
    cluster.wait_caught_up(follower_id, CLUSTER_CONVERGE_TIMEOUT).await?;
    let mut through_follower = cluster.node(follower_id)?.stub()?;
    let claim = v1::ClaimRequest {
        worker: "big-claimer".to_string(),
        queue: BIG.to_string(),
        max: JOBS,
        wait_ms: 0,
        ..Default::default()
    };

    phase("a claim of all of them through a follower asks for what one answer carries");
    let through =
        through_follower.claim(claim.clone()).await.context("claim through a follower")?;
    let through = through.into_inner().grants.len();
    ensure!(through == cap as usize, "{through} grants through a follower, cap {cap}");

    phase("the leader answers its own client whole: the rest");
    let direct = at_leader.claim(claim).await.context("claim at the leader")?.into_inner().grants;
    ensure!(direct.len() == (JOBS - cap) as usize, "{} grants at the leader", direct.len());

    phase("a retry of a claim the leader granted past the cap is sent to the leader");
    let more = (0..JOBS).map(|_| job(BIG, b"small")).collect();
    at_leader.enqueue(v1::EnqueueRequest { jobs: more }).await.context("enqueue more")?;
    let once = v1::ClaimRequest {
        worker: "retrier".to_string(),
        queue: BIG.to_string(),
        max: JOBS,
        wait_ms: 0,
        request_id: "first-try".to_string(),
        ..Default::default()
    };
    let first = at_leader.claim(once.clone()).await.context("claim once at the leader")?;
    let first = first.into_inner().grants.len();
    ensure!(first == JOBS as usize, "{first} grants at the leader");
    // Its answer lost, the worker retries at a follower (caught up, so its
    // copy remembers the first try): the follower would forward it and be
    // answered with all of them, more than it carries.
    cluster.wait_caught_up(follower_id, CLUSTER_CONVERGE_TIMEOUT).await?;
    let retried = through_follower.claim(once.clone()).await;
    ensure!(
        matches!(&retried, Err(s) if s.code() == tonic::Code::Unavailable
            && s.message().contains("retry it at the leader")),
        "a retry holding {JOBS} leases through a follower was answered {}",
        match &retried {
            Ok(answer) => format!("with {} grants", answer.get_ref().grants.len()),
            Err(status) => format!("{status:?}"),
        }
    );
    let again = at_leader.claim(once).await.context("the retry at the leader")?;
    ensure!(again.into_inner().grants.len() == first, "the retry at the leader lost leases");

    phase("the leader holds exactly the leases the clients were given");
    let stats = at_leader
        .stats(v1::StatsRequest { queue: Some(BIG.to_string()), stale: false })
        .await
        .context("stats")?
        .into_inner();
    let counts = stats.queues.first().context("no stats for the queue")?;
    ensure!(
        counts.claimed == 2 * u64::from(JOBS) && counts.ready == 0,
        "claimed {} and ready {}",
        counts.claimed,
        counts.ready
    );
    Ok(())
}

fn tagged_jobs(call: usize) -> Vec<v1::JobSpec> {
    let tags: Vec<String> =
        (0..TAGS).map(|tag| format!("{call:02}{tag:02}{}", "t".repeat(TAG_BYTES - 4))).collect();
    (0..JOBS).map(|_| v1::JobSpec { tags: tags.clone(), ..job(QUEUE, b"") }).collect()
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let leader = cluster.node(converged.leader)?;

    phase("twelve enqueues of 1,000 tag-heavy jobs each, at once, to the leader");
    let mut calls = tokio::task::JoinSet::new();
    for call in 0..CALLS {
        let mut stub = leader.stub()?.max_encoding_message_size(16 * 1024 * 1024);
        let request = v1::EnqueueRequest { jobs: tagged_jobs(call) };
        calls.spawn(async move {
            let answer = tokio::time::timeout(CALL_TIMEOUT, stub.enqueue(request)).await;
            let answer = answer.with_context(|| format!("enqueue {call} did not commit"))?;
            let results = answer.with_context(|| format!("enqueue {call}"))?.into_inner().results;
            ensure!(results.len() == JOBS, "enqueue {call}: {} results", results.len());
            anyhow::Ok(())
        });
    }
    while let Some(done) = calls.join_next().await {
        done.context("an enqueue task")??;
    }

    phase("a small write commits after them, and the replicas agree");
    let mut stub = leader.stub()?;
    let small = v1::EnqueueRequest { jobs: vec![job("after", b"small")] };
    tokio::time::timeout(CALL_TIMEOUT, stub.enqueue(small))
        .await
        .context("the write after did not commit")?
        .context("the write after")?;
    let after = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(after.applied_index > converged.applied_index, "nothing applied: {after:?}");
    Ok(())
}
