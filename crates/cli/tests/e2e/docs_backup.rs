//! Goal: the backup and restore procedure of docs/deployment.md works as
//! written: a node's data directory copied while that node is stopped is a
//! whole backup, and a cluster whose every disk is lost comes back from one
//! node's backup with exactly the jobs it held when the backup was taken.
//!
//! Method: a real three-node cluster that snapshots every 20 entries (so
//! the backup holds a snapshot file and a purged log, not only sled's log).
//! Enqueue and ack jobs; back up follower 3 as the doc says (stop it with
//! SIGTERM, `cp -a` its data directory, start it again); enqueue more
//! jobs; then lose every node and its disk, copy the backup into every
//! node's data directory, start them all on their old ids and addresses,
//! and compare what the cluster holds with the picture at the backup.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_proto::v1;

use super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Cluster, ClusterOptions, Sandbox, deadline_in, enqueue_job, phase,
    stats_snapshot,
};

/// The queue of this story.
const QUEUE: &str = "backup";
/// The follower whose data directory is backed up.
const BACKED_UP: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_comes_back_from_one_nodes_backup() -> Result<()> {
    let sandbox = Sandbox::new("docs-backup")?;
    sandbox.run(Duration::from_secs(240), story(&sandbox)).await
}

/// `cp -a FROM TO`, the copy the doc shows.
fn copy_all(from: &Path, to: &Path) -> Result<()> {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status().context("cp -a")?;
    ensure!(status.success(), "cp -a {} {}: {status}", from.display(), to.display());
    Ok(())
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes that snapshot every 20 entries");
    let options =
        ClusterOptions { config: "snapshot_every_entries = 20\n".into(), ..Default::default() };
    let mut cluster = Cluster::start_with(sandbox, 3, options).await?;
    let mut stub = cluster.node(1)?.stub()?;

    phase("enqueue 40 jobs and ack one");
    for n in 0..40 {
        enqueue_job(&mut stub, QUEUE, format!("job {n}").as_bytes()).await?;
    }
    let claimed = stub
        .claim(v1::ClaimRequest {
            worker: "backup-story".into(),
            queue: QUEUE.into(),
            max: 1,
            ..Default::default()
        })
        .await
        .context("claim")?
        .into_inner();
    let grant = claimed.grants.first().context("no job claimed")?;
    let lease = grant.lease.as_ref().context("a grant without a lease")?;
    stub.ack(v1::AckRequest { job_id: lease.job_id, token: lease.token, result: Vec::new() })
        .await
        .context("ack")?;
    cluster.wait_caught_up(BACKED_UP, CLUSTER_CONVERGE_TIMEOUT).await?;
    let at_backup = stats_snapshot(&mut stub).await?;
    eprintln!("at the backup: {at_backup:?}");

    phase("back up node 3: stop it, copy its data directory, start it again");
    let backup = sandbox.path().join("backup-node-3");
    let data = cluster.node(BACKED_UP)?.data.clone();
    cluster.node_mut(BACKED_UP)?.stop(deadline_in(Duration::from_secs(30))).await?;
    copy_all(&data, &backup)?;
    ensure!(
        backup.join("snapshot").is_file(),
        "the backup holds no snapshot file: the story does not test what it says"
    );
    cluster.restart(sandbox, BACKED_UP).await?;
    cluster.wait_caught_up(BACKED_UP, CLUSTER_CONVERGE_TIMEOUT).await?;

    phase("work after the backup: five more jobs");
    for n in 0..5 {
        enqueue_job(&mut stub, QUEUE, format!("late {n}").as_bytes()).await?;
    }
    let later = stats_snapshot(&mut stub).await?;
    ensure!(later != at_backup, "the later jobs changed nothing");

    phase("lose every node and its disk");
    for id in cluster.ids() {
        let node = cluster.node_mut(id)?;
        node.kill()?;
        std::fs::remove_dir_all(&node.data)
            .with_context(|| format!("wiping {}", node.data.display()))?;
    }

    phase("restore: node 3's backup into every node's data directory, start them all");
    for id in cluster.ids() {
        copy_all(&backup, &cluster.node(id)?.data)?;
    }
    for id in cluster.ids() {
        cluster.node_mut(id)?.launch(sandbox)?;
    }
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    eprintln!("restored: {converged:?}");

    phase("the cluster holds what it held at the backup, and takes writes");
    let client = cluster.client()?;
    let mut raw = cluster.node(converged.leader)?.stub()?;
    let restored = stats_snapshot(&mut raw).await?;
    ensure!(restored == at_backup, "restored {restored:?}, at the backup {at_backup:?}");
    let job = client.get_job(lease.job_id, false).await.context("the acked job")?;
    ensure!(job.state == v1::JobState::Acked as i32, "job {} is {:?}", lease.job_id, job.state);
    let next = enqueue_job(&mut raw, QUEUE, b"after the restore").await?;
    ensure!(next == at_backup.last_job_id + 1, "new job id {next} after {at_backup:?}");
    client.status().await.context("status")?;
    Ok(())
}
