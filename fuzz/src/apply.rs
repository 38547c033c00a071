//! The `apply` target: arbitrary command sequences through
//! `State::apply`.
//!
//! Goal: `apply` never panics, whatever the commands, clocks and epochs,
//! and after every step the guarantees core is responsible for still hold.
//! These are the properties `crates/core/tests/properties.rs` checks with
//! proptest, here reached by a coverage-guided fuzzer and over every
//! command (schedules, nodes and batches included) with values up to
//! `u64::MAX`:
//!
//! - `State::check_invariants` passes (each job's fields agree with its
//!   state, no shared tokens or keys, indexes equal a rebuild);
//! - fencing tokens strictly increase and each grant carries the epoch;
//! - a job holds at most one live lease, and only its current token acks,
//!   nacks, releases or renews it;
//! - an acked job is never granted again;
//! - a schedule's fire mark only moves forward, and a bucket at or below it
//!   changes nothing;
//! - cluster time is the largest `now_ms` applied;
//! - a refused command changes nothing but cluster time;
//! - two replicas, and one reloaded from a snapshot every few steps,
//!   answer identically and end equal.
//!
//! Method: the bytes are read with `arbitrary` into at most
//! [`MAX_STEPS`] steps. Steps name jobs and tokens by picks resolved
//! against the state when the step runs (a held job and its current
//! token, a superseded token, a made-up one), so sequences reach real
//! leases rather than refusals only.

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use leasehold_core::schedule::{
    Catchup, HISTORY_LEN, JobTemplate, Overlap, Schedule, ScheduleSpec, SkipReason, Target,
    TickOutcome,
};
use leasehold_core::{
    Backoff, Command, Job, JobFilter, JobSpec, JobState, Proposal, RedriveTarget, Refusal,
    Response, State,
};

use crate::pick::{Number, Priority, Text};

/// Most steps one input drives.
pub const MAX_STEPS: usize = 64;
/// Queue names steps usually pick from.
pub const QUEUES: [&str; 3] = ["alpha", "beta", "exec"];
/// Tags (and selectors) steps usually pick from.
pub const TAGS: [&str; 3] = ["gpu", "eu", "node:2"];
/// Idempotency keys steps usually pick from.
pub const KEYS: [&str; 3] = ["k1", "k2", "cron:s1:1"];
/// Schedule names steps usually pick from.
pub const SCHEDULES: [&str; 2] = ["s1", "s2"];
/// Cron expressions schedules usually carry.
pub const CRONS: [&str; 5] =
    ["* * * * * *", "*/5 * * * *", "0 2 * * *", "@every 90s", "0 0 30 2 *"];
/// Timezones schedules usually carry.
pub const ZONES: [&str; 4] = ["", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"];
/// Worker ids steps usually pick from.
pub const WORKERS: [&str; 2] = ["worker-1", "worker-2"];

/// Runs one input; panics on a violation.
pub fn check(data: &[u8]) {
    let mut input = Unstructured::new(data);
    let mut run = Run::new();
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        let Ok(step) = Step::arbitrary(&mut input) else {
            break;
        };
        run.step(&step);
    }
    run.finish();
}

/// How the proposer's clock moves before a step.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Clock {
    /// Forward by this many milliseconds.
    Forward(u16),
    /// Forward by this many seconds.
    ForwardSeconds(u16),
    /// Backward by this many milliseconds (a slower leader's clock).
    Backward(u16),
    /// To this instant, wherever it is.
    Exact(Number),
}

/// One step: a clock move, perhaps a new term, and an operation.
#[derive(Arbitrary, Clone, Debug)]
pub struct Step {
    clock: Clock,
    new_epoch: Option<Number>,
    op: Op,
}

/// A top-level operation: one command, or several in one batch.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// One command.
    Single(Leaf),
    /// A batch of commands (empty and oversized ones are refused).
    Batch(Vec<Leaf>),
}

/// How a step names a job.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum JobPick {
    /// One of the claimed jobs (any job when none is).
    Held(u8),
    /// Any id from 0 to one past the last assigned.
    Any(u16),
    /// A made-up id.
    Raw(Number),
}

/// How a step names a fencing token.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum TokenPick {
    /// The job's current lease token.
    Current,
    /// A token granted earlier, to any job.
    Granted(u16),
    /// A made-up token.
    Raw(Number),
}

