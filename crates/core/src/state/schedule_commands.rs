//! Schedule and node commands of [`State::apply`]: put, delete, pause,
//! fire, skip, trigger, node registration and draining marks.
//!
//! The one rule that makes a double fire impossible lives in [`State::fire`]
//! and [`State::skip`]: a bucket at or below `last_fired_bucket` changes
//! nothing, whatever a ticker proposes and however often.

use super::State;
use crate::command::Command;
use crate::job::{JobSpec, JobState};
use crate::limits::Limits;
use crate::node_info::NodeInfo;
use crate::response::{Refusal, Response};
use crate::schedule::{
    LATE_AFTER_MS, NODE_TAG_PREFIX, Overlap, Schedule, ScheduleSpec, SkipReason, Target,
    TickOutcome, TickRecord,
};

/// Whose unfinished instances a `target = each` tick keeps watching for
/// the overlap policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Watch {
    /// Only the targeted members' (`FireEach`, log formats 2 and 3): a
    /// member not targeted at a tick has its instance forgotten.
    Targets,
    /// The targeted members' and those away (`offline`: down or draining;
    /// `FireEachTracked`, format 4): a member away at a tick still has its
    /// instance watched.
    Away,
}

impl State {
    /// Every schedule by name.
    pub fn schedules(&self) -> &std::collections::BTreeMap<String, Schedule> {
        &self.schedules
    }

    /// One schedule.
    pub fn schedule(&self, name: &str) -> Option<&Schedule> {
        self.schedules.get(name)
    }

    /// Registered nodes by id.
    pub fn nodes(&self) -> &std::collections::BTreeMap<u64, NodeInfo> {
        &self.nodes
    }

    /// Whether any of `job_ids` is still ready or claimed (an unfinished
    /// instance, for the overlap policy). Acked, dead and purged jobs are
    /// finished.
    pub fn any_unfinished(&self, job_ids: &[u64]) -> bool {
        job_ids.iter().any(|id| {
            self.jobs
                .get(id)
                .is_some_and(|job| matches!(job.state, JobState::Ready | JobState::Claimed))
        })
    }

    /// Creates a schedule, or replaces an existing one's spec. With
    /// `retime` (`PutScheduleRetimed`), a changed cron expression or
    /// timezone plans the schedule from now: ticks of the new timing from
    /// before the put are neither fired nor counted as missed.
    pub(super) fn put_schedule(&mut self, spec: &ScheduleSpec, retime: bool) -> Response {
        let now_ms = self.cluster_time_ms;
        match self.schedules.get_mut(&spec.name) {
            Some(existing) => {
                let timing_changed =
                    existing.spec.cron != spec.cron || existing.spec.timezone != spec.timezone;
                if retime && timing_changed {
                    existing.created_at_ms = now_ms;
                }
                existing.spec = spec.clone();
            }
            None => {
                self.schedules.insert(spec.name.clone(), Schedule::new(spec.clone(), now_ms));
            }
        }
        Response::ScheduleChanged
    }

    pub(super) fn delete_schedule(&mut self, name: &str) -> Response {
        match self.schedules.remove(name) {
            Some(_) => Response::ScheduleChanged,
            None => not_found(name),
        }
    }

    pub(super) fn set_paused(&mut self, name: &str, paused: bool) -> Response {
        match self.schedules.get_mut(name) {
            Some(schedule) => {
                schedule.spec.paused = paused;
                Response::ScheduleChanged
            }
            None => not_found(name),
        }
    }

    /// Resumes `name`, recording first, while it is still paused, the
    /// ticks due meanwhile that left no record (see
    /// [`Command::ResumeSchedule`](crate::command::Command::ResumeSchedule)).
    pub(super) fn resume_schedule(
        &mut self,
        name: &str,
        counted_after_ms: u64,
        paused_through: u64,
        paused_ticks: u64,
    ) -> Response {
        let now_ms = self.cluster_time_ms;
        let Some(schedule) = self.schedules.get_mut(name) else {
            return not_found(name);
        };
        let through_ms = crate::cron::tick_ms(paused_through);
        if schedule.spec.paused
            && schedule.planned_after_ms() == counted_after_ms
            && through_ms > counted_after_ms
            && through_ms <= now_ms
        {
            let outcome =
                TickOutcome::Skipped { reason: SkipReason::Paused, ticks: paused_ticks.max(1) };
            schedule.last_fired_bucket = paused_through;
            schedule.record(TickRecord { bucket: paused_through, outcome, late: false });
        }
        schedule.spec.paused = false;
        Response::ScheduleChanged
    }

