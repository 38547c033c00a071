//! SPEC §7.4: each (schedule, bucket) is fired at most once, and, while a
//! quorum is up, at least once within the catch-up policy.
//!
//! Two sources. The schedules' tick records, read (linearizably) every few
//! seconds and once more after the schedules were paused at the end: each
//! record is a tick fired (with its job ids) or skipped (with a reason and
//! the number of ticks it stands for). And the execution log: every run of
//! a cron job, written by the command itself on the node that ran it, with
//! the bucket, job and fencing token it ran under.
//!
//! Safety: a tick covered by more than one record (fired twice, or fired
//! and skipped) — the journal's `bucket > last_fired_bucket` guard is what
//! forbids it; one bucket run as more than one job; a run of a job other
//! than the one its bucket fired, or of a bucket recorded as skipped; one
//! lease (token) running twice; a job acked although no run of it
//! finished; an overlap skip on a schedule whose overlap is `allow`.
//! Liveness (a quorum lived throughout in safety+liveness mode): a tick
//! inside the span one read returned that no record covers; a fired job
//! not acked after heal; ticks skipped by catch-up on a `catchup = all`
//! schedule (that policy skips only past `catchup_max` missed ticks — the
//! harness sets 120, two minutes of ticks, which a cluster with a quorum
//! never misses, even under link faults).
//!
//! Runs on the bus path (a pool whose gate chose the broadcast path) carry
//! no job and are left to `journal_once`; their ticks are recorded as
//! skipped (reason `bus`) when the pool returns to the journal.
//!
//! Runs of one job under several tokens are redeliveries (a lapsed or
//! released lease), counted, not failed: execution is at least once, and
//! the token lets a downstream store fence the stale run.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::checkers::{Anomaly, Checker, RunRecord, Verdict, cap};
use crate::execlog::RunPhase;
use crate::history::{OpFunction, OpType, TickRecord, pairs};
use crate::plan::CronSchedulePlan;

/// Checker for cron ticks.
pub struct CronOnce;

/// Paths the cron workload exercised.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronCounters {
    /// Ticks fired.
    pub fires: u64,
    /// Ticks skipped by the catch-up policy.
    pub ticks_coalesced: u64,
    /// Ticks skipped because the previous run was unfinished.
    pub overlap_skips: u64,
    /// Runs that finished (end lines).
    pub runs_finished: u64,
    /// Jobs that ran under more than one token.
    pub reruns: u64,
    /// Runs that started and never finished (killed, cut off by a drain).
    pub runs_cut_off: u64,
    /// Ticks that skip records counted although an earlier record covered
    /// them (a new leader planning before it applied its predecessor's
    /// last fire).
    #[serde(default)]
    pub skips_overstated: u64,
}

/// One tick record as merged across reads, with the reads that showed it.
struct Seen {
    record: TickRecord,
    copies: usize,
    evidence: u64,
}

/// What the reads of one schedule showed.
#[derive(Default)]
struct Reads {
    /// Every distinct record, with the most copies any single read showed.
    records: Vec<Seen>,
    /// The bucket span of every read: (first, last, history index).
    spans: Vec<(u64, u64, u64)>,
    /// Records a read listed after a record of the same or a later bucket:
    /// (earlier bucket, later-listed bucket, history index).
    out_of_order: Vec<(u64, u64, u64)>,
}

fn merged_ticks(run: &RunRecord) -> BTreeMap<String, Reads> {
    let mut result: BTreeMap<String, Reads> = BTreeMap::new();
    for pair in pairs(&run.history) {
        if pair.invoke.f != OpFunction::ScheduleRead {
            continue;
        }
        let Some(done) = pair.completion.filter(|c| c.kind == OpType::Ok) else { continue };
        let Some(name) = done.value.schedule.clone() else { continue };
        let entry = result.entry(name).or_default();
        let mut counts: BTreeMap<&TickRecord, usize> = BTreeMap::new();
        for record in &done.value.ticks {
            *counts.entry(record).or_insert(0) += 1;
        }
        for (record, copies) in counts {
            match entry.records.iter_mut().find(|s| &s.record == record) {
                Some(seen) => seen.copies = seen.copies.max(copies),
                None => entry.records.push(Seen {
                    record: record.clone(),
                    copies,
                    evidence: done.index,
                }),
            }
        }
        for window in done.value.ticks.windows(2) {
            if window[1].bucket <= window[0].bucket {
                let found = (window[0].bucket, window[1].bucket, done.index);
                if !entry.out_of_order.iter().any(|o| (o.0, o.1) == (found.0, found.1)) {
                    entry.out_of_order.push(found);
                }
            }
        }
        let buckets = done.value.ticks.iter().map(|r| r.bucket);
        if let (Some(first), Some(last)) = (buckets.clone().min(), buckets.max()) {
            entry.spans.push((first, last, done.index));
        }
    }
    for reads in result.values_mut() {
        reads.records.sort_by(|a, b| a.record.cmp(&b.record));
    }
    result
}

