//! Helpers shared by the node's in-process cluster tests.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use leasehold_node::config::{Config, SecretText};
use leasehold_node::{Node, NodeHandle, Transport};
use tokio::net::TcpListener;

/// Prints a story's phase, so a failure's output says where it was.
pub fn phase(name: &str) {
    eprintln!("--- {name}");
}

/// Starts a node on the gRPC and HTTP addresses `config` names.
pub async fn start(config: Config) -> Result<NodeHandle> {
    let grpc = TcpListener::bind(&config.grpc).await?;
    let http = TcpListener::bind(&config.http).await?;
    let id = config.id;
    Node::start(config, Transport { grpc, http }).await.map_err(|e| anyhow!("node {id}: {e}"))
}

/// Waits until `check` holds, polling, or fails naming `what`.
pub async fn wait_for(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + within;
    while !check() {
        if Instant::now() > deadline {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The index of the last entry in `node`'s log (0 when empty).
pub fn last_index(node: &NodeHandle) -> u64 {
    node.raft().metrics().borrow().last_log_index.unwrap_or(0)
}

/// Starts node 1 alone on loopback ports with its data under `dir`: no
/// executor, and no sweeps or purges from its driver, so a story's own
/// writes are the only ones.
pub async fn start_alone(dir: &std::path::Path) -> Result<NodeHandle> {
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let http = TcpListener::bind("127.0.0.1:0").await?;
    let config = Config {
        id: 1,
        grpc: grpc.local_addr()?.to_string(),
        http: http.local_addr()?.to_string(),
        data: dir.join("node-1"),
        executor: false,
        sweep_interval_ms: 3_600_000,
        purge_interval_ms: 3_600_000,
        cluster_secret: Some(SecretText("single-node-test-secret-0123456789".into())),
        ..Config::default()
    };
    Node::start(config, Transport { grpc, http }).await.map_err(|e| anyhow!("node 1: {e}"))
}
