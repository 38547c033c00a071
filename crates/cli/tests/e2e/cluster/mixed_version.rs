//! Goal: replicas agree whatever their binary (issue 14, item 4). Two builds
//! of the state machine with different compiled-in limits apply one journal
//! and reach one digest, because every entry carries the limits its leader
//! judged it by (`Command::Ruled`), so no replica re-judges a command by
//! limits of its own.
//!
//! Method: a three-node cluster of this build writes commands that the
//! other build's smaller limits (`leasehold-core`'s `older-build` feature:
//! 16 KiB payloads, 64-byte texts) would refuse — a 20 KiB payload,
//! a 100-byte tag, a claim by a worker with a 100-byte id, an ack of it —
//! and converges to one digest at one applied index. The nodes are killed,
//! and `leasehold-replay` built with `older-build` (scripts/check.sh builds
//! it before the tests, into `target/older-build/`) replays each node's
//! committed log from its first entry through that build's storage and
//! state machine. It must report the other build's limits, the same applied
//! index and the same digest. With the leader's limits left out of the
//! entries, the older build refuses the large enqueue and its digest
//! differs (checked once: see the commit).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_proto::v1;

use super::super::support::{CLUSTER_CONVERGE_TIMEOUT, Cluster, Sandbox, binary, job, phase};
use super::cluster_slot;

const QUEUE: &str = "mixed";
/// Between the two builds' payload bounds (16 KiB and 256 KiB).
const LARGE_PAYLOAD: usize = 20 * 1024;
/// Between the two builds' text bounds (64 and 256 bytes).
const LONG_TEXT: usize = 100;
/// What the other build reports as its payload bound.
const OLDER_MAX_PAYLOAD: u64 = 16 * 1024;

/// The other build of the replay tool, or `None` when it was not built
/// (outside scripts/check.sh, which builds it and sets
/// `LEASEHOLD_REQUIRE_OLDER_BUILD=1` so that its absence fails the test).
fn older_replay() -> Result<Option<PathBuf>> {
    let path = match std::env::var_os("LEASEHOLD_OLDER_REPLAY") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(binary())
            .parent()
            .and_then(|debug| debug.parent())
            .context("the leasehold binary has no target directory")?
            .join("older-build/leasehold-replay"),
    };
    if path.is_file() {
        return Ok(Some(path));
    }
    let required = std::env::var("LEASEHOLD_REQUIRE_OLDER_BUILD").is_ok_and(|v| v == "1");
    ensure!(
        !required,
        "{} is missing: build it with `cargo build -p leasehold-replay --features older-build` \
         and copy target/debug/leasehold-replay there (scripts/check.sh does)",
        path.display()
    );
    eprintln!(
        "skipped: {} is missing (scripts/check.sh builds it; see this file's doc)",
        path.display()
    );
    Ok(None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_builds_with_different_limits_replay_one_journal_to_one_digest() -> Result<()> {
    let Some(replay) = older_replay()? else { return Ok(()) };
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-mixed-version")?;
    sandbox.run(Duration::from_secs(120), story(&sandbox, replay)).await
}

async fn story(sandbox: &Sandbox, replay: PathBuf) -> Result<()> {
    phase("start a three-node cluster of this build");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let client = cluster.client()?;

    phase("write what only this build's limits allow");
    let mut large = job(QUEUE, &vec![b'x'; LARGE_PAYLOAD]);
    large.tags = vec!["t".repeat(LONG_TEXT)];
    let ids = client.enqueue(vec![large]).await.context("the large enqueue")?;
    ensure!(ids.len() == 1, "one job enqueued, got {ids:?}");
    let worker = "w".repeat(LONG_TEXT);
    let grants = client
        .claim(v1::ClaimRequest {
            worker: worker.clone(),
            queue: QUEUE.to_string(),
            max: 1,
            selector: vec!["t".repeat(LONG_TEXT)],
            ..Default::default()
        })
        .await
        .context("the claim by a long worker id")?;
    let lease = grants
        .first()
        .and_then(|grant| grant.lease.clone())
        .context("the claim granted no lease")?;
    ensure!(lease.holder == worker, "the lease is held by {:?}", lease.holder);
    client.ack(lease.job_id, lease.token).await.context("the ack")?;

    phase("converge, then kill every node");
    let converged = cluster.wait_quiet(Duration::from_secs(2), CLUSTER_CONVERGE_TIMEOUT).await?;
    eprintln!("converged: {converged:?}");
    // SIGKILL, not a drain: a drain writes to the journal on its way out,
    // and the logs are to end where the cluster's digest was taken.
    let ids = cluster.ids();
    for node in cluster.nodes_mut() {
        node.kill()?;
    }

    phase("replay each node's log through the other build");
    for id in ids {
        let data = cluster.node(id)?.data.clone();
        let output = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(&replay)
                .arg("--data")
                .arg(&data)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("the replay did not finish within 30 s")?
        .context("running the replay")?;
        ensure!(
            output.status.success(),
            "replay of node {id} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("the replay's JSON line")?;
        eprintln!("node {id} replayed by the other build: {report}");
        ensure!(
            report["max_payload_bytes"].as_u64() == Some(OLDER_MAX_PAYLOAD),
            "the replay is not the other build (its limits: {report})"
        );
        ensure!(
            report["applied_index"].as_u64() == Some(converged.applied_index),
            "node {id}'s replay applied up to {} where the cluster applied {}",
            report["applied_index"],
            converged.applied_index
        );
        ensure!(
            report["digest"].as_u64() == Some(converged.digest),
            "node {id}'s replay by the other build reached digest {} where this build reached {}",
            report["digest"],
            converged.digest
        );
    }
    Ok(())
}
