//! SPEC §7.1, second half, and §3 fencing: tokens on one job strictly
//! increase, every token is issued once cluster-wide, and the fenced sink
//! never accepted a lower token after a higher one.
//!
//! Checks, all from the history and the sink's log:
//! - a token is never granted twice (to another job, holder or time);
//! - on one job, a grant at a later cluster time carries a higher token;
//! - real-time order: a claim invoked after another claim returned gets
//!   higher tokens than every token that claim got (tokens come from one
//!   replicated counter, so this holds across jobs too);
//! - the sink accepted, per job, a non-decreasing sequence of tokens, and
//!   only tokens the cluster granted for that job.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::history::{OpFunction, OpType, pairs};

/// Checker for fencing tokens.
pub struct Fencing;

#[derive(Debug)]
struct Granted {
    job_id: u64,
    holder: String,
    granted_at_ms: u64,
    op: u64,
}

impl Checker for Fencing {
    fn name(&self) -> &'static str {
        "fencing"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        let mut checked = 0u64;
        let mut by_token: BTreeMap<u64, Granted> = BTreeMap::new();
        // (invoke ns, completion ns, min token, max token, completion index)
        let mut claims: Vec<(u64, u64, u64, u64, u64)> = Vec::new();
        for pair in pairs(&run.history) {
            let Some(done) = pair.completion else { continue };
            if pair.invoke.f != OpFunction::Claim || done.kind != OpType::Ok {
                continue;
            }
            let tokens: Vec<u64> = done.value.leases.iter().map(|l| l.token).collect();
            if let (Some(min), Some(max)) = (tokens.iter().min(), tokens.iter().max()) {
                claims.push((pair.invoke.time_ns, done.time_ns, *min, *max, done.index));
            }
            for lease in &done.value.leases {
                checked += 1;
                let granted = Granted {
                    job_id: lease.job_id,
                    holder: lease.holder.clone(),
                    granted_at_ms: lease.granted_at_ms,
                    op: done.index,
                };
                match by_token.get(&lease.token) {
                    Some(first) => anomalies.push(Anomaly::safety(
                        format!(
                            "token {} granted twice: job {} to {} at {} ms, and job {} to {} at {} ms",
                            lease.token,
                            first.job_id,
                            first.holder,
                            first.granted_at_ms,
                            granted.job_id,
                            granted.holder,
                            granted.granted_at_ms
                        ),
                        vec![first.op, granted.op],
                    )),
                    None => {
                        by_token.insert(lease.token, granted);
                    }
                }
            }
        }

        // Per job, in token order, cluster time must not go backwards.
        let mut per_job: BTreeMap<u64, Vec<(u64, &Granted)>> = BTreeMap::new();
        for (token, granted) in &by_token {
            per_job.entry(granted.job_id).or_default().push((*token, granted));
        }
        for (job, grants) in &per_job {
            for window in grants.windows(2) {
                let [(low, a), (high, b)] = window else { continue };
                if b.granted_at_ms < a.granted_at_ms {
                    anomalies.push(Anomaly::safety(
                        format!(
                            "job {job}: token {high} was granted at cluster time {} ms, before the lower token {low} at {} ms",
                            b.granted_at_ms, a.granted_at_ms
                        ),
                        vec![a.op, b.op],
                    ));
                }
            }
        }

        // Real-time order across claims.
        let mut completed: Vec<(u64, u64, u64)> = claims.iter().map(|c| (c.1, c.3, c.4)).collect();
        completed.sort_unstable();
        let mut invoked: Vec<(u64, u64, u64)> = claims.iter().map(|c| (c.0, c.2, c.4)).collect();
        invoked.sort_unstable();
        let mut next = 0;
        let mut highest: Option<(u64, u64)> = None;
        for (invoke_ns, min_token, op) in invoked {
            while let Some((done_ns, max_token, done_op)) = completed.get(next).copied() {
                if done_ns >= invoke_ns {
                    break;
                }
                if highest.is_none_or(|(t, _)| max_token > t) {
                    highest = Some((max_token, done_op));
                }
                next += 1;
            }
            if let Some((max_token, earlier)) = highest
                && min_token <= max_token
            {
                anomalies.push(Anomaly::safety(
                    format!(
                        "a claim invoked after another returned token {max_token} was granted the lower or equal token {min_token}"
                    ),
                    vec![earlier, op],
                ));
            }
        }

