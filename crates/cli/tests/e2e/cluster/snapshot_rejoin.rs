//! Goal: a node whose data directory is wiped rejoins and catches up through
//! a snapshot, because the log it would need has been purged, and its state
//! converges to the others' (issue 3, "Snapshots and log compaction").
//!
//! Method: run the cluster with `snapshot_every_entries = 50`. The nodes keep
//! the last 1,000 entries behind a snapshot, so enqueue jobs until the
//! leader's log says it purged entries: from then on, a node starting from an
//! empty log cannot be brought up by replication alone. The writes go one at
//! a time, each its own log entry (concurrent proposals would share one). Stop a follower, wipe
//! its data directory, restart it with `--join`, and require: its log says
//! it installed a snapshot, every digest is equal at one applied index, it
//! answers a linearizable read of the very first job (an entry that no
//! longer exists in any log), and its counts are the cluster's before the
//! wipe. The snapshot travels as chunks read from the leader's snapshot
//! file and written to a file on the receiver, which is gone once the
//! snapshot is installed.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_proto::v1;

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, ClusterOptions, Sandbox, deadline_in, job, phase,
    queue_stats, stats_snapshot, wait_until,
};
use super::cluster_slot;

const QUEUE: &str = "snapshot";
/// Bound on the writes: a purge is due after about 1,050 log entries (1,000
/// kept behind a snapshot taken every 50), and one write is one entry.
const MAX_WRITES: usize = 3_000;
const NODE_CONFIG: &str = "snapshot_every_entries = 50\n";
/// The purge is logged at debug level by the log store.
const LOG_FILTER: &str =
    "info,openraft=warn,raft_log=warn,chunked_wal=warn,leasehold_storage::log_store=debug";
/// What the log store prints when it purges entries.
const PURGED_LINE: &str = "log purged";
/// What the state machine prints when it replaces its state with a snapshot.
const INSTALLED_LINE: &str = "snapshot installed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_node_rejoins_by_snapshot() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-snapshot-rejoin")?;
    sandbox.run(Duration::from_secs(150), story(&sandbox)).await
}

/// Waits until the current log of `node` contains `line`.
async fn wait_log_line(cluster: &Cluster, node: u64, line: &str, within: Duration) -> Result<()> {
    let log = cluster.node(node)?.log().context("the node has no log")?.to_path_buf();
    let what = format!("node {node}'s log to say {line:?}");
    wait_until(&what, deadline_in(within), || {
        let text =
            std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()));
        async move {
            let text = text?;
            Ok(if text.contains(line) {
                Check::Done(())
            } else {
                Check::NotYet(format!("{} bytes of log without it", text.len()))
            })
        }
    })
    .await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster that snapshots every 50 entries");
    let options = ClusterOptions {
        config: NODE_CONFIG.to_string(),
        log_filter: LOG_FILTER.to_string(),
        ..Default::default()
    };
    let mut cluster = Cluster::start_with(sandbox, 3, options).await?;
    let leader = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?.leader;

    phase("write, one job at a time, until the leader purges log entries");
    let client = cluster.client()?;
    let purge_log = cluster.node(leader)?.log().context("the leader has no log")?.to_path_buf();
    let mut written = 0_usize;
    loop {
        let purged = std::fs::read_to_string(&purge_log)
            .with_context(|| format!("reading {}", purge_log.display()))?
            .contains(PURGED_LINE);
        if purged {
            break;
        }
        ensure!(written < MAX_WRITES, "no purge in the leader's log after {written} writes");
        let spec = v1::JobSpec {
            idempotency_key: Some(format!("snapshot-{written}")),
            ..job(QUEUE, format!("entry {written}").as_bytes())
        };
        client.enqueue(vec![spec]).await.with_context(|| format!("enqueue {written}"))?;
        written += 1;
    }
    eprintln!("the leader purged log entries after {written} writes");
    let mut stub = cluster.node(leader)?.stub()?;
    let stats = queue_stats(&mut stub, QUEUE).await?;
    ensure!(stats.ready == written as u64, "after {written} writes: {stats:?}");
    let before_wipe = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let jobs_before = stats_snapshot(&mut stub).await?;

    phase("stop a follower, wipe its data directory, restart it with --join");
    let wiped = cluster.ids().into_iter().find(|id| *id != leader).context("no follower")?;
    cluster.wipe(wiped)?;
    eprintln!("wiped node {wiped} (leader {leader})");
    cluster.restart(sandbox, wiped).await?;

    phase("it installs a snapshot and converges");
    wait_log_line(&cluster, wiped, INSTALLED_LINE, CLUSTER_CONVERGE_TIMEOUT).await?;
    // Digests are compared among the nodes, not with the one before the
    // wipe: the wiped node registers itself again, a write of its own.
    let after = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(
        after.applied_index >= before_wipe.applied_index,
        "applied index went back across the rejoin: {before_wipe:?} before, {after:?} after"
    );

    phase("the received snapshot's file is gone; the snapshot file holds it");
    let data = cluster.node(wiped)?.data.clone();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&data).with_context(|| format!("listing {}", data.display()))? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    ensure!(
        !names.iter().any(|name| name.starts_with("snapshot.receiving")),
        "a received snapshot's file was left behind: {names:?}"
    );
    ensure!(names.iter().any(|name| name == "snapshot"), "no snapshot file: {names:?}");

    phase("the wiped node serves the first job, long purged from every log");
    let first = cluster
        .node(wiped)?
        .client()?
        .get_job(1, false)
        .await
        .context("reading job 1 from the wiped node")?;
    ensure!(first.payload.starts_with(b"entry "), "job 1 on the wiped node: {first:?}");
    let mut at_wiped = cluster.node(wiped)?.stub()?;
    let jobs_after = stats_snapshot(&mut at_wiped).await?;
    ensure!(
        jobs_after == jobs_before,
        "the wiped node counts {jobs_after:?}, the cluster counted {jobs_before:?} before the wipe"
    );
    Ok(())
}
