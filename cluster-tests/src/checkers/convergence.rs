//! Replicas converge: after heal, every node catches up and the replicas
//! settle at one applied index, and nodes at the same applied index have
//! the same state digest (the state machine is deterministic, so equal logs
//! must give equal states).
//!
//! A node's status reads its applied index and its digest one after the
//! other, so a read taken while the node applies an entry can pair an index
//! with the next state's digest. Each sampling round therefore reads every
//! node twice, back to back, and only a *stable* observation counts: both
//! reads gave the same (index, digest). Across all nodes and rounds, one
//! index must map to one digest (safety).
//!
//! Liveness, after the workload has stopped: every node reaches the highest
//! index seen in the first round (nobody stays behind), and the last round
//! shows every node stable at one index (the cluster went quiet). A cluster
//! whose log keeps growing with no client left fails the second part, and
//! the message says how fast it grew.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkers::{Anomaly, Checker, RunRecord, StatusSample, Verdict, cap};

/// Checker for replica convergence.
pub struct Convergence;

/// (node, round) → the stable (index, digest), if the round's reads agreed.
fn stable_observations(samples: &[StatusSample]) -> BTreeMap<(u64, u32), Option<(u64, u64)>> {
    let mut reads: BTreeMap<(u64, u32), Vec<(u64, u64)>> = BTreeMap::new();
    for sample in samples {
        reads
            .entry((sample.node, sample.round))
            .or_default()
            .push((sample.applied_index, sample.digest));
    }
    reads
        .into_iter()
        .map(|(key, seen)| {
            let stable = seen.len() >= 2 && seen.windows(2).all(|w| w[0] == w[1]);
            (key, if stable { seen.first().copied() } else { None })
        })
        .collect()
}

impl Checker for Convergence {
    fn name(&self) -> &'static str {
        "convergence"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        let observations = stable_observations(&run.samples);
        // index → (digest, node, round) of the first stable observation.
        let mut digest_at: BTreeMap<u64, (u64, u64, u32)> = BTreeMap::new();
        // One report per (index, node) however many rounds repeat it.
        let mut reported: BTreeSet<(u64, u64)> = BTreeSet::new();
        let mut checked = 0u64;
        for ((node, round), observed) in &observations {
            let Some((index, digest)) = observed else { continue };
            checked += 1;
            match digest_at.get(index) {
                Some((other_digest, other_node, other_round))
                    if other_digest != digest && reported.insert((*index, *node)) =>
                {
                    anomalies.push(Anomaly::safety(
                        format!(
                            "at applied index {index}, node {other_node} (round {other_round}) has digest {other_digest:#x} but node {node} (round {round}) has {digest:#x}"
                        ),
                        Vec::new(),
                    ));
                }
                Some(_) => {}
                None => {
                    digest_at.insert(*index, (*digest, *node, *round));
                }
            }
        }

