//! Cluster acceptance stories (issues 3 and 6): three real `leasehold
//! serve` processes on 127.0.0.1 formed through `--join`, then faults and
//! operations — SIGKILL of the leader under load, a wiped data directory, a
//! lost quorum, a drain, a rolling restart of every node under load — each
//! judged by what the clients saw and what the nodes report.
//!
//! Every story takes a slot before it starts its nodes. Three debug-build
//! nodes per story on a two-core machine leave little slack: with every
//! story's nodes at once, starved heartbeats would trigger elections no
//! story asked for, and a failover time measured then would say more about
//! the machine than about leasehold.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::{Semaphore, SemaphorePermit};

mod big_entries;
mod clocks;
mod drain;
mod failover;
mod formation;
mod forwarding;
mod history;
mod load;
mod mixed_version;
mod no_quorum;
mod rolling_restart;
mod security;
mod snapshot_rejoin;
mod wire;

/// Clusters running at once across the stories of this module.
const CONCURRENT_CLUSTERS: usize = 1;
/// How long a story may wait for its slot: the longest other stories'
/// budgets together.
const SLOT_TIMEOUT: Duration = Duration::from_secs(400);

static SLOTS: Semaphore = Semaphore::const_new(CONCURRENT_CLUSTERS);

/// Waits for a slot to run a cluster in; the slot is held until dropped.
pub(crate) async fn cluster_slot() -> Result<SemaphorePermit<'static>> {
    tokio::time::timeout(SLOT_TIMEOUT, SLOTS.acquire())
        .await
        .context("no cluster slot freed within the timeout")?
        .context("the slot semaphore was closed")
}