/// A lease length.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Ttl {
    /// The shortest valid one (1 s).
    Shortest,
    /// The longest valid one (12 h).
    Longest,
    /// Anything, mostly invalid.
    Raw(Number),
}

impl Ttl {
    fn value(self) -> u64 {
        match self {
            Ttl::Shortest => 1_000,
            Ttl::Longest => 12 * 60 * 60 * 1_000,
            Ttl::Raw(number) => number.value(),
        }
    }
}

/// When a job becomes due.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Due {
    /// This many milliseconds after the proposer's clock.
    After(u16),
    /// At this instant.
    At(Number),
}

/// A job spec whose fields are mostly valid.
#[derive(Arbitrary, Clone, Debug)]
pub struct SpecSeed {
    queue: Text,
    payload: Vec<u8>,
    priority: Priority,
    due: Option<Due>,
    max_attempts: Option<Number>,
    backoff: Option<(Number, Number)>,
    lease_ttl: Option<Ttl>,
    key: Option<Text>,
    tags: Vec<Text>,
}

/// A schedule spec whose fields are mostly valid.
#[derive(Arbitrary, Clone, Debug)]
pub struct ScheduleSeed {
    name: Text,
    cron: Text,
    timezone: Text,
    queue: Option<Text>,
    command: Option<Text>,
    priority: Priority,
    lease_ttl: Option<Ttl>,
    max_attempts: Option<Number>,
    tags: Vec<Text>,
    overlap_allow: bool,
    catchup: u8,
    catchup_window_ms: Number,
    catchup_max: Number,
    target_each: bool,
    paused: bool,
}

/// Which bucket a fire or skip names.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum BucketPick {
    /// This many buckets past the schedule's mark.
    AfterMark(u8),
    /// At or below the mark (a replayed tick).
    BelowMark(u8),
    /// The bucket of cluster time, shifted by this many seconds.
    Now(i16),
    /// A made-up bucket.
    Raw(Number),
}

/// One command, with its jobs, tokens and buckets still to be resolved.
#[derive(Arbitrary, Clone, Debug)]
pub enum Leaf {
    /// `Enqueue`.
    Enqueue(Vec<SpecSeed>),
    /// `Claim`.
    Claim {
        /// Worker id.
        worker: Text,
        /// Queue.
        queue: Text,
        /// Most grants.
        max: Number,
        /// Lease length.
        ttl: Option<Ttl>,
        /// Worker tags.
        selector: Vec<Text>,
    },
    /// `Refresh`; duplicates are dropped unless `keep_duplicates`.
    Refresh {
        /// Worker id.
        worker: Text,
        /// Leases to renew.
        leases: Vec<(JobPick, TokenPick)>,
        /// New lease length.
        ttl: Option<Ttl>,
        /// Keep a job listed twice (validation refuses it).
        keep_duplicates: bool,
    },
    /// `Ack`.
    Ack(JobPick, TokenPick, Option<Vec<u8>>),
    /// `Nack`.
    Nack(JobPick, TokenPick, String, Option<Number>),
    /// `Release`.
    Release(JobPick, TokenPick),
    /// `Sweep`.
    Sweep,
    /// `SweepKeepingTokens` (log format 5).
    SweepKeepingTokens,
    /// `Purge`.
    Purge,
    /// `Redrive` of a queue.
    RedriveQueue(Text),
    /// `Redrive` of ids.
    RedriveIds(Vec<JobPick>),
    /// `PutSchedule`.
    PutSchedule(Box<ScheduleSeed>),
    /// `DeleteSchedule`.
    DeleteSchedule(Text),
    /// `SetPaused`.
    SetPaused(Text, bool),
    /// `Fire`.
    Fire(Text, BucketPick, Vec<Number>),
    /// `Skip`.
    Skip(Text, BucketPick, u8, Number),
    /// `Trigger`.
    Trigger(Text, bool, Vec<Number>),
    /// `RegisterNode`.
    RegisterNode(Number, Vec<Text>),
    /// `SetDraining`.
    SetDraining(Number, bool),
    /// A batch inside a batch, which apply must refuse.
    NestedBatch,
    /// `ResumeSchedule` (log format 6): counted after the schedule's
    /// planning instant, or after a raw one.
    ResumeSchedule(Text, Option<Number>, BucketPick, Number),
    /// `Planned` (log format 7) around a leaf: planned from the schedule
    /// as it is, or from a raw instant (a schedule put since).
    Planned(Option<Number>, Box<Leaf>),
}