/// The ticks a skip record stands for: its `ticks` ticks ending at its
/// bucket, but none at or before the bucket of the record before it. A
/// proposer plans a skip from its own view of the last fired tick; a new
/// leader that has not yet applied its predecessor's last fire counts that
/// fire's tick too. The journal's guard keeps the skip from undoing the
/// fire, so such a record only overstates its count (counted, not failed).
fn skip_covers(record: &TickRecord, previous: Option<u64>, period: u64) -> (Vec<u64>, u64) {
    let period = period.max(1);
    let nominal: Vec<u64> =
        (0..record.ticks.max(1)).map(|i| record.bucket.saturating_sub(i * period)).collect();
    let kept: Vec<u64> =
        nominal.iter().copied().filter(|b| previous.is_none_or(|p| *b > p)).collect();
    let overstated = (nominal.len() - kept.len()) as u64;
    (kept, overstated)
}

fn plan_of<'a>(run: &'a RunRecord, name: &str) -> Option<&'a CronSchedulePlan> {
    run.cron.iter().find(|s| s.name == name)
}

/// Per schedule: bucket → the records covering it (record, history index);
/// and how many ticks skip records overstated.
type Coverage<'a> = BTreeMap<u64, Vec<(&'a TickRecord, u64)>>;

fn coverage<'a>(reads: &'a Reads, period: u64) -> (Coverage<'a>, u64) {
    let mut covered: Coverage<'a> = BTreeMap::new();
    let mut overstated = 0;
    let mut previous: Option<u64> = None;
    for seen in &reads.records {
        let buckets = if seen.record.outcome == "skipped" {
            let (kept, over) = skip_covers(&seen.record, previous, period);
            overstated += over;
            kept
        } else {
            vec![seen.record.bucket]
        };
        for bucket in buckets {
            for _ in 0..seen.copies {
                covered.entry(bucket).or_default().push((&seen.record, seen.evidence));
            }
        }
        previous = Some(previous.map_or(seen.record.bucket, |p| p.max(seen.record.bucket)));
    }
    (covered, overstated)
}

/// Computes the counters (also used by the summary).
pub fn counters(run: &RunRecord) -> CronCounters {
    let mut counters = CronCounters::default();
    for (name, reads) in merged_ticks(run) {
        let period = plan_of(run, &name).map(|p| p.period_s).unwrap_or(1);
        counters.skips_overstated += coverage(&reads, period).1;
        for seen in &reads.records {
            match (seen.record.outcome.as_str(), seen.record.reason.as_str()) {
                ("fired", _) => counters.fires += 1,
                ("skipped", "catchup") => counters.ticks_coalesced += seen.record.ticks.max(1),
                ("skipped", "overlap") => counters.overlap_skips += 1,
                _ => {}
            }
        }
    }
    let mut tokens: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut started: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut ended: BTreeSet<(u64, u64)> = BTreeSet::new();
    for event in &run.runs {
        match event.phase {
            RunPhase::Start => {
                tokens.entry(event.job_id).or_default().insert(event.token);
                started.insert((event.job_id, event.token));
            }
            RunPhase::End => {
                counters.runs_finished += 1;
                ended.insert((event.job_id, event.token));
            }
        }
    }
    counters.reruns = tokens.values().filter(|t| t.len() > 1).count() as u64;
    counters.runs_cut_off = started.difference(&ended).count() as u64;
    counters
}

