//! The checkers: one file per guarantee of SPEC §7 that applies to the
//! queue today. Each reads the recorded run (history, sink log, final state,
//! status samples) and answers a [`Verdict`]: how much it checked and the
//! anomalies it found, each marked safety (always enforced) or liveness
//! (enforced only in safety+liveness mode).
//!
//! | file | guarantee |
//! | --- | --- |
//! | `lease_exclusivity` | §7.1: no two leases of one job overlap in cluster time; §7.7: none is cut short in real time by more than the clock bound |
//! | `fencing` | §7.1: tokens strictly increase; the sink never takes a lower token after a higher |
//! | `no_redelivery` | §7.2: an acked job is never granted again; a stale ack is refused |
//! | `none_lost` | §7.3: every enqueued job ends acked or dead, exactly once |
//! | `convergence` | replicas reach equal digests at equal applied index |
//! | `cron_once` | §7.4: each (schedule, bucket) fires at most once, and exactly once within the catch-up policy while a quorum lives |
//! | `journal_once` | §7.5: on the journal path no job runs twice; one path per claim |
//! | `drained_leases` | §7.6: a drained node leaves no lease held past its TTL |
//! | `durable_acks` | a node never acknowledges a write it could not make durable (disk full) |
//! | `clock_bound` | §7.7: a node whose clock is beyond the bound stands aside, the others serve; within it nothing changes |

use serde::{Deserialize, Serialize};

use crate::execlog::ExecEvent;
use crate::history::Op;
use crate::plan::{CronSchedulePlan, Mode};
use crate::sink::SinkWrite;

pub mod clock_bound;
pub mod convergence;
pub mod cron_once;
pub mod drained_leases;
pub mod durable_acks;
pub mod fencing;
pub mod journal_once;
pub mod lease_exclusivity;
pub mod no_redelivery;
pub mod none_lost;

/// A job as the final read found it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalJob {
    /// Job id.
    pub id: u64,
    /// The workload's unique value: the payload, or, for an acked job
    /// whose tombstone keeps no payload (log format 3), the idempotency
    /// key, which the workload sets to the value ([`FinalJob::value_of`]).
    pub value: String,
    /// "ready", "claimed", "acked" or "dead".
    pub state: String,
    /// Failed attempts.
    pub attempts: u32,
    /// The token of the job's current (or, once acked, last) lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<u64>,
    /// The idempotency key (cron jobs: `cron:NAME:BUCKET`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl FinalJob {
    /// The value a final read reports for a job with this payload, state
    /// and idempotency key: the payload, unless the job is acked and its
    /// tombstone kept none, then the key. Every workload enqueue names its
    /// value as its key, so an acked job is still found by value; a job
    /// with neither reports an empty value, which no enqueue sent (a loud
    /// anomaly, not a silent pass).
    pub fn value_of(payload: &[u8], state: &str, key: Option<&str>) -> String {
        match key {
            Some(key) if payload.is_empty() && state == "acked" => key.to_string(),
            _ => String::from_utf8_lossy(payload).into_owned(),
        }
    }
}

/// One read of one node's own status in a sampling round (each round reads
/// every node twice, back to back).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusSample {
    /// Sampling round (0-based).
    pub round: u32,
    /// Which of the round's reads of this node (0 or 1).
    pub read: u8,
    /// Host time, ns since the run began.
    pub time_ns: u64,
    /// The node.
    pub node: u64,
    /// Its applied index.
    pub applied_index: u64,
    /// Its state digest.
    pub digest: u64,
}

/// Everything recorded about a run that the checkers read.
#[derive(Clone, Debug, Default)]
pub struct RunRecord {
    /// The history.
    pub history: Vec<Op>,
    /// The sink's log.
    pub sink: Vec<SinkWrite>,
    /// The workload queue's jobs after heal; `None` if they could not be read.
    pub final_jobs: Option<Vec<FinalJob>>,
    /// Status samples taken after heal.
    pub samples: Vec<StatusSample>,
    /// Nodes in the cluster.
    pub nodes: u64,
    /// The cron workload's runs, from the execution log.
    pub runs: Vec<ExecEvent>,
    /// The command queue's jobs after heal; `None` if not read.
    pub final_exec_jobs: Option<Vec<FinalJob>>,
    /// The cron schedules the plan put.
    pub cron: Vec<CronSchedulePlan>,
    /// The clock bound the nodes enforced (`max_clock_offset_ms`), by which
    /// lease timing is judged in real time.
    pub clock_bound_ms: u64,
}

/// Whether an anomaly breaks safety (always a failure) or liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something that must never happen happened.
    Safety,
    /// Something that should have happened did not.
    Liveness,
}

/// One anomaly, with the history entries that show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// Safety or liveness.
    pub severity: Severity,
    /// What went wrong, in a sentence naming jobs and tokens.
    pub message: String,
    /// History indexes (or sink sequence numbers, as the message says).
    pub evidence: Vec<u64>,
}