/// What resolving needs: the state as the step sees it, the tokens
/// granted so far and the proposer's clock.
struct Resolver<'a> {
    state: &'a State,
    granted: &'a [u64],
    clock_ms: u64,
}

impl Resolver<'_> {
    fn job(&self, pick: JobPick) -> u64 {
        let any = |index: u64| index % self.state.last_job_id().saturating_add(2);
        match pick {
            JobPick::Held(index) => {
                let held = JobFilter { queue: None, state: Some(JobState::Claimed) };
                let claimed = self.state.jobs(&held, 0, usize::MAX);
                match claimed.len() {
                    0 => any(u64::from(index)),
                    len => claimed[usize::from(index) % len].id,
                }
            }
            JobPick::Any(index) => any(u64::from(index)),
            JobPick::Raw(number) => number.value(),
        }
    }

    fn token(&self, pick: TokenPick, job_id: u64) -> u64 {
        match pick {
            TokenPick::Current => {
                self.state.job(job_id).and_then(|job| job.lease).map_or(0, |lease| lease.token)
            }
            TokenPick::Granted(index) => match self.granted.len() {
                0 => 0,
                len => self.granted[usize::from(index) % len],
            },
            TokenPick::Raw(number) => number.value(),
        }
    }

    fn job_and_token(&self, job: JobPick, token: TokenPick) -> (u64, u64) {
        let job_id = self.job(job);
        (job_id, self.token(token, job_id))
    }

    fn bucket(&self, schedule: &str, pick: BucketPick) -> u64 {
        let mark = self.state.schedule(schedule).map_or(0, |s| s.last_fired_bucket);
        let now_bucket = self.state.cluster_time_ms().max(self.clock_ms) / 1_000;
        match pick {
            BucketPick::AfterMark(step) => mark.saturating_add(u64::from(step)),
            BucketPick::BelowMark(step) => mark.saturating_sub(u64::from(step)),
            BucketPick::Now(shift) => now_bucket.saturating_add_signed(i64::from(shift)),
            BucketPick::Raw(number) => number.value(),
        }
    }

    fn spec(&self, seed: &SpecSeed) -> JobSpec {
        JobSpec {
            queue: seed.queue.resolve(&QUEUES),
            payload: seed.payload.clone(),
            priority: seed.priority.value(),
            not_before_ms: seed.due.map(|due| match due {
                Due::After(delay_ms) => self.clock_ms.saturating_add(u64::from(delay_ms)),
                Due::At(at) => at.value(),
            }),
            max_attempts: seed.max_attempts.map(Number::value32),
            backoff: seed
                .backoff
                .map(|(base, cap)| Backoff { base_ms: base.value(), cap_ms: cap.value() }),
            lease_ttl_ms: seed.lease_ttl.map(Ttl::value),
            idempotency_key: seed.key.as_ref().map(|key| key.resolve(&KEYS)),
            tags: seed.tags.iter().map(|tag| tag.resolve(&TAGS)).collect(),
        }
    }

    fn schedule(&self, seed: &ScheduleSeed) -> ScheduleSpec {
        ScheduleSpec {
            name: seed.name.resolve(&SCHEDULES),
            cron: seed.cron.resolve(&CRONS),
            timezone: seed.timezone.resolve(&ZONES),
            template: JobTemplate {
                queue: seed.queue.as_ref().map(|queue| queue.resolve(&QUEUES)),
                payload: Vec::new(),
                priority: seed.priority.value(),
                lease_ttl_ms: seed.lease_ttl.map(Ttl::value),
                max_attempts: seed.max_attempts.map(Number::value32),
                tags: seed.tags.iter().map(|tag| tag.resolve(&TAGS)).collect(),
                command: seed.command.as_ref().map(|command| command.resolve(&["true", "date"])),
            },
            overlap: if seed.overlap_allow { Overlap::Allow } else { Overlap::Skip },
            catchup: match seed.catchup % 3 {
                0 => Catchup::Coalesce,
                1 => Catchup::Skip,
                _ => Catchup::All,
            },
            catchup_window_ms: seed.catchup_window_ms.value(),
            catchup_max: seed.catchup_max.value32(),
            target: if seed.target_each { Target::Each } else { Target::Any },
            paused: seed.paused,
        }
    }

    fn command(&self, leaf: &Leaf) -> Command {
        let nodes = |nodes: &[Number]| nodes.iter().map(|node| node.value()).collect();
        match leaf {
            Leaf::Enqueue(seeds) => {
                Command::Enqueue { jobs: seeds.iter().map(|seed| self.spec(seed)).collect() }
            }
            Leaf::Claim { worker, queue, max, ttl, selector } => Command::Claim {
                worker: worker.resolve(&WORKERS),
                queue: queue.resolve(&QUEUES),
                max: max.value32(),
                lease_ttl_ms: ttl.map(Ttl::value),
                selector: selector.iter().map(|tag| tag.resolve(&TAGS)).collect(),
            },
            Leaf::Refresh { worker, leases, ttl, keep_duplicates } => {
                let mut seen = BTreeSet::new();
                let leases = leases
                    .iter()
                    .map(|(job, token)| self.job_and_token(*job, *token))
                    .filter(|(job_id, _)| *keep_duplicates || seen.insert(*job_id))
                    .collect();
                Command::Refresh {
                    worker: worker.resolve(&WORKERS),
                    leases,
                    lease_ttl_ms: ttl.map(Ttl::value),
                }
            }
            Leaf::Ack(job, token, result) => {
                let (job_id, token) = self.job_and_token(*job, *token);
                let result = result.clone();
                // Every third token's ack is lean (log format 3).
                if token.is_multiple_of(3) {
                    Command::AckLean { job_id, token, result }
                } else {
                    Command::Ack { job_id, token, result }
                }
            }
            Leaf::Nack(job, token, error, retry_after) => {
                let (job_id, token) = self.job_and_token(*job, *token);
                Command::Nack {
                    job_id,
                    token,
                    error: error.clone(),
                    retry_after_ms: retry_after.map(Number::value),
                }
            }
            Leaf::Release(job, token) => {
                let (job_id, token) = self.job_and_token(*job, *token);
                Command::Release { job_id, token }
            }
            Leaf::Sweep => Command::Sweep,
            Leaf::SweepKeepingTokens => Command::SweepKeepingTokens { max_clock_offset_ms: 0 },
            Leaf::Purge => Command::Purge,
            Leaf::RedriveQueue(queue) => {
                Command::Redrive { target: RedriveTarget::Queue(queue.resolve(&QUEUES)) }
            }
            Leaf::RedriveIds(picks) => Command::Redrive {
                target: RedriveTarget::Ids(picks.iter().map(|pick| self.job(*pick)).collect()),
            },
            Leaf::PutSchedule(seed) => Command::PutSchedule { spec: self.schedule(seed) },
            Leaf::DeleteSchedule(name) => {
                Command::DeleteSchedule { name: name.resolve(&SCHEDULES) }
            }
            Leaf::SetPaused(name, paused) => {
                Command::SetPaused { name: name.resolve(&SCHEDULES), paused: *paused }
            }
            Leaf::Fire(name, bucket, targets) => {
                let schedule = name.resolve(&SCHEDULES);
                let bucket = self.bucket(&schedule, *bucket);
                Command::Fire { schedule, bucket, targets: nodes(targets) }
            }
            Leaf::Skip(name, bucket, reason, ticks) => {
                let schedule = name.resolve(&SCHEDULES);
                let bucket = self.bucket(&schedule, *bucket);
                let reason = match reason % 5 {
                    0 => SkipReason::Overlap,
                    1 => SkipReason::Catchup,
                    2 => SkipReason::Paused,
                    3 => SkipReason::NoTarget,
                    _ => SkipReason::Bus,
                };
                Command::Skip { schedule, bucket, reason, ticks: ticks.value() }
            }
            Leaf::Trigger(name, force, targets) => Command::Trigger {
                schedule: name.resolve(&SCHEDULES),
                force: *force,
                targets: nodes(targets),
            },
            Leaf::RegisterNode(node, tags) => Command::RegisterNode {
                node: node.value(),
                tags: tags.iter().map(|tag| tag.resolve(&TAGS)).collect(),
            },
            Leaf::SetDraining(node, draining) => {
                Command::SetDraining { node: node.value(), draining: *draining }
            }
            Leaf::NestedBatch => Command::Batch { commands: vec![Command::Sweep] },
            Leaf::ResumeSchedule(name, after, bucket, ticks) => {
                let name = name.resolve(&SCHEDULES);
                let planned = self.state.schedule(&name).map_or(0, Schedule::planned_after_ms);
                let counted_after_ms = after.map_or(planned, |after| after.value());
                let paused_through = self.bucket(&name, *bucket);
                let paused_ticks = ticks.value();
                Command::ResumeSchedule { name, counted_after_ms, paused_through, paused_ticks }
            }
            Leaf::Planned(created, leaf) => {
                let command = self.command(leaf);
                let current = command
                    .tick_schedule()
                    .and_then(|name| self.state.schedule(name))
                    .map_or(0, |schedule| schedule.created_at_ms);
                let created_at_ms = created.map_or(current, |created| created.value());
                Command::Planned { created_at_ms, command: Box::new(command) }
            }
        }
    }
}

