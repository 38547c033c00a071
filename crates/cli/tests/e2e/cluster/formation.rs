//! Goal: three nodes form one cluster through `--join`, and a second node
//! claiming an id already in use is turned away without disturbing it
//! (SPEC §5 "Start", §6 `cluster status`; issue 3, membership).
//!
//! Method: start node 1, join nodes 2 and 3 through it, and read
//! `leasehold cluster status --output json` from node 3 (a joined node
//! answers for every member): three voters, exactly one leader whom the
//! `leader` field names, equal digests at equal applied indexes. A write
//! must move every digest alike. Then start a fourth process as `--id 2` on
//! new ports and a new data directory: it must exit non-zero with a message
//! naming id 2, and the cluster must look exactly as it did before (both
//! pictures taken once the cluster has applied nothing for a while, so a
//! write the impostor caused would show). Last, node 3 started again
//! without the cluster secret (and without `--join`) must refuse to start
//! and keep no secret of its own: one made up would be refused by every
//! peer.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, CLUSTER_SECRET, Cluster, Process, QUIET, Sandbox, binary,
    deadline_in, free_port, job, phase, run_cli,
};
use super::cluster_slot;

/// How long the refused process may take to give up.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_a_cluster_through_join() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-formation")?;
    sandbox.run(Duration::from_secs(90), story(&sandbox)).await
}

/// One member as `cluster status --output json` prints it.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    id: u64,
    addr: String,
    role: String,
    voter: bool,
    applied_index: u64,
    digest: String,
    digest_index: u64,
}

/// The leader and members of a `cluster status --output json` document.
fn parse_status(status: &Value) -> Result<(u64, Vec<Member>)> {
    let leader = status["leader"].as_u64().context("no numeric leader")?;
    let nodes = status["nodes"].as_array().context("no nodes array")?;
    let mut members = Vec::new();
    for node in nodes {
        let text = |key: &str| {
            node[key].as_str().map(str::to_string).with_context(|| format!("{key} in {node}"))
        };
        members.push(Member {
            id: node["id"].as_u64().with_context(|| format!("id in {node}"))?,
            addr: text("addr")?,
            role: text("role")?,
            voter: node["voter"].as_bool().with_context(|| format!("voter in {node}"))?,
            applied_index: node["applied_index"]
                .as_u64()
                .with_context(|| format!("applied_index in {node}"))?,
            digest: text("digest")?,
            digest_index: node["digest_index"]
                .as_u64()
                .with_context(|| format!("digest_index in {node}"))?,
        });
    }
    Ok((leader, members))
}

