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

use std::time::Duration;

use anyhow::{Context, Result, ensure};
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