/// Serializes and reloads a state, as a snapshot install does.
fn reload(state: &State) -> State {
    let bytes = bincode::serialize(state).expect("a state serializes");
    bincode::deserialize(&bytes).expect("a serialized state deserializes")
}

/// Everything a refusal must leave alone (cluster time may move).
fn unchanged_view(state: &State) -> (Vec<Job>, u64, u64, String) {
    let schedules_and_nodes = format!("{:?} {:?}", state.schedules(), state.nodes());
    (
        state.jobs(&JobFilter::default(), 0, usize::MAX),
        state.last_token(),
        state.last_job_id(),
        schedules_and_nodes,
    )
}

/// The three replicas and the model the checks compare them with.
struct Run {
    state: State,
    replica: State,
    reloaded: State,
    clock_ms: u64,
    epoch: u64,
    steps: usize,
    granted: Vec<u64>,
    model: Model,
}

impl Run {
    fn new() -> Run {
        Run {
            state: State::new(),
            replica: State::new(),
            reloaded: State::new(),
            clock_ms: 1_767_225_600_000,
            epoch: 1,
            steps: 0,
            granted: Vec::new(),
            model: Model::default(),
        }
    }

    fn step(&mut self, step: &Step) {
        self.clock_ms = match step.clock {
            Clock::Forward(ms) => self.clock_ms.saturating_add(u64::from(ms)),
            Clock::ForwardSeconds(s) => self.clock_ms.saturating_add(u64::from(s) * 1_000),
            Clock::Backward(ms) => self.clock_ms.saturating_sub(u64::from(ms)),
            Clock::Exact(at) => at.value(),
        };
        if let Some(jump) = step.new_epoch {
            self.epoch = self.epoch.saturating_add(jump.value().max(1));
        }
        let resolver =
            Resolver { state: &self.state, granted: &self.granted, clock_ms: self.clock_ms };
        let command = match &step.op {
            Op::Single(leaf) => resolver.command(leaf),
            Op::Batch(leaves) => Command::Batch {
                commands: leaves.iter().map(|leaf| resolver.command(leaf)).collect(),
            },
        };
        let proposal = Proposal { now_ms: self.clock_ms, command };
        let before = self.state.clone();
        let response = self.state.apply(self.epoch, &proposal);
        let context = format!("step {}: {proposal:?} -> {response:?}", self.steps);

        assert_eq!(
            response,
            self.replica.apply(self.epoch, &proposal),
            "{context}: replicas differ"
        );
        if self.steps % 5 == 4 {
            self.reloaded = reload(&self.reloaded);
        }
        let reloaded = self.reloaded.apply(self.epoch, &proposal);
        assert_eq!(response, reloaded, "{context}: the reloaded replica differs");
        if let Err(violation) = self.state.check_invariants() {
            panic!("{context}: {violation}");
        }
        if let Response::Refused(_) = response {
            assert_eq!(unchanged_view(&before), unchanged_view(&self.state), "{context}");
        }
        self.model.observe(&proposal, &response, self.epoch, &self.state, &context);
        collect_tokens(&response, &mut self.granted);
        self.steps += 1;
    }

