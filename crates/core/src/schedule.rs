//! Schedules: what an operator puts ([`ScheduleSpec`]), what the journal
//! keeps ([`Schedule`], with its bounded tick history), and the leader's pure
//! tick planning ([`plan_ticks`]) that turns due cron ticks into `Fire` and
//! `Skip` commands according to the catch-up policy.
//!
//! The state machine never evaluates cron: it only enforces
//! `bucket > last_fired_bucket`, so whatever a ticker plans, a bucket fires
//! at most once.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::cron::{self, CronSchedule};

/// Most tick records kept per schedule.
pub const HISTORY_LEN: usize = 100;
/// Most ticks one planning round looks at; older ones are coalesced. Room
/// for `catchup = all` at its largest bound: that many missed ticks, the
/// current one, and one more for the window's search.
pub const MAX_TICKS_PER_PLAN: usize = crate::validate::MAX_CATCHUP as usize + 2;
/// Most older ticks a plan counts for its catch-up record (the count of a
/// longer gap is this lower bound).
pub const MAX_TICKS_COUNTED: usize = 100_000;
/// A tick fired this long after its instant or more is recorded as late.
pub const LATE_AFTER_MS: u64 = 2_000;
/// Tag every per-node job of a `target = each` schedule carries: `node:ID`.
pub const NODE_TAG_PREFIX: &str = "node:";
/// Queue command jobs go to when the template names none.
pub const DEFAULT_COMMAND_QUEUE: &str = "exec";
/// How the idempotency key of a job a schedule fired begins
/// ([`Schedule::job_key`]). Reserved: a producer may not enqueue with it
/// ([`crate::validate::enqueue_key`]).
pub const CRON_KEY_PREFIX: &str = "cron:";

/// Whether `queue` is a command queue: `exec`, or `exec.` followed by a
/// name. Only command queues may feed the built-in executor, whose jobs'
/// payloads are shell commands, so whoever may enqueue on one may run a
/// command on the fleet: the edge asks the admin role for it. Being a pure
/// function of the name, every node draws the line in the same place
/// whatever its configuration.
pub fn is_command_queue(queue: &str) -> bool {
    queue == DEFAULT_COMMAND_QUEUE
        || queue.strip_prefix(DEFAULT_COMMAND_QUEUE).is_some_and(|rest| rest.starts_with('.'))
}

/// What to do with a tick while the previous instance is unfinished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overlap {
    /// Do not fire while the previous instance is unacked (not acked or dead).
    #[default]
    Skip,
    /// Fire regardless.
    Allow,
}

/// What to do with ticks missed while no leader was ticking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Catchup {
    /// One run for the newest missed tick inside the catch-up window.
    #[default]
    Coalesce,
    /// No run for missed ticks.
    Skip,
    /// A run for each missed tick, up to `catchup_max`.
    All,
}

/// Who runs a fired tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// One job, claimable by any matching worker.
    #[default]
    Any,
    /// One job per live node whose tags match, claimable only by that node.
    Each,
}

/// Why a tick did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SkipReason {
    /// The previous instance was still unfinished (overlap = skip).
    Overlap,
    /// The catch-up policy dropped it.
    Catchup,
    /// The schedule was paused.
    Paused,
    /// `target = each` and no live node matched.
    NoTarget,
    /// The tick was claimed and run on the broadcast (bus) path while the
    /// cutover gate chose it; the journal records it so a later switch to
    /// the journal does not run it again.
    Bus,
    /// `target = each`: these members were down (no recent advert), so no
    /// job was made for them; the tick ran on the live ones.
    TargetOffline,
}

impl SkipReason {
    /// Lower-case name for the API and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Overlap => "overlap",
            SkipReason::Catchup => "catchup",
            SkipReason::Paused => "paused",
            SkipReason::NoTarget => "no_target",
            SkipReason::Bus => "bus",
            SkipReason::TargetOffline => "target_offline",
        }
    }
}

/// The job a schedule enqueues at each tick.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTemplate {
    /// Queue; for a command job `None` means [`DEFAULT_COMMAND_QUEUE`].
    pub queue: Option<String>,
    /// Payload (ignored when `command` is set: the command is the payload).
    pub payload: Vec<u8>,
    /// Priority of the job.
    pub priority: i32,
    /// Lease length; `None` = default.
    pub lease_ttl_ms: Option<u64>,
    /// Attempts; `None` = default.
    pub max_attempts: Option<u32>,
    /// Tags the job carries (and, for `target = each`, the node tags that
    /// must match).
    pub tags: Vec<String>,
    /// A shell command for the built-in executor.
    pub command: Option<String>,
}

impl JobTemplate {
    /// The queue the job goes to.
    pub fn queue_name(&self) -> &str {
        match (&self.queue, &self.command) {
            (Some(queue), _) => queue,
            (None, _) => DEFAULT_COMMAND_QUEUE,
        }
    }
}

