//! The leader-side driver: runs at its own pace and proposes housekeeping
//! commands only while this node leads. Sweep returns lapsed leases to ready;
//! Purge drops tombstones past retention. Both are idempotent, so a stale or
//! duplicated proposal from a deposed leader is harmless.

use std::time::Duration;

use leasehold_core::{Command, Response};
use leasehold_server::Journal;
use tokio::sync::watch;

/// Intervals of the driver.
#[derive(Clone, Copy, Debug)]
pub struct DriverConfig {
    /// How often to check for lapsed leases.
    pub sweep_interval: Duration,
    /// How often to check for tombstones past retention.
    pub purge_interval: Duration,
}

/// Runs until `shutdown` turns true.
pub async fn run(journal: Journal, config: DriverConfig, mut shutdown: watch::Receiver<bool>) {
    let mut sweep = tokio::time::interval(config.sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut purge = tokio::time::interval(config.purge_interval);
    purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sweep.tick() => sweep_once(&journal).await,
            _ = purge.tick() => purge_once(&journal).await,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Proposes a Sweep when this node leads and some lease has lapsed by its
/// clock. Checking first keeps an idle cluster's log from growing.
pub async fn sweep_once(journal: &Journal) {
    if !journal.is_leader() {
        return;
    }
    let now_ms = journal.clock().now_ms();
    let due = journal.read_stale(|state| state.next_expiry_ms().is_some_and(|at| at <= now_ms));
    if !due {
        return;
    }
    match journal.propose(Command::Sweep).await {
        Ok(Response::Swept { requeued, dead }) => {
            journal.metrics().sweeps.inc();
            journal.metrics().lease_expiries.inc_by((requeued.len() + dead.len()) as u64);
            tracing::info!(
                event = "sweep",
                requeued = requeued.len(),
                dead = dead.len(),
                "swept lapsed leases"
            );
            for job in requeued.iter().chain(dead.iter()) {
                tracing::info!(event = "lease.expire", job = *job, "lease lapsed");
            }
        }
        Ok(other) => {
            tracing::warn!(event = "sweep", response = ?other, "unexpected sweep response")
        }
        Err(error) => tracing::warn!(event = "sweep", %error, "sweep not committed"),
    }
}

async fn purge_once(journal: &Journal) {
    if !journal.is_leader() {
        return;
    }
    let now_ms = journal.clock().now_ms();
    if !journal.read_stale(|state| state.has_purgeable(now_ms)) {
        return;
    }
    match journal.propose(Command::Purge).await {
        Ok(Response::Purged(count)) => tracing::info!(purged = count, "purged tombstones"),
        Ok(other) => tracing::warn!(response = ?other, "unexpected purge response"),
        Err(error) => tracing::warn!(%error, "purge not committed"),
    }
}