    fn finish(&self) {
        let bytes = bincode::serialize(&self.state).expect("a state serializes");
        assert_eq!(bytes, bincode::serialize(&self.replica).expect("a state serializes"));
        assert_eq!(self.state, self.reloaded, "the reloaded replica ended elsewhere");
        let round_tripped: State = bincode::deserialize(&bytes).expect("a state deserializes");
        assert_eq!(round_tripped, self.state);
    }
}

fn collect_tokens(response: &Response, granted: &mut Vec<u64>) {
    match response {
        Response::Claimed(grants) => granted.extend(grants.iter().map(|g| g.lease.token)),
        Response::Batch(responses) => {
            for response in responses {
                collect_tokens(response, granted);
            }
        }
        _ => {}
    }
}

/// What the checks expect, kept from the responses alone.
#[derive(Default)]
struct Model {
    /// The largest `now_ms` applied.
    cluster_time_ms: u64,
    /// The last token granted.
    highest_token: u64,
    /// The last job id assigned.
    highest_job_id: u64,
    /// Job → token of its live lease.
    live: BTreeMap<u64, u64>,
    /// Acked job → token of the lease that acked it.
    acked: BTreeMap<u64, u64>,
    /// Job → token of the lease a sweep that keeps tokens took back, until
    /// the job is granted again, acked or redriven.
    swept: BTreeMap<u64, u64>,
    /// Schedule → fire mark.
    marks: BTreeMap<String, u64>,
    /// Schedule → (fired, skipped) counters.
    counters: BTreeMap<String, (u64, u64)>,
    /// Schedule → (paused, cluster time it was put): what decides whether
    /// a resume records its paused ticks.
    puts: BTreeMap<String, (bool, u64)>,
}

