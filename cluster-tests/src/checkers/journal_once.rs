//! SPEC §7.5: on the journal path no job runs twice, and the gate never
//! returns both paths for one claim.
//!
//! Record shape: every run of a cron job reports the claim path its node
//! took (`path` in the execution log: `journal`, or `bus` for the
//! best-effort broadcast path), and gate-flag changes appear in the history
//! as `gate_flip` operations. A claim is one (schedule, bucket).
//!
//! Safety: one claim run on both paths (the gate answered both, or the
//! claim seam consulted both stores, or two nodes whose views of their
//! peers differed decided different paths: SPEC §7.8, never-both for the
//! pool); on the bus path, one claim run more than once (two nodes each
//! won it, or one node ran it twice); on the journal path, one claim run as
//! more than one job, or one lease (token) starting more than one run.
//! Together: across all nodes and both paths a bucket runs as one claim. A
//! job re-run under a newer token after its lease lapsed or was released is
//! a redelivery, which the journal path allows (execution is at least once,
//! fenced by the token); it is counted by `cron_once`.
//!
//! Until nodes can flip their gate flags at run time, every run is on the
//! journal path and no flip happens; the checker then covers the journal
//! half, and counts flips as zero.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::execlog::RunPhase;
use crate::history::{OpFunction, OpType, pairs};

/// Checker for the journal path.
pub struct JournalOnce;

/// (claims run on the journal path, claims run on the bus path, gate flips).
pub fn counters(run: &RunRecord) -> (u64, u64, u64) {
    let mut journal = BTreeSet::new();
    let mut bus = BTreeSet::new();
    for event in run.runs.iter().filter(|e| e.phase == RunPhase::Start) {
        let key = (event.schedule.as_str(), event.bucket);
        if event.path == "bus" {
            bus.insert(key);
        } else {
            journal.insert(key);
        }
    }
    let flips = pairs(&run.history)
        .iter()
        .filter(|p| p.invoke.f == OpFunction::GateFlip && p.outcome() == OpType::Ok)
        .count() as u64;
    (journal.len() as u64, bus.len() as u64, flips)
}

