//! SPEC §7.1, first half: no two workers hold a lease on the same job with
//! overlapping validity under cluster time.
//!
//! Every lease the server described (a grant from Claim, a renewal from
//! Refresh) carries its cluster-time window `[granted_at, expires_at)`. For
//! one job, order the leases by token; a lease's validity runs from its grant
//! to the latest `expires_at` any renewal of *that token* gave it. Two leases
//! `a < b` (by token) overlap when `a`'s validity reaches past `b`'s grant —
//! unless `a` was ended explicitly first: an ack, nack or release with
//! token `a` (ok, or unknown) invoked before `b`'s claim returned, which
//! lets the server hand the job on before `a`'s TTL ran out.
//!
//! A refresh may extend only the current token: a renewal of `a` that
//! applied after `b`'s grant (a later cluster time, or a refresh sent after
//! `b`'s claim returned) is reported on its own (it would make the stale
//! holder believe it still owns the job), and so is a refresh presenting
//! one token that comes back renewing another token's lease.

use std::collections::BTreeMap;

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
    /// (cluster time of the renewal, history index, refresh invoked at ns).
    renewals: Vec<(u64, u64, u64)>,
    /// Earliest invocation of an ack/nack/release with this token that may
    /// have taken effect.
    ended_ns: Option<u64>,
}

impl Checker for LeaseExclusivity {
    fn name(&self) -> &'static str {
        "lease_exclusivity"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut windows: BTreeMap<u64, BTreeMap<u64, Window>> = BTreeMap::new();
        let all = pairs(&run.history);
        for pair in &all {
            let Some(done) = pair.completion else { continue };
            if pair.invoke.f == OpFunction::Claim && done.kind == OpType::Ok {
                for lease in &done.value.leases {
                    windows.entry(lease.job_id).or_default().entry(lease.token).or_insert(Window {
                        holder: lease.holder.clone(),
                        granted_at_ms: lease.granted_at_ms,
                        valid_until_ms: lease.expires_at_ms,
                        grant_done_ns: done.time_ns,
                        grant_op: done.index,
                        renewals: Vec::new(),
                        ended_ns: None,
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
                            window.renewals.push((
                                lease.granted_at_ms,
                                done.index,
                                pair.invoke.time_ns,
                            ));
                        }
                    }
                }
                OpFunction::Ack | OpFunction::Nack | OpFunction::Release
                    if matches!(outcome, OpType::Ok | OpType::Info) =>
                {
                    let (Some(job), Some(token)) =
                        (pair.invoke.value.job_id, pair.invoke.value.token)
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

        let mut anomalies = foreign;
        let mut checked = 0u64;
        for (job, tokens) in &windows {
            checked += tokens.len() as u64;
            let ordered: Vec<(&u64, &Window)> = tokens.iter().collect();
            for (i, (token_a, a)) in ordered.iter().enumerate() {
                for (token_b, b) in ordered.iter().skip(i + 1) {
                    for (renewed_at, op, invoked_ns) in &a.renewals {
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
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::test_support::{Builder, lease};

    fn check(builder: &Builder) -> Verdict {
        LeaseExclusivity.check(&RunRecord { history: builder.ops.clone(), ..RunRecord::default() })
    }

    #[test]
    fn handover_after_expiry_is_fine() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .refresh(30, 40, "w1", 1, 5, vec![lease(1, 5, "w1", 2_000, 4_000)], vec![])
            .claim(50, 60, "w2", vec![lease(1, 9, "w2", 4_000, 6_000)]);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 2);
    }

    #[test]
    fn handover_after_nack_before_expiry_is_fine() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .token_op(30, 40, "w1", OpFunction::Nack, 1, 5, OpType::Ok)
            .claim(50, 60, "w2", vec![lease(1, 6, "w2", 1_500, 3_500)]);
        assert!(check(&b).anomalies.is_empty());
    }

    #[test]
    fn overlapping_grants_are_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)]).claim(
            50,
            60,
            "w2",
            vec![lease(1, 6, "w2", 2_000, 4_000)],
        );
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert!(verdict.anomalies[0].message.contains("overlap"));
    }

    #[test]
    fn a_nack_invoked_after_the_next_grant_does_not_excuse_overlap() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(50, 60, "w2", vec![lease(1, 6, "w2", 2_000, 4_000)])
            .token_op(70, 80, "w1", OpFunction::Nack, 1, 5, OpType::Ok);
        assert_eq!(check(&b).anomalies.len(), 1);
    }

    #[test]
    fn renewal_at_the_same_frozen_cluster_time_before_a_nack_is_fine() {
        // Cluster time stands still while real time catches up with a
        // clock that ran ahead: every entry carries the same time.
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 9_000, 11_000)])
            .refresh(30, 40, "w1", 1, 5, vec![lease(1, 5, "w1", 9_000, 11_000)], vec![])
            .token_op(50, 60, "w1", OpFunction::Nack, 1, 5, OpType::Ok)
            .claim(70, 80, "w2", vec![lease(1, 6, "w2", 9_000, 11_000)]);
        let verdict = check(&b);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
    }

    #[test]
    fn a_refresh_renewing_another_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(50, 60, "w2", vec![lease(1, 6, "w2", 3_000, 5_000)])
            .refresh(70, 80, "w1", 1, 5, vec![lease(1, 6, "w2", 3_500, 5_500)], vec![]);
        let verdict = check(&b);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert!(verdict.anomalies[0].message.contains("presenting token 5"));
    }

    #[test]
    fn renewing_a_superseded_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(50, 60, "w2", vec![lease(1, 6, "w2", 3_000, 5_000)])
            .refresh(70, 80, "w1", 1, 5, vec![lease(1, 5, "w1", 3_500, 5_500)], vec![]);
        let verdict = check(&b);
        // The renewal itself, and the overlap it creates.
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
        assert!(verdict.anomalies.iter().any(|a| a.message.contains("renewed")));
    }
}
