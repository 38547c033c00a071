//! Readiness: is this node safe to schedule on? A store write+read probe, a
//! known leader (acknowledged by a quorum lately, when it is this node),
//! applied index caught up with the log, not draining. The answer is cached
//! for about a second so probes cannot load the store.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::journal::Journal;

/// How long a readiness answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(1);
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

    /// Whether the `draining` check failed when this report was made.
    fn says_draining(&self) -> bool {
        self.checks.iter().any(|(name, outcome)| name == "draining" && outcome.is_err())
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

    /// The current report, at most about a second old — except that a drain
    /// is seen at once: it is the drain's first step, and claims are refused
    /// right after it, so a report from before the drain must not outlive it.
    pub async fn report(&self) -> ReadinessReport {
        let draining = self.journal.is_draining();
        if let Ok(cached) = self.cached.lock()
            && let Some((at, report)) = cached.as_ref()
            && at.elapsed() < CACHE_FOR
            && report.says_draining() == draining
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
        // A leader cut off from its quorum still names itself leader (openraft
        // does not step down on its own), so a leader must also have heard
        // from a quorum lately: past two election timeouts its followers have
        // elected, or are electing, someone else, and it can commit nothing.
        let quorum_ack_bound_ms = 2 * self.journal.raft().config().election_timeout_max;
        checks.push((
            "leader".to_string(),
            match metrics.current_leader {
                None => Err("no leader known".to_string()),
                Some(leader) if leader == self.journal.node_id() => {
                    match metrics.millis_since_quorum_ack {
                        Some(ms) if ms <= quorum_ack_bound_ms => Ok(()),
                        Some(ms) => Err(format!(
                            "this node leads but no quorum has acknowledged it for {ms} ms"
                        )),
                        None => {
                            Err("this node leads but no quorum has acknowledged it".to_string())
                        }
                    }
                }
                Some(_) => Ok(()),
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
        // Judged against the other voters' clocks, never against cluster
        // time: a wrong clock elsewhere (which may have pushed cluster time
        // ahead) must not take this node out of service, and this node's
        // own wrong clock shows against the majority (see docs/safety.md).
        let verdict = self.journal.clock_verdict();
        let bound_ms = self.journal.clock_watch().bound_ms();
        checks.push((
            "clock".to_string(),
            if verdict.is_skewed() {
                Err(crate::clock_watch::describe(&verdict, bound_ms))
            } else {
                Ok(())
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