impl Checker for CronOnce {
    fn name(&self) -> &'static str {
        "cron_once"
    }

    fn check(&self, run: &RunRecord) -> Verdict {
        let mut anomalies = Vec::new();
        let mut checked = 0u64;
        // (schedule, bucket) → (fired job ids, skipped?, evidence)
        let mut fired: BTreeMap<(String, u64), BTreeSet<u64>> = BTreeMap::new();
        let mut skipped: BTreeSet<(String, u64)> = BTreeSet::new();
        for (name, reads) in merged_ticks(run) {
            let period = plan_of(run, &name).map(|p| p.period_s).unwrap_or(1).max(1);
            let allow_overlap = plan_of(run, &name).is_some_and(|p| p.overlap == "allow");
            let catchup_all = plan_of(run, &name).is_some_and(|p| p.catchup == "all");
            for (earlier, later, index) in &reads.out_of_order {
                anomalies.push(Anomaly::safety(
                    format!(
                        "schedule {name}: tick {later} was recorded after tick {earlier} (the journal accepted a tick at or below the last fired one)"
                    ),
                    vec![*index],
                ));
            }
            let (coverage, _) = coverage(&reads, period);
            for seen in &reads.records {
                if seen.record.outcome == "skipped" {
                    if seen.record.reason == "overlap" && allow_overlap {
                        anomalies.push(Anomaly::safety(
                            format!(
                                "schedule {name} bucket {}: skipped for overlap although its overlap policy is allow",
                                seen.record.bucket
                            ),
                            vec![seen.evidence],
                        ));
                    }
                    if seen.record.reason == "catchup" && catchup_all {
                        anomalies.push(Anomaly::liveness(
                            format!(
                                "schedule {name} (catch-up all): {} ticks up to bucket {} skipped by catch-up, which means more than catchup_max ticks were missed while a quorum lived",
                                seen.record.ticks.max(1),
                                seen.record.bucket
                            ),
                            vec![seen.evidence],
                        ));
                    }
                }
            }
            for (bucket, records) in &coverage {
                checked += 1;
                if records.len() > 1 {
                    let shown: Vec<String> = records
                        .iter()
                        .map(|(r, _)| match r.outcome.as_str() {
                            "fired" => format!("fired {:?}", r.job_ids),
                            _ => format!("skipped ({}) at {}", r.reason, r.bucket),
                        })
                        .collect();
                    anomalies.push(Anomaly::safety(
                        format!(
                            "schedule {name} bucket {bucket} is covered by {} tick records: {}",
                            records.len(),
                            shown.join(", ")
                        ),
                        records.iter().map(|(_, e)| *e).collect(),
                    ));
                }
                for (record, _) in records {
                    if record.outcome == "fired" && record.bucket == *bucket {
                        fired
                            .entry((name.clone(), *bucket))
                            .or_default()
                            .extend(record.job_ids.iter().copied());
                    } else {
                        skipped.insert((name.clone(), *bucket));
                    }
                }
            }
            // A gap inside the span of one read is a tick nobody fired or skipped.
            let mut gaps = BTreeSet::new();
            for (first, last, _) in &reads.spans {
                let mut tick = first.div_ceil(period) * period;
                while tick <= *last {
                    if !coverage.contains_key(&tick) {
                        gaps.insert(tick);
                    }
                    tick += period;
                }
            }
            if !gaps.is_empty() {
                let evidence = reads.spans.iter().map(|s| s.2).take(5).collect();
                anomalies.push(Anomaly::liveness(
                    format!(
                        "schedule {name}: {} ticks neither fired nor skipped (first {:?})",
                        gaps.len(),
                        gaps.iter().take(5).collect::<Vec<_>>()
                    ),
                    evidence,
                ));
            }
        }

        // Runs, per (schedule, bucket).
        // Journal-path runs only: a tick run on the bus path has no job
        // (journal_once holds the paths apart).
        let mut runs: BTreeMap<(String, u64), Vec<&crate::execlog::ExecEvent>> = BTreeMap::new();
        for event in run.runs.iter().filter(|e| e.path != "bus") {
            runs.entry((event.schedule.clone(), event.bucket)).or_default().push(event);
        }
        let mut finished_jobs: BTreeSet<u64> = BTreeSet::new();
        for ((name, bucket), events) in &runs {
            checked += 1;
            let jobs: BTreeSet<u64> = events.iter().map(|e| e.job_id).collect();
            if jobs.len() > 1 {
                anomalies.push(Anomaly::safety(
                    format!("schedule {name} bucket {bucket} ran as {} jobs {jobs:?}", jobs.len()),
                    Vec::new(),
                ));
            }
            let key = (name.clone(), *bucket);
            if let Some(fired_ids) = fired.get(&key) {
                let foreign: Vec<u64> = jobs.difference(fired_ids).copied().collect();
                if !foreign.is_empty() {
                    anomalies.push(Anomaly::safety(
                        format!(
                            "schedule {name} bucket {bucket} fired job(s) {fired_ids:?} but job(s) {foreign:?} ran for it"
                        ),
                        Vec::new(),
                    ));
                }
            } else if skipped.contains(&key) {
                anomalies.push(Anomaly::safety(
                    format!(
                        "schedule {name} bucket {bucket} was recorded as skipped, yet job(s) {jobs:?} ran for it"
                    ),
                    Vec::new(),
                ));
            }
            let mut starts: BTreeMap<u64, usize> = BTreeMap::new();
            for event in events {
                match event.phase {
                    RunPhase::Start => *starts.entry(event.token).or_insert(0) += 1,
                    RunPhase::End => {
                        finished_jobs.insert(event.job_id);
                    }
                }
            }
            for (token, count) in starts.iter().filter(|(_, c)| **c > 1) {
                anomalies.push(Anomaly::safety(
                    format!(
                        "schedule {name} bucket {bucket}: the lease with token {token} started {count} runs"
                    ),
                    Vec::new(),
                ));
            }
        }

        // Every fired job ends acked, and only after some run finished.
        if let Some(final_jobs) = &run.final_exec_jobs {
            let by_id: BTreeMap<u64, &crate::checkers::FinalJob> =
                final_jobs.iter().map(|j| (j.id, j)).collect();
            for job in final_jobs {
                let key = job.key.as_deref().unwrap_or("");
                let ours = run.cron.iter().any(|s| key.starts_with(&format!("cron:{}:", s.name)));
                if ours && job.state == "acked" && !finished_jobs.contains(&job.id) {
                    anomalies.push(Anomaly::safety(
                        format!("job {} ({key}) was acked, but no run of it finished", job.id),
                        Vec::new(),
                    ));
                }
            }
            for ((name, bucket), ids) in &fired {
                for id in ids {
                    match by_id.get(id) {
                        Some(job) if job.state == "acked" => {}
                        Some(job) => anomalies.push(Anomaly::liveness(
                            format!(
                                "schedule {name} bucket {bucket}: job {id} is {} after heal",
                                job.state
                            ),
                            Vec::new(),
                        )),
                        None => anomalies.push(Anomaly::liveness(
                            format!(
                                "schedule {name} bucket {bucket}: fired job {id} is not in the final state"
                            ),
                            Vec::new(),
                        )),
                    }
                }
            }
        } else if !run.cron.is_empty() {
            anomalies.push(Anomaly::liveness(
                "the command queue could not be read after heal".to_string(),
                Vec::new(),
            ));
        }
        Verdict { checker: self.name().to_string(), checked, anomalies: cap(anomalies) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::test_support::{assert_anomaly, assert_kind};
    use crate::checkers::{FinalJob, Severity};
    use crate::execlog::test_support::event;
    use crate::history::OpValue;
    use crate::history::test_support::Builder;

    fn fired(bucket: u64, job: u64) -> TickRecord {
        TickRecord { bucket, outcome: "fired".into(), job_ids: vec![job], ..TickRecord::default() }
    }

    fn skipped(bucket: u64, reason: &str, ticks: u64) -> TickRecord {
        TickRecord {
            bucket,
            outcome: "skipped".into(),
            reason: reason.into(),
            ticks,
            ..TickRecord::default()
        }
    }

    fn read(b: &mut Builder, time: u64, name: &str, ticks: Vec<TickRecord>) {
        let value = OpValue { schedule: Some(name.into()), ..OpValue::default() };
        b.op(time, "cron", OpType::Invoke, OpFunction::ScheduleRead, value.clone());
        b.op(time + 1, "cron", OpType::Ok, OpFunction::ScheduleRead, OpValue { ticks, ..value });
    }

    fn plan(name: &str, catchup: &str, overlap: &str) -> CronSchedulePlan {
        CronSchedulePlan {
            name: name.into(),
            period_s: 1,
            catchup: catchup.into(),
            overlap: overlap.into(),
            run_ms: 100,
            lease_ttl_ms: 3_000,
        }
    }

    fn acked(id: u64, bucket: u64) -> FinalJob {
        FinalJob {
            id,
            value: String::new(),
            state: "acked".into(),
            attempts: 0,
            lease_token: None,
            key: Some(format!("cron:t:{bucket}")),
        }
    }

    /// Buckets 100..=104 of schedule "t": 100, 101 fired; 102 and 103
    /// coalesced into one catch-up skip; 104 fired. Job 4 (bucket 104) ran
    /// twice, under tokens 7 and 9 (a redelivery).
    fn clean() -> RunRecord {
        let mut b = Builder::default();
        read(&mut b, 10, "t", vec![fired(100, 1), fired(101, 2)]);
        read(
            &mut b,
            20,
            "t",
            vec![fired(100, 1), fired(101, 2), skipped(103, "catchup", 2), fired(104, 4)],
        );
        let runs = vec![
            event(RunPhase::Start, 1, "t", 100, 1, 3, 1),
            event(RunPhase::End, 2, "t", 100, 1, 3, 1),
            event(RunPhase::Start, 3, "t", 101, 2, 5, 2),
            event(RunPhase::End, 4, "t", 101, 2, 5, 2),
            event(RunPhase::Start, 5, "t", 104, 3, 7, 4),
            event(RunPhase::Start, 6, "t", 104, 1, 9, 4),
            event(RunPhase::End, 7, "t", 104, 1, 9, 4),
        ];
        RunRecord {
            history: b.ops.clone(),
            runs,
            final_exec_jobs: Some(vec![acked(1, 100), acked(2, 101), acked(4, 104)]),
            cron: vec![plan("t", "coalesce", "allow")],
            ..RunRecord::default()
        }
    }

    #[test]
    fn a_clean_run_passes_and_counts_its_paths() {
        let run = clean();
        let verdict = CronOnce.check(&run);
        assert!(verdict.anomalies.is_empty(), "{:?}", verdict.anomalies);
        assert!(verdict.checked > 0);
        let c = counters(&run);
        assert_eq!((c.fires, c.ticks_coalesced, c.reruns, c.runs_cut_off), (3, 2, 1, 1));
    }

    #[test]
    fn a_bucket_fired_twice_is_caught() {
        let mut run = clean();
        let mut b = Builder { ops: run.history.clone() };
        // The journal's bucket guard is gone: bucket 101 fired again.
        read(
            &mut b,
            30,
            "t",
            vec![
                fired(100, 1),
                fired(101, 2),
                fired(101, 2),
                skipped(103, "catchup", 2),
                fired(104, 4),
            ],
        );
        run.history = b.ops.clone();
        let verdict = CronOnce.check(&run);
        assert!(
            verdict.anomalies.iter().any(|a| a.severity == Severity::Safety
                && a.message.contains("bucket 101 is covered by 2")),
            "{:?}",
            verdict.anomalies
        );
    }

    #[test]
    fn a_skip_planned_before_the_last_fire_was_applied_only_overstates() {
        // A new leader planned from a state without the fire of 104 and
        // skipped 104..=106; the journal took the skip (106 > 104), so 104
        // ran once and the skip's count is one too high.
        let mut run = clean();
        let mut b = Builder { ops: run.history.clone() };
        read(&mut b, 30, "t", vec![fired(104, 4), skipped(106, "catchup", 3), fired(107, 8)]);
        run.history = b.ops.clone();
        run.final_exec_jobs = None;
        let verdict = CronOnce.check(&run);
        assert!(
            verdict.anomalies.iter().all(|a| a.severity == Severity::Liveness),
            "{:?}",
            verdict.anomalies
        );
        assert_eq!(counters(&run).skips_overstated, 1);
        // A skip recorded after a later fire is the guard failing.
        let mut b = Builder { ops: run.history.clone() };
        read(&mut b, 40, "t", vec![fired(107, 8), skipped(106, "catchup", 1)]);
        run.history = b.ops.clone();
        let verdict = CronOnce.check(&run);
        assert!(verdict.anomalies.iter().any(|a| a.severity == Severity::Safety
            && a.message.contains("tick 106 was recorded after tick 107")));
    }

    #[test]
    fn a_bucket_run_as_two_jobs_or_a_skipped_bucket_run_is_caught() {
        let mut run = clean();
        run.runs.push(event(RunPhase::Start, 8, "t", 101, 3, 11, 6));
        run.runs.push(event(RunPhase::Start, 9, "t", 102, 3, 12, 7));
        let verdict = CronOnce.check(&run);
        assert_anomaly(&verdict, Severity::Safety, "bucket 101 ran as 2 jobs");
        assert_anomaly(&verdict, Severity::Safety, "bucket 102 was recorded as skipped");
    }

    #[test]
    fn one_lease_run_twice_is_caught() {
        let mut run = clean();
        run.runs.push(event(RunPhase::Start, 8, "t", 100, 2, 3, 1));
        let verdict = CronOnce.check(&run);
        assert_anomaly(&verdict, Severity::Safety, "token 3 started 2 runs");
    }

    #[test]
    fn gaps_unfinished_jobs_and_lossy_catch_up_are_liveness() {
        let mut run = clean();
        let mut b = Builder { ops: run.history.clone() };
        read(&mut b, 30, "t", vec![fired(104, 4), fired(106, 5)]);
        run.history = b.ops.clone();
        run.final_exec_jobs = Some(vec![acked(1, 100), acked(2, 101), acked(4, 104)]);
        run.cron = vec![plan("t", "all", "allow")];
        let verdict = CronOnce.check(&run);
        let live: Vec<&str> = verdict
            .anomalies
            .iter()
            .filter(|a| a.severity == Severity::Liveness)
            .map(|a| a.message.as_str())
            .collect();
        assert!(
            live.iter().any(|m| m.contains("neither fired nor skipped (first [105])")),
            "{live:?}"
        );
        assert!(
            live.iter().any(|m| m.contains("fired job 5 is not in the final state")),
            "{live:?}"
        );
        assert!(live.iter().any(|m| m.contains("catch-up all")), "{live:?}");
        assert!(verdict.anomalies.iter().all(|a| a.severity == Severity::Liveness));
    }

    #[test]
    fn an_ack_without_a_finished_run_and_a_wrong_overlap_skip_are_caught() {
        let mut run = clean();
        let mut b = Builder { ops: run.history.clone() };
        read(&mut b, 30, "t", vec![fired(104, 4), skipped(105, "overlap", 1)]);
        run.history = b.ops.clone();
        run.runs.retain(|e| !(e.job_id == 2 && e.phase == RunPhase::End));
        let verdict = CronOnce.check(&run);
        assert_anomaly(&verdict, Severity::Safety, "job 2 (cron:t:101) was acked, but no run");
        assert_anomaly(&verdict, Severity::Safety, "overlap policy is allow");
    }

    #[test]
    fn a_foreign_job_for_a_fired_bucket_is_safety_and_a_stuck_one_liveness() {
        // Bucket 100 fired job 1, yet job 6 ran for it: a second job for one
        // bucket (safety). Job 2 of bucket 101 is still claimed after heal:
        // it may yet finish (liveness).
        let mut run = clean();
        run.runs.push(event(RunPhase::Start, 8, "t", 100, 3, 11, 6));
        run.final_exec_jobs = Some(vec![
            acked(1, 100),
            FinalJob { state: "claimed".into(), ..acked(2, 101) },
            acked(4, 104),
        ]);
        let verdict = CronOnce.check(&run);
        assert_anomaly(&verdict, Severity::Safety, "fired job(s) {1} but job(s) [6] ran for it");
        assert_anomaly(&verdict, Severity::Liveness, "bucket 101: job 2 is claimed after heal");
    }

    #[test]
    fn an_unreadable_command_queue_is_liveness() {
        let mut run = clean();
        run.final_exec_jobs = None;
        let verdict = CronOnce.check(&run);
        assert_eq!(verdict.anomalies.len(), 1, "{:?}", verdict.anomalies);
        assert_kind(&verdict.anomalies[0], Severity::Liveness, "command queue could not be read");
    }
}