    /// Whether `tick` was planned from another schedule than the one of
    /// its name now: one put at another instant than `created_at_ms` (put
    /// anew after a delete, or retimed) since. A tick of a schedule that
    /// is gone is left to the tick itself to refuse.
    pub(super) fn planned_from_another(&self, created_at_ms: u64, tick: &Command) -> bool {
        tick.tick_schedule()
            .and_then(|name| self.schedules.get(name))
            .is_some_and(|schedule| schedule.created_at_ms != created_at_ms)
    }

    pub(super) fn fire(
        &mut self,
        name: &str,
        bucket: u64,
        targets: &[u64],
        limits: &Limits,
    ) -> Response {
        let Some(schedule) = self.schedules.get(name) else {
            return not_found(name);
        };
        if bucket <= schedule.last_fired_bucket {
            return Response::Tick(None);
        }
        let lag_ms = self.cluster_time_ms.saturating_sub(bucket.saturating_mul(1_000));
        let late = lag_ms >= LATE_AFTER_MS;
        // A deposed or restarted leader may still propose a tick planned from
        // stale state: the journal's own view of `paused` decides.
        let refusal = if schedule.spec.paused {
            Some(SkipReason::Paused)
        } else if schedule.spec.overlap == Overlap::Skip
            && self.any_unfinished(&schedule.last_job_ids)
        {
            Some(SkipReason::Overlap)
        } else if schedule.spec.target == Target::Each && targets.is_empty() {
            Some(SkipReason::NoTarget)
        } else {
            None
        };
        let outcome = match refusal {
            Some(reason) => TickOutcome::Skipped { reason, ticks: 1 },
            None => {
                let specs = tick_jobs(schedule, bucket, targets, None);
                match self.enqueue(&specs, limits) {
                    Response::Enqueued(outcomes) => TickOutcome::Fired {
                        job_ids: outcomes.iter().map(|o| o.job_id).collect(),
                        lag_ms,
                    },
                    other => return other,
                }
            }
        };
        let Some(schedule) = self.schedules.get_mut(name) else {
            return not_found(name);
        };
        if let TickOutcome::Fired { job_ids, .. } = &outcome {
            schedule.last_job_ids = job_ids.clone();
        }
        schedule.last_fired_bucket = bucket;
        schedule.record(TickRecord { bucket, outcome: outcome.clone(), late });
        Response::Tick(Some(outcome))
    }

    /// A `target = each` tick judged per member (see
    /// [`Command::FireEach`](crate::command::Command::FireEach)).
    pub(super) fn fire_each(
        &mut self,
        name: &str,
        bucket: u64,
        targets: &[u64],
        offline: &[u64],
        watch: Watch,
        limits: &Limits,
    ) -> Response {
        let Some(schedule) = self.schedules.get(name) else {
            return not_found(name);
        };
        if schedule.spec.target != Target::Each {
            return self.fire(name, bucket, targets, limits);
        }
        if bucket <= schedule.last_fired_bucket {
            return Response::Tick(None);
        }
        let lag_ms = self.cluster_time_ms.saturating_sub(bucket.saturating_mul(1_000));
        let late = lag_ms >= LATE_AFTER_MS;
        if schedule.spec.paused {
            return self.record_tick(
                name,
                bucket,
                late,
                TickOutcome::Skipped { reason: SkipReason::Paused, ticks: 1 },
            );
        }
        // Per member: a member whose last instance is unfinished is
        // skipped alone (overlap = skip), and keeps that instance counted.
        let mut run = Vec::new();
        let mut still_running = Vec::new();
        for node in targets {
            let tag = format!("{NODE_TAG_PREFIX}{node}");
            let unfinished: Vec<u64> = schedule
                .last_job_ids
                .iter()
                .copied()
                .filter(|id| {
                    self.jobs.live(id).is_some_and(|job| {
                        job.tags().contains(&tag)
                            && matches!(job.state, JobState::Ready | JobState::Claimed)
                    })
                })
                .collect();
            if schedule.spec.overlap == Overlap::Skip && !unfinished.is_empty() {
                still_running.extend(unfinished);
            } else {
                run.push(*node);
            }
        }
        if watch == Watch::Away && schedule.spec.overlap == Overlap::Skip {
            // The members away now (`offline`: down, or draining) keep
            // their unfinished instance watched: forgotten, it would not
            // stop the member's next tick once it is back. A member no
            // longer in the cluster or no longer matching is in neither
            // list, and its instance is let go as before.
            let away: Vec<String> =
                offline.iter().map(|node| format!("{NODE_TAG_PREFIX}{node}")).collect();
            let targeted: Vec<String> =
                targets.iter().map(|node| format!("{NODE_TAG_PREFIX}{node}")).collect();
            still_running.extend(schedule.last_job_ids.iter().copied().filter(|id| {
                self.jobs.live(id).is_some_and(|job| {
                    matches!(job.state, JobState::Ready | JobState::Claimed)
                        && job.tags().iter().any(|tag| away.contains(tag))
                        && !job.tags().iter().any(|tag| targeted.contains(tag))
                })
            }));
        }
        let overlapped = targets.len() - run.len();
        let mut records = Vec::new();
        let mut job_ids = Vec::new();
        if !run.is_empty() {
            let specs = tick_jobs(schedule, bucket, &run, None);
            match self.enqueue(&specs, limits) {
                Response::Enqueued(outcomes) => {
                    job_ids = outcomes.iter().map(|o| o.job_id).collect();
                    records.push(TickOutcome::Fired { job_ids: job_ids.clone(), lag_ms });
                }
                other => return other,
            }
        }
        if overlapped > 0 {
            records.push(TickOutcome::Skipped {
                reason: SkipReason::Overlap,
                ticks: u64::try_from(overlapped).unwrap_or(u64::MAX),
            });
        }
        if !offline.is_empty() {
            records.push(TickOutcome::Skipped {
                reason: SkipReason::TargetOffline,
                ticks: u64::try_from(offline.len()).unwrap_or(u64::MAX),
            });
        }
        if records.is_empty() {
            records.push(TickOutcome::Skipped { reason: SkipReason::NoTarget, ticks: 1 });
        }
        let Some(schedule) = self.schedules.get_mut(name) else {
            return not_found(name);
        };
        if !job_ids.is_empty() || !still_running.is_empty() {
            schedule.last_job_ids = job_ids.into_iter().chain(still_running).collect();
        }
        schedule.last_fired_bucket = bucket;
        let answer = records[0].clone();
        for outcome in records {
            schedule.record(TickRecord { bucket, outcome, late });
        }
        Response::Tick(Some(answer))
    }