        if let Some(problem) = liveness_problem(run) {
            anomalies.push(Anomaly::liveness(problem, Vec::new()));
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

/// Why the replicas did not converge, if they did not.
fn liveness_problem(run: &RunRecord) -> Option<String> {
    let (Some(first), Some(last)) =
        (run.samples.iter().map(|s| s.round).min(), run.samples.iter().map(|s| s.round).max())
    else {
        return Some("no status sample was taken after heal".to_string());
    };
    let in_round = |round: u32| -> BTreeMap<u64, u64> {
        let mut highest = BTreeMap::new();
        for s in run.samples.iter().filter(|s| s.round == round) {
            let entry = highest.entry(s.node).or_insert(0);
            *entry = s.applied_index.max(*entry);
        }
        highest
    };
    let (start, end) = (in_round(first), in_round(last));
    let target = start.values().copied().max().unwrap_or(0);
    let behind: Vec<String> = (1..=run.nodes)
        .filter(|node| end.get(node).is_none_or(|index| *index < target))
        .map(|node| match end.get(&node) {
            Some(index) => format!("node {node} at {index}"),
            None => format!("node {node} did not answer"),
        })
        .collect();
    if !behind.is_empty() {
        return Some(format!(
            "replicas did not catch up to index {target} after heal: {}",
            behind.join(", ")
        ));
    }
    let observations = stable_observations(&run.samples);
    let settled: Vec<u64> = (1..=run.nodes)
        .filter_map(|node| observations.get(&(node, last)).copied().flatten())
        .map(|o| o.0)
        .collect();
    if settled.len() as u64 == run.nodes && settled.windows(2).all(|w| w[0] == w[1]) {
        return None;
    }
    let time =
        |round: u32| run.samples.iter().filter(|s| s.round == round).map(|s| s.time_ns).min();
    let grown = end.values().copied().max().unwrap_or(0).saturating_sub(target);
    let seconds = match (time(first), time(last)) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
        _ => 0.0,
    };
    let rate = if seconds > 0.0 { grown as f64 / seconds } else { 0.0 };
    let shown: Vec<String> =
        end.iter().map(|(node, index)| format!("node {node} at {index}")).collect();
    Some(format!(
        "replicas never settled at one applied index: the log grew by {grown} entries in {seconds:.1} s ({rate:.1}/s) after the workload stopped (last round: {})",
        shown.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Severity;
    use crate::checkers::test_support::assert_kind;

    /// Two identical reads of `node` in `round`.
    fn stable(round: u32, node: u64, applied_index: u64, digest: u64) -> [StatusSample; 2] {
        let sample = |read| StatusSample {
            round,
            read,
            time_ns: u64::from(round) * 500_000_000,
            node,
            applied_index,
            digest,
        };
        [sample(0), sample(1)]
    }

    fn check(samples: Vec<StatusSample>) -> Verdict {
        Convergence.check(&RunRecord { samples, nodes: 3, ..RunRecord::default() })
    }

    #[test]
    fn equal_digests_at_equal_index_pass() {
        let mut samples = Vec::new();
        samples.extend(stable(0, 1, 90, 0xa));
        samples.extend(stable(0, 2, 100, 0xb));
        samples.extend(stable(0, 3, 100, 0xb));
        for node in 1..=3 {
            samples.extend(stable(1, node, 100, 0xb));
        }
        let verdict = check(samples);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 6);
    }

    #[test]
    fn a_torn_read_is_ignored() {
        let mut samples = Vec::new();
        // Node 1's first read pairs index 100 with the next state's digest.
        let [mut torn, next] = stable(0, 1, 101, 0xc);
        torn.applied_index = 100;
        samples.push(torn);
        samples.push(next);
        samples.extend(stable(0, 2, 100, 0xb));
        samples.extend(stable(0, 3, 100, 0xb));
        for node in 1..=3 {
            samples.extend(stable(1, node, 101, 0xc));
        }
        let verdict = check(samples);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
    }

    #[test]
    fn diverged_digests_are_caught() {
        let mut samples = Vec::new();
        for round in 0..3 {
            samples.extend(stable(round, 1, 100, 0xb));
            samples.extend(stable(round, 2, 100, 0xb));
            samples.extend(stable(round, 3, 100, 0xdead));
        }
        let verdict = check(samples);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "node 3 (round 0) has 0xdead");
    }

    #[test]
    fn a_lagging_replica_is_a_liveness_anomaly() {
        let mut samples = Vec::new();
        for round in 0..3 {
            samples.extend(stable(round, 1, 100, 0xb));
            samples.extend(stable(round, 2, 100, 0xb));
            samples.extend(stable(round, 3, 40, 0x4));
        }
        let verdict = check(samples);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Liveness);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "catch up");
    }

    #[test]
    fn a_log_that_keeps_growing_is_a_liveness_anomaly() {
        let mut samples = Vec::new();
        for round in 0..4u32 {
            for node in 1..=3 {
                samples.extend(stable(round, node, 100 + u64::from(round) * 20 + node, 0xb + node));
            }
        }
        let verdict = check(samples);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "never settled");
    }
}
