//! SPEC §7.1, first half: no two workers hold a lease on the same job with
//! overlapping validity under cluster time; and §7.7's real-time half:
//! within the enforced clock bound no lease is cut short in real time by
//! more than the bound, whichever node leads.
//!
//! **Cluster time.** Every lease the server described (a grant from Claim,
//! a renewal from Refresh) carries its cluster-time window
//! `[granted_at, expires_at)`. For one job, order the leases by token; a
//! lease's validity runs from its grant to the latest `expires_at` any
//! renewal of *that token* gave it. Two leases `a < b` (by token) overlap
//! when `a`'s validity reaches past `b`'s grant — unless `a` was ended
//! explicitly first: an ack, nack or release with token `a` (ok, or
//! unknown) invoked before `b`'s claim returned, which lets the server hand
//! the job on before `a`'s TTL ran out.
//!
//! A refresh may extend only the current token: a renewal of `a` that
//! applied after `b`'s grant (a later cluster time, or a refresh sent after
//! `b`'s claim returned) is reported on its own (it would make the stale
//! holder believe it still owns the job), and so is a refresh presenting
//! one token that comes back renewing another token's lease.
//!
//! **Real time.** Cluster time is only as good as the clocks that stamp
//! it, so the leases are also judged on the history's own clock, the
//! host's monotonic time, which no fault touches. A grant cannot have
//! happened before its claim was sent, and a renewal not before its
//! refresh was sent; so a lease of TTL `t` whose claim (or latest renewal
//! that answered ok) was sent at `s` must, by SPEC §7.7, stay with its
//! holder until at least `s + t − bound` in real time (the bound is the
//! enforced `max_clock_offset_ms`). A later grant of the job whose claim
//! *returned* before then — so it certainly happened before then — while
//! `a` was not ended first, is a safety anomaly: the lease was **cut short
//! in real time**. (The holder's own view is stricter: it counts its
//! lease lost at `s + waited + t − margin`, the client library's local
//! deadline. A later grant before that deadline is counted, not failed:
//! the client's margin, `min(ttl/5, 2 s)`, is smaller than the default
//! bound for TTLs under 2.5 s, so the node may honestly re-grant inside
//! it. See docs/safety.md.)

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_client::worker::lease_margin;
use serde::{Deserialize, Serialize};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::history::{OpFunction, OpType, pairs};

/// Checker for lease exclusivity.
pub struct LeaseExclusivity;

#[derive(Debug)]
struct Window {
    holder: String,
    granted_at_ms: u64,
    valid_until_ms: u64,
    grant_done_ns: u64,
    grant_op: u64,
    /// (cluster time of the renewal, history index, refresh invoked at ns,
    /// the renewal's TTL in ms).
    renewals: Vec<(u64, u64, u64, u64)>,
    /// Earliest invocation of an ack/nack/release with this token that may
    /// have taken effect.
    ended_ns: Option<u64>,
    /// The claim's send time (its invocation), host ns.
    claim_sent_ns: u64,
    /// How long the node held the claim before granting, ms.
    waited_ms: u64,
    /// The grant's TTL, ms.
    ttl_ms: u64,
}

impl Window {
    /// Real time before which no grant after `next` may happen (the
    /// latest send time + TTL of the grant and of its renewals that came
    /// before `next`, less the bound), and the holder's own local deadline.
    /// A renewal after `next` was granted is an anomaly of its own and
    /// moves neither.
    fn limits(&self, next: &Window, bound_ms: u64) -> (u64, u64) {
        let (mut floor, mut deadline) =
            real_time_limits(self.claim_sent_ns, self.waited_ms, self.ttl_ms, bound_ms);
        for (renewed_at_ms, _, invoked_ns, ttl_ms) in &self.renewals {
            if *renewed_at_ms <= next.granted_at_ms && *invoked_ns < next.grant_done_ns {
                let (f, d) = real_time_limits(*invoked_ns, 0, *ttl_ms, bound_ms);
                floor = floor.max(f);
                deadline = deadline.max(d);
            }
        }
        (floor, deadline)
    }
}

/// What the real-time judgement saw, for the summary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RealTimeCounters {
    /// Hand-overs judged in real time (a lease and the next grant of its
    /// job, the lease not ended first).
    pub handovers: u64,
    /// The least real time between a lease's floor and the return of the
    /// next grant's claim, ms (negative: cut short); none judged: `None`.
    pub closest_ms: Option<i64>,
    /// Next grants whose claim returned before the previous holder's own
    /// local deadline (send + waited + ttl − margin).
    pub inside_holder_deadline: u64,
}

fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

fn signed_ms(ns_a: u64, ns_b: u64) -> i64 {
    let difference = i128::from(ns_a) - i128::from(ns_b);
    i64::try_from(difference / 1_000_000).unwrap_or(if difference < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// The floor and the holder's deadline of a lease sent at `sent_ns` (plus
/// `waited_ms` before the node granted it) with TTL `ttl_ms`.
fn real_time_limits(sent_ns: u64, waited_ms: u64, ttl_ms: u64, bound_ms: u64) -> (u64, u64) {
    let margin_ms =
        u64::try_from(lease_margin(Duration::from_millis(ttl_ms)).as_millis()).unwrap_or(u64::MAX);
    let floor = sent_ns.saturating_add(ms_to_ns(ttl_ms.saturating_sub(bound_ms)));
    let deadline = sent_ns
        .saturating_add(ms_to_ns(waited_ms))
        .saturating_add(ms_to_ns(ttl_ms.saturating_sub(margin_ms)));
    (floor, deadline)
}

/// Every lease of the history by job and token, with renewals and ends.
fn windows(run: &RunRecord) -> (BTreeMap<u64, BTreeMap<u64, Window>>, Vec<Anomaly>) {
    let mut windows: BTreeMap<u64, BTreeMap<u64, Window>> = BTreeMap::new();
    let all = pairs(&run.history);
    for pair in &all {
        let Some(done) = pair.completion else { continue };
        if pair.invoke.f == OpFunction::Claim && done.kind == OpType::Ok {
            let waited_ms = done.value.waited_ms.unwrap_or(0);
            for lease in &done.value.leases {
                windows.entry(lease.job_id).or_default().entry(lease.token).or_insert(Window {
                    holder: lease.holder.clone(),
                    granted_at_ms: lease.granted_at_ms,
                    valid_until_ms: lease.expires_at_ms,
                    grant_done_ns: done.time_ns,
                    grant_op: done.index,
                    renewals: Vec::new(),
                    ended_ns: None,
                    claim_sent_ns: pair.invoke.time_ns,
                    waited_ms,
                    ttl_ms: lease.expires_at_ms.saturating_sub(lease.granted_at_ms),
                });
            }
        }
    }
    let mut foreign = Vec::new();
    for pair in &all {
        let outcome = pair.outcome();
        match pair.invoke.f {
            OpFunction::Refresh if outcome == OpType::Ok => {
                let Some(done) = pair.completion else { continue };
                let presented = (pair.invoke.value.job_id, pair.invoke.value.token);
                for lease in &done.value.leases {
                    if let (Some(job), Some(token)) = presented
                        && lease.job_id == job
                        && lease.token != token
                    {
                        foreign.push(Anomaly::safety(
                            format!(
                                "job {job}: a refresh presenting token {token} renewed the lease of token {} ({})",
                                lease.token, lease.holder
                            ),
                            vec![pair.invoke.index, done.index],
                        ));
                    }
                    let window = windows
                        .get_mut(&lease.job_id)
                        .and_then(|tokens| tokens.get_mut(&lease.token));
                    if let Some(window) = window {
                        window.valid_until_ms = window.valid_until_ms.max(lease.expires_at_ms);
                        // Renewed from when the refresh was sent.
                        window.renewals.push((
                            lease.granted_at_ms,
                            done.index,
                            pair.invoke.time_ns,
                            lease.expires_at_ms.saturating_sub(lease.granted_at_ms),
                        ));
                    }
                }
            }
            OpFunction::Ack | OpFunction::Nack | OpFunction::Release
                if matches!(outcome, OpType::Ok | OpType::Info) =>
            {
                let (Some(job), Some(token)) = (pair.invoke.value.job_id, pair.invoke.value.token)
                else {
                    continue;
                };
                if let Some(window) = windows.get_mut(&job).and_then(|t| t.get_mut(&token)) {
                    let at = pair.invoke.time_ns;
                    window.ended_ns = Some(window.ended_ns.map_or(at, |e| e.min(at)));
                }
            }
            _ => {}
        }
    }
    (windows, foreign)
}

/// One lease and the earliest-returned later grant of its job, when the
/// lease was not ended before that grant's claim returned.
/// A lease by its token.
type Leased<'a> = (&'a u64, &'a Window);

fn handovers(tokens: &BTreeMap<u64, Window>) -> Vec<(Leased<'_>, Leased<'_>)> {
    let ordered: Vec<Leased<'_>> = tokens.iter().collect();
    let mut result = Vec::new();
    for (i, a) in ordered.iter().enumerate() {
        // A later grant happened after the next one, so whichever later
        // claim returned first bounds the next grant's real time.
        let Some(next) = ordered.iter().skip(i + 1).min_by_key(|(_, b)| b.grant_done_ns) else {
            continue;
        };
        if a.1.ended_ns.is_some_and(|ended| ended < next.1.grant_done_ns) {
            continue;
        }
        result.push((*a, *next));
    }
    result
}

/// The real-time judgement's counters.
pub fn counters(run: &RunRecord) -> RealTimeCounters {
    let (windows, _) = windows(run);
    let mut counters = RealTimeCounters::default();
    for tokens in windows.values() {
        for ((_, a), (_, b)) in handovers(tokens) {
            let (floor_ns, deadline_ns) = a.limits(b, run.clock_bound_ms);
            counters.handovers += 1;
            let slack_ms = signed_ms(b.grant_done_ns, floor_ns);
            counters.closest_ms = Some(counters.closest_ms.map_or(slack_ms, |c| c.min(slack_ms)));
            if b.grant_done_ns < deadline_ns {
                counters.inside_holder_deadline += 1;
            }
        }
    }
    counters
}

impl Checker for LeaseExclusivity {
    fn name(&self) -> &'static str {
        "lease_exclusivity"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let (windows, foreign) = windows(run);
        let mut anomalies = foreign;
        let mut checked = 0u64;
        for (job, tokens) in &windows {
            checked += tokens.len() as u64;
            let ordered: Vec<(&u64, &Window)> = tokens.iter().collect();
            for (i, (token_a, a)) in ordered.iter().enumerate() {
                for (token_b, b) in ordered.iter().skip(i + 1) {
                    for (renewed_at, op, invoked_ns, _) in &a.renewals {
                        // Later in cluster time means later in the log; a
                        // refresh sent after the next grant returned is
                        // later in real time. Either way `a` was superseded.
                        if *renewed_at > b.granted_at_ms || *invoked_ns > b.grant_done_ns {
                            anomalies.push(Anomaly::safety(
                                format!(
                                    "job {job}: lease with token {token_a} ({}) was renewed at cluster time {renewed_at} ms, after token {token_b} ({}) was granted at {} ms",
                                    a.holder, b.holder, b.granted_at_ms
                                ),
                                vec![a.grant_op, b.grant_op, *op],
                            ));
                        }
                    }
                    let ended_first = a.ended_ns.is_some_and(|ended| ended < b.grant_done_ns);
                    if a.valid_until_ms > b.granted_at_ms && !ended_first {
                        anomalies.push(Anomaly::safety(
                            format!(
                                "job {job}: leases overlap in cluster time: token {token_a} ({}) valid [{}, {}) ms and token {token_b} ({}) granted at {} ms",
                                a.holder, a.granted_at_ms, a.valid_until_ms, b.holder, b.granted_at_ms
                            ),
                            vec![a.grant_op, b.grant_op],
                        ));
                    }
                }
            }
            for ((token_a, a), (token_b, b)) in handovers(tokens) {
                let (floor_ns, _) = a.limits(b, run.clock_bound_ms);
                if b.grant_done_ns < floor_ns {
                    anomalies.push(Anomaly::safety(
                        format!(
                            "job {job}: lease cut short in real time: token {token_a} ({}, claim sent at {:.3} s) must hold until {:.3} s (its TTL less the {} ms bound), but token {token_b} ({}) was granted by {:.3} s, {} ms early",
                            a.holder,
                            seconds(a.claim_sent_ns),
                            seconds(floor_ns),
                            run.clock_bound_ms,
                            b.holder,
                            seconds(b.grant_done_ns),
                            signed_ms(floor_ns, b.grant_done_ns),
                        ),
                        vec![a.grant_op, b.grant_op],
                    ));
                }
            }
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Severity;
    use crate::checkers::test_support::{assert_anomaly, assert_kind};
    use crate::history::test_support::{Builder, lease};
    use crate::plan::Mode;

    /// Host time in the synthetic histories: milliseconds, as ns.
    const MS: u64 = 1_000_000;

    fn record(builder: &Builder) -> RunRecord {
        RunRecord { history: builder.ops.clone(), clock_bound_ms: 500, ..RunRecord::default() }
    }

    fn check(builder: &Builder) -> Verdict {
        LeaseExclusivity.check(&record(builder))
    }

    #[test]
    fn handover_after_expiry_is_fine() {
        let mut b = Builder::default();
        b.claim(990 * MS, 1_000 * MS, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .refresh(
                1_990 * MS,
                2_000 * MS,
                "w1",
                1,
                5,
                vec![lease(1, 5, "w1", 2_000, 4_000)],
                vec![],
            )
            .claim(3_900 * MS, 4_010 * MS, "w2", vec![lease(1, 9, "w2", 4_000, 6_000)]);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 2);
        let counters = counters(&record(&b));
        assert_eq!(counters.handovers, 1);
        // Floor: refresh sent at 1,990 ms + 2,000 ms − 500 ms = 3,490 ms.
        assert_eq!(counters.closest_ms, Some(520));
        assert_eq!(counters.inside_holder_deadline, 0);
    }

    #[test]
    fn handover_after_nack_before_expiry_is_fine() {
        let mut b = Builder::default();
        b.claim(10 * MS, 20 * MS, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .token_op(30 * MS, 40 * MS, "w1", OpFunction::Nack, 1, 5, OpType::Ok)
            .claim(50 * MS, 60 * MS, "w2", vec![lease(1, 6, "w2", 1_500, 3_500)]);
        assert!(check(&b).anomalies.is_empty());
        assert_eq!(counters(&record(&b)).handovers, 0, "an ended lease is not judged");
    }

    #[test]
    fn overlapping_grants_are_caught() {
        let mut b = Builder::default();
        b.claim(10 * MS, 20 * MS, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)]).claim(
            3_000 * MS,
            3_010 * MS,
            "w2",
            vec![lease(1, 6, "w2", 2_000, 4_000)],
        );
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "overlap");
    }

    #[test]
    fn a_nack_invoked_after_the_next_grant_does_not_excuse_overlap() {
        let mut b = Builder::default();
        b.claim(10 * MS, 20 * MS, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(3_000 * MS, 3_010 * MS, "w2", vec![lease(1, 6, "w2", 2_000, 4_000)])
            .token_op(3_100 * MS, 3_110 * MS, "w1", OpFunction::Nack, 1, 5, OpType::Ok);
        assert_eq!(check(&b).anomalies.len(), 1);
    }

    #[test]
    fn renewal_at_the_same_frozen_cluster_time_before_a_nack_is_fine() {
        // Cluster time stands still while real time catches up with a
        // clock that ran ahead: every entry carries the same time.
        let mut b = Builder::default();
        b.claim(10 * MS, 20 * MS, "w1", vec![lease(1, 5, "w1", 9_000, 11_000)])
            .refresh(30 * MS, 40 * MS, "w1", 1, 5, vec![lease(1, 5, "w1", 9_000, 11_000)], vec![])
            .token_op(50 * MS, 60 * MS, "w1", OpFunction::Nack, 1, 5, OpType::Ok)
            .claim(70 * MS, 80 * MS, "w2", vec![lease(1, 6, "w2", 9_000, 11_000)]);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
    }

    #[test]
    fn a_refresh_renewing_another_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10 * MS, 20 * MS, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(2_990 * MS, 3_000 * MS, "w2", vec![lease(1, 6, "w2", 3_000, 5_000)])
            .refresh(
                3_490 * MS,
                3_500 * MS,
                "w1",
                1,
                5,
                vec![lease(1, 6, "w2", 3_500, 5_500)],
                vec![],
            );
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "presenting token 5");
    }

    #[test]
    fn renewing_a_superseded_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10 * MS, 20 * MS, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(2_990 * MS, 3_000 * MS, "w2", vec![lease(1, 6, "w2", 3_000, 5_000)])
            .refresh(
                3_490 * MS,
                3_500 * MS,
                "w1",
                1,
                5,
                vec![lease(1, 5, "w1", 3_500, 5_500)],
                vec![],
            );
        let verdict = check(&b);
        // The renewal itself, and the overlap it creates.
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
        assert_anomaly(&verdict, Severity::Safety, "was renewed at cluster time");
        assert_anomaly(&verdict, Severity::Safety, "leases overlap in cluster time");
    }

    /// A leader whose clock jumped ahead after it granted a lease sweeps it
    /// early: in cluster time the next grant comes after the expiry, so
    /// only real time shows the lease was cut short.
    fn cut_short(next_claim_returns_ms: u64) -> Builder {
        let mut b = Builder::default();
        // Sent at 1.000 s; 2 s TTL; the node held the claim 10 ms.
        b.claim_waited(1_000 * MS, 1_015 * MS, "w1", 10, vec![lease(7, 40, "w1", 50_000, 52_000)])
            // The leader's clock is a minute ahead now: the sweep lapses
            // the lease at once and w2 gets it, all "after" its expiry.
            .claim(
                next_claim_returns_ms * MS - 5 * MS,
                next_claim_returns_ms * MS,
                "w2",
                vec![lease(7, 41, "w2", 110_000, 112_000)],
            );
        b
    }

    #[test]
    fn a_lease_cut_short_in_real_time_is_a_safety_anomaly() {
        let b = cut_short(1_200);
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        let anomaly = &verdict.anomalies[0];
        assert!(anomaly.message.contains("cut short in real time"), "{}", anomaly.message);
        assert!(anomaly.message.contains("token 40") && anomaly.message.contains("token 41"));
        // Floor: 1.000 s + 2 s − 0.5 s = 2.5 s; w2's claim returned at 1.2 s.
        assert!(anomaly.message.contains("1300 ms early"), "{}", anomaly.message);
        assert_eq!(anomaly.severity, Severity::Safety);
        // Safety fails the run in either mode.
        assert_eq!(verdict.failures(Mode::SafetyOnly), 1);
        assert_eq!(verdict.failures(Mode::SafetyLiveness), 1);
        let counters = counters(&record(&b));
        assert_eq!(counters.closest_ms, Some(-1_300));
        assert_eq!(counters.inside_holder_deadline, 1);
    }

    #[test]
    fn a_handover_within_the_bound_is_honest() {
        // The next grant returns 2.6 s after the first claim was sent: past
        // the floor (2.5 s), even though it is inside the holder's own
        // deadline (1.000 + 0.010 + 2 − 0.4 = 2.61 s): the client's margin
        // is smaller than the bound at this TTL, which is counted, not failed.
        let b = cut_short(2_600);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        let counters = counters(&record(&b));
        assert_eq!(counters.handovers, 1);
        assert_eq!(counters.closest_ms, Some(100));
        assert_eq!(counters.inside_holder_deadline, 1);
        // And once past the holder's deadline too, nothing is counted.
        let counters = counters_of(&cut_short(2_700));
        assert_eq!(counters.inside_holder_deadline, 0);
    }

    fn counters_of(builder: &Builder) -> RealTimeCounters {
        counters(&record(builder))
    }

    #[test]
    fn a_late_answer_is_judged_from_the_send_time() {
        // w1's claim answer came back 2.7 s late, after its lease lapsed
        // and w2 took the job: the lease still held its full TTL from the
        // moment it could have been granted, so nothing was cut short.
        let mut b = Builder::default();
        b.claim(1_000 * MS, 3_700 * MS, "w1", vec![lease(7, 40, "w1", 1_000, 3_000)]).claim(
            2_990 * MS,
            3_050 * MS,
            "w2",
            vec![lease(7, 41, "w2", 3_040, 5_040)],
        );
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
    }

    #[test]
    fn a_renewal_moves_the_floor_and_the_earliest_later_grant_decides() {
        // Renewed at 2.0 s: the floor moves to 3.5 s. Token 42 returned at
        // 3.3 s (before token 41's delayed answer at 3.9 s): cut short.
        let mut b = Builder::default();
        b.claim(1_000 * MS, 1_010 * MS, "w1", vec![lease(7, 40, "w1", 1_000, 3_000)])
            .refresh(
                2_000 * MS,
                2_010 * MS,
                "w1",
                7,
                40,
                vec![lease(7, 40, "w1", 2_000, 4_000)],
                vec![],
            )
            .claim(3_000 * MS, 3_900 * MS, "w2", vec![lease(7, 41, "w2", 4_000, 6_000)])
            .claim(3_200 * MS, 3_300 * MS, "w3", vec![lease(7, 42, "w3", 6_000, 8_000)]);
        let verdict = check(&b);
        let cut: Vec<&Anomaly> =
            verdict.anomalies.iter().filter(|a| a.message.contains("cut short")).collect();
        assert_eq!(cut.len(), 2, "{:?}", verdict.anomalies);
        assert!(cut.iter().all(|a| a.severity == Severity::Safety), "{cut:?}");
        assert!(cut[0].message.contains("token 40") && cut[0].message.contains("token 42"));
        assert!(cut[0].message.contains("200 ms early"), "{}", cut[0].message);
        // Token 41, sent at 3.0 s, was taken back by 3.3 s as well.
        assert!(cut[1].message.contains("token 41") && cut[1].message.contains("1200 ms early"));
    }
}
