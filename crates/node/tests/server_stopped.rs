//! Goal: a node whose gRPC listener fails for good (not a passing error
//! such as a connection reset before it was accepted) says so, so that
//! `leasehold serve` exits for its supervisor to restart it, rather than
//! go on reporting itself ready while it serves nothing.
//!
//! Method: one node in this process on a listener the test keeps a
//! duplicate of; shutting that socket down makes every later `accept`
//! fail (EINVAL). The node's `server_stopped` must then resolve, naming
//! the gRPC server. Without the watch on the server's task (checked once)
//! it never does.

use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use leasehold_node::config::{Config, SecretText};
use leasehold_node::{Node, Transport};
use tokio::net::TcpListener;

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_grpc_listener_fails_says_its_server_stopped() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(60), story()).await.context("story timed out")?
}

async fn story() -> Result<()> {
    let dir = tempfile::tempdir()?;
    support::phase("start node 1 on a listener the test holds a duplicate of");
    let grpc = TcpListener::bind("127.0.0.1:0").await?.into_std()?;
    let duplicate = grpc.try_clone()?;
    let grpc = TcpListener::from_std(grpc)?;
    let http = TcpListener::bind("127.0.0.1:0").await?;
    let config = Config {
        id: 1,
        grpc: grpc.local_addr()?.to_string(),
        http: http.local_addr()?.to_string(),
        data: dir.path().join("node-1"),
        executor: false,
        cluster_secret: Some(SecretText("server-stopped-test-secret-0123456789".into())),
        ..Config::default()
    };
    let node =
        Node::start(config, Transport { grpc, http }).await.map_err(|e| anyhow!("start: {e}"))?;
    let quiet = tokio::time::timeout(Duration::from_millis(500), node.server_stopped()).await;
    ensure!(quiet.is_err(), "a server stopped on a healthy node: {quiet:?}");

    support::phase("the listening socket is shut down: accepting fails for good");
    nix::sys::socket::shutdown(duplicate.as_raw_fd(), nix::sys::socket::Shutdown::Both)
        .context("shutting the listener down")?;
    // A connection attempt wakes the accept loop, which then fails.
    let _ = tokio::net::TcpStream::connect(node.grpc_addr()).await;
    let why = tokio::time::timeout(Duration::from_secs(10), node.server_stopped())
        .await
        .context("the node did not say its gRPC server stopped")?;
    eprintln!("{why}");
    ensure!(why.contains("gRPC"), "{why}");
    node.shutdown(Duration::from_secs(10)).await.map_err(|e| anyhow!("shutdown: {e}"))?;
    Ok(())
}