/// What an operator puts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// Name: same pattern as queue names.
    pub name: String,
    /// Cron expression (5 or 6 fields, macros, `@every`).
    pub cron: String,
    /// IANA timezone; `""` = UTC.
    pub timezone: String,
    /// The job to enqueue.
    pub template: JobTemplate,
    /// Overlap policy.
    pub overlap: Overlap,
    /// Catch-up policy.
    pub catchup: Catchup,
    /// Coalesce: only a tick this recent may still run.
    pub catchup_window_ms: u64,
    /// All: at most this many missed ticks run.
    pub catchup_max: u32,
    /// Who runs it.
    pub target: Target,
    /// Paused schedules record ticks as skipped.
    pub paused: bool,
}

impl Default for ScheduleSpec {
    fn default() -> Self {
        ScheduleSpec {
            name: String::new(),
            cron: String::new(),
            timezone: String::new(),
            template: JobTemplate::default(),
            overlap: Overlap::default(),
            catchup: Catchup::default(),
            catchup_window_ms: 3_600_000,
            catchup_max: 10,
            target: Target::default(),
            paused: false,
        }
    }
}

/// What happened at one tick.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TickOutcome {
    /// Jobs were enqueued.
    Fired {
        /// The jobs (one, or one per node for `target = each`).
        job_ids: Vec<u64>,
        /// Cluster time of the fire minus the tick's instant.
        lag_ms: u64,
    },
    /// The tick did not run.
    Skipped {
        /// Why.
        reason: SkipReason,
        /// How many ticks this record stands for (coalesced skips).
        ticks: u64,
    },
}

/// One entry of a schedule's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TickRecord {
    /// The tick's bucket (its instant in Unix seconds).
    pub bucket: u64,
    /// What happened.
    pub outcome: TickOutcome,
    /// Whether it fired at least [`LATE_AFTER_MS`] after its instant.
    pub late: bool,
}

/// A schedule as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// What the operator put.
    pub spec: ScheduleSpec,
    /// The newest bucket fired or skipped; 0 = none yet.
    pub last_fired_bucket: u64,
    /// Cluster time the schedule was first put, or last put with another
    /// cron expression or timezone (`PutScheduleRetimed`): ticks before it
    /// are not due.
    pub created_at_ms: u64,
    /// Jobs of the newest fired tick (overlap checks look at them).
    pub last_job_ids: Vec<u64>,
    /// The newest [`HISTORY_LEN`] tick records, oldest first.
    pub history: VecDeque<TickRecord>,
    /// Counters over the whole life: fired, skipped by reason (in
    /// [`SkipReason`] order), late.
    pub fired_count: u64,
    /// Skipped ticks (coalesced ones counted each).
    pub skipped_count: u64,
}

impl Schedule {
    /// A new schedule put at cluster time `now_ms`.
    pub fn new(spec: ScheduleSpec, now_ms: u64) -> Schedule {
        Schedule {
            spec,
            last_fired_bucket: 0,
            created_at_ms: now_ms,
            last_job_ids: Vec::new(),
            history: VecDeque::new(),
            fired_count: 0,
            skipped_count: 0,
        }
    }

    /// The instant this schedule is planned from: its newest record's tick,
    /// never before it was put (a mark below that, a bus record of a tick
    /// of an earlier schedule of the same name, plans nothing from before
    /// this one existed). Ticks after it are due.
    pub fn planned_after_ms(&self) -> u64 {
        if self.last_fired_bucket > 0 {
            cron::tick_ms(self.last_fired_bucket).max(self.created_at_ms)
        } else {
            self.created_at_ms
        }
    }

    /// Appends a record, dropping the oldest beyond [`HISTORY_LEN`].
    ///
    /// The counters saturate: a `Skip` may stand for any number of ticks
    /// (`u64::MAX` among them), and an overflow here would panic inside
    /// `apply` in a debug build and wrap the count in a release one.
    pub fn record(&mut self, record: TickRecord) {
        match &record.outcome {
            TickOutcome::Fired { .. } => self.fired_count = self.fired_count.saturating_add(1),
            TickOutcome::Skipped { ticks, .. } => {
                self.skipped_count = self.skipped_count.saturating_add(*ticks);
            }
        }
        self.history.push_back(record);
        while self.history.len() > HISTORY_LEN {
            self.history.pop_front();
        }
    }

    /// The idempotency key of the job a tick enqueues (per node for `each`).
    pub fn job_key(&self, bucket: u64, node: Option<u64>) -> String {
        match node {
            Some(node) => format!("{CRON_KEY_PREFIX}{}:{bucket}:{node}", self.spec.name),
            None => format!("{CRON_KEY_PREFIX}{}:{bucket}", self.spec.name),
        }
    }
}

