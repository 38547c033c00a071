//! A status call that asks every member takes one of a few turns: many
//! callers at once cannot multiply the calls a node makes to its peers.
//! The node's one other member is a listener that takes connections and
//! never answers, so each such call holds its turn for the full per-member
//! timeout; a call that asks only the node itself needs no turn, and the
//! status page, which has turns of its own, is not crowded out.

mod support;

use std::time::Duration;

use anyhow::{Result, anyhow, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use openraft::BasicNode;
use support::{phase, start_alone, wait_for};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Calls sent at once: far more than the node's turns can take within the
/// time a call waits for one (each turn is held a second).
const CALLERS: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_calls_asking_every_member_take_turns() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(60), story())
        .await
        .map_err(|_| anyhow!("timed out"))?
}

async fn story() -> Result<()> {
    let dir = tempfile::tempdir()?;
    phase("node 1 alone, then a learner at an address that never answers");
    let node = start_alone(dir.path()).await?;
    wait_for("node 1 leads", Duration::from_secs(10), || {
        node.raft().metrics().borrow().current_leader == Some(1)
    })
    .await?;
    let hole = TcpListener::bind("127.0.0.1:0").await?;
    let hole_addr = hole.local_addr()?;
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            held.push(socket);
        }
    });
    node.raft()
        .add_learner(2, BasicNode::new(hole_addr.to_string()), false)
        .await
        .map_err(|e| anyhow!("adding the learner: {e}"))?;

    phase("many status calls at once: some wait their turn, the rest are refused busy");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr()))?
        .connect()
        .await?;
    let mut calls = JoinSet::new();
    for _ in 0..CALLERS {
        let mut client = ClusterClient::new(channel.clone());
        calls.spawn(async move { client.status(v1::StatusRequest { local_only: false }).await });
    }
    phase("meanwhile, a call asking only node 1 is answered");
    let mut client = ClusterClient::new(channel.clone());
    let local = tokio::time::timeout(
        Duration::from_millis(900),
        client.status(v1::StatusRequest { local_only: true }),
    )
    .await
    .map_err(|_| anyhow!("a local-only status call waited for a turn"))??
    .into_inner();
    ensure!(local.nodes.len() == 1, "{local:?}");
    phase("meanwhile, the status page answers");
    let page = tokio::time::timeout(Duration::from_secs(4), page_status(node.http_addr()))
        .await
        .map_err(|_| anyhow!("the status page did not answer within 4 s"))??;
    ensure!(page.starts_with("HTTP/1.1 200"), "the status page: {page}");

    let (mut answered, mut busy) = (0, 0);
    while let Some(call) = calls.join_next().await {
        match call? {
            Ok(reply) => {
                let reply = reply.into_inner();
                let learner = reply.nodes.iter().find(|n| n.id == 2);
                ensure!(learner.is_some_and(|n| !n.reachable), "{reply:?}");
                answered += 1;
            }
            Err(status)
                if status.code() == tonic::Code::Unavailable
                    && status.message().contains("busy") =>
            {
                busy += 1
            }
            Err(status) => return Err(anyhow!("a status call failed otherwise: {status:?}")),
        }
    }
    eprintln!("{answered} answered, {busy} refused busy");
    ensure!(answered >= 4, "fewer calls answered than there are turns: {answered}");
    ensure!(busy > 0, "all {CALLERS} calls asked the unanswering member at once");

    holder.abort();
    node.shutdown(Duration::from_secs(5)).await.map_err(|e| anyhow!("shutdown: {e}"))?;
    Ok(())
}

/// The status line and headers of `GET /api/status` at `addr`.
async fn page_status(addr: std::net::SocketAddr) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /api/status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    Ok(answer.split("\r\n\r\n").next().unwrap_or_default().to_string())
}