impl Checker for JournalOnce {
    fn name(&self) -> &'static str {
        "journal_once"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        let mut claims: BTreeMap<(&str, u64), Vec<&crate::execlog::ExecEvent>> = BTreeMap::new();
        for event in run.runs.iter().filter(|e| e.phase == RunPhase::Start) {
            claims.entry((event.schedule.as_str(), event.bucket)).or_default().push(event);
        }
        for ((schedule, bucket), starts) in &claims {
            let paths: BTreeSet<&str> = starts.iter().map(|e| e.path.as_str()).collect();
            if paths.len() > 1 {
                let nodes: Vec<String> =
                    starts.iter().map(|e| format!("node {} on {}", e.node, e.path)).collect();
                anomalies.push(Anomaly::safety(
                    format!(
                        "schedule {schedule} bucket {bucket} was claimed on both paths ({})",
                        nodes.join(", ")
                    ),
                    Vec::new(),
                ));
            }
            // Never-both for the pool (§7.8) also means once on the bus:
            // each bus start is a claim won, so two of them are two runs.
            let bus: Vec<_> = starts.iter().filter(|e| e.path == "bus").collect();
            if bus.len() > 1 {
                let nodes: Vec<u64> = bus.iter().map(|e| e.node).collect();
                anomalies.push(Anomaly::safety(
                    format!(
                        "schedule {schedule} bucket {bucket} ran {} times on the bus path (nodes {nodes:?})",
                        bus.len()
                    ),
                    Vec::new(),
                ));
            }
            let journal: Vec<_> = starts.iter().filter(|e| e.path != "bus").collect();
            let jobs: BTreeSet<u64> = journal.iter().map(|e| e.job_id).collect();
            if jobs.len() > 1 {
                anomalies.push(Anomaly::safety(
                    format!(
                        "schedule {schedule} bucket {bucket} ran on the journal path as jobs {jobs:?}"
                    ),
                    Vec::new(),
                ));
            }
            let mut tokens: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
            for event in &journal {
                tokens.entry((event.job_id, event.token)).or_default().push(event.node);
            }
            for ((job, token), nodes) in tokens.iter().filter(|(_, n)| n.len() > 1) {
                anomalies.push(Anomaly::safety(
                    format!(
                        "job {job} (schedule {schedule} bucket {bucket}) ran {} times on the journal path under one lease, token {token} (nodes {nodes:?})",
                        nodes.len()
                    ),
                    Vec::new(),
                ));
            }
        }
        Verdict {
            checker: self.name().to_string(),
            checked: claims.len() as u64,
            anomalies: cap(anomalies),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Severity;
    use crate::checkers::test_support::{assert_anomaly, assert_kind};
    use crate::execlog::test_support::event;
    use crate::execlog::{ExecEvent, RunPhase::*};
    use crate::history::OpValue;
    use crate::history::test_support::Builder;

    fn on_bus(mut e: ExecEvent) -> ExecEvent {
        e.path = "bus".into();
        e
    }

    fn clean() -> RunRecord {
        let mut b = Builder::default();
        let flip = OpValue { nodes: vec![2], phase: Some("bus".into()), ..OpValue::default() };
        b.op(5, "gate", OpType::Invoke, OpFunction::GateFlip, flip.clone());
        b.op(6, "gate", OpType::Ok, OpFunction::GateFlip, flip);
        RunRecord {
            history: b.ops.clone(),
            runs: vec![
                event(Start, 1, "t", 100, 1, 3, 1),
                event(End, 2, "t", 100, 1, 3, 1),
                // A redelivery under a newer token: allowed.
                event(Start, 3, "t", 101, 2, 5, 2),
                event(Start, 4, "t", 101, 3, 8, 2),
                // After the flip, bucket 102 runs on the bus path only.
                on_bus(event(Start, 7, "t", 102, 2, 0, 0)),
            ],
            ..RunRecord::default()
        }
    }

    #[test]
    fn one_path_per_claim_and_redeliveries_pass() {
        let run = clean();
        let verdict = JournalOnce.check(&run);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 3);
        assert_eq!(counters(&run), (2, 1, 1));
    }

    #[test]
    fn a_claim_on_both_paths_is_caught() {
        let mut run = clean();
        run.runs.push(on_bus(event(Start, 8, "t", 100, 3, 0, 0)));
        let verdict = JournalOnce.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Safety);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "claimed on both paths");
    }

    #[test]
    fn a_bucket_run_twice_on_the_bus_path_is_caught() {
        // Two nodes that did not hear each other each won bucket 102's bus
        // claim: one bucket, two runs, though each path alone looks clean.
        let mut run = clean();
        run.runs.push(on_bus(event(Start, 9, "t", 102, 3, 0, 0)));
        let verdict = JournalOnce.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Safety);
        assert_kind(
            &verdict.anomalies[0],
            Severity::Safety,
            "ran 2 times on the bus path (nodes [2, 3])",
        );
        // A second bus bucket run once each is fine.
        let mut run = clean();
        run.runs.push(on_bus(event(Start, 9, "t", 103, 3, 0, 0)));
        assert!(JournalOnce.check(&run).anomalies.is_empty());
    }

    #[test]
    fn a_job_run_twice_on_the_journal_path_is_caught() {
        let mut run = clean();
        // One lease started twice, and a second job for one claim.
        run.runs.push(event(Start, 8, "t", 100, 2, 3, 1));
        run.runs.push(event(Start, 9, "t", 101, 1, 9, 6));
        let verdict = JournalOnce.check(&run);
        assert_anomaly(&verdict, Severity::Safety, "under one lease, token 3");
        assert_anomaly(&verdict, Severity::Safety, "as jobs {2, 6}");
    }
}
