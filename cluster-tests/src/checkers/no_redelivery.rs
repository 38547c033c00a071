//! SPEC §7.2: an acked job is never claimed again, and an ack with a stale
//! token is refused.
//!
//! An ack that returned ok with token `t` means that, when it applied, `t`
//! was the job's current lease and the job became acked. So any grant of
//! that job with a token above `t` is an anomaly, whatever the timing: if
//! the grant came first, the ack used a superseded token and should have
//! been refused; if it came after, an acked job was delivered again. The
//! host times tell which of the two the report names. Two ok acks of one
//! job under different tokens, and an ok ack whose token is not the one on
//! the job's final tombstone, are the same bug seen from other sides.

use std::collections::BTreeMap;

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::history::{OpFunction, OpType, pairs};

/// Checker for no redelivery after ack and refusal of stale acks.
pub struct NoRedelivery;

impl Checker for NoRedelivery {
    fn name(&self) -> &'static str {
        "no_redelivery"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let all = pairs(&run.history);
        // job → [(token, invoke ns, completion ns, completion index)]
        let mut grants: BTreeMap<u64, Vec<(u64, u64, u64, u64)>> = BTreeMap::new();
        let mut acks: BTreeMap<u64, Vec<(u64, u64, u64)>> = BTreeMap::new();
        for pair in &all {
            let Some(done) = pair.completion else { continue };
            if done.kind != OpType::Ok {
                continue;
            }
            match pair.invoke.f {
                OpFunction::Claim => {
                    for lease in &done.value.leases {
                        grants.entry(lease.job_id).or_default().push((
                            lease.token,
                            pair.invoke.time_ns,
                            done.time_ns,
                            done.index,
                        ));
                    }
                }
                OpFunction::Ack => {
                    if let (Some(job), Some(token)) =
                        (pair.invoke.value.job_id, pair.invoke.value.token)
                    {
                        acks.entry(job).or_default().push((token, pair.invoke.time_ns, done.index));
                    }
                }
                _ => {}
            }
        }
        let tombstones: BTreeMap<u64, Option<u64>> = run
            .final_jobs
            .iter()
            .flatten()
            .filter(|job| job.state == "acked")
            .map(|job| (job.id, job.lease_token))
            .collect();

        let mut anomalies = Vec::new();
        let mut checked = 0u64;
        for (job, job_acks) in &acks {
            checked += job_acks.len() as u64;
            let mut tokens: Vec<u64> = job_acks.iter().map(|a| a.0).collect();
            tokens.sort_unstable();
            tokens.dedup();
            if tokens.len() > 1 {
                anomalies.push(Anomaly::safety(
                    format!("job {job} was acked under several tokens {tokens:?}"),
                    job_acks.iter().map(|a| a.2).collect(),
                ));
            }
            for (token, ack_invoke_ns, ack_op) in job_acks {
                for (granted, _, grant_done_ns, grant_op) in grants.get(job).into_iter().flatten() {
                    if granted <= token {
                        continue;
                    }
                    let message = if *grant_done_ns < *ack_invoke_ns {
                        format!(
                            "job {job}: ack with stale token {token} was accepted although token {granted} had been granted before the ack was sent"
                        )
                    } else {
                        format!(
                            "job {job}: delivered again (token {granted}) after it was acked with token {token}"
                        )
                    };
                    anomalies.push(Anomaly::safety(message, vec![*ack_op, *grant_op]));
                }
                if let Some(Some(final_token)) = tombstones.get(job)
                    && final_token != token
                {
                    anomalies.push(Anomaly::safety(
                        format!(
                            "job {job}: ack with token {token} returned ok, but the job's tombstone holds token {final_token}"
                        ),
                        vec![*ack_op],
                    ));
                }
            }
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::test_support::{assert_anomaly, assert_kind};
    use crate::checkers::{FinalJob, Severity};
    use crate::history::test_support::{Builder, lease};

    fn check(builder: &Builder, final_jobs: Option<Vec<FinalJob>>) -> Verdict {
        NoRedelivery.check(&RunRecord {
            history: builder.ops.clone(),
            final_jobs,
            ..RunRecord::default()
        })
    }

    fn acked(id: u64, token: u64) -> FinalJob {
        FinalJob {
            id,
            value: format!("job-{id}"),
            state: "acked".to_string(),
            attempts: 0,
            lease_token: Some(token),
            key: None,
        }
    }

    #[test]
    fn a_refused_stale_ack_and_a_clean_ack_pass() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(30, 40, "w2", vec![lease(1, 6, "w2", 4_000, 6_000)])
            .token_op(50, 60, "w1", OpFunction::Ack, 1, 5, OpType::Fail)
            .token_op(70, 80, "w2", OpFunction::Ack, 1, 6, OpType::Ok)
            // A retried ack with the same token is idempotent.
            .token_op(90, 95, "w2", OpFunction::Ack, 1, 6, OpType::Ok);
        let verdict = check(&b, Some(vec![acked(1, 6)]));
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 2);
    }

    #[test]
    fn an_accepted_stale_ack_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(30, 40, "w2", vec![lease(1, 6, "w2", 4_000, 6_000)])
            .token_op(50, 60, "w1", OpFunction::Ack, 1, 5, OpType::Ok)
            .token_op(70, 80, "w2", OpFunction::Ack, 1, 6, OpType::Ok);
        let verdict = check(&b, Some(vec![acked(1, 6)]));
        assert_anomaly(&verdict, Severity::Safety, "several tokens");
        assert_anomaly(&verdict, Severity::Safety, "stale token 5 was accepted");
        assert_anomaly(&verdict, Severity::Safety, "tombstone holds token 6");
    }

    #[test]
    fn a_grant_after_ack_is_caught() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .token_op(30, 40, "w1", OpFunction::Ack, 1, 5, OpType::Ok)
            .claim(50, 60, "w2", vec![lease(1, 6, "w2", 4_000, 6_000)]);
        let verdict = check(&b, None);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "delivered again");
    }
}
