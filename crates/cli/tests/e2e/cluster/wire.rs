//! Goal: nodes speak the binary Raft envelope to each other once their
//! adverts say they read it (issue 15, item 3), a leader sends its
//! appends as messages of one long-lived stream per follower rather than
//! as calls, and a payload near the size limit replicates (as JSON, each
//! of its bytes was a decimal number and a comma: four times the bytes,
//! and slow to parse).
//!
//! Method: a three-node cluster; every node counts the envelopes it
//! receives by layout and by call
//! (`leasehold_raft_envelopes_received_total{wire,call}`). Within a few
//! advert rounds of forming, each follower must be receiving binary
//! envelopes on the leader's append stream. Then a 200 KiB payload of 0xff
//! bytes is enqueued and must commit and converge, and while it replicates
//! the followers receive no JSON envelope and no unary call at all, but
//! more stream messages: every node of this build is sent binary, on the
//! stream.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, Sandbox, deadline_in, http_get, job, phase,
    wait_until,
};
use super::cluster_slot;

const QUEUE: &str = "wire";
/// Under the 256 KiB payload limit, over sled's separate-blob threshold.
const PAYLOAD: usize = 200 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_speak_binary_and_a_large_payload_replicates() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-wire")?;
    sandbox.run(Duration::from_secs(120), story(&sandbox)).await
}

/// Raft envelopes `http`'s node received whose labels include `label`
/// (`wire="binary"`, `call="stream"`).
async fn received(http: SocketAddr, label: &str) -> Result<u64> {
    let metrics = http_get(http, "/metrics").await?;
    let family = "leasehold_raft_envelopes_received_total{";
    let mut total = 0;
    for line in metrics.body.lines().filter(|l| l.starts_with(family) && l.contains(label)) {
        total += line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("metric line {line:?}"))? as u64;
    }
    Ok(total)
}

const JSON: &str = "wire=\"json\"";
const BINARY: &str = "wire=\"binary\"";
const STREAM: &str = "call=\"stream\"";
const UNARY: &str = "call=\"unary\"";

/// Each follower's count of envelopes with `label`.
async fn counts(followers: &[SocketAddr], label: &str) -> Result<Vec<u64>> {
    let mut counts = Vec::new();
    for http in followers {
        counts.push(received(*http, label).await?);
    }
    Ok(counts)
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let followers: Vec<SocketAddr> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != converged.leader)
        .map(|id| cluster.node(id).map(|node| node.http))
        .collect::<Result<_>>()?;

    phase("the followers receive binary envelopes on a stream once adverts are heard");
    for http in &followers {
        let http = *http;
        wait_until(
            "a follower to receive binary envelopes on the leader's stream",
            deadline_in(Duration::from_secs(20)),
            || async move {
                let binary = received(http, BINARY).await?;
                let streamed = received(http, STREAM).await?;
                Ok(if binary > 0 && streamed > 0 {
                    Check::Done(())
                } else {
                    Check::NotYet(format!(
                        "{} JSON envelopes, {binary} binary, {streamed} on a stream",
                        received(http, JSON).await?
                    ))
                })
            },
        )
        .await?;
    }
    let json_before = counts(&followers, JSON).await?;
    let unary_before = counts(&followers, UNARY).await?;
    let streamed_before = counts(&followers, STREAM).await?;

    phase("a 200 KiB payload commits and replicates");
    let client = cluster.client()?;
    let ids = client
        .enqueue(vec![job(QUEUE, &vec![0xff; PAYLOAD])])
        .await
        .context("enqueueing the 200 KiB payload")?;
    ensure!(ids.len() == 1, "one job enqueued, got {ids:?}");
    let after = cluster.wait_quiet(Duration::from_secs(2), CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(after.applied_index > converged.applied_index, "nothing applied: {after:?}");
    let json_after = counts(&followers, JSON).await?;
    let unary_after = counts(&followers, UNARY).await?;
    let streamed_after = counts(&followers, STREAM).await?;
    for (index, http) in followers.iter().enumerate() {
        ensure!(
            json_after[index] == json_before[index],
            "follower {http} received {} JSON envelopes after binary began",
            json_after[index] - json_before[index]
        );
        ensure!(
            unary_after[index] == unary_before[index],
            "follower {http} received {} unary calls after its stream opened",
            unary_after[index] - unary_before[index]
        );
        ensure!(
            streamed_after[index] > streamed_before[index],
            "follower {http} received nothing on its stream while the payload replicated"
        );
    }
    Ok(())
}
