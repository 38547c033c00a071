//! The node never acknowledges a write it could not make durable (SPEC §7's
//! "full or failing disk"; issue 7's disk-full mode).
//!
//! During a `disk-full` round one node's data dir (a size-limited tmpfs) is
//! filled with a ballast file until a write fails with ENOSPC; at heal the
//! ballast goes, and the node is restarted if it did not recover by itself.
//! Beside the workload, the round runs a writer of its own (`disk-writer`,
//! an enqueue every 200 ms through every node until heal), so the window
//! has writes even when the workload's share was all enqueued before it or
//! the full node stopped at once (the raft log stops on a failed write).
//! Every write the workload saw acknowledged between the injection and the
//! end of the heal is checked against the final state read after heal:
//! an enqueue answered ok names a job that exists and holds the enqueued
//! value; an ack answered ok left the job acked under that very token.
//! (`none_lost` and `no_redelivery` check the same for the whole run; this
//! checker holds the disk-full windows to it separately, so a run in which
//! no write was acknowledged while a disk was full cannot pass vacuously.)

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checkers::{Anomaly, Checker, FinalJob, RunRecord, Verdict, cap};
use crate::history::{OpFunction, OpType, pairs};

/// Checker for writes acknowledged while a disk was full.
pub struct DurableAcks;

/// Paths the disk-full rounds exercised.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskCounters {
    /// Disk-full rounds in which the ballast reached ENOSPC.
    pub full_rounds: u64,
    /// Writes acknowledged (ok) inside the windows.
    pub ok_writes: u64,
    /// Writes that failed or stayed unknown inside the windows.
    pub refused_writes: u64,
}

/// The windows (host ns) from each disk-full injection to the end of its
/// heal, and whether the disk really filled.
fn windows(run: &RunRecord) -> Vec<(u64, u64, bool)> {
    let all = pairs(&run.history);
    let mut result = Vec::new();
    for pair in &all {
        if pair.invoke.f != OpFunction::Fault
            || pair.invoke.value.fault.as_deref() != Some("disk-full")
        {
            continue;
        }
        let round = pair.invoke.value.round;
        let filled = pair
            .completion
            .is_some_and(|c| c.value.message.as_deref().is_some_and(|m| m.contains("ENOSPC")));
        let healed = all
            .iter()
            .find(|p| {
                p.invoke.f == OpFunction::Heal
                    && p.invoke.value.round == round
                    && p.invoke.time_ns >= pair.invoke.time_ns
            })
            .map(|p| p.completed_ns())
            .unwrap_or(u64::MAX);
        result.push((pair.invoke.time_ns, healed, filled));
    }
    result
}

fn is_write(f: OpFunction) -> bool {
    matches!(f, OpFunction::Enqueue | OpFunction::Ack | OpFunction::Nack | OpFunction::Release)
}

/// Computes the counters (also used by the summary).
pub fn counters(run: &RunRecord) -> DiskCounters {
    let windows = windows(run);
    let mut counters = DiskCounters {
        full_rounds: windows.iter().filter(|w| w.2).count() as u64,
        ..DiskCounters::default()
    };
    for pair in pairs(&run.history) {
        if !is_write(pair.invoke.f) {
            continue;
        }
        let done = pair.completed_ns();
        if !windows.iter().any(|(from, to, _)| pair.invoke.time_ns >= *from && done <= *to) {
            continue;
        }
        match pair.outcome() {
            OpType::Ok => counters.ok_writes += 1,
            _ => counters.refused_writes += 1,
        }
    }
    counters
}

