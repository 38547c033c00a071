//! SPEC §7.7: a node whose clock is off by more than the enforced bound
//! (`max_clock_offset_ms`) stands aside — it judges its own clock skewed,
//! does not lead, and so stamps nothing — while the others stay ready and
//! serve; once the clock is back it rejoins by itself; and a step within
//! the bound changes nothing.
//!
//! The history holds, per clock round, the nemesis's fault (with the node
//! it hit and how long after the injection the clock is beyond the bound,
//! or the phase `within-bound` for a step inside it), `clock_read`s of
//! every node's own status (its role and its `clock_skewed` verdict) taken
//! every quarter second while the fault holds and after the heal, a probe
//! write tried while the fault holds (phase `during`), and the heal.
//!
//! **Beyond the bound.** From the moment the clock is beyond the bound plus
//! [`STAND_ASIDE_GRACE_MS`] until the heal is sent: every read of the
//! target must say skewed and not leader (safety: a node with a clock that
//! far off must not lead, since a leader stamps the cluster's time); every
//! read of another node must say not skewed, and a probe write must succeed
//! (liveness: the others carry on). After the heal some read of the target
//! must say not skewed within [`REJOIN_LIMIT_MS`] (liveness).
//!
//! **Within the bound.** From injection to heal, no read of any node may
//! say skewed (liveness: a step the bound allows must not cost
//! availability).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::history::{OpFunction, OpType, Pair, pairs};

/// The node's advert interval (`advert_interval_ms`; the harness leaves the
/// node's default). Clock offsets are measured on advert round trips.
pub const ADVERT_INTERVAL_MS: u64 = 1_000;

/// How long a node may take to stand aside once its clock is beyond the
/// bound, derived from the advert interval: a step of the node's own clock
/// shows in its own offsets at once (they are corrected by how far its wall
/// clock moved from its monotonic clock), but a drift, and the peers' view
/// of either, waits for a fresh advert round trip — up to one interval, and
/// one more when the first straddled the change. Then the election guard
/// (every 250 ms) stops the leader's heartbeats and asks the most
/// caught-up voter to campaign, which wins in a vote round (a leader
/// elected less than its own lease ago, at most 600 ms, asks once the
/// lease is over): a second for those. So two advert intervals plus one second.
pub const STAND_ASIDE_GRACE_MS: u64 = 2 * ADVERT_INTERVAL_MS + 1_000;

/// How long after the heal a node may take to say its clock agrees again:
/// the same grace, plus a second for the heal's own calls.
pub const REJOIN_LIMIT_MS: u64 = STAND_ASIDE_GRACE_MS + 1_000;

/// The process that reads each node's clock verdict.
pub const CLOCK_WATCH: &str = "clock-watch";

/// The phase a within-bound clock fault is recorded with.
pub const WITHIN_BOUND: &str = "within-bound";

/// The checker.
pub struct ClockBound;

/// What the clock rounds exercised, for the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockCounters {
    /// Rounds with a node beyond the bound in which its reads were judged
    /// and a write was served meanwhile.
    pub beyond_rounds: u64,
    /// Rounds with a step within the bound whose reads were judged.
    pub within_rounds: u64,
    /// Reads of a node beyond the bound that found it standing aside.
    pub stood_aside: u64,
}

/// One clock round as the history tells it.
struct ClockRound {
    round: usize,
    target: u64,
    /// `Some(ms)`: beyond the bound `ms` after injection; `None`: within.
    beyond_after_ms: Option<u64>,
    injected_ns: u64,
    fault_op: u64,
    healed_ns: Option<u64>,
}

/// One read of a node's clock verdict.
struct Read {
    node: u64,
    round: Option<usize>,
    invoked_ns: u64,
    op: u64,
    role: String,
    skewed: bool,
}

fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

