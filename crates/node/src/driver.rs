//! The leader-side driver: runs at its own pace and proposes housekeeping
//! commands only while this node leads. Sweep returns lapsed leases to ready;
//! Purge drops tombstones past retention. Both are idempotent, so a stale or
//! duplicated proposal from a deposed leader is harmless.

use std::collections::HashMap;
use std::time::Duration;

use leasehold_core::cron::{self, CronSchedule};
use leasehold_core::schedule::{Target, TickOutcome, TickPlan, plan_ticks};
use leasehold_core::{Command, Response};
use leasehold_server::Journal;
use leasehold_server::metrics::TickLabels;
use leasehold_server::schedules_service::each_targets;
use tokio::sync::watch;

/// How often the leader looks for due ticks (the fire lag of a healthy
/// cluster is about half of this plus one commit).
pub const TICK_INTERVAL: Duration = Duration::from_millis(25);
/// A tick younger than this counts as current; older ones are missed and
/// follow the catch-up policy.
pub const TICK_TOLERANCE_MS: u64 = 5_000;

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
    let mut ticker = tokio::time::interval(TICK_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut parsed = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sweep.tick() => sweep_once(&journal).await,
            _ = purge.tick() => purge_once(&journal).await,
            _ = ticker.tick() => tick_schedules(&journal, &mut parsed).await,
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

/// Proposes `Fire` or `Skip` for every due tick of every schedule, when this
/// node leads. The plan comes from the journal's `last_fired_bucket`, so a
/// new leader picks up exactly where the last one stopped; the journal
/// refuses any bucket already covered, so a duplicate proposal (a deposed
/// leader, a retry) changes nothing.
pub async fn tick_schedules(
    journal: &Journal,
    parsed: &mut HashMap<(String, String), Option<CronSchedule>>,
) {
    if !journal.is_leader() {
        return;
    }
    let now_ms = journal.clock().now_ms();
    // Clone only the schedules with a tick due: this runs every 25 ms.
    let schedules = journal.read_stale(|state| {
        state
            .schedules()
            .values()
            .filter(|schedule| {
                let key = (schedule.spec.cron.clone(), schedule.spec.timezone.clone());
                let cron = parsed.entry(key).or_insert_with(|| {
                    cron::parse(&schedule.spec.cron, &schedule.spec.timezone).ok()
                });
                let after_ms = if schedule.last_fired_bucket > 0 {
                    cron::tick_ms(schedule.last_fired_bucket)
                } else {
                    schedule.created_at_ms
                };
                cron.as_ref()
                    .and_then(|cron| cron.next_after(after_ms))
                    .is_some_and(|next_ms| next_ms <= now_ms)
            })
            .cloned()
            .collect::<Vec<_>>()
    });
    for schedule in schedules {
        let key = (schedule.spec.cron.clone(), schedule.spec.timezone.clone());
        let Some(Some(cron)) = parsed.get(&key) else {
            tracing::warn!(schedule = %schedule.spec.name, "cron expression no longer parses");
            continue;
        };
        for step in plan_ticks(&schedule, cron, now_ms, TICK_TOLERANCE_MS) {
            let name = schedule.spec.name.clone();
            let command = match step {
                TickPlan::Fire(bucket) => {
                    let targets = match schedule.spec.target {
                        Target::Each => each_targets(journal, &schedule),
                        Target::Any => Vec::new(),
                    };
                    Command::Fire { schedule: name, bucket, targets }
                }
                TickPlan::Skip { bucket, reason, ticks } => {
                    Command::Skip { schedule: name, bucket, reason, ticks }
                }
            };
            let bucket = match &command {
                Command::Fire { bucket, .. } | Command::Skip { bucket, .. } => *bucket,
                _ => 0,
            };
            match journal.propose(command).await {
                Ok(Response::Tick(Some(TickOutcome::Fired { job_ids, lag_ms }))) => {
                    tracing::info!(
                        event = "cron.fire",
                        schedule = %schedule.spec.name,
                        bucket,
                        lag_ms,
                        jobs = ?job_ids,
                        "tick fired"
                    );
                    let metrics = journal.metrics();
                    metrics.fire_lag_seconds.observe(lag_ms as f64 / 1_000.0);
                    metrics
                        .ticks
                        .get_or_create(&TickLabels {
                            outcome: "fired".into(),
                            reason: String::new(),
                        })
                        .inc();
                }
                Ok(Response::Tick(Some(TickOutcome::Skipped { reason, ticks }))) => {
                    tracing::info!(
                        event = "cron.skip",
                        schedule = %schedule.spec.name,
                        bucket,
                        reason = reason.as_str(),
                        ticks,
                        "tick skipped"
                    );
                    journal
                        .metrics()
                        .ticks
                        .get_or_create(&TickLabels {
                            outcome: "skipped".into(),
                            reason: reason.as_str().into(),
                        })
                        .inc_by(ticks);
                }
                Ok(Response::Tick(None)) => {}
                Ok(other) => {
                    tracing::warn!(schedule = %schedule.spec.name, response = ?other, "tick refused");
                    break;
                }
                Err(error) => {
                    // Not committed (no quorum, leadership moved): the next
                    // round plans again from the journal.
                    tracing::warn!(schedule = %schedule.spec.name, %error, "tick not committed");
                    return;
                }
            }
        }
    }
}