impl Checker for DurableAcks {
    fn name(&self) -> &'static str {
        "durable_acks"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        let windows = windows(run);
        if windows.is_empty() {
            return Verdict { checker: self.name().to_string(), ..Verdict::default() };
        }
        let Some(final_jobs) = &run.final_jobs else {
            anomalies.push(Anomaly::liveness(
                "the final state could not be read after heal".to_string(),
                Vec::new(),
            ));
            return Verdict { checker: self.name().to_string(), checked: 0, anomalies };
        };
        let by_id: BTreeMap<u64, &FinalJob> = final_jobs.iter().map(|j| (j.id, j)).collect();
        let mut checked = 0;
        for pair in pairs(&run.history) {
            if !is_write(pair.invoke.f) || pair.outcome() != OpType::Ok {
                continue;
            }
            let Some(done) = pair.completion else { continue };
            if !windows
                .iter()
                .any(|(from, to, _)| pair.invoke.time_ns >= *from && done.time_ns <= *to)
            {
                continue;
            }
            checked += 1;
            match pair.invoke.f {
                OpFunction::Enqueue => {
                    let (Some(id), Some(value)) = (done.value.job_id, &pair.invoke.value.value)
                    else {
                        continue;
                    };
                    match by_id.get(&id) {
                        Some(job) if &job.value == value => {}
                        Some(job) => anomalies.push(Anomaly::safety(
                            format!(
                                "enqueue of {value} answered job {id} while a disk was full, but job {id} holds {}",
                                job.value
                            ),
                            vec![done.index],
                        )),
                        None => anomalies.push(Anomaly::safety(
                            format!(
                                "enqueue of {value} answered job {id} while a disk was full, and the job is gone after heal"
                            ),
                            vec![done.index],
                        )),
                    }
                }
                OpFunction::Ack => {
                    let (Some(id), Some(token)) =
                        (pair.invoke.value.job_id, pair.invoke.value.token)
                    else {
                        continue;
                    };
                    let job = by_id.get(&id);
                    let ok =
                        job.is_some_and(|j| j.state == "acked" && j.lease_token == Some(token));
                    if !ok {
                        anomalies.push(Anomaly::safety(
                            format!(
                                "ack of job {id} with token {token} answered ok while a disk was full, but after heal the job is {}",
                                job.map(|j| format!("{} (token {:?})", j.state, j.lease_token))
                                    .unwrap_or_else(|| "gone".to_string())
                            ),
                            vec![done.index],
                        ));
                    }
                }
                _ => {}
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
    use crate::history::test_support::Builder;

    fn job(id: u64, value: &str, state: &str, token: Option<u64>) -> FinalJob {
        FinalJob {
            id,
            value: value.into(),
            state: state.into(),
            attempts: 0,
            lease_token: token,
            key: None,
        }
    }

    fn history() -> Builder {
        let mut b = Builder::default();
        let fault =
            OpValue { fault: Some("disk-full".into()), round: Some(2), ..OpValue::default() };
        b.op(100, "nemesis", OpType::Invoke, OpFunction::Fault, fault.clone());
        b.op(
            110,
            "nemesis",
            OpType::Ok,
            OpFunction::Fault,
            OpValue {
                message: Some("ballast 120 MiB; ENOSPC".into()),
                nodes: vec![1],
                ..fault.clone()
            },
        );
        b.enqueue(120, 130, "p0", "job-a", false, OpType::Ok, Some(7))
            .enqueue(121, 131, "p1", "job-b", false, OpType::Info, None)
            .token_op(140, 150, "w0", OpFunction::Ack, 7, 12, OpType::Ok);
        b.op(200, "nemesis", OpType::Invoke, OpFunction::Heal, fault.clone());
        b.op(210, "nemesis", OpType::Ok, OpFunction::Heal, fault);
        // Outside the window: not this checker's business.
        b.enqueue(300, 310, "p0", "job-c", false, OpType::Ok, Some(9));
        b
    }

    #[test]
    fn durable_writes_pass_and_are_counted() {
        let b = history();
        let run = RunRecord {
            history: b.ops.clone(),
            final_jobs: Some(vec![job(7, "job-a", "acked", Some(12))]),
            ..RunRecord::default()
        };
        let verdict = DurableAcks.check(&run);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert_eq!(verdict.checked, 2);
        let c = counters(&run);
        assert_eq!((c.full_rounds, c.ok_writes, c.refused_writes), (1, 2, 1));
    }

    #[test]
    fn an_acknowledged_write_lost_after_heal_is_caught() {
        let b = history();
        let run = RunRecord {
            history: b.ops.clone(),
            // The node acked the enqueue and the ack, but after the restart
            // the ack is gone: the job is ready again under its old token.
            final_jobs: Some(vec![job(7, "job-a", "ready", Some(12))]),
            ..RunRecord::default()
        };
        let verdict = DurableAcks.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "ack of job 7 with token 12");
        let run =
            RunRecord { history: b.ops.clone(), final_jobs: Some(vec![]), ..RunRecord::default() };
        let verdict = DurableAcks.check(&run);
        assert_eq!(verdict.anomalies.len(), 2, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "the job is gone after heal");
    }

    #[test]
    fn a_job_holding_another_value_is_safety_and_an_unreadable_state_liveness() {
        let b = history();
        let run = RunRecord {
            history: b.ops.clone(),
            final_jobs: Some(vec![job(7, "job-x", "acked", Some(12))]),
            ..RunRecord::default()
        };
        let verdict = DurableAcks.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Safety, "but job 7 holds job-x");
        let run = RunRecord { history: b.ops.clone(), final_jobs: None, ..RunRecord::default() };
        let verdict = DurableAcks.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "final state could not be read");
    }
}