fn clock_rounds(all: &[Pair<'_>]) -> Vec<ClockRound> {
    let mut heals: BTreeMap<usize, u64> = BTreeMap::new();
    for pair in all {
        if pair.invoke.f == OpFunction::Heal
            && let Some(round) = pair.invoke.value.round
        {
            heals.entry(round).or_insert(pair.invoke.time_ns);
        }
    }
    let mut rounds = Vec::new();
    for pair in all {
        let Some(done) = pair.completion else { continue };
        if pair.invoke.f != OpFunction::Fault || done.kind != OpType::Ok {
            continue;
        }
        let within = done.value.phase.as_deref() == Some(WITHIN_BOUND);
        let beyond_after_ms = done.value.beyond_bound_after_ms;
        if !within && beyond_after_ms.is_none() {
            continue;
        }
        let (Some(round), [target]) = (done.value.round, done.value.nodes.as_slice()) else {
            continue;
        };
        rounds.push(ClockRound {
            round,
            target: *target,
            beyond_after_ms: if within { None } else { beyond_after_ms },
            injected_ns: done.time_ns,
            fault_op: done.index,
            healed_ns: heals.get(&round).copied(),
        });
    }
    rounds
}

fn reads(all: &[Pair<'_>]) -> Vec<Read> {
    all.iter()
        .filter(|p| p.invoke.f == OpFunction::ClockRead)
        .filter_map(|pair| {
            let done = pair.completion.filter(|c| c.kind == OpType::Ok)?;
            let node = *done.value.nodes.first()?;
            Some(Read {
                node,
                round: done.value.round,
                invoked_ns: pair.invoke.time_ns,
                op: done.index,
                role: done.value.role.clone().unwrap_or_default(),
                skewed: done.value.clock_skewed?,
            })
        })
        .collect()
}

/// Whether an ok probe write of `round` with phase `during` was sent in
/// `[from_ns, until_ns)`.
fn served_during(all: &[Pair<'_>], round: usize, from_ns: u64, until_ns: u64) -> bool {
    all.iter().any(|pair| {
        pair.invoke.f == OpFunction::Probe
            && pair.invoke.value.round == Some(round)
            && pair.invoke.value.phase.as_deref() == Some("during")
            && pair.outcome() == OpType::Ok
            && (from_ns..until_ns).contains(&pair.invoke.time_ns)
    })
}

/// The judgement, and what it exercised.
fn judge(run: &RunRecord) -> (Vec<Anomaly>, u64, ClockCounters) {
    let all = pairs(&run.history);
    let reads = reads(&all);
    let mut anomalies = Vec::new();
    let mut checked = 0u64;
    let mut counters = ClockCounters::default();
    for round in clock_rounds(&all) {
        let Some(healed_ns) = round.healed_ns else { continue };
        let in_round: Vec<&Read> = reads.iter().filter(|r| r.round == Some(round.round)).collect();
        match round.beyond_after_ms {
            Some(after_ms) => {
                let from_ns =
                    round.injected_ns.saturating_add(ms_to_ns(after_ms + STAND_ASIDE_GRACE_MS));
                let held: Vec<&&Read> = in_round
                    .iter()
                    .filter(|r| (from_ns..healed_ns).contains(&r.invoked_ns))
                    .collect();
                let mut target_reads = 0u64;
                for read in &held {
                    checked += 1;
                    if read.node == round.target {
                        target_reads += 1;
                        if read.role == "leader" {
                            anomalies.push(Anomaly::safety(
                                format!(
                                    "round {}: node {} led {:.1} s after its clock went beyond the bound",
                                    round.round,
                                    read.node,
                                    seconds(read.invoked_ns.saturating_sub(round.injected_ns))
                                ),
                                vec![round.fault_op, read.op],
                            ));
                        }
                        if !read.skewed {
                            anomalies.push(Anomaly::safety(
                                format!(
                                    "round {}: node {} did not judge its clock skewed {:.1} s after it went beyond the bound (role {})",
                                    round.round,
                                    read.node,
                                    seconds(read.invoked_ns.saturating_sub(round.injected_ns)),
                                    read.role
                                ),
                                vec![round.fault_op, read.op],
                            ));
                        }
                        if read.skewed && read.role != "leader" {
                            counters.stood_aside += 1;
                        }
                    } else if read.skewed {
                        anomalies.push(Anomaly::liveness(
                            format!(
                                "round {}: node {}, whose clock was untouched, judged itself skewed while node {} was beyond the bound",
                                round.round, read.node, round.target
                            ),
                            vec![round.fault_op, read.op],
                        ));
                    }
                }
                let served = served_during(&all, round.round, from_ns, healed_ns);
                if !served {
                    anomalies.push(Anomaly::liveness(
                        format!(
                            "round {}: no write was served while node {} stood aside",
                            round.round, round.target
                        ),
                        vec![round.fault_op],
                    ));
                }
                if target_reads > 0 && served {
                    counters.beyond_rounds += 1;
                }
                let rejoin_by = healed_ns.saturating_add(ms_to_ns(REJOIN_LIMIT_MS));
                let rejoined = in_round.iter().any(|r| {
                    r.node == round.target
                        && !r.skewed
                        && (healed_ns..rejoin_by).contains(&r.invoked_ns)
                });
                if !rejoined {
                    anomalies.push(Anomaly::liveness(
                        format!(
                            "round {}: node {} still judged its clock skewed {} ms after the heal",
                            round.round, round.target, REJOIN_LIMIT_MS
                        ),
                        vec![round.fault_op],
                    ));
                }
            }
            None => {
                let mut judged = false;
                for read in in_round
                    .iter()
                    .filter(|r| (round.injected_ns..healed_ns).contains(&r.invoked_ns))
                {
                    checked += 1;
                    judged = true;
                    if read.skewed {
                        anomalies.push(Anomaly::liveness(
                            format!(
                                "round {}: node {} judged its clock skewed after node {}'s clock stepped within the bound",
                                round.round, read.node, round.target
                            ),
                            vec![round.fault_op, read.op],
                        ));
                    }
                }
                if judged {
                    counters.within_rounds += 1;
                }
            }
        }
    }
    (anomalies, checked, counters)
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// What the clock rounds exercised.
pub fn counters(run: &RunRecord) -> ClockCounters {
    judge(run).2
}

impl Checker for ClockBound {
    fn name(&self) -> &'static str {
        "clock_bound"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let (anomalies, checked, _) = judge(run);
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Severity;
    use crate::checkers::test_support::{assert_anomaly, assert_kind};
    use crate::history::OpValue;
    use crate::history::test_support::Builder;
    use crate::plan::Mode;

    const MS: u64 = 1_000_000;

    fn fault(b: &mut Builder, at_ms: u64, round: usize, target: u64, beyond: Option<u64>) {
        let value =
            OpValue { round: Some(round), fault: Some("clock-bump".into()), ..OpValue::default() };
        b.op(at_ms * MS, "nemesis", OpType::Invoke, OpFunction::Fault, value.clone());
        let done = OpValue {
            nodes: vec![target],
            beyond_bound_after_ms: beyond,
            phase: beyond.is_none().then(|| WITHIN_BOUND.to_string()),
            ..value
        };
        b.op(at_ms * MS + MS, "nemesis", OpType::Ok, OpFunction::Fault, done);
    }

    fn heal(b: &mut Builder, at_ms: u64, round: usize) {
        let value = OpValue { round: Some(round), ..OpValue::default() };
        b.op(at_ms * MS, "nemesis", OpType::Invoke, OpFunction::Heal, value.clone());
        b.op(at_ms * MS + MS, "nemesis", OpType::Ok, OpFunction::Heal, value);
    }

    fn read(b: &mut Builder, at_ms: u64, round: usize, node: u64, role: &str, skewed: bool) {
        b.op(at_ms * MS, CLOCK_WATCH, OpType::Invoke, OpFunction::ClockRead, OpValue::default());
        let value = OpValue {
            nodes: vec![node],
            round: Some(round),
            role: Some(role.to_string()),
            clock_skewed: Some(skewed),
            ..OpValue::default()
        };
        b.op(at_ms * MS + MS, CLOCK_WATCH, OpType::Ok, OpFunction::ClockRead, value);
    }

    fn probe(b: &mut Builder, at_ms: u64, round: usize, ok: bool) {
        let value =
            OpValue { round: Some(round), phase: Some("during".into()), ..OpValue::default() };
        b.op(at_ms * MS, "probe", OpType::Invoke, OpFunction::Probe, value.clone());
        let kind = if ok { OpType::Ok } else { OpType::Info };
        b.op(at_ms * MS + 5 * MS, "probe", kind, OpFunction::Probe, value);
    }

    fn check(b: &Builder) -> Verdict {
        ClockBound.check(&RunRecord { history: b.ops.clone(), ..RunRecord::default() })
    }

    /// Node 1's clock goes minutes ahead at 10 s; reads every second until
    /// the heal at 17 s and after it. `target` says what node 1 reported.
    fn beyond_round(target_role: &str, target_skewed: bool, rejoined: bool) -> Builder {
        let mut b = Builder::default();
        fault(&mut b, 10_000, 0, 1, Some(0));
        // Inside the grace node 1 still leads and agrees: not judged.
        read(&mut b, 10_500, 0, 1, "leader", false);
        for second in 14..17 {
            read(&mut b, second * 1_000, 0, 1, target_role, target_skewed);
            read(&mut b, second * 1_000 + 10, 0, 2, "leader", false);
            read(&mut b, second * 1_000 + 20, 0, 3, "follower", false);
        }
        probe(&mut b, 13_100, 0, true);
        heal(&mut b, 17_000, 0);
        read(&mut b, 18_000, 0, 1, "follower", !rejoined);
        b
    }

    #[test]
    fn a_node_beyond_the_bound_that_stands_aside_passes() {
        let b = beyond_round("follower", true, true);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 9, "the read inside the grace is not judged");
        let counters = counters(&RunRecord { history: b.ops.clone(), ..RunRecord::default() });
        assert_eq!(counters, ClockCounters { beyond_rounds: 1, within_rounds: 0, stood_aside: 3 });
    }

    #[test]
    fn a_node_beyond_the_bound_that_still_leads_is_a_safety_anomaly() {
        let verdict = check(&beyond_round("leader", false, true));
        assert_eq!(verdict.failures(Mode::SafetyOnly), 6, "{:?}", verdict.anomalies);
        assert_anomaly(&verdict, Severity::Safety, "node 1 led");
        assert_anomaly(&verdict, Severity::Safety, "did not judge its clock skewed");
    }

    #[test]
    fn a_node_that_does_not_rejoin_is_a_liveness_anomaly() {
        let verdict = check(&beyond_round("follower", true, false));
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Liveness);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "after the heal");
        assert_eq!(verdict.failures(Mode::SafetyOnly), 0);
    }

    #[test]
    fn no_write_while_the_node_stood_aside_is_a_liveness_anomaly() {
        let mut b = Builder::default();
        fault(&mut b, 10_000, 0, 1, Some(0));
        read(&mut b, 14_000, 0, 1, "follower", true);
        read(&mut b, 14_010, 0, 2, "candidate", true);
        // A probe inside the grace does not count.
        probe(&mut b, 11_000, 0, true);
        probe(&mut b, 14_100, 0, false);
        heal(&mut b, 17_000, 0);
        read(&mut b, 18_000, 0, 1, "follower", false);
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
        assert!(verdict.anomalies.iter().all(|a| a.severity == Severity::Liveness));
        assert_anomaly(&verdict, Severity::Liveness, "no write was served");
        assert_anomaly(&verdict, Severity::Liveness, "node 2, whose clock");
        let counters = counters(&RunRecord { history: b.ops.clone(), ..RunRecord::default() });
        assert_eq!(counters.beyond_rounds, 0);
    }

    #[test]
    fn a_drift_is_judged_from_when_it_is_beyond_the_bound() {
        let mut b = Builder::default();
        // Twice real time: 500 ms off after 500 ms, so judged from 3.5 s.
        fault(&mut b, 10_000, 0, 3, Some(500));
        read(&mut b, 13_200, 0, 3, "leader", false);
        read(&mut b, 13_700, 0, 3, "leader", false);
        probe(&mut b, 13_800, 0, true);
        heal(&mut b, 15_000, 0);
        read(&mut b, 15_500, 0, 3, "follower", false);
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
        // The read at 13.2 s is inside the grace; the one at 13.7 s is not.
        assert!(verdict.anomalies.iter().all(|a| a.severity == Severity::Safety));
        assert!(
            verdict.anomalies.iter().all(|a| a.message.contains("3.7 s")),
            "{:?}",
            verdict.anomalies
        );
    }

    #[test]
    fn a_step_within_the_bound_must_cost_nothing() {
        let mut b = Builder::default();
        fault(&mut b, 10_000, 2, 2, None);
        read(&mut b, 10_300, 2, 1, "leader", false);
        read(&mut b, 10_310, 2, 2, "follower", false);
        heal(&mut b, 13_000, 2);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 2);
        let mut b2 = Builder::default();
        fault(&mut b2, 10_000, 2, 2, None);
        read(&mut b2, 10_300, 2, 2, "follower", true);
        heal(&mut b2, 13_000, 2);
        let verdict = check(&b2);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_eq!(verdict.anomalies[0].severity, Severity::Liveness);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "within the bound");
    }

    #[test]
    fn other_faults_are_not_judged() {
        let mut b = Builder::default();
        let value = OpValue { round: Some(0), fault: Some("kill".into()), ..OpValue::default() };
        b.op(0, "nemesis", OpType::Invoke, OpFunction::Fault, value.clone());
        b.op(MS, "nemesis", OpType::Ok, OpFunction::Fault, OpValue { nodes: vec![1], ..value });
        heal(&mut b, 5_000, 0);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty());
        assert_eq!(verdict.checked, 0);
    }
}