    /// Records one outcome for `bucket` and advances the fire mark.
    fn record_tick(
        &mut self,
        name: &str,
        bucket: u64,
        late: bool,
        outcome: TickOutcome,
    ) -> Response {
        let Some(schedule) = self.schedules.get_mut(name) else {
            return not_found(name);
        };
        schedule.last_fired_bucket = bucket;
        schedule.record(TickRecord { bucket, outcome: outcome.clone(), late });
        Response::Tick(Some(outcome))
    }

    pub(super) fn skip(
        &mut self,
        name: &str,
        bucket: u64,
        reason: SkipReason,
        ticks: u64,
    ) -> Response {
        let Some(schedule) = self.schedules.get_mut(name) else {
            return not_found(name);
        };
        if bucket <= schedule.last_fired_bucket {
            return Response::Tick(None);
        }
        let outcome = TickOutcome::Skipped { reason, ticks: ticks.max(1) };
        schedule.last_fired_bucket = bucket;
        schedule.record(TickRecord { bucket, outcome: outcome.clone(), late: false });
        Response::Tick(Some(outcome))
    }

    pub(super) fn trigger(
        &mut self,
        name: &str,
        force: bool,
        targets: &[u64],
        limits: &Limits,
    ) -> Response {
        let Some(schedule) = self.schedules.get(name) else {
            return not_found(name);
        };
        if !force
            && schedule.spec.overlap == Overlap::Skip
            && self.any_unfinished(&schedule.last_job_ids)
        {
            return Response::Tick(Some(TickOutcome::Skipped {
                reason: SkipReason::Overlap,
                ticks: 1,
            }));
        }
        if schedule.spec.target == Target::Each && targets.is_empty() {
            return Response::Tick(Some(TickOutcome::Skipped {
                reason: SkipReason::NoTarget,
                ticks: 1,
            }));
        }
        // A manual run is named by the cluster time it was asked at and the
        // next job id, so it never collides with a tick's key.
        let bucket = self.cluster_time_ms / 1_000;
        let manual = format!("manual-{}", self.last_job_id.saturating_add(1));
        let specs = tick_jobs(schedule, bucket, targets, Some(&manual));
        let earlier = schedule.last_job_ids.clone();
        match self.enqueue(&specs, limits) {
            Response::Enqueued(outcomes) => {
                let job_ids: Vec<u64> = outcomes.iter().map(|o| o.job_id).collect();
                // Keep the earlier instance's unfinished jobs too: a forced
                // run that ends first must not let the next tick start
                // beside a run that is still going (overlap = skip).
                let mut watched: Vec<u64> =
                    earlier.into_iter().filter(|id| self.any_unfinished(&[*id])).collect();
                watched.extend(job_ids.iter().copied());
                if let Some(schedule) = self.schedules.get_mut(name) {
                    schedule.last_job_ids = watched;
                }
                Response::Tick(Some(TickOutcome::Fired { job_ids, lag_ms: 0 }))
            }
            other => other,
        }
    }

    pub(super) fn register_node(&mut self, node: u64, tags: &[String]) -> Response {
        let mut tags = tags.to_vec();
        tags.sort();
        tags.dedup();
        self.nodes.entry(node).or_default().tags = tags;
        Response::NodeChanged
    }

