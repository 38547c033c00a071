//! SPEC §7.3: every enqueued job ends acked or dead, exactly once, after the
//! faults heal.
//!
//! "Enqueued" means an enqueue that returned ok, or whose outcome is unknown
//! (info) and whose value the final read found. For each such value the
//! final read (linearizable ListJobs of the workload queue, after heal and a
//! bounded drain) must hold exactly one job, in state acked or dead.
//! Safety: a job an ok enqueue named is missing; one value became two jobs
//! (idempotency broken); two ok enqueues of one value named different ids; a
//! job nobody enqueued appeared; a poison job (never acked by any worker)
//! ended acked. Liveness: a job is still ready or claimed after the drain,
//! or the final state could not be read.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::history::{OpFunction, OpType, pairs};
use crate::workload::POISON_PREFIX;

/// Checker for none lost.
pub struct NoneLost;

impl Checker for NoneLost {
    fn name(&self) -> &'static str {
        "none_lost"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        // value → ids ok enqueues named (with the op index), and whether
        // any enqueue of it was invoked at all.
        let mut ok_ids: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
        let mut invoked: BTreeSet<&str> = BTreeSet::new();
        for pair in pairs(&run.history) {
            if pair.invoke.f != OpFunction::Enqueue {
                continue;
            }
            let Some(value) = pair.invoke.value.value.as_deref() else { continue };
            invoked.insert(value);
            if let Some(done) = pair.completion
                && done.kind == OpType::Ok
                && let Some(id) = done.value.job_id
            {
                ok_ids.entry(value).or_default().push((id, done.index));
            }
        }
        let Some(final_jobs) = &run.final_jobs else {
            anomalies.push(Anomaly::liveness(
                "the final state could not be read after heal".to_string(),
                Vec::new(),
            ));
            return Verdict {
                checker: self.name().to_string(),
                checked: 0,
                anomalies: cap(anomalies),
            };
        };
        let mut found: BTreeMap<&str, Vec<&crate::checkers::FinalJob>> = BTreeMap::new();
        let mut by_id: BTreeMap<u64, &crate::checkers::FinalJob> = BTreeMap::new();
        for job in final_jobs {
            found.entry(job.value.as_str()).or_default().push(job);
            by_id.insert(job.id, job);
        }

