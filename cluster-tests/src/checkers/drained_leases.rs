//! SPEC §7.6: a drained node leaves no lease held past its TTL.
//!
//! For every drain (SIGTERM, the node drains and exits) the nemesis reads,
//! linearizably, the command queue's leases whose holder is that node's
//! executor (`node-ID`) three times, each recorded as a `lease_read` of the
//! process `drainer` with the round, the node and a phase: `before` the
//! signal (the last of up to ten reads that wait for the node to hold a
//! lease, since the drain's release step is what is under test), right after the `exit` (with the exit code), and a `ttl` later:
//! the longest lease TTL plus two sweep intervals and a margin after the
//! exit.
//!
//! Safety: a lease the node held at its exit is still held, under the same
//! token, at the `ttl` read — nobody may renew a drained node's lease, and
//! the sweep must have returned it; or a lease it held before the drain and
//! no longer held at the exit is held again under the same token.
//! Liveness: a node that drained cleanly (exit 0) still held leases at its
//! exit — the drain's last step is to release what the node holds, which
//! needs a quorum.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::history::{LeaseRecord, OpFunction, OpType, pairs};

/// Checker for drained nodes' leases.
pub struct DrainedLeases;

/// Paths the drains exercised.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainCounters {
    /// Drains whose exit was observed.
    pub drains: u64,
    /// Of those, clean exits (code 0).
    pub clean: u64,
    /// Leases the drained nodes held when their drains began.
    pub held_at_start: u64,
    /// Leases still held at their exits.
    pub left_at_exit: u64,
}

/// A drain's reads: phase → (leases, exit code, history index).
type Reads<'a> = BTreeMap<&'a str, (&'a [LeaseRecord], Option<i32>, u64)>;

fn drains(run: &RunRecord) -> BTreeMap<(usize, u64), Reads<'_>> {
    let mut result: BTreeMap<(usize, u64), Reads<'_>> = BTreeMap::new();
    for pair in pairs(&run.history) {
        if pair.invoke.f != OpFunction::LeaseRead {
            continue;
        }
        let Some(done) = pair.completion.filter(|c| c.kind == OpType::Ok) else { continue };
        let (Some(round), Some(node), Some(phase)) =
            (done.value.round, done.value.nodes.first(), done.value.phase.as_deref())
        else {
            continue;
        };
        result
            .entry((round, *node))
            .or_default()
            .insert(phase, (done.value.leases.as_slice(), done.value.exit_code, done.index));
    }
    result
}

/// Computes the counters (also used by the summary).
pub fn counters(run: &RunRecord) -> DrainCounters {
    let mut counters = DrainCounters::default();
    for reads in drains(run).values() {
        if let Some((leases, _, _)) = reads.get("before") {
            counters.held_at_start += leases.len() as u64;
        }
        if let Some((leases, code, _)) = reads.get("exit") {
            counters.drains += 1;
            if *code == Some(0) {
                counters.clean += 1;
            }
            counters.left_at_exit += leases.len() as u64;
        }
    }
    counters
}

