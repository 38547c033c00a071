//! What leasehold's three test harnesses share — the end-to-end stories
//! (`crates/cli/tests/e2e`), the chaos harness (`cluster-tests`) and the
//! benchmark driver (`bench`): a sandbox directory whose logs are reported
//! when a test fails, a child process that is killed and reaped whatever
//! way the test ends, free ports, bounded waits on named conditions, how
//! long a node may take to serve, and which node leads by a set of status
//! answers.
//!
//! Test code only (`publish = false`); nothing shipped depends on it. It
//! prints to stderr, as test harnesses do.

pub mod cluster;
pub mod process;
pub mod sandbox;
pub mod wait;

pub use cluster::{NODE_READY_TIMEOUT, agreed_leader, highest_term_leader};
pub use process::Process;
pub use sandbox::Sandbox;
pub use wait::{Check, POLL_INTERVAL, deadline_in, wait_until};

/// A free TCP port on `ip`: bind port 0, read the port, let it go. The
/// caller binds it moments later; a collision fails that start loudly.
pub fn free_port(ip: std::net::IpAddr) -> anyhow::Result<u16> {
    use anyhow::Context;
    let listener =
        std::net::TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}:0"))?;
    Ok(listener.local_addr().context("reading the bound address")?.port())
}