        // The sink's log.
        let mut accepted_max: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let granted_per_job: BTreeSet<(u64, u64)> =
            by_token.iter().map(|(token, g)| (g.job_id, *token)).collect();
        for write in &run.sink {
            checked += 1;
            if !write.accepted {
                continue;
            }
            if let Some((max, seq)) = accepted_max.get(&write.job_id)
                && write.token < *max
            {
                anomalies.push(Anomaly::safety(
                    format!(
                        "sink accepted token {} for job {} after token {max} (sink writes {seq} and {})",
                        write.token, write.job_id, write.seq
                    ),
                    vec![*seq, write.seq],
                ));
            }
            let entry = accepted_max.entry(write.job_id).or_insert((write.token, write.seq));
            if write.token >= entry.0 {
                *entry = (write.token, write.seq);
            }
            if !granted_per_job.contains(&(write.job_id, write.token)) {
                anomalies.push(Anomaly::safety(
                    format!(
                        "sink accepted token {} for job {} from {}, a token never granted for that job (sink write {})",
                        write.token, write.job_id, write.worker, write.seq
                    ),
                    vec![write.seq],
                ));
            }
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Severity;
    use crate::checkers::test_support::{assert_anomaly, assert_kind};
    use crate::history::test_support::{Builder, lease};
    use crate::sink::SinkWrite;

    fn write(seq: u64, job_id: u64, token: u64, accepted: bool) -> SinkWrite {
        SinkWrite { seq, time_ns: seq, job_id, token, worker: "w".to_string(), accepted }
    }

    fn check(builder: &Builder, sink: Vec<SinkWrite>) -> Verdict {
        Fencing.check(&RunRecord { history: builder.ops.clone(), sink, ..RunRecord::default() })
    }

    #[test]
    fn increasing_tokens_and_a_fenced_sink_pass() {
        let mut b = Builder::default();
        b.claim(
            10,
            20,
            "w1",
            vec![lease(1, 5, "w1", 1_000, 3_000), lease(2, 6, "w1", 1_000, 3_000)],
        )
        .claim(30, 40, "w2", vec![lease(1, 7, "w2", 3_000, 5_000)]);
        let sink = vec![write(0, 1, 5, true), write(1, 1, 7, true), write(2, 1, 5, false)];
        let verdict = check(&b, sink);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 6);
    }

    #[test]
    fn a_reused_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)]).claim(
            30,
            40,
            "w2",
            vec![lease(2, 5, "w2", 3_000, 5_000)],
        );
        let verdict = check(&b, Vec::new());
        assert_anomaly(&verdict, Severity::Safety, "granted twice");
    }

    #[test]
    fn tokens_going_backwards_in_time_are_caught() {
        let mut b = Builder::default();
        // Concurrent claims (no real-time order), but cluster time disagrees
        // with token order on job 1.
        b.op(10, "w1", OpType::Invoke, OpFunction::Claim, Default::default())
            .op(11, "w2", OpType::Invoke, OpFunction::Claim, Default::default())
            .op(
                20,
                "w1",
                OpType::Ok,
                OpFunction::Claim,
                crate::history::OpValue {
                    leases: vec![lease(1, 9, "w1", 1_000, 3_000)],
                    ..Default::default()
                },
            )
            .op(
                21,
                "w2",
                OpType::Ok,
                OpFunction::Claim,
                crate::history::OpValue {
                    leases: vec![lease(1, 10, "w2", 500, 900)],
                    ..Default::default()
                },
            );
        let verdict = check(&b, Vec::new());
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "before the lower token");
    }

    #[test]
    fn a_later_claim_with_a_lower_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 8, "w1", 1_000, 3_000)]).claim(
            30,
            40,
            "w2",
            vec![lease(2, 4, "w2", 3_000, 5_000)],
        );
        let verdict = check(&b, Vec::new());
        assert_anomaly(&verdict, Severity::Safety, "invoked after");
    }

    #[test]
    fn a_sink_accepting_a_lower_token_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)]).claim(
            30,
            40,
            "w2",
            vec![lease(1, 7, "w2", 3_000, 5_000)],
        );
        let sink = vec![write(0, 1, 7, true), write(1, 1, 5, true), write(2, 1, 99, true)];
        let verdict = check(&b, sink);
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "after token 7");
        assert_kind(&verdict.anomalies[1], Severity::Safety, "never granted");
    }
}