impl Model {
    fn observe(
        &mut self,
        proposal: &Proposal,
        response: &Response,
        epoch: u64,
        state: &State,
        context: &str,
    ) {
        self.cluster_time_ms = self.cluster_time_ms.max(proposal.now_ms);
        assert_eq!(state.cluster_time_ms(), self.cluster_time_ms, "{context}: cluster time");
        self.command(&proposal.command, response, epoch, context);
        self.compare(state, context);
    }

    /// Follows one command and its answer (a batch, command by command).
    fn command(&mut self, command: &Command, response: &Response, epoch: u64, context: &str) {
        match (command, response) {
            (Command::Batch { commands }, Response::Batch(responses)) => {
                assert_eq!(commands.len(), responses.len(), "{context}: one answer per command");
                for (command, response) in commands.iter().zip(responses) {
                    self.command(command, response, epoch, context);
                }
            }
            (Command::Batch { .. }, Response::Refused(Refusal::Invalid(_))) => {}
            (Command::Batch { .. }, other) => panic!("{context}: a batch answered {other:?}"),
            (Command::Enqueue { jobs }, Response::Enqueued(outcomes)) => {
                assert_eq!(jobs.len(), outcomes.len(), "{context}: one outcome per job");
                for outcome in outcomes.iter().filter(|o| !o.duplicate) {
                    assert!(outcome.job_id > self.highest_job_id, "{context}: id reused");
                    self.highest_job_id = outcome.job_id;
                }
            }
            (_, Response::Claimed(grants)) => {
                for grant in grants {
                    let lease = &grant.lease;
                    assert!(lease.token > self.highest_token, "{context}: token not increasing");
                    self.highest_token = lease.token;
                    assert_eq!(lease.epoch, epoch, "{context}: grant epoch");
                    assert_eq!(lease.granted_at_ms, self.cluster_time_ms, "{context}: grant time");
                    assert!(lease.expires_at_ms >= lease.granted_at_ms, "{context}: expiry");
                    assert!(grant.job.not_before_ms <= self.cluster_time_ms, "{context}: not due");
                    self.swept.remove(&lease.job_id);
                    let previous = self.live.insert(lease.job_id, lease.token);
                    assert!(previous.is_none(), "{context}: job still held under {previous:?}");
                    assert!(!self.acked.contains_key(&lease.job_id), "{context}: acked regranted");
                }
            }
            (Command::Refresh { leases, .. }, Response::Refreshed { renewed, lost }) => {
                assert_eq!(renewed.len() + lost.len(), leases.len(), "{context}");
                for lease in renewed {
                    assert_eq!(self.live.get(&lease.job_id), Some(&lease.token), "{context}");
                    assert!(lease.expires_at_ms >= self.cluster_time_ms, "{context}");
                }
                for (job_id, token) in leases {
                    if lost.contains(job_id) {
                        assert_ne!(self.live.get(job_id), Some(token), "{context}: current lost");
                    }
                }
            }
            (
                Command::Ack { job_id, token, .. } | Command::AckLean { job_id, token, .. },
                Response::Acked,
            ) => {
                let current = self.live.get(job_id) == Some(token);
                let retry = self.acked.get(job_id) == Some(token);
                let late = self.swept.get(job_id) == Some(token);
                assert!(
                    current || retry || late,
                    "{context}: ack with a token that is not current"
                );
                self.live.remove(job_id);
                self.swept.remove(job_id);
                self.acked.insert(*job_id, *token);
            }
            (Command::Nack { job_id, token, .. }, Response::Nacked { .. })
            | (Command::Release { job_id, token }, Response::Released) => {
                assert_eq!(self.live.remove(job_id), Some(*token), "{context}");
            }
            (
                command @ (Command::Sweep | Command::SweepKeepingTokens { .. }),
                Response::Swept { requeued, dead },
            ) => {
                let keeps = matches!(command, Command::SweepKeepingTokens { .. });
                for job_id in requeued.iter().chain(dead) {
                    let token = self.live.remove(job_id);
                    assert!(token.is_some(), "{context}: swept a job not held");
                    if let (Some(token), true) = (token, keeps) {
                        self.swept.insert(*job_id, token);
                    }
                }
            }
            (
                Command::Ack { token, .. }
                | Command::AckLean { token, .. }
                | Command::Nack { token, .. }
                | Command::Release { token, .. },
                Response::Refused(Refusal::StaleToken { job_id, presented }),
            ) => {
                assert_eq!(token, presented, "{context}");
                assert_ne!(self.live.get(job_id), Some(presented), "{context}: current refused");
                if matches!(command, Command::Ack { .. } | Command::AckLean { .. }) {
                    assert_ne!(self.swept.get(job_id), Some(presented), "{context}: swept refused");
                }
            }
            (Command::PutSchedule { spec }, Response::ScheduleChanged) => {
                self.marks.entry(spec.name.clone()).or_insert(0);
                self.counters.entry(spec.name.clone()).or_insert((0, 0));
                let put =
                    self.puts.entry(spec.name.clone()).or_insert((false, self.cluster_time_ms));
                put.0 = spec.paused;
            }
            (Command::DeleteSchedule { name }, Response::ScheduleChanged) => {
                self.marks.remove(name);
                self.counters.remove(name);
                self.puts.remove(name);
            }
            (Command::SetPaused { name, paused }, Response::ScheduleChanged) => {
                let put = self.puts.get_mut(name);
                let Some(put) = put else { panic!("{context}: paused an unknown schedule") };
                put.0 = *paused;
            }
            (
                Command::ResumeSchedule { name, counted_after_ms, paused_through, .. },
                Response::ScheduleChanged,
            ) => {
                let (Some(put), Some(mark)) = (self.puts.get_mut(name), self.marks.get_mut(name))
                else {
                    panic!("{context}: resumed an unknown schedule")
                };
                let planned_after_ms =
                    if *mark > 0 { mark.saturating_mul(1_000).max(put.1) } else { put.1 };
                let through_ms = paused_through.saturating_mul(1_000);
                // Recorded only while paused, counted from where the
                // schedule is planned, after that and not after the entry.
                if put.0
                    && planned_after_ms == *counted_after_ms
                    && through_ms > planned_after_ms
                    && through_ms <= self.cluster_time_ms
                {
                    assert!(*paused_through > *mark, "{context}: a resume moved the mark back");
                    *mark = *paused_through;
                }
                put.0 = false;
            }
            // A wrapper of anything but one valid tick is refused as
            // invalid (the catch-all below).
            (Command::Planned { created_at_ms, command }, response)
                if !matches!(response, Response::Refused(Refusal::Invalid(_))) =>
            {
                let put = command.tick_schedule().and_then(|name| self.puts.get(name));
                match put {
                    // Planned from another schedule of the name: nothing.
                    Some((_, put_at)) if put_at != created_at_ms => {
                        assert_eq!(response, &Response::Tick(None), "{context}: a stale plan ran");
                    }
                    _ => self.command(command, response, epoch, context),
                }
            }
            (
                Command::Fire { schedule, bucket, .. } | Command::Skip { schedule, bucket, .. },
                Response::Tick(outcome),
            ) => {
                let mark = self.marks.get(schedule).copied();
                let Some(mark) = mark else { panic!("{context}: a tick of an unknown schedule") };
                match outcome {
                    Some(outcome) => {
                        assert!(*bucket > mark, "{context}: bucket {bucket} at or below {mark}");
                        self.marks.insert(schedule.clone(), *bucket);
                        self.fired(outcome);
                    }
                    None => assert!(*bucket <= mark, "{context}: a new bucket did nothing"),
                }
            }
            (
                Command::Fire { schedule, .. }
                | Command::Skip { schedule, .. }
                | Command::Trigger { schedule, .. },
                Response::Refused(Refusal::ScheduleNotFound { name }),
            )
            | (
                Command::DeleteSchedule { name: schedule }
                | Command::SetPaused { name: schedule, .. }
                | Command::ResumeSchedule { name: schedule, .. },
                Response::Refused(Refusal::ScheduleNotFound { name }),
            ) => {
                assert_eq!(schedule, name, "{context}");
                assert!(!self.marks.contains_key(name), "{context}: a known schedule not found");
            }
            (Command::Trigger { .. }, Response::Tick(Some(outcome))) => self.fired(outcome),
            (_, Response::Refused(Refusal::Invalid(_) | Refusal::NotFound { .. })) => {}
            (command, response) if answers(command, response) => {}
            (command, response) => panic!("{context}: {command:?} answered {response:?}"),
        }
    }