    pub(super) fn set_draining(&mut self, node: u64, draining: bool) -> Response {
        self.nodes.entry(node).or_default().draining = draining;
        Response::NodeChanged
    }
}

fn not_found(name: &str) -> Response {
    Response::Refused(Refusal::ScheduleNotFound { name: name.to_string() })
}

/// The jobs one tick of `schedule` enqueues: one, or one per target node,
/// each keyed `cron:NAME:BUCKET[:NODE][:manual-N]` so a repeated proposal
/// deduplicates.
fn tick_jobs(
    schedule: &Schedule,
    bucket: u64,
    targets: &[u64],
    manual: Option<&str>,
) -> Vec<JobSpec> {
    let template = &schedule.spec.template;
    let payload = match &template.command {
        Some(command) => command.clone().into_bytes(),
        None => template.payload.clone(),
    };
    let base = |node: Option<u64>| {
        let mut key = schedule.job_key(bucket, node);
        if let Some(manual) = manual {
            key.push(':');
            key.push_str(manual);
        }
        let mut tags = template.tags.clone();
        if let Some(node) = node {
            tags.push(format!("{NODE_TAG_PREFIX}{node}"));
        }
        JobSpec {
            queue: template.queue_name().to_string(),
            payload: payload.clone(),
            priority: template.priority,
            not_before_ms: None,
            max_attempts: template.max_attempts,
            backoff: None,
            lease_ttl_ms: template.lease_ttl_ms,
            idempotency_key: Some(key),
            tags,
        }
    };
    match schedule.spec.target {
        Target::Any => vec![base(None)],
        Target::Each => targets.iter().map(|node| base(Some(*node))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Proposal};
    use crate::schedule::JobTemplate;

    const T0_MS: u64 = 1_767_225_600_000;

    fn apply(state: &mut State, now_ms: u64, command: Command) -> Response {
        state.apply(1, &Proposal { now_ms, command })
    }

    /// Every second, `backup.sh` on the executor.
    fn backup_spec(overlap: Overlap, target: Target) -> ScheduleSpec {
        ScheduleSpec {
            name: "backup".into(),
            cron: "* * * * * *".into(),
            template: JobTemplate { command: Some("backup.sh".into()), ..JobTemplate::default() },
            overlap,
            target,
            ..ScheduleSpec::default()
        }
    }

    fn put(state: &mut State, overlap: Overlap, target: Target) {
        let spec = backup_spec(overlap, target);
        assert_eq!(apply(state, T0_MS, Command::PutSchedule { spec }), Response::ScheduleChanged);
    }

    fn fire(state: &mut State, bucket: u64) -> Response {
        let command = Command::Fire { schedule: "backup".into(), bucket, targets: vec![] };
        apply(state, bucket * 1_000 + 10, command)
    }

    fn fire_each(state: &mut State, bucket: u64, targets: &[u64], offline: &[u64]) -> Response {
        let command = Command::FireEach {
            schedule: "backup".into(),
            bucket,
            targets: targets.to_vec(),
            offline: offline.to_vec(),
        };
        apply(state, bucket * 1_000 + 10, command)
    }

    fn history_of(state: &State, bucket: u64) -> Vec<TickOutcome> {
        let schedule = state.schedule("backup").expect("the schedule");
        schedule.history.iter().filter(|r| r.bucket == bucket).map(|r| r.outcome.clone()).collect()
    }

    #[test]
    fn a_member_that_is_down_never_blocks_the_others() {
        let mut state = State::new();
        put(&mut state, Overlap::Skip, Target::Each);
        let first = T0_MS / 1_000 + 1;
        // All three run the first tick; node 3 then dies with its job unrun.
        let fired = fire_each(&mut state, first, &[1, 2, 3], &[]);
        assert!(
            matches!(fired, Response::Tick(Some(TickOutcome::Fired { ref job_ids, .. })) if job_ids.len() == 3)
        );
        for (job_id, token) in [(1, 1), (2, 2)] {
            let claim = Command::Claim {
                worker: format!("node-{job_id}"),
                queue: "exec".into(),
                max: 1,
                lease_ttl_ms: None,
                selector: vec![format!("{NODE_TAG_PREFIX}{job_id}")],
            };
            apply(&mut state, first * 1_000 + 100, claim);
            apply(&mut state, first * 1_000 + 200, Command::Ack { job_id, token, result: None });
        }
        // Next tick: 3 is offline (the driver says so). Its unfinished job
        // does not skip the others, and the skip is accounted.
        let next = first + 1;
        let answer = fire_each(&mut state, next, &[1, 2], &[3]);
        let Response::Tick(Some(TickOutcome::Fired { job_ids, .. })) = answer else {
            panic!("the live members ran: {answer:?}")
        };
        assert_eq!(job_ids.len(), 2);
        assert_eq!(
            history_of(&state, next)[1],
            TickOutcome::Skipped { reason: SkipReason::TargetOffline, ticks: 1 }
        );
        // 2 is slow this time; 1 finished: only 2 skips, by overlap.
        apply(
            &mut state,
            next * 1_000 + 300,
            Command::Claim {
                worker: "node-1".into(),
                queue: "exec".into(),
                max: 1,
                lease_ttl_ms: None,
                selector: vec![format!("{NODE_TAG_PREFIX}1")],
            },
        );
        let held = state.leases_held_by("node-1", None);
        for (job_id, token) in held {
            apply(&mut state, next * 1_000 + 400, Command::Ack { job_id, token, result: None });
        }
        let third = next + 1;
        let answer = fire_each(&mut state, third, &[1, 2], &[3]);
        let Response::Tick(Some(TickOutcome::Fired { job_ids, .. })) = answer else {
            panic!("member 1 ran: {answer:?}")
        };
        assert_eq!(job_ids.len(), 1);
        assert_eq!(
            history_of(&state, third)[1..],
            [
                TickOutcome::Skipped { reason: SkipReason::Overlap, ticks: 1 },
                TickOutcome::Skipped { reason: SkipReason::TargetOffline, ticks: 1 },
            ]
        );
        // The old Fire judged overlap for the whole schedule: any member's
        // unfinished job skipped everyone.
        let mut old = State::new();
        put(&mut old, Overlap::Skip, Target::Each);
        apply(
            &mut old,
            first * 1_000,
            Command::Fire { schedule: "backup".into(), bucket: first, targets: vec![1, 3] },
        );
        let blocked = apply(
            &mut old,
            next * 1_000,
            Command::Fire { schedule: "backup".into(), bucket: next, targets: vec![1] },
        );
        assert!(matches!(
            blocked,
            Response::Tick(Some(TickOutcome::Skipped { reason: SkipReason::Overlap, .. }))
        ));
        assert_eq!(fire_each(&mut state, third, &[1], &[]), Response::Tick(None), "a bucket once");
    }

    /// A member that missed a tick (down or draining: listed `offline`)
    /// while its last instance was unfinished gets no second job beside it
    /// when it is targeted again (overlap = skip). `FireEach` forgot that
    /// instance as soon as another member ran a tick. A member in neither
    /// list (removed from the cluster) has its instance let go.
    #[test]
    fn a_member_missing_a_tick_keeps_its_unfinished_instance_watched() {
        let run = |tracked: bool, away: &[u64]| {
            let mut state = State::new();
            put(&mut state, Overlap::Skip, Target::Each);
            let fire = |state: &mut State, bucket: u64, targets: &[u64], offline: &[u64]| {
                let (schedule, targets, offline) =
                    ("backup".to_string(), targets.to_vec(), offline.to_vec());
                let command = if tracked {
                    Command::FireEachTracked { schedule, bucket, targets, offline }
                } else {
                    Command::FireEach { schedule, bucket, targets, offline }
                };
                apply(state, bucket * 1_000 + 10, command)
            };
            let claim_and_ack = |state: &mut State, node: u64, at_ms: u64| {
                let worker = format!("node-{node}");
                let claim = Command::Claim {
                    worker: worker.clone(),
                    queue: "exec".into(),
                    max: 1,
                    lease_ttl_ms: None,
                    selector: vec![format!("{NODE_TAG_PREFIX}{node}")],
                };
                apply(state, at_ms, claim);
                for (job_id, token) in state.leases_held_by(&worker, None) {
                    apply(state, at_ms + 1, Command::Ack { job_id, token, result: None });
                }
            };
            let first = T0_MS / 1_000 + 1;
            fire(&mut state, first, &[1, 2], &[]);
            // Node 1 finishes; node 2's job stays ready (it went down).
            claim_and_ack(&mut state, 1, first * 1_000 + 100);
            let next = first + 1;
            fire(&mut state, next, &[1], away);
            claim_and_ack(&mut state, 1, next * 1_000 + 100);
            // Node 2 is back, its first tick's job still unrun.
            let third = next + 1;
            let answer = fire(&mut state, third, &[1, 2], &[]);
            let node_2 = format!("{NODE_TAG_PREFIX}2");
            let node_2_jobs = state
                .jobs(&crate::state::JobFilter::default(), 0, 100)
                .into_iter()
                .filter(|job| job.tags.contains(&node_2))
                .filter(|job| matches!(job.state, JobState::Ready | JobState::Claimed))
                .count();
            (answer, history_of(&state, third), node_2_jobs)
        };
        let (answer, history, node_2_jobs) = run(true, &[2]);
        assert!(
            matches!(answer, Response::Tick(Some(TickOutcome::Fired { ref job_ids, .. })) if job_ids.len() == 1),
            "node 1 alone ran: {answer:?}"
        );
        assert_eq!(history[1..], [TickOutcome::Skipped { reason: SkipReason::Overlap, ticks: 1 }]);
        assert_eq!(node_2_jobs, 1, "node 2 holds one instance, not two");
        let (_, _, forgotten) = run(false, &[2]);
        assert_eq!(forgotten, 2, "FireEach (format 3) forgets the untargeted member's instance");
        let (_, _, let_go) = run(true, &[]);
        assert_eq!(let_go, 2, "a member in neither list is no longer watched");
    }

    /// A schedule put again with another cron expression is planned from
    /// that put: the new timing's tick of a quarter of an hour before is
    /// not fired as a missed one. A `PutSchedule` (format 3) kept the first
    /// put's time, and the plan fired it.
    #[test]
    fn a_schedule_put_again_with_another_timing_plans_from_the_put() {
        const MINUTE_MS: u64 = 60_000;
        let spec = |cron: &str| ScheduleSpec {
            name: "backup".into(),
            cron: cron.into(),
            template: JobTemplate { command: Some("backup.sh".into()), ..JobTemplate::default() },
            ..ScheduleSpec::default()
        };
        let plan = |retimed: bool| {
            let mut state = State::new();
            let hourly = spec("0 0 * * * *");
            apply(&mut state, T0_MS - MINUTE_MS, Command::PutScheduleRetimed { spec: hourly });
            assert!(matches!(fire(&mut state, T0_MS / 1_000), Response::Tick(Some(_))));
            // Half an hour later: every hour at a quarter past instead.
            let (quarter, at_ms) = (spec("0 15 * * * *"), T0_MS + 30 * MINUTE_MS);
            let put = if retimed {
                Command::PutScheduleRetimed { spec: quarter.clone() }
            } else {
                Command::PutSchedule { spec: quarter.clone() }
            };
            apply(&mut state, at_ms, put);
            let schedule = state.schedule("backup").expect("the schedule").clone();
            let cron = crate::cron::parse(&quarter.cron, "").expect("parses");
            (schedule.created_at_ms, crate::schedule::plan_ticks(&schedule, &cron, at_ms, 5_000))
        };
        let (created, planned) = plan(true);
        assert_eq!(created, T0_MS + 30 * MINUTE_MS, "planned from the put");
        assert_eq!(planned, Vec::new(), "nothing of the new timing before the put");
        let (created, planned) = plan(false);
        assert_eq!(created, T0_MS - 60_000, "PutSchedule keeps the first put's time");
        assert_eq!(
            planned,
            vec![crate::schedule::TickPlan::Fire(T0_MS / 1_000 + 15 * 60)],
            "the quarter past, before the change, fired as missed"
        );
        // The same timing put again plans as before (the mark stays).
        let mut state = State::new();
        apply(&mut state, T0_MS, Command::PutScheduleRetimed { spec: spec("0 0 * * * *") });
        let again = Command::PutScheduleRetimed { spec: spec("0 0 * * * *") };
        apply(&mut state, T0_MS + MINUTE_MS, again);
        assert_eq!(state.schedule("backup").map(|s| s.created_at_ms), Some(T0_MS));
    }

    #[test]
    fn a_bucket_fires_at_most_once() {
        let mut state = State::new();
        put(&mut state, Overlap::Allow, Target::Any);
        let bucket = T0_MS / 1_000 + 1;
        let first = fire(&mut state, bucket);
        assert!(matches!(first, Response::Tick(Some(TickOutcome::Fired { .. }))), "{first:?}");
        assert_eq!(fire(&mut state, bucket), Response::Tick(None));
        assert_eq!(fire(&mut state, bucket - 1), Response::Tick(None));
        let jobs = state.stats(0).get("exec").map(|s| s.ready).unwrap_or(0);
        assert_eq!(jobs, 1);
        let job = state.job(1).map(|j| (j.idempotency_key.clone(), j.payload.clone()));
        assert_eq!(job, Some((Some(format!("cron:backup:{bucket}")), b"backup.sh".to_vec())));
    }

    #[test]
    fn overlap_skip_waits_for_the_previous_instance() {
        let mut state = State::new();
        put(&mut state, Overlap::Skip, Target::Any);
        let bucket = T0_MS / 1_000 + 1;
        assert!(matches!(
            fire(&mut state, bucket),
            Response::Tick(Some(TickOutcome::Fired { .. }))
        ));
        let second = fire(&mut state, bucket + 1);
        assert_eq!(
            second,
            Response::Tick(Some(TickOutcome::Skipped { reason: SkipReason::Overlap, ticks: 1 }))
        );
        // Finish the first instance: the next tick fires again.
        let claim = Command::Claim {
            worker: "w".into(),
            queue: "exec".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec![],
        };
        let Response::Claimed(grants) = apply(&mut state, T0_MS + 3_000, claim) else {
            panic!("claim answers grants")
        };
        let ack =
            Command::Ack { job_id: grants[0].job.id, token: grants[0].lease.token, result: None };
        assert_eq!(apply(&mut state, T0_MS + 3_000, ack), Response::Acked);
        assert!(matches!(
            fire(&mut state, bucket + 2),
            Response::Tick(Some(TickOutcome::Fired { .. }))
        ));
        let history: Vec<_> = state
            .schedule("backup")
            .map(|s| s.history.iter().map(|r| r.bucket).collect())
            .unwrap_or_default();
        assert_eq!(history, vec![bucket, bucket + 1, bucket + 2]);
    }

    #[test]
    fn each_target_gets_its_own_job_and_none_means_no_target() {
        let mut state = State::new();
        put(&mut state, Overlap::Allow, Target::Each);
        let bucket = T0_MS / 1_000 + 1;
        let none = fire(&mut state, bucket);
        assert_eq!(
            none,
            Response::Tick(Some(TickOutcome::Skipped { reason: SkipReason::NoTarget, ticks: 1 }))
        );
        let command =
            Command::Fire { schedule: "backup".into(), bucket: bucket + 1, targets: vec![2, 3] };
        let fired = apply(&mut state, T0_MS + 2_000, command);
        assert!(
            matches!(fired, Response::Tick(Some(TickOutcome::Fired { ref job_ids, .. })) if job_ids.len() == 2)
        );
        let tags: Vec<Vec<String>> =
            [1, 2].iter().filter_map(|id| state.job(*id).map(|j| j.tags.clone())).collect();
        assert_eq!(tags, vec![vec!["node:2".to_string()], vec!["node:3".to_string()]]);
    }

    #[test]
    fn skip_advances_the_mark_and_trigger_does_not() {
        let mut state = State::new();
        put(&mut state, Overlap::Skip, Target::Any);
        let bucket = T0_MS / 1_000 + 5;
        let skip = Command::Skip {
            schedule: "backup".into(),
            bucket,
            reason: SkipReason::Catchup,
            ticks: 5,
        };
        assert!(matches!(apply(&mut state, T0_MS + 6_000, skip), Response::Tick(Some(_))));
        assert_eq!(fire(&mut state, bucket), Response::Tick(None));
        let trigger = Command::Trigger { schedule: "backup".into(), force: false, targets: vec![] };
        assert!(matches!(
            apply(&mut state, T0_MS + 7_000, trigger.clone()),
            Response::Tick(Some(TickOutcome::Fired { .. }))
        ));
        // The triggered run is unfinished: a second unforced trigger is an overlap.
        assert_eq!(
            apply(&mut state, T0_MS + 7_000, trigger),
            Response::Tick(Some(TickOutcome::Skipped { reason: SkipReason::Overlap, ticks: 1 }))
        );
        let forced = Command::Trigger { schedule: "backup".into(), force: true, targets: vec![] };
        assert!(matches!(
            apply(&mut state, T0_MS + 7_000, forced),
            Response::Tick(Some(TickOutcome::Fired { .. }))
        ));
        assert_eq!(state.schedule("backup").map(|s| s.last_fired_bucket), Some(bucket));
        assert_eq!(state.schedule("backup").map(|s| s.skipped_count), Some(5));
    }

    /// A tick planned from a schedule that was deleted and put again under
    /// the same name, or retimed, before it applied: the bare tick runs the
    /// new schedule's template for it; planned, it changes nothing.
    #[test]
    fn a_tick_planned_from_an_earlier_schedule_of_the_name_changes_nothing() {
        let bucket = T0_MS / 1_000 + 5;
        let planned = |created_at_ms: u64, command: Command| Command::Planned {
            created_at_ms,
            command: Box::new(command),
        };
        let tick = || Command::Fire { schedule: "backup".into(), bucket, targets: vec![] };
        let skip = || Command::Skip {
            schedule: "backup".into(),
            bucket,
            reason: SkipReason::Catchup,
            ticks: 2,
        };
        // Put at T0, then deleted and put again 3 s later.
        let put_again = |state: &mut State| {
            put(state, Overlap::Allow, Target::Any);
            apply(state, T0_MS + 1_000, Command::DeleteSchedule { name: "backup".into() });
            let spec = backup_spec(Overlap::Allow, Target::Any);
            apply(state, T0_MS + 3_000, Command::PutSchedule { spec });
        };
        let mut bare = State::new();
        put_again(&mut bare);
        assert!(
            matches!(apply(&mut bare, bucket * 1_000, tick()), Response::Tick(Some(_))),
            "the bare tick runs the new schedule for the old one's tick"
        );
        let mut state = State::new();
        put_again(&mut state);
        let before = state.clone();
        assert_eq!(apply(&mut state, bucket * 1_000, planned(T0_MS, tick())), Response::Tick(None));
        assert_eq!(apply(&mut state, bucket * 1_000, planned(T0_MS, skip())), Response::Tick(None));
        assert_eq!(state.schedules(), before.schedules(), "nothing recorded, no mark moved");
        assert_eq!(state.last_job_id(), 0, "no job enqueued");
        // Planned from the schedule as it is now, it fires.
        let fired = apply(&mut state, bucket * 1_000, planned(T0_MS + 3_000, tick()));
        assert!(matches!(fired, Response::Tick(Some(TickOutcome::Fired { .. }))), "{fired:?}");
        // Retimed: ticks planned from the old timing change nothing.
        let mut retimed = State::new();
        put(&mut retimed, Overlap::Allow, Target::Any);
        let spec = ScheduleSpec {
            cron: "*/2 * * * * *".into(),
            ..backup_spec(Overlap::Allow, Target::Any)
        };
        apply(&mut retimed, T0_MS + 3_000, Command::PutScheduleRetimed { spec });
        assert_eq!(
            apply(&mut retimed, bucket * 1_000, planned(T0_MS, tick())),
            Response::Tick(None)
        );
        assert_eq!(retimed.schedule("backup").map(|s| s.last_fired_bucket), Some(0));
        // Put again with the same timing, a schedule is the same one.
        let mut same = State::new();
        put(&mut same, Overlap::Allow, Target::Any);
        apply(
            &mut same,
            T0_MS + 3_000,
            Command::PutScheduleRetimed { spec: backup_spec(Overlap::Allow, Target::Any) },
        );
        let fired = apply(&mut same, bucket * 1_000, planned(T0_MS, tick()));
        assert!(matches!(fired, Response::Tick(Some(TickOutcome::Fired { .. }))), "{fired:?}");
    }

    #[test]
    fn planned_holds_only_a_tick_of_a_known_schedule() {
        let mut state = State::new();
        let unknown = Command::Planned {
            created_at_ms: T0_MS,
            command: Box::new(Command::Fire {
                schedule: "backup".into(),
                bucket: 9,
                targets: vec![],
            }),
        };
        assert_eq!(
            apply(&mut state, T0_MS, unknown),
            Response::Refused(Refusal::ScheduleNotFound { name: "backup".into() })
        );
        put(&mut state, Overlap::Allow, Target::Any);
        let before = state.clone();
        for command in [
            Command::Trigger { schedule: "backup".into(), force: true, targets: vec![] },
            Command::Batch { commands: vec![] },
            Command::Planned { created_at_ms: T0_MS, command: Box::new(Command::Sweep) },
        ] {
            let wrapped = Command::Planned { created_at_ms: T0_MS, command: Box::new(command) };
            let answer = apply(&mut state, T0_MS + 1, wrapped);
            assert!(matches!(answer, Response::Refused(Refusal::Invalid(_))), "{answer:?}");
            assert_eq!(state.schedules(), before.schedules());
            assert_eq!(state.last_job_id(), 0);
        }
        // A bad tick is refused as bad, planned from this put or another.
        for created_at_ms in [T0_MS, T0_MS + 1] {
            let zero = Command::Fire { schedule: "backup".into(), bucket: 0, targets: vec![] };
            let wrapped = Command::Planned { created_at_ms, command: Box::new(zero) };
            let answer = apply(&mut state, T0_MS + 1, wrapped);
            assert!(matches!(answer, Response::Refused(Refusal::Invalid(_))), "{answer:?}");
        }
    }

    #[test]
    fn unknown_schedules_are_refused() {
        let mut state = State::new();
        let fired = fire(&mut state, 1);
        assert_eq!(fired, Response::Refused(Refusal::ScheduleNotFound { name: "backup".into() }));
    }

    #[test]
    fn schedules_and_nodes_survive_a_snapshot() -> Result<(), String> {
        let mut state = State::new();
        put(&mut state, Overlap::Allow, Target::Any);
        fire(&mut state, T0_MS / 1_000 + 1);
        apply(&mut state, T0_MS, Command::RegisterNode { node: 2, tags: vec!["gpu".into()] });
        apply(&mut state, T0_MS, Command::SetDraining { node: 2, draining: true });
        let bytes = bincode::serialize(&state).map_err(|e| e.to_string())?;
        let back: State = bincode::deserialize(&bytes).map_err(|e| e.to_string())?;
        assert_eq!(back, state);
        assert_eq!(back.nodes().get(&2).map(|n| n.draining), Some(true));
        Ok(())
    }
}