/// One step the ticker proposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickPlan {
    /// Propose `Fire{bucket}`.
    Fire(u64),
    /// Propose `Skip{bucket, reason}` standing for `ticks` ticks up to `bucket`.
    Skip {
        /// The newest bucket the skip covers.
        bucket: u64,
        /// Why.
        reason: SkipReason,
        /// How many ticks.
        ticks: u64,
    },
}

/// The newest ticks of `cron` in `(after_ms, now_ms]`: all of them when
/// there are fewer than `most`, else those of a window `(from_ms, now_ms]`
/// holding at least `least` (at most `most - 1`) and fewer than `most`.
/// Answers `from_ms` (`after_ms` when all were read) and the ticks. The
/// window's start is found by bisection on the number of ticks after it,
/// so ticks bunched in time (office hours, then a weekend) are found
/// however the span's halves fall.
pub fn newest_ticks(
    cron: &CronSchedule,
    after_ms: u64,
    now_ms: u64,
    least: usize,
    most: usize,
) -> (u64, Vec<u64>) {
    let all = cron.ticks_between(after_ms, now_ms, most);
    if all.len() < most {
        return (after_ms, all);
    }
    let least = least.clamp(1, most.saturating_sub(1).max(1));
    // At `early` at least `most` ticks follow; at `late`, fewer than `least`.
    let (mut early, mut late) = (after_ms, now_ms);
    while late.saturating_sub(early) > 1 {
        let mid = early + (late - early) / 2;
        let count = cron.count_ticks_between(mid, now_ms, most);
        if count >= most {
            early = mid;
        } else if count < least {
            late = mid;
        } else {
            return (mid, cron.ticks_between(mid, now_ms, most));
        }
    }
    // Ticks are whole seconds, so one millisecond passes at most one, and
    // the count steps by one: the loop returns before this.
    (late, cron.ticks_between(late, now_ms, most))
}

/// The commands a leader should propose for `schedule` at `now_ms`, oldest
/// first. Every tick after the last fired bucket (or after the creation
/// time) up to now is fired or skipped:
///
/// - the newest due tick is *current* when it is less than `tolerance_ms`
///   old; all other due ticks are *missed*;
/// - paused: everything due is skipped, as one record;
/// - a current tick fires; the missed ticks before it follow the policy,
///   except that under `coalesce` the current run stands for them;
/// - missed ticks: `coalesce` fires the newest one when it is inside the
///   catch-up window and skips the rest as one record; `skip` skips them all
///   as one record; `all` fires the newest `catchup_max` of them and skips
///   the older ones as one record.
///
/// The plan is bounded: at most [`MAX_TICKS_PER_PLAN`] ticks are read
/// (when there are more, the newest ones are read and the gap is counted as
/// skipped), and skips are coalesced, so a cluster that was down for a week
/// does not propose a week of ticks.
pub fn plan_ticks(
    schedule: &Schedule,
    cron: &CronSchedule,
    now_ms: u64,
    tolerance_ms: u64,
) -> Vec<TickPlan> {
    let after_ms = schedule.planned_after_ms();
    // More ticks than one plan reads: the newest ones, and a count of the
    // older ones (exact up to MAX_TICKS_COUNTED) for the catch-up record.
    // Enough of them to fire what the policy fires: the newest missed one
    // and the current one, or `catchup_max` missed ones and the current.
    let least = (schedule.spec.catchup_max as usize).max(1) + 1;
    let (from_ms, ticks) = newest_ticks(cron, after_ms, now_ms, least, MAX_TICKS_PER_PLAN);
    let unread = if from_ms > after_ms {
        cron.count_ticks_between(after_ms, from_ms, MAX_TICKS_COUNTED) as u64
    } else {
        0
    };
    let Some(&newest) = ticks.last() else {
        return Vec::new();
    };
    let newest_bucket = cron::bucket_of(newest);
    let total = ticks.len() as u64 + unread;
    if schedule.spec.paused {
        return vec![TickPlan::Skip {
            bucket: newest_bucket,
            reason: SkipReason::Paused,
            ticks: total,
        }];
    }
    let skip = |upto_ms: u64, count: u64| TickPlan::Skip {
        bucket: cron::bucket_of(upto_ms),
        reason: SkipReason::Catchup,
        ticks: count,
    };
    let current = now_ms.saturating_sub(newest) < tolerance_ms;
    let (missed, fire_current) =
        if current { (&ticks[..ticks.len() - 1], true) } else { (&ticks[..], false) };
    let missed_count = missed.len() as u64 + unread;
    let mut plan = Vec::new();
    if missed.is_empty() && unread > 0 {
        // Only unread ticks lie before the current one: one record of them
        // whatever the policy, as none is fired.
        plan.push(TickPlan::Skip {
            bucket: cron::bucket_of(from_ms),
            reason: SkipReason::Catchup,
            ticks: unread,
        });
    }
    match schedule.spec.catchup {
        Catchup::Skip => {
            if let Some(&last_missed) = missed.last() {
                plan.push(skip(last_missed, missed_count));
            }
        }
        Catchup::Coalesce => {
            if let Some(&last_missed) = missed.last() {
                let inside = now_ms.saturating_sub(last_missed) <= schedule.spec.catchup_window_ms;
                if fire_current || !inside {
                    plan.push(skip(last_missed, missed_count));
                } else {
                    if missed.len() > 1 {
                        plan.push(skip(missed[missed.len() - 2], missed_count - 1));
                    } else if unread > 0 {
                        // Only unread ticks lie before it; they need no record
                        // of their own beyond the count carried here.
                        plan.push(TickPlan::Skip {
                            bucket: cron::bucket_of(last_missed).saturating_sub(1),
                            reason: SkipReason::Catchup,
                            ticks: unread,
                        });
                    }
                    plan.push(TickPlan::Fire(cron::bucket_of(last_missed)));
                }
            }
        }
        Catchup::All => {
            let keep_from = missed.len().saturating_sub(schedule.spec.catchup_max as usize);
            if keep_from > 0 {
                plan.push(skip(missed[keep_from - 1], keep_from as u64 + unread));
            } else if let (Some(&first), true) = (missed.first(), unread > 0) {
                // Every read missed tick fires; the unread ones before them
                // still need their record.
                plan.push(TickPlan::Skip {
                    bucket: cron::bucket_of(first).saturating_sub(1),
                    reason: SkipReason::Catchup,
                    ticks: unread,
                });
            }
            plan.extend(missed[keep_from..].iter().map(|t| TickPlan::Fire(cron::bucket_of(*t))));
        }
    }
    if fire_current {
        plan.push(TickPlan::Fire(newest_bucket));
    }
    plan
}