impl Anomaly {
    /// A safety anomaly.
    pub fn safety(message: String, evidence: Vec<u64>) -> Anomaly {
        Anomaly { severity: Severity::Safety, message, evidence }
    }

    /// A liveness anomaly.
    pub fn liveness(message: String, evidence: Vec<u64>) -> Anomaly {
        Anomaly { severity: Severity::Liveness, message, evidence }
    }
}

/// What a checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The checker.
    pub checker: String,
    /// How many items (leases, writes, jobs, samples) it examined.
    pub checked: u64,
    /// What it found.
    pub anomalies: Vec<Anomaly>,
}

impl Verdict {
    /// Anomalies that fail the run in `mode`.
    pub fn failures(&self, mode: Mode) -> usize {
        self.anomalies
            .iter()
            .filter(|a| a.severity == Severity::Safety || mode.enforces_liveness())
            .count()
    }
}

/// A checker of one guarantee.
pub trait Checker {
    /// Its name (the file name).
    fn name(&self) -> &'static str;
    /// Checks a run.
    fn check(&self, run: &RunRecord) -> Verdict;
}

/// Every checker, in summary order.
pub fn all() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(lease_exclusivity::LeaseExclusivity),
        Box::new(fencing::Fencing),
        Box::new(no_redelivery::NoRedelivery),
        Box::new(none_lost::NoneLost),
        Box::new(convergence::Convergence),
        Box::new(cron_once::CronOnce),
        Box::new(journal_once::JournalOnce),
        Box::new(drained_leases::DrainedLeases),
        Box::new(durable_acks::DurableAcks),
        Box::new(clock_bound::ClockBound),
    ]
}

/// The most anomalies a checker reports in full (the count is always exact).
pub const MAX_REPORTED: usize = 50;

/// Keeps at most [`MAX_REPORTED`] anomalies, noting how many were left out.
pub fn cap(mut anomalies: Vec<Anomaly>) -> Vec<Anomaly> {
    if anomalies.len() > MAX_REPORTED {
        let left = anomalies.len() - MAX_REPORTED;
        let any_safety =
            anomalies.iter().skip(MAX_REPORTED).any(|a| a.severity == Severity::Safety);
        let severity = if any_safety { Severity::Safety } else { Severity::Liveness };
        anomalies.truncate(MAX_REPORTED);
        anomalies.push(Anomaly {
            severity,
            message: format!("... and {left} more anomalies like these"),
            evidence: Vec::new(),
        });
    }
    anomalies
}

/// Assertions the checkers' unit tests share. A checker's severity decides
/// whether a safety-only run fails, so every test that provokes an anomaly
/// pins its severity as firmly as its message: a safety violation relabelled
/// as liveness would otherwise pass every safety-only run unnoticed.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{Anomaly, Severity, Verdict};

    /// Asserts that `verdict` reports at least one anomaly whose message
    /// contains `needle`, and that every such anomaly carries `severity`.
    #[track_caller]
    pub(crate) fn assert_anomaly(verdict: &Verdict, severity: Severity, needle: &str) {
        let matching: Vec<&Anomaly> =
            verdict.anomalies.iter().filter(|a| a.message.contains(needle)).collect();
        assert!(!matching.is_empty(), "no anomaly mentions {needle:?}: {:?}", verdict.anomalies);
        for anomaly in matching {
            assert_eq!(anomaly.severity, severity, "wrong severity for {:?}", anomaly.message);
        }
    }

    /// Asserts that one anomaly's message contains `needle` and that it
    /// carries `severity`.
    #[track_caller]
    pub(crate) fn assert_kind(anomaly: &Anomaly, severity: Severity, needle: &str) {
        assert!(
            anomaly.message.contains(needle),
            "{:?} does not mention {needle:?}",
            anomaly.message
        );
        assert_eq!(anomaly.severity, severity, "wrong severity for {:?}", anomaly.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn many(severity: Severity, count: usize) -> Vec<Anomaly> {
        (0..count)
            .map(|i| Anomaly { severity, message: format!("anomaly {i}"), evidence: Vec::new() })
            .collect()
    }

    #[test]
    fn the_cap_note_is_safety_when_a_dropped_anomaly_is_safety() {
        // A safety anomaly past the cap must still fail a safety-only run.
        let mut anomalies = many(Severity::Liveness, MAX_REPORTED);
        anomalies.push(Anomaly::safety("dropped".to_string(), Vec::new()));
        let capped = cap(anomalies);
        assert_eq!(capped.len(), MAX_REPORTED + 1);
        test_support::assert_kind(&capped[MAX_REPORTED], Severity::Safety, "and 1 more");
        let capped = cap(many(Severity::Liveness, MAX_REPORTED + 2));
        test_support::assert_kind(&capped[MAX_REPORTED], Severity::Liveness, "and 2 more");
        assert_eq!(cap(many(Severity::Safety, MAX_REPORTED)).len(), MAX_REPORTED);
    }
}