    /// A fired tick enqueued jobs: new ones take the next ids (a repeated
    /// idempotency key answers an older id).
    fn fired(&mut self, outcome: &TickOutcome) {
        if let TickOutcome::Fired { job_ids, .. } = outcome {
            let newest = job_ids.iter().copied().max().unwrap_or(0);
            self.highest_job_id = self.highest_job_id.max(newest);
        }
    }

    /// The model and the state agree on who holds what and on the marks.
    fn compare(&mut self, state: &State, context: &str) {
        assert_eq!(state.last_token(), self.highest_token, "{context}: last token");
        assert_eq!(state.last_job_id(), self.highest_job_id, "{context}: last job id");
        // A redrive (the only way back to no attempts) drops a kept lease.
        self.swept.retain(|job_id, _| {
            state.job(*job_id).is_some_and(|job| job.attempts > 0 || job.state != JobState::Ready)
        });
        for job in state.jobs(&JobFilter::default(), 0, usize::MAX) {
            let held = self.live.get(&job.id);
            if job.state == JobState::Claimed {
                let token = job.lease.as_ref().map(|lease| &lease.token);
                assert_eq!(held, token, "{context}: job {}", job.id);
            } else {
                assert!(held.is_none(), "{context}: {:?} job {} held", job.state, job.id);
            }
            if self.acked.contains_key(&job.id) {
                assert_eq!(job.state, JobState::Acked, "{context}: acked job {} moved", job.id);
            }
        }
        let held_jobs = self.live.keys().filter(|id| state.job(**id).is_none()).count();
        assert_eq!(held_jobs, 0, "{context}: a held job vanished");
        let marks: BTreeMap<String, u64> = state
            .schedules()
            .iter()
            .map(|(name, schedule)| (name.clone(), schedule.last_fired_bucket))
            .collect();
        assert_eq!(marks, self.marks, "{context}: fire marks");
        for (name, schedule) in state.schedules() {
            assert!(schedule.history.len() <= HISTORY_LEN, "{context}: history of {name}");
            let (fired, skipped) = self.counters.get(name).copied().unwrap_or((0, 0));
            assert!(schedule.fired_count >= fired, "{context}: fired count of {name} fell");
            assert!(schedule.skipped_count >= skipped, "{context}: skipped count of {name} fell");
            if let Some(record) = schedule.history.back()
                && let TickOutcome::Skipped { ticks, .. } = record.outcome
            {
                assert!(ticks >= 1, "{context}: a skip of no ticks");
            }
            self.counters.insert(name.clone(), (schedule.fired_count, schedule.skipped_count));
        }
    }
}

/// Whether `response` is the kind of answer `command` gets when it is not
/// refused (the cases `Model::command` does not follow in detail).
fn answers(command: &Command, response: &Response) -> bool {
    matches!(
        (command, response),
        (Command::Sweep, Response::Swept { .. })
            | (Command::Redrive { .. }, Response::Redriven(_))
            | (Command::Purge, Response::Purged(_))
            | (Command::SetPaused { .. }, Response::ScheduleChanged)
            | (Command::RegisterNode { .. } | Command::SetDraining { .. }, Response::NodeChanged)
            | (Command::Claim { .. }, Response::Claimed(_))
    )
}