        for (value, named) in &ok_ids {
            let ids: BTreeSet<u64> = named.iter().map(|n| n.0).collect();
            if ids.len() > 1 {
                anomalies.push(Anomaly::safety(
                    format!(
                        "value {value}: enqueues with one idempotency key answered ids {ids:?}"
                    ),
                    named.iter().map(|n| n.1).collect(),
                ));
            }
            for (id, op) in named {
                if !by_id.contains_key(id) {
                    anomalies.push(Anomaly::safety(
                        format!(
                            "job {id} ({value}) was enqueued (ok) but is not in the final state"
                        ),
                        vec![*op],
                    ));
                }
            }
        }
        let mut checked = 0u64;
        for (value, jobs) in &found {
            checked += 1;
            if !invoked.contains(value) {
                anomalies.push(Anomaly::safety(
                    format!(
                        "job {} holds value {value}, which no enqueue of this run sent",
                        jobs.first().map(|j| j.id).unwrap_or_default()
                    ),
                    Vec::new(),
                ));
            }
            if jobs.len() > 1 {
                let ids: Vec<u64> = jobs.iter().map(|j| j.id).collect();
                anomalies.push(Anomaly::safety(
                    format!(
                        "value {value} exists as {} jobs {ids:?} (enqueued more than once)",
                        jobs.len()
                    ),
                    Vec::new(),
                ));
            }
            for job in jobs {
                let poison = value.starts_with(POISON_PREFIX);
                match job.state.as_str() {
                    "acked" if poison => anomalies.push(Anomaly::safety(
                        format!(
                            "poison job {} ({value}) ended acked; no worker ever acks it",
                            job.id
                        ),
                        Vec::new(),
                    )),
                    "acked" | "dead" => {}
                    other => anomalies.push(Anomaly::liveness(
                        format!(
                            "job {} ({value}) is still {other} after heal and drain (attempts {})",
                            job.id, job.attempts
                        ),
                        Vec::new(),
                    )),
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
    use crate::history::test_support::Builder;

    fn job(id: u64, value: &str, state: &str) -> FinalJob {
        FinalJob {
            id,
            value: value.to_string(),
            state: state.to_string(),
            attempts: 1,
            lease_token: None,
            key: None,
        }
    }

    fn check(builder: &Builder, final_jobs: Option<Vec<FinalJob>>) -> Verdict {
        NoneLost.check(&RunRecord {
            history: builder.ops.clone(),
            final_jobs,
            ..RunRecord::default()
        })
    }

    #[test]
    fn every_job_acked_or_dead_passes() {
        let mut b = Builder::default();
        b.enqueue(1, 2, "p", "job-a", false, OpType::Ok, Some(1))
            .enqueue(3, 4, "p", "poison-b", true, OpType::Ok, Some(2))
            // Unknown outcome, never committed: nothing to find.
            .enqueue(5, 6, "p", "job-c", false, OpType::Info, None)
            // Unknown outcome that did commit, then settled by a retry.
            .enqueue(7, 8, "p", "job-d", false, OpType::Info, None)
            .enqueue(9, 10, "p", "job-d", false, OpType::Ok, Some(3));
        let jobs =
            vec![job(1, "job-a", "acked"), job(2, "poison-b", "dead"), job(3, "job-d", "acked")];
        let verdict = check(&b, Some(jobs));
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 3);
    }

    /// A lean tombstone (no payload) is found by its key, which the
    /// workload sets to the value; a payload-less job with no key reports
    /// an empty value, which no enqueue sent.
    #[test]
    fn a_tombstone_without_its_payload_is_found_by_its_key() {
        let value = |payload: &str, state: &str, key: Option<&str>| {
            FinalJob::value_of(payload.as_bytes(), state, key)
        };
        assert_eq!(value("", "acked", Some("job-a")), "job-a");
        assert_eq!(value("job-b", "acked", Some("job-b")), "job-b", "a kept payload wins");
        assert_eq!(value("", "ready", Some("job-c")), "", "only a tombstone drops it");
        let mut b = Builder::default();
        b.enqueue(1, 2, "p", "job-a", false, OpType::Ok, Some(1)).enqueue(
            3,
            4,
            "p",
            "job-b",
            false,
            OpType::Ok,
            Some(2),
        );
        let jobs = vec![
            job(1, &value("", "acked", Some("job-a")), "acked"),
            job(2, &value("", "acked", None), "acked"),
        ];
        let verdict = check(&b, Some(jobs));
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_anomaly(&verdict, Severity::Safety, "no enqueue");
    }

    #[test]
    fn lost_duplicated_stuck_and_phantom_jobs_are_caught() {
        let mut b = Builder::default();
        b.enqueue(1, 2, "p", "job-a", false, OpType::Ok, Some(1))
            .enqueue(3, 4, "p", "job-b", false, OpType::Ok, Some(2))
            .enqueue(5, 6, "p", "job-c", false, OpType::Ok, Some(3))
            .enqueue(7, 8, "p", "poison-d", true, OpType::Ok, Some(4));
        let jobs = vec![
            // job-a (id 1) is missing.
            job(2, "job-b", "acked"),
            job(5, "job-b", "acked"),
            job(3, "job-c", "claimed"),
            job(4, "poison-d", "acked"),
            job(6, "job-zzz", "acked"),
        ];
        let verdict = check(&b, Some(jobs));
        assert_eq!(verdict.anomalies.len(), 5, "{:?}", verdict.anomalies);
        assert_anomaly(&verdict, Severity::Safety, "not in the final state");
        assert_anomaly(&verdict, Severity::Safety, "exists as 2 jobs");
        assert_anomaly(&verdict, Severity::Liveness, "still claimed");
        assert_anomaly(&verdict, Severity::Safety, "poison job 4");
        assert_anomaly(&verdict, Severity::Safety, "no enqueue");
    }

    #[test]
    fn one_key_answering_two_ids_is_a_safety_anomaly() {
        // Two enqueues of one value (one idempotency key) both answered ok,
        // with different ids: the key did not deduplicate.
        let mut b = Builder::default();
        b.enqueue(1, 2, "p", "job-a", false, OpType::Ok, Some(1)).enqueue(
            3,
            4,
            "p",
            "job-a",
            false,
            OpType::Ok,
            Some(2),
        );
        let verdict = check(&b, Some(vec![job(1, "job-a", "acked")]));
        assert_anomaly(&verdict, Severity::Safety, "one idempotency key answered ids {1, 2}");
        assert_anomaly(&verdict, Severity::Safety, "job 2 (job-a) was enqueued (ok)");
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
    }

    #[test]
    fn an_unreadable_final_state_is_a_liveness_anomaly() {
        let b = Builder::default();
        let verdict = check(&b, None);
        assert_eq!(verdict.anomalies.len(), 1);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "could not be read");
    }
}
