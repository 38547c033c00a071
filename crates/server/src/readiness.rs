//! Readiness: is this node safe to schedule on? A store write+read probe, a
//! known leader, applied index caught up with the log, not draining. The
//! answer is cached for about a second so probes cannot load the store.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::journal::Journal;

/// How long a readiness answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(1);
/// How far this node's clock may trail cluster time and still be ready.
const MAX_CLOCK_BEHIND_MS: u64 = 5_000;
/// How far the applied index may trail the last log index and still be ready.
const MAX_APPLY_LAG: u64 = 1_000;

/// The outcome of the readiness checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessReport {
    /// Whether every check passed.
    pub ready: bool,
    /// One line per check: `name: ok` or `name: why not`.
    pub checks: Vec<(String, Result<(), String>)>,
}

impl ReadinessReport {
    /// The body `/readyz` answers.
    pub fn body(&self) -> String {
        let mut body = String::new();
        for (name, outcome) in &self.checks {
            match outcome {
                Ok(()) => body.push_str(&format!("{name}: ok\n")),
                Err(why) => body.push_str(&format!("{name}: failed: {why}\n")),
            }
        }
        body
    }
}

/// Computes and caches readiness for one node.
#[derive(Clone)]
pub struct Readiness {
    journal: Journal,
    cached: Arc<Mutex<Option<(Instant, ReadinessReport)>>>,
}

impl Readiness {
    /// Readiness of `journal`'s node.
    pub fn new(journal: Journal) -> Self {
        Readiness { journal, cached: Arc::new(Mutex::new(None)) }
    }

    /// The journal whose node this describes.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The current report, at most about a second old.
    pub async fn report(&self) -> ReadinessReport {
        if let Ok(cached) = self.cached.lock()
            && let Some((at, report)) = cached.as_ref()
            && at.elapsed() < CACHE_FOR
        {
            return report.clone();
        }
        let report = self.check().await;
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some((Instant::now(), report.clone()));
        }
        report
    }

    async fn check(&self) -> ReadinessReport {
        let mut checks = Vec::new();
        let probe = if self.journal.probe_fault() {
            Err("injected probe fault".to_string())
        } else {
            self.journal.log_store().probe().await.map_err(|e| e.to_string())
        };
        if let Err(why) = &probe {
            tracing::warn!(event = "probe.fail", error = %why, "store probe failed");
        }
        checks.push(("store".to_string(), probe));
        let metrics = self.journal.raft().metrics().borrow().clone();
        checks.push((
            "leader".to_string(),
            match metrics.current_leader {
                Some(_) => Ok(()),
                None => Err("no leader known".to_string()),
            },
        ));
        let last_log = metrics.last_log_index.unwrap_or(0);
        let applied = metrics.last_applied.map(|l| l.index).unwrap_or(0);
        checks.push((
            "applied".to_string(),
            if last_log.saturating_sub(applied) <= MAX_APPLY_LAG {
                Ok(())
            } else {
                Err(format!("applied {applied} trails log {last_log}"))
            },
        ));
        // A clock well behind cluster time means this node's leases and ticks
        // would be judged late; a clock far ahead cannot be seen from here
        // (it would already have moved cluster time), see docs/safety.md.
        let now_ms = self.journal.clock().now_ms();
        let cluster_ms = self.journal.read_stale(|state| state.cluster_time_ms());
        checks.push((
            "clock".to_string(),
            if now_ms.saturating_add(MAX_CLOCK_BEHIND_MS) >= cluster_ms {
                Ok(())
            } else {
                Err(format!("clock is {} ms behind cluster time", cluster_ms - now_ms))
            },
        ));
        checks.push((
            "draining".to_string(),
            if self.journal.is_draining() { Err("node is draining".to_string()) } else { Ok(()) },
        ));
        let ready = checks.iter().all(|(_, outcome)| outcome.is_ok());
        ReadinessReport { ready, checks }
    }
}