/// Checks the picture the issue asks for: three voters, one leader named by
/// the `leader` field, every other member a follower, one digest at one
/// applied index. Answers that digest.
fn check_formed(leader: u64, members: &[Member]) -> Result<String> {
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    ensure!(ids == [1, 2, 3], "members {ids:?}, expected [1, 2, 3]");
    ensure!(members.iter().all(|m| m.voter), "not all voters: {members:?}");
    let leaders: Vec<u64> = members.iter().filter(|m| m.role == "leader").map(|m| m.id).collect();
    ensure!(leaders == [leader], "leader field {leader}, nodes in role leader {leaders:?}");
    ensure!(
        members.iter().filter(|m| m.id != leader).all(|m| m.role == "follower"),
        "a non-leader is not a follower: {members:?}"
    );
    let first = &members[0];
    ensure!(
        members.iter().all(|m| m.digest == first.digest
            && m.applied_index == first.applied_index
            && m.digest_index == m.applied_index),
        "digests or applied indexes differ: {members:?}"
    );
    Ok(first.digest.clone())
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1, join nodes 2 and 3 through it");
    let mut cluster = Cluster::start(sandbox, 3).await?;

    phase("`cluster status --output json` from node 3 shows three voters and one leader");
    let node3 = cluster.node(3)?.addr();
    let run = run_cli(sandbox, &["cluster", "status", "--output", "json", "--addr", &node3], &[])
        .await?
        .success()?;
    let (leader, before) = parse_status(&run.json()?)?;
    let digest_before = check_formed(leader, &before)?;
    for member in &before {
        let expected = cluster.node(member.id)?.grpc.to_string();
        ensure!(
            member.addr == expected,
            "member {} at {}, started at {expected}",
            member.id,
            member.addr
        );
    }
    eprintln!(
        "leader {leader}, digest {digest_before} at applied index {}",
        before[0].applied_index
    );

    phase("a write through node 3 moves every digest alike");
    let written = cluster.node(3)?.client()?.enqueue(vec![job("formation", b"hello")]).await?;
    ensure!(written.len() == 1, "one job enqueued, {} results", written.len());
    let converged = cluster.wait_quiet(QUIET, CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(
        format!("{:016x}", converged.digest) != digest_before,
        "the digest did not change with a write: {converged:?}"
    );
    let run = run_cli(sandbox, &["cluster", "status", "--output", "json", "--addr", &node3], &[])
        .await?
        .success()?;
    let (leader, after_write) = parse_status(&run.json()?)?;
    let digest_after_write = check_formed(leader, &after_write)?;

    phase("a second process with id 2 on new ports is refused");
    let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut command = Command::new(binary());
    command
        .arg("serve")
        .args(["--id", "2"])
        .args(["--grpc", &grpc.to_string()])
        .args(["--http", &http.to_string()])
        .arg("--data")
        .arg(sandbox.path().join("data-impostor"))
        .args(["--join", &cluster.node(1)?.grpc.to_string()])
        .env("LEASEHOLD_CLUSTER_SECRET", CLUSTER_SECRET)
        .env_remove("LEASEHOLD_ADDR")
        .env("NO_COLOR", "1");
    let log = sandbox.log_file("impostor-2");
    let mut process = Process::spawn("impostor with id 2", command, &log)?;
    let status = process.wait_exit(deadline_in(REFUSAL_TIMEOUT)).await?;
    let output = std::fs::read_to_string(&log).context("reading the impostor's log")?;
    ensure!(!status.success(), "the impostor exited successfully: {status}; log {output:?}");
    ensure!(
        output.contains("node id 2") && output.contains("already"),
        "the refusal does not name id 2 as already in use: {output:?}"
    );

    phase("the cluster is unchanged: same members, same addresses, same digest");
    let converged_after = cluster.wait_quiet(QUIET, CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(
        converged_after == converged,
        "the refused join changed the cluster: {converged:?} before, {converged_after:?} after"
    );
    let run = run_cli(sandbox, &["cluster", "status", "--output", "json", "--addr", &node3], &[])
        .await?
        .success()?;
    let (leader_after, after) = parse_status(&run.json()?)?;
    ensure!(
        check_formed(leader_after, &after)? == digest_after_write,
        "digest moved after the refusal: {after:?}"
    );
    ensure!(after == after_write, "members changed: {after_write:?} before, {after:?} after");

    phase("node 3 restarted without the cluster secret or --join refuses, keeping no new one");
    let node3 = cluster.node_mut(3)?;
    node3.kill()?;
    let mut command = Command::new(binary());
    command
        .arg("serve")
        .args(["--id", "3"])
        .args(["--grpc", &node3.grpc.to_string()])
        .args(["--http", &node3.http.to_string()])
        .arg("--data")
        .arg(&node3.data)
        .env_remove("LEASEHOLD_CLUSTER_SECRET")
        .env_remove("LEASEHOLD_ADDR")
        .env("NO_COLOR", "1");
    let log = sandbox.log_file("node-3-without-secret");
    let mut process = Process::spawn("node 3 without its secret", command, &log)?;
    let status = process.wait_exit(deadline_in(REFUSAL_TIMEOUT)).await?;
    let output = std::fs::read_to_string(&log).context("reading node 3's log")?;
    ensure!(!status.success(), "node 3 started without its secret: {status}; log {output:?}");
    ensure!(
        output.contains("cluster_secret") && output.contains("LEASEHOLD_CLUSTER_SECRET"),
        "the refusal does not name the secret's settings: {output:?}"
    );
    let kept = node3.data.join("cluster-secret");
    ensure!(!kept.exists(), "a new secret was kept at {}", kept.display());
    Ok(())
}
