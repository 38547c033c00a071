//! Goal: nodes speak the binary Raft envelope to each other once their
//! adverts say they read it (issue 15, item 3), and a payload near the
//! size limit replicates (as JSON, each of its bytes was a decimal number
//! and a comma: four times the bytes, and slow to parse).
//!
//! Method: a three-node cluster; every node counts the envelopes it
//! receives by layout (`leasehold_raft_envelopes_received_total{wire}`).
//! Within a few advert rounds of forming, each follower must be receiving
//! binary envelopes. Then a 200 KiB payload of 0xff bytes is enqueued and
//! must commit and converge, and while it replicates the followers receive
//! no JSON envelope at all: every node of this build is sent binary.

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

/// Raft envelopes `http`'s node received in `wire`'s layout.
async fn received(http: SocketAddr, wire: &str) -> Result<u64> {
    let metrics = http_get(http, "/metrics").await?;
    let family = "leasehold_raft_envelopes_received_total{";
    let label = format!("wire=\"{wire}\"");
    let mut total = 0;
    for line in metrics.body.lines().filter(|l| l.starts_with(family) && l.contains(&label)) {
        total += line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("metric line {line:?}"))? as u64;
    }
    Ok(total)
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

    phase("the followers receive binary envelopes once adverts are heard");
    for http in &followers {
        let http = *http;
        wait_until(
            "a follower to receive binary envelopes",
            deadline_in(Duration::from_secs(20)),
            || async move {
                let binary = received(http, "binary").await?;
                Ok(if binary > 0 {
                    Check::Done(())
                } else {
                    Check::NotYet(format!(
                        "{} JSON envelopes, no binary",
                        received(http, "json").await?
                    ))
                })
            },
        )
        .await?;
    }
    let json_before: Vec<u64> = {
        let mut counts = Vec::new();
        for http in &followers {
            counts.push(received(*http, "json").await?);
        }
        counts
    };

    phase("a 200 KiB payload commits and replicates");
    let client = cluster.client()?;
    let ids = client
        .enqueue(vec![job(QUEUE, &vec![0xff; PAYLOAD])])
        .await
        .context("enqueueing the 200 KiB payload")?;
    ensure!(ids.len() == 1, "one job enqueued, got {ids:?}");
    let after = cluster.wait_quiet(Duration::from_secs(2), CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(after.applied_index > converged.applied_index, "nothing applied: {after:?}");
    for (http, before) in followers.iter().zip(json_before) {
        let now = received(*http, "json").await?;
        ensure!(
            now == before,
            "a follower received {} JSON envelopes after binary began",
            now - before
        );
    }
    Ok(())
}