/// The ticks of a paused `schedule` due by `now_ms` that have no record in
/// the journal (after its newest record, never before it was put): the
/// newest, as a bucket, and how many, for the resume that ends the pause to
/// record as skipped ([`crate::Command::ResumeSchedule`]). A leader on the
/// journal records a paused schedule's ticks as they fall due; these are
/// the ones it did not (the pool was on the broadcast path, or no leader
/// planned). `None` when the schedule is not paused or has none.
pub fn ticks_while_paused(
    schedule: &Schedule,
    cron: &CronSchedule,
    now_ms: u64,
) -> Option<(u64, u64)> {
    if !schedule.spec.paused {
        return None;
    }
    match plan_ticks(schedule, cron, now_ms, 0).as_slice() {
        [TickPlan::Skip { bucket, reason: SkipReason::Paused, ticks }] => Some((*bucket, *ticks)),
        _ => None,
    }
}

/// The command that resumes `name`, whose state is `schedule` (as read
/// now, outside the state's lock: counting may read many ticks), at
/// `now_ms`: a [`crate::Command::ResumeSchedule`] carrying the ticks due
/// while it was paused and the instant they were counted after. A schedule
/// this build cannot parse, or one not found (the journal answers
/// NOT_FOUND), carries none.
pub fn resume_command(name: &str, schedule: Option<&Schedule>, now_ms: u64) -> crate::Command {
    let paused = schedule.and_then(|schedule| {
        let cron = cron::parse(&schedule.spec.cron, &schedule.spec.timezone).ok()?;
        let (through, ticks) = ticks_while_paused(schedule, &cron, now_ms)?;
        Some((schedule.planned_after_ms(), through, ticks))
    });
    let (counted_after_ms, paused_through, paused_ticks) = paused.unwrap_or((0, 0, 0));
    crate::Command::ResumeSchedule {
        name: name.to_string(),
        counted_after_ms,
        paused_through,
        paused_ticks,
    }
}

/// `tick` (a `Fire`, `FireEach` or `Skip` of `schedule`) as planned from
/// `schedule`, in the form a log whose members decode `format` takes: a
/// [`crate::Command::Planned`] from format 7, which changes nothing once
/// the schedule of that name is another one (put anew or retimed); the
/// bare tick below it.
pub fn planned_tick(schedule: &Schedule, tick: crate::Command, format: u32) -> crate::Command {
    let created_at_ms = schedule.created_at_ms;
    crate::Command::Planned { created_at_ms, command: Box::new(tick) }.for_log_format(format)
}