impl Checker for DrainedLeases {
    fn name(&self) -> &'static str {
        "drained_leases"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        let mut checked = 0;
        for ((round, node), reads) in drains(run) {
            let Some((at_exit, code, exit_index)) = reads.get("exit").copied() else { continue };
            checked += 1;
            let ids = |leases: &[LeaseRecord]| -> BTreeSet<(u64, u64)> {
                leases.iter().map(|l| (l.job_id, l.token)).collect()
            };
            let exit_set = ids(at_exit);
            if code == Some(0) {
                for lease in at_exit {
                    anomalies.push(Anomaly::liveness(
                        format!(
                            "round {round}: node {node} drained and exited 0 but still held job {} (token {}, expires at {} ms)",
                            lease.job_id, lease.token, lease.expires_at_ms
                        ),
                        vec![exit_index],
                    ));
                }
            }
            if let Some((later, _, ttl_index)) = reads.get("ttl").copied() {
                for lease in later.iter().filter(|l| exit_set.contains(&(l.job_id, l.token))) {
                    let renewed = at_exit
                        .iter()
                        .find(|l| l.job_id == lease.job_id)
                        .is_some_and(|l| lease.expires_at_ms > l.expires_at_ms);
                    anomalies.push(Anomaly::safety(
                        format!(
                            "round {round}: node {node} exited holding job {} (token {}); a TTL later the lease is still held{} (expires at {} ms)",
                            lease.job_id,
                            lease.token,
                            if renewed { " and was renewed after the exit" } else { "" },
                            lease.expires_at_ms
                        ),
                        vec![exit_index, ttl_index],
                    ));
                }
            }
            if let Some((before, _, before_index)) = reads.get("before").copied() {
                let given_up: BTreeSet<(u64, u64)> =
                    ids(before).difference(&exit_set).copied().collect();
                if let Some((later, _, ttl_index)) = reads.get("ttl").copied() {
                    for lease in later.iter().filter(|l| given_up.contains(&(l.job_id, l.token))) {
                        anomalies.push(Anomaly::safety(
                            format!(
                                "round {round}: node {node} gave up job {} (token {}) while draining, yet the same lease is held a TTL later",
                                lease.job_id, lease.token
                            ),
                            vec![before_index, exit_index, ttl_index],
                        ));
                    }
                }
            }
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Severity;
    use crate::checkers::test_support::assert_kind;
    use crate::history::OpValue;
    use crate::history::test_support::{Builder, lease};

    fn lease_read(
        b: &mut Builder,
        time: u64,
        node: u64,
        phase: &str,
        exit_code: Option<i32>,
        leases: Vec<LeaseRecord>,
    ) {
        let value = OpValue {
            round: Some(3),
            nodes: vec![node],
            phase: Some(phase.into()),
            ..OpValue::default()
        };
        b.op(time, "drainer", OpType::Invoke, OpFunction::LeaseRead, value.clone());
        b.op(
            time + 1,
            "drainer",
            OpType::Ok,
            OpFunction::LeaseRead,
            OpValue { leases, exit_code, ..value },
        );
    }

    fn held(job: u64, token: u64, expires: u64) -> LeaseRecord {
        lease(job, token, "node-2", expires - 3_000, expires)
    }

    #[test]
    fn a_drain_that_released_everything_passes() {
        let mut b = Builder::default();
        lease_read(&mut b, 10, 2, "before", None, vec![held(5, 40, 9_000), held(6, 41, 9_500)]);
        lease_read(&mut b, 20, 2, "exit", Some(0), vec![]);
        // Job 5 was claimed again by the restarted node: a new token.
        lease_read(&mut b, 30, 2, "ttl", None, vec![held(5, 52, 20_000)]);
        let run = RunRecord { history: b.ops.clone(), ..RunRecord::default() };
        let verdict = DrainedLeases.check(&run);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 1);
        let c = counters(&run);
        assert_eq!((c.drains, c.clean, c.held_at_start, c.left_at_exit), (1, 1, 2, 0));
    }

    #[test]
    fn a_lease_left_by_a_clean_drain_is_liveness() {
        let mut b = Builder::default();
        lease_read(&mut b, 10, 2, "before", None, vec![held(5, 40, 9_000)]);
        lease_read(&mut b, 20, 2, "exit", Some(0), vec![held(5, 40, 9_000)]);
        lease_read(&mut b, 30, 2, "ttl", None, vec![]);
        let run = RunRecord { history: b.ops.clone(), ..RunRecord::default() };
        let verdict = DrainedLeases.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Liveness);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "still held job 5");
        // A drain that ran out of time (killed) may leave leases to lapse.
        let mut b = Builder::default();
        lease_read(&mut b, 20, 2, "exit", None, vec![held(5, 40, 9_000)]);
        lease_read(&mut b, 30, 2, "ttl", None, vec![]);
        let run = RunRecord { history: b.ops.clone(), ..RunRecord::default() };
        assert!(DrainedLeases.check(&run).anomalies.is_empty());
    }

    #[test]
    fn a_lease_held_past_its_ttl_is_safety() {
        let mut b = Builder::default();
        lease_read(&mut b, 20, 2, "exit", None, vec![held(5, 40, 9_000)]);
        lease_read(&mut b, 30, 2, "ttl", None, vec![held(5, 40, 12_000)]);
        let run = RunRecord { history: b.ops.clone(), ..RunRecord::default() };
        let verdict = DrainedLeases.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Safety);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "renewed after the exit");
    }

    #[test]
    fn a_lease_given_up_then_held_again_is_safety() {
        let mut b = Builder::default();
        lease_read(&mut b, 10, 2, "before", None, vec![held(5, 40, 9_000)]);
        lease_read(&mut b, 20, 2, "exit", Some(0), vec![]);
        lease_read(&mut b, 30, 2, "ttl", None, vec![held(5, 40, 9_000)]);
        let run = RunRecord { history: b.ops.clone(), ..RunRecord::default() };
        let verdict = DrainedLeases.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "gave up job 5");
    }
}