/// Whether a tick this node won on the bus may run here, judged from the
/// journal: SPEC §7.8 (never-both for the pool, whatever each node's view
/// of its peers). Nodes decide a tick's path from their own peer
/// registries, so the leader may fire a tick on the journal while a node
/// that hears the pool differently wins it on the bus. A bus winner
/// therefore first proposes `Skip{bucket, reason: Bus}`, and the journal's
/// `bucket > last_fired_bucket` guard lets exactly one record of the
/// bucket in: a `Fire` (the journal path runs it), or one bus record.
///
/// `answer` is the journal's answer to this node's bus record (`Some`: it
/// was taken; `None`: the bucket was already covered, or the outcome is
/// unknown). `recorded` is the journal's record of the bucket, read after
/// the proposal; only a `target = each` tick consults it, since each member
/// runs its own share of a bucket some node recorded for the bus.
pub fn may_run_on_bus(
    target: Target,
    answer: Option<&TickOutcome>,
    recorded: Option<&TickRecord>,
    bucket: u64,
) -> bool {
    let on_bus = |outcome: &TickOutcome| {
        matches!(outcome, TickOutcome::Skipped { reason: SkipReason::Bus, .. })
    };
    match answer {
        Some(outcome) => on_bus(outcome),
        // Someone else's record: for `any`, another claimant (the journal's
        // fire, or a second bus winner) has the tick; for `each`, the
        // bucket is the bus's if its record says so.
        None => {
            target == Target::Each
                && recorded.is_some_and(|record| record.bucket == bucket && on_bus(&record.outcome))
        }
    }
}

/// Whether a tick planned from `planned` may still run, judged by the
/// schedule as the journal holds it `now` (read after the tick's record
/// committed): not deleted, not paused, not put anew (a schedule deleted
/// and put again under the same name starts over), and not turned from
/// `any` to `each`. A tick claimed on the bus as `any` whose schedule
/// turned `each` meanwhile is not run by its claimant: every member runs
/// its own share of a tick recorded after the change, and the claimant
/// would run it twice. (A share planned under `each` whose schedule turned
/// `any` still runs: no `any` claimant runs a tick the journal already
/// holds a record of.)
pub fn still_runs(planned: &Schedule, now: Option<&Schedule>) -> bool {
    now.is_some_and(|now| {
        let turned_each = planned.spec.target == Target::Any && now.spec.target == Target::Each;
        !now.spec.paused && now.created_at_ms == planned.created_at_ms && !turned_each
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE_MS: u64 = 60_000;
    const T0_MS: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    /// Office hours every minute, down from Thursday 09:00 to Monday
    /// 09:00: 1,080 ticks, more than a plan reads, bunched so that the
    /// newer half of the span (the weekend) holds none. The plan still
    /// fires Friday's last ticks and Monday's first, and records every
    /// other tick as skipped; it once found nothing in the newer half and
    /// planned only Monday's, leaving 1,079 ticks without a record.
    #[test]
    fn a_long_outage_of_bunched_ticks_is_planned_and_counted_whole() {
        let spec = ScheduleSpec {
            name: "s".into(),
            cron: "* 9-17 * * 1-5".into(),
            catchup: Catchup::All,
            catchup_max: 10,
            ..ScheduleSpec::default()
        };
        let cron = cron::parse(&spec.cron, "").unwrap_or_else(|e| panic!("{e}"));
        let thursday_9 = T0_MS + 9 * 60 * MINUTE_MS;
        let monday_9 = thursday_9 + 4 * 24 * 60 * MINUTE_MS;
        let mut schedule = Schedule::new(spec, thursday_9 - MINUTE_MS);
        schedule.last_fired_bucket = thursday_9 / 1_000;
        let plan = plan_ticks(&schedule, &cron, monday_9 + 500, 5_000);
        let fired: Vec<u64> = plan
            .iter()
            .filter_map(|step| match step {
                TickPlan::Fire(bucket) => Some(*bucket),
                TickPlan::Skip { .. } => None,
            })
            .collect();
        let friday_17_59 =
            (thursday_9 + 24 * 60 * MINUTE_MS + 8 * 60 * MINUTE_MS + 59 * MINUTE_MS) / 1_000;
        let mut expected: Vec<u64> = (0..10).rev().map(|back| friday_17_59 - back * 60).collect();
        expected.push(monday_9 / 1_000);
        assert_eq!(fired, expected, "Friday's last ten, then Monday's first: {plan:?}");
        let skipped = skipped_ticks(&plan);
        assert_eq!(skipped + fired.len() as u64, 1_080, "every tick accounted once: {plan:?}");
        let (from_ms, newest) =
            newest_ticks(&cron, thursday_9, monday_9 + 500, 1, MAX_TICKS_PER_PLAN);
        assert!(from_ms > thursday_9 && newest.last() == Some(&monday_9), "{from_ms} {newest:?}");
    }

    /// The ticks a plan's skip records count.
    fn skipped_ticks(plan: &[TickPlan]) -> u64 {
        plan.iter()
            .map(|step| match step {
                TickPlan::Skip { ticks, .. } => *ticks,
                TickPlan::Fire(_) => 0,
            })
            .sum()
    }

    fn every_minute(catchup: Catchup) -> (Schedule, CronSchedule) {
        let spec = ScheduleSpec {
            name: "s".into(),
            cron: "* * * * *".into(),
            catchup,
            catchup_window_ms: 10 * MINUTE_MS,
            catchup_max: 3,
            ..ScheduleSpec::default()
        };
        let parsed = cron::parse(&spec.cron, "");
        let schedule = Schedule::new(spec, T0_MS);
        (schedule, parsed.unwrap_or_else(|e| panic!("{e}")))
    }

    fn bucket(minutes: u64) -> u64 {
        (T0_MS + minutes * MINUTE_MS) / 1_000
    }

    #[test]
    fn command_queues_are_exec_and_its_dotted_children_only() {
        for queue in ["exec", "exec.gpu", "exec.a.b"] {
            assert!(is_command_queue(queue), "{queue}");
        }
        for queue in ["executor", "exec-gpu", "exe", "emails", "my.exec", ""] {
            assert!(!is_command_queue(queue), "{queue}");
        }
    }

    #[test]
    fn a_current_tick_fires_once_and_then_nothing_is_due() {
        let (mut schedule, cron) = every_minute(Catchup::Coalesce);
        let plan = plan_ticks(&schedule, &cron, T0_MS + MINUTE_MS + 100, 2_000);
        assert_eq!(plan, vec![TickPlan::Fire(bucket(1))]);
        schedule.last_fired_bucket = bucket(1);
        assert!(plan_ticks(&schedule, &cron, T0_MS + MINUTE_MS + 900, 2_000).is_empty());
    }

    #[test]
    fn coalesce_runs_the_newest_missed_tick_once() {
        let (schedule, cron) = every_minute(Catchup::Coalesce);
        // Down from minute 0 to 5:30: ticks 1..=5 missed, none current.
        let plan = plan_ticks(&schedule, &cron, T0_MS + 5 * MINUTE_MS + 30_000, 2_000);
        assert_eq!(
            plan,
            vec![
                TickPlan::Skip { bucket: bucket(4), reason: SkipReason::Catchup, ticks: 4 },
                TickPlan::Fire(bucket(5)),
            ]
        );
    }

    #[test]
    fn coalesce_outside_the_window_runs_nothing() {
        let (mut schedule, cron) = every_minute(Catchup::Coalesce);
        // The newest missed tick is 30 s old; a 10 s window lets none run.
        schedule.spec.catchup_window_ms = 10_000;
        let plan = plan_ticks(&schedule, &cron, T0_MS + 30 * MINUTE_MS + 30_000, 2_000);
        assert_eq!(
            plan,
            vec![TickPlan::Skip { bucket: bucket(30), reason: SkipReason::Catchup, ticks: 30 }]
        );
    }

    #[test]
    fn coalesce_with_a_current_tick_lets_it_stand_for_the_missed_ones() {
        let (schedule, cron) = every_minute(Catchup::Coalesce);
        let plan = plan_ticks(&schedule, &cron, T0_MS + 5 * MINUTE_MS + 500, 2_000);
        assert_eq!(
            plan,
            vec![
                TickPlan::Skip { bucket: bucket(4), reason: SkipReason::Catchup, ticks: 4 },
                TickPlan::Fire(bucket(5)),
            ]
        );
    }

    #[test]
    fn skip_runs_only_a_current_tick() {
        let (schedule, cron) = every_minute(Catchup::Skip);
        let missed_only = plan_ticks(&schedule, &cron, T0_MS + 5 * MINUTE_MS + 30_000, 2_000);
        assert_eq!(
            missed_only,
            vec![TickPlan::Skip { bucket: bucket(5), reason: SkipReason::Catchup, ticks: 5 }]
        );
        let with_current = plan_ticks(&schedule, &cron, T0_MS + 5 * MINUTE_MS + 500, 2_000);
        assert_eq!(
            with_current,
            vec![
                TickPlan::Skip { bucket: bucket(4), reason: SkipReason::Catchup, ticks: 4 },
                TickPlan::Fire(bucket(5)),
            ]
        );
    }

    #[test]
    fn all_runs_each_missed_tick_up_to_the_bound() {
        let (schedule, cron) = every_minute(Catchup::All);
        let plan = plan_ticks(&schedule, &cron, T0_MS + 5 * MINUTE_MS + 30_000, 2_000);
        assert_eq!(
            plan,
            vec![
                TickPlan::Skip { bucket: bucket(2), reason: SkipReason::Catchup, ticks: 2 },
                TickPlan::Fire(bucket(3)),
                TickPlan::Fire(bucket(4)),
                TickPlan::Fire(bucket(5)),
            ]
        );
    }

    /// An outage of more ticks than a plan reads, under `catchup = all` at
    /// its largest bound: the bound's missed ticks fire (not a few short
    /// of it), and the older ones are recorded, every tick once.
    #[test]
    fn all_at_its_largest_bound_fires_that_many_and_records_the_rest() {
        let (mut schedule, cron) = every_minute(Catchup::All);
        schedule.spec.catchup_max = crate::validate::MAX_CATCHUP;
        let minutes = 3_000;
        let plan = plan_ticks(&schedule, &cron, T0_MS + minutes * MINUTE_MS + 500, 2_000);
        let fired = plan.iter().filter(|step| matches!(step, TickPlan::Fire(_))).count();
        // The bound's missed ticks, then the current one.
        assert_eq!(fired, crate::validate::MAX_CATCHUP as usize + 1, "{:?}", &plan[..3]);
        let skipped = skipped_ticks(&plan);
        assert_eq!(skipped + fired as u64, minutes, "every tick accounted once: {:?}", &plan[..3]);
        let mut buckets = plan.iter().map(|step| match step {
            TickPlan::Fire(bucket) | TickPlan::Skip { bucket, .. } => *bucket,
        });
        let mut previous = buckets.next().unwrap_or_default();
        for bucket in buckets {
            assert!(bucket > previous, "out of order: {previous} then {bucket}");
            previous = bucket;
        }
    }

    #[test]
    fn paused_skips_everything_as_one_record() {
        let (mut schedule, cron) = every_minute(Catchup::All);
        schedule.spec.paused = true;
        let plan = plan_ticks(&schedule, &cron, T0_MS + 5 * MINUTE_MS + 500, 2_000);
        assert_eq!(
            plan,
            vec![TickPlan::Skip { bucket: bucket(5), reason: SkipReason::Paused, ticks: 5 }]
        );
    }

    #[test]
    fn a_long_outage_is_bounded_and_coalesced() {
        let spec = ScheduleSpec {
            name: "s".into(),
            cron: "* * * * * *".into(),
            catchup: Catchup::Coalesce,
            ..ScheduleSpec::default()
        };
        let cron = cron::parse(&spec.cron, "").unwrap_or_else(|e| panic!("{e}"));
        let schedule = Schedule::new(spec, T0_MS);
        // Five hours of every-second ticks: 18,000 missed.
        let now_ms = T0_MS + 5 * 3_600_000 + 500;
        let plan = plan_ticks(&schedule, &cron, now_ms, 2_000);
        let fires = plan.iter().filter(|p| matches!(p, TickPlan::Fire(_))).count();
        assert_eq!(fires, 1, "{plan:?}");
        assert!(plan.len() <= 2, "{plan:?}");
    }

    /// Planning at the edges of time neither panics nor plans a bucket at
    /// or below the mark: a mark of `u64::MAX` (its instant saturates),
    /// a clock at `u64::MAX` (past the last tick, year 9999), and the
    /// widest tolerance and catch-up bound.
    #[test]
    fn planning_at_the_edges_of_time_saturates() {
        for catchup in [Catchup::Coalesce, Catchup::Skip, Catchup::All] {
            let (mut schedule, cron) = every_minute(catchup);
            schedule.spec.catchup_max = u32::MAX;
            schedule.spec.catchup_window_ms = u64::MAX;
            for (mark, created_at_ms, now_ms, tolerance_ms) in [
                (u64::MAX, 0, u64::MAX, u64::MAX),
                (0, 0, u64::MAX, u64::MAX),
                (0, u64::MAX, u64::MAX, 0),
                (u64::MAX - 1, 0, T0_MS, 2_000),
                (0, 0, T0_MS, u64::MAX),
            ] {
                schedule.last_fired_bucket = mark;
                schedule.created_at_ms = created_at_ms;
                for step in plan_ticks(&schedule, &cron, now_ms, tolerance_ms) {
                    let bucket = match step {
                        TickPlan::Fire(bucket) | TickPlan::Skip { bucket, .. } => bucket,
                    };
                    assert!(bucket > mark || mark == 0, "{catchup:?}: {step:?} after {mark}");
                }
            }
        }
    }

    #[test]
    fn history_is_bounded() {
        let (mut schedule, _) = every_minute(Catchup::All);
        for minute in 0..(HISTORY_LEN as u64 + 10) {
            schedule.record(TickRecord {
                bucket: bucket(minute),
                outcome: TickOutcome::Fired { job_ids: vec![minute], lag_ms: 0 },
                late: false,
            });
        }
        assert_eq!(schedule.history.len(), HISTORY_LEN);
        assert_eq!(schedule.fired_count, HISTORY_LEN as u64 + 10);
        assert_eq!(schedule.history.front().map(|r| r.bucket), Some(bucket(10)));
    }

    #[test]
    fn a_bus_win_runs_only_when_the_journal_took_this_nodes_bus_record() {
        let bus = TickOutcome::Skipped { reason: SkipReason::Bus, ticks: 1 };
        let fired = TickOutcome::Fired { job_ids: vec![7], lag_ms: 20 };
        let record = |outcome: &TickOutcome, bucket| TickRecord {
            bucket,
            outcome: outcome.clone(),
            late: false,
        };
        // This node's record went in: the bus is the tick's path.
        assert!(may_run_on_bus(Target::Any, Some(&bus), None, 100));
        // The leader fired the tick on the journal first (its view put the
        // tick there): the bus winner must not run it too.
        assert!(!may_run_on_bus(Target::Any, None, Some(&record(&fired, 100)), 100));
        // Another bus winner recorded it first (two nodes that did not hear
        // each other both won): only that one runs.
        assert!(!may_run_on_bus(Target::Any, None, Some(&record(&bus, 100)), 100));
        // Unknown outcome, nothing read: not run (at most once).
        assert!(!may_run_on_bus(Target::Any, None, None, 100));
        assert!(!may_run_on_bus(Target::Each, None, None, 100));
        // `each`: every member runs its share of a bus bucket, never of a
        // fired one (each member got a job), nor of another bucket's record.
        assert!(may_run_on_bus(Target::Each, Some(&bus), None, 100));
        assert!(may_run_on_bus(Target::Each, None, Some(&record(&bus, 100)), 100));
        assert!(!may_run_on_bus(Target::Each, None, Some(&record(&fired, 100)), 100));
        assert!(!may_run_on_bus(Target::Each, None, Some(&record(&bus, 101)), 100));
        // Any other answer (a refusal of another kind) is not a bus record.
        let paused = TickOutcome::Skipped { reason: SkipReason::Paused, ticks: 1 };
        assert!(!may_run_on_bus(Target::Any, Some(&paused), None, 100));
    }

    #[test]
    fn a_mark_from_before_the_schedule_was_put_plans_nothing_before_it() {
        // Put at minute 30; a bus record of minute 5 (a tick of an earlier
        // schedule of the same name) moved its mark there.
        let (mut schedule, cron) = every_minute(Catchup::All);
        schedule.created_at_ms = T0_MS + 30 * MINUTE_MS;
        schedule.last_fired_bucket = bucket(5);
        let plan = plan_ticks(&schedule, &cron, T0_MS + 31 * MINUTE_MS + 100, 2_000);
        let before = |b: u64| b * 1_000 < schedule.created_at_ms;
        for step in &plan {
            let planned = match step {
                TickPlan::Fire(b) => *b,
                TickPlan::Skip { bucket, .. } => *bucket,
            };
            assert!(!before(planned), "planned bucket {planned} before the schedule: {plan:?}");
        }
        assert_eq!(plan, vec![TickPlan::Fire(bucket(31))], "only minute 31 is due");
    }

    #[test]
    fn a_tick_claimed_before_a_pause_or_a_delete_does_not_run() {
        let (planned, _) = every_minute(Catchup::Skip);
        assert!(still_runs(&planned, Some(&planned)));
        let mut paused = planned.clone();
        paused.spec.paused = true;
        assert!(!still_runs(&planned, Some(&paused)), "paused after the plan");
        assert!(!still_runs(&planned, None), "deleted after the plan");
        let mut anew = planned.clone();
        anew.created_at_ms += MINUTE_MS;
        assert!(!still_runs(&planned, Some(&anew)), "deleted and put again");
        let mut each = planned.clone();
        each.spec.target = Target::Each;
        assert_eq!(planned.spec.target, Target::Any);
        assert!(!still_runs(&planned, Some(&each)), "turned each after the plan");
        assert!(still_runs(&each, Some(&planned)), "a share planned under each, turned any");
    }

    #[test]
    fn a_tick_carries_its_schedules_put_instant_from_format_7() {
        let (mut schedule, _) = every_minute(Catchup::Skip);
        schedule.created_at_ms = T0_MS + 7;
        let fire =
            crate::Command::Fire { schedule: "s".into(), bucket: bucket(1), targets: vec![] };
        let planned =
            crate::Command::Planned { created_at_ms: T0_MS + 7, command: Box::new(fire.clone()) };
        assert_eq!(planned_tick(&schedule, fire.clone(), 7), planned);
        assert_eq!(planned_tick(&schedule, fire.clone(), 6), fire, "bare below format 7");
    }
}
