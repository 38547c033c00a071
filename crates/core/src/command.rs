//! The journal's command set. Every change to scheduler state is one of these,
//! wrapped in a [`Proposal`] that carries the proposer's clock.

use serde::{Deserialize, Serialize};

use crate::job::JobSpec;
use crate::limits::Limits;
use crate::schedule::{ScheduleSpec, SkipReason};

/// One Raft log payload: a command plus the proposer's wall-clock time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Proposer's wall clock, Unix milliseconds. Cluster time becomes
    /// `max(cluster time, now_ms)` before the command takes effect.
    pub now_ms: u64,
    /// What to do.
    pub command: Command,
}

/// Which dead jobs a redrive returns to ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RedriveTarget {
    /// Every dead job of the queue.
    Queue(String),
    /// These jobs, where dead (others are left alone and not counted).
    Ids(Vec<u64>),
}

/// A journal command (SPEC §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Validate, dedup by idempotency key, insert ready.
    Enqueue {
        /// The jobs, in order; ids are assigned in this order.
        jobs: Vec<JobSpec>,
    },
    /// Grant up to `max` ready, due, matching jobs a lease each.
    Claim {
        /// Worker id of the claimant.
        worker: String,
        /// Queue to claim from.
        queue: String,
        /// Most leases to grant (1 ..= max_batch).
        max: u32,
        /// Lease length; `None` = each job's own `lease_ttl_ms`.
        lease_ttl_ms: Option<u64>,
        /// The worker's tags: a job is claimable when all its tags are here.
        selector: Vec<String>,
    },
    /// Extend each lease whose token is exactly the current one.
    Refresh {
        /// Worker id of the holder.
        worker: String,
        /// `(job_id, token)` pairs.
        leases: Vec<(u64, u64)>,
        /// New lease length from now; `None` = each job's own `lease_ttl_ms`.
        lease_ttl_ms: Option<u64>,
    },
    /// Finish a job; only the current token is accepted.
    Ack {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
        /// Kept on the job as its result (at most `max_result_bytes`).
        result: Option<Vec<u8>>,
    },
    /// Fail an attempt: attempts+1, back to ready after backoff, or dead.
    Nack {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
        /// What went wrong (truncated to `max_error_bytes`).
        error: String,
        /// Overrides the backoff delay when set.
        retry_after_ms: Option<u64>,
    },
    /// Return a job to ready now, no attempt charged (drain).
    Release {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
    },
    /// Every lease with `expires_at_ms <= cluster time` returns to ready
    /// (attempts+1) or dead. Idempotent.
    Sweep,
    /// Dead jobs back to ready with attempts reset.
    Redrive {
        /// Which jobs.
        target: RedriveTarget,
    },
    /// Drop acked tombstones older than retention.
    Purge,
    /// Create a schedule, or replace the spec of an existing one (its
    /// fired-bucket mark and history are kept).
    PutSchedule {
        /// The schedule.
        spec: ScheduleSpec,
    },
    /// Delete a schedule (jobs it enqueued are untouched).
    DeleteSchedule {
        /// Schedule name.
        name: String,
    },
    /// Pause or resume a schedule.
    SetPaused {
        /// Schedule name.
        name: String,
        /// Paused when true.
        paused: bool,
    },
    /// Enqueue the schedule's job for `bucket` only if
    /// `bucket > last_fired_bucket` and the overlap policy allows (else
    /// record a skip with its reason); then advance `last_fired_bucket`.
    Fire {
        /// Schedule name.
        schedule: String,
        /// The tick's instant, Unix seconds.
        bucket: u64,
        /// For `target = each`: the nodes to enqueue one job for each.
        targets: Vec<u64>,
    },
    /// Record a tick deliberately not run and advance `last_fired_bucket`.
    Skip {
        /// Schedule name.
        schedule: String,
        /// The newest bucket the skip covers.
        bucket: u64,
        /// Why.
        reason: SkipReason,
        /// How many ticks it stands for.
        ticks: u64,
    },
    /// Run a schedule's job now, outside its ticks; honours the overlap
    /// policy unless `force`. Does not touch `last_fired_bucket`.
    Trigger {
        /// Schedule name.
        schedule: String,
        /// Run even if the previous instance is unfinished.
        force: bool,
        /// For `target = each`: the nodes.
        targets: Vec<u64>,
    },
    /// Record a node's tags (nodes register on start).
    RegisterNode {
        /// Node id.
        node: u64,
        /// Its tags.
        tags: Vec<String>,
    },
    /// Mark a node draining (no new targets for it) or not.
    SetDraining {
        /// Node id.
        node: u64,
        /// Draining when true.
        draining: bool,
    },
    /// Several independent commands in one log entry, applied in order, each
    /// answered on its own (one refused command does not refuse the others).
    /// The journal groups concurrent proposals this way so they share one
    /// Raft round and one log flush. Batches do not nest.
    Batch {
        /// The commands.
        #[serde(deserialize_with = "crate::nesting::nested")]
        commands: Vec<Command>,
    },
    /// `Claim`, answered once: a retry with the same `request_id` (from the
    /// same worker) gets the leases the first try granted, not new ones.
    ClaimOnce {
        /// The client's name of this claim; scoped by the worker.
        request_id: String,
        /// Worker id of the claimant.
        worker: String,
        /// Queue to claim from.
        queue: String,
        /// Most leases to grant (1 ..= max_batch).
        max: u32,
        /// Lease length; `None` = each job's own `lease_ttl_ms`.
        lease_ttl_ms: Option<u64>,
        /// The worker's tags.
        selector: Vec<String>,
    },
    /// `Trigger`, answered once: a retry with the same `request_id` gets
    /// the first answer, and does not run the schedule again.
    TriggerOnce {
        /// The client's name of this trigger; scoped by the schedule.
        request_id: String,
        /// Schedule name.
        schedule: String,
        /// Run even if the previous instance is unfinished.
        force: bool,
        /// For `target = each`: the nodes.
        targets: Vec<u64>,
    },
    /// `Fire` for a `target = each` schedule, judged per member: a job for
    /// each live member in `targets` whose previous instance is finished
    /// (with `overlap = skip`, a member still running the last tick is
    /// skipped alone), and the members in `offline` recorded as skipped
    /// (`target_offline`), so a member that is down never blocks the
    /// others' runs.
    FireEach {
        /// Schedule name.
        schedule: String,
        /// The tick's bucket.
        bucket: u64,
        /// The live members to run it on.
        targets: Vec<u64>,
        /// The members that would run it but are down.
        offline: Vec<u64>,
    },
    /// `Sweep`, honouring every lease granted under an earlier term until
    /// `max_clock_offset_ms` past its `expires_at`: the leader that granted
    /// it may have stamped time up to that much apart from this one's (see
    /// docs/safety.md). The leader proposes this; a plain `Sweep` is this
    /// with 0.
    SweepBounded {
        /// The cluster's clock bound, from the proposing leader.
        max_clock_offset_ms: u64,
    },
    /// `command` judged by `limits`: the leader wraps every entry it
    /// proposes in the limits of its own build, so every replica validates
    /// and fills defaults by the same numbers whatever its binary's
    /// [`Limits::default`] (a rolling upgrade that changes a limit cannot
    /// make replicas disagree). Only the leader makes these: one inside
    /// another, or inside a batch, is refused.
    Ruled {
        /// The limits in force for `command`.
        limits: Limits,
        /// The command (a batch, or one command).
        #[serde(deserialize_with = "crate::nesting::nested")]
        command: Box<Command>,
    },
    /// `Ack` whose tombstone keeps no payload: the job's bytes are the
    /// producer's input to the worker, not part of the audit record (who
    /// finished it, with which token, when, and what it reported), and
    /// they are most of what a day of tombstones would hold. A leader
    /// writes every ack as this once every member decodes format 3.
    ///
    /// New variants go last: the log and the wire encode a variant by its
    /// position, so one inserted before others would renumber them.
    AckLean {
        /// The job.
        job_id: u64,
        /// Fencing token of the lease.
        token: u64,
        /// Kept on the job as its result (at most `max_result_bytes`).
        result: Option<Vec<u8>>,
    },
    /// `FireEach` that keeps the unfinished instances of the members in
    /// `offline` (down or draining) watched, not only the targeted
    /// members': with `overlap = skip` such a member gets no second job
    /// beside its last one when it is back. A `FireEach` forgets the
    /// instances of members it does not target. A leader writes every
    /// `FireEach` as this once every member decodes format 4.
    FireEachTracked {
        /// Schedule name.
        schedule: String,
        /// The tick's bucket.
        bucket: u64,
        /// The live members to run it on.
        targets: Vec<u64>,
        /// The members that would run it but are down.
        offline: Vec<u64>,
    },
    /// `PutSchedule` that, when it changes an existing schedule's cron
    /// expression or timezone, plans the schedule from the put: its
    /// `created_at_ms` becomes the entry's time, so no tick of the new
    /// timing from before the put is fired or counted as missed (a
    /// `PutSchedule` kept the first put's time, and the leader then fired
    /// the new timing's ticks of the past hour at once). Its mark, history,
    /// counters and watched jobs are kept either way. A leader writes every
    /// `PutSchedule` as this once every member decodes format 4.
    PutScheduleRetimed {
        /// The schedule.
        spec: ScheduleSpec,
    },
    /// `SweepBounded` that keeps each lease it takes back on its job, so
    /// an ack with that lease's token still counts until the job is granted
    /// again (SPEC §3: an expired lease not yet re-granted still counts).
    /// A `SweepBounded` drops the lease, and such an ack is refused as
    /// stale. A refresh, nack or release with a swept token is refused
    /// either way: the job is ready for anyone, so the worker must stop. A
    /// leader writes every `SweepBounded` as this once every member decodes
    /// format 5.
    SweepKeepingTokens {
        /// The cluster's clock bound, from the proposing leader.
        max_clock_offset_ms: u64,
    },
    /// Resumes a schedule, first recording as skipped (reason `paused`)
    /// the ticks that fell due while it was paused and left no record in
    /// the journal: those after `counted_after_ms` through
    /// `paused_through`, `paused_ticks` of them, as the proposer counted
    /// them ([`crate::schedule::resume_command`]). Such ticks are those a
    /// paused schedule had on the broadcast path, or while no leader
    /// planned it; a plain resume left them to the leader, which planned
    /// them as missed and ran one or all of them by the catch-up policy.
    /// They are recorded only if, when this applies, the schedule is still
    /// paused (one resumed meanwhile keeps its due ticks) and still planned
    /// from `counted_after_ms` (a record or a put since then makes the
    /// count stale: the schedule is then only resumed), and only for a
    /// bucket after that instant and not after the entry's own time.
    /// Written only once every member decodes format 6; a plain
    /// `SetPaused` resume before.
    ResumeSchedule {
        /// Schedule name.
        name: String,
        /// The instant the ticks were counted after (the schedule's
        /// [`crate::schedule::Schedule::planned_after_ms`] as the proposer
        /// read it).
        counted_after_ms: u64,
        /// The newest tick due while paused, as a bucket; 0 for none.
        paused_through: u64,
        /// How many ticks that record stands for.
        paused_ticks: u64,
    },
    /// A tick of a schedule (`Fire`, `FireEach`, `FireEachTracked` or
    /// `Skip`) as planned from the schedule put at `created_at_ms`: it
    /// applies only while the schedule of that name is still that one.
    /// Once the schedule was deleted and put again under the same name, or
    /// put with another timing (`PutScheduleRetimed`), since the tick was
    /// planned, it answers `Tick(None)` and changes nothing: a bare tick
    /// would run the new schedule's template for a tick of the old one, or
    /// (a skip) move the new schedule's mark for it. A leader writes its
    /// ticks as this once every member decodes format 7; below it the bare
    /// tick.
    Planned {
        /// The planning schedule's `created_at_ms`
        /// ([`crate::schedule::Schedule::created_at_ms`]).
        created_at_ms: u64,
        /// The tick.
        #[serde(deserialize_with = "crate::nesting::nested")]
        command: Box<Command>,
    },
}

/// The newest log format this build writes and reads. Format 1 is the
/// journal's first command set; format 2 adds [`Command::Ruled`],
/// [`Command::FireEach`], [`Command::ClaimOnce`], [`Command::TriggerOnce`]
/// and [`Command::SweepBounded`]; format 3 adds [`Command::AckLean`] and
/// writes every ack as one; format 4 adds [`Command::FireEachTracked`] and
/// [`Command::PutScheduleRetimed`] and writes every `FireEach` and
/// `PutSchedule` as them; format 5 adds [`Command::SweepKeepingTokens`]
/// and writes every sweep as one; format 6 adds
/// [`Command::ResumeSchedule`]; format 7 adds [`Command::Planned`] and
/// writes every tick of the cron driver and the broadcast path as one. A
/// leader writes the format every member
/// advertises ([`agreed_log_format`]), so no replica meets an entry it
/// cannot decode.
pub const LOG_FORMAT: u32 = 7;

/// The newest format every member decodes: the least of this build's and
/// each member's advertised one. A member that advertised no format (a
/// build before adverts carried it, shown as 0) reads format 1; a member
/// never heard at all is assumed current (a node that joins is checked
/// when it joins, and adverts are kept across restarts).
pub fn agreed_log_format(own: u32, members: impl IntoIterator<Item = Option<u32>>) -> u32 {
    members
        .into_iter()
        .map(|advertised| match advertised {
            Some(0) => 1,
            Some(format) => format,
            None => own,
        })
        .fold(own, u32::min)
}

/// The largest `max_clock_offset_ms` a `SweepBounded` may carry.
pub const MAX_CLOCK_OFFSET_MS: u64 = 60_000;

/// Most commands in one [`Command::Batch`].
pub const MAX_BATCH_COMMANDS: usize = 256;

impl Command {
    /// This command as a log of `format` writes it. At format 5 a
    /// `SweepBounded` is a [`Command::SweepKeepingTokens`] (an ack with a
    /// swept lease's token counts until the job is granted again); below 5
    /// it is a plain `SweepBounded`. At format 4 a
    /// `FireEach` is a [`Command::FireEachTracked`] (it keeps watching the
    /// unfinished instances of members it does not target); below 4 a
    /// `FireEachTracked` is a plain `FireEach`. At format 3 an ack is
    /// an [`Command::AckLean`] (its tombstone keeps no payload). Below 3 an
    /// `AckLean` is a plain `Ack`. At format 1, `ClaimOnce` and
    /// `TriggerOnce` lose their request id (a retry is not recognised),
    /// `SweepBounded` sweeps without the clock bound, and `FireEach` makes
    /// jobs for its live targets without recording the offline ones; a
    /// `Ruled` command is unwrapped. What the older format lacks is lost
    /// for as long as an older build is a member, and nothing else changes.
    pub fn for_log_format(self, format: u32) -> Command {
        match self {
            Command::Ack { job_id, token, result } if format >= 3 => {
                Command::AckLean { job_id, token, result }
            }
            Command::AckLean { job_id, token, result } if format < 3 => {
                Command::Ack { job_id, token, result }
            }
            Command::ClaimOnce { request_id: _, worker, queue, max, lease_ttl_ms, selector }
                if format < 2 =>
            {
                Command::Claim { worker, queue, max, lease_ttl_ms, selector }
            }
            Command::TriggerOnce { request_id: _, schedule, force, targets } if format < 2 => {
                Command::Trigger { schedule, force, targets }
            }
            Command::SweepBounded { .. } | Command::SweepKeepingTokens { .. } if format < 2 => {
                Command::Sweep
            }
            Command::SweepBounded { max_clock_offset_ms } if format >= 5 => {
                Command::SweepKeepingTokens { max_clock_offset_ms }
            }
            Command::SweepKeepingTokens { max_clock_offset_ms } if format < 5 => {
                Command::SweepBounded { max_clock_offset_ms }
            }
            Command::FireEach { schedule, bucket, targets, offline: _ }
            | Command::FireEachTracked { schedule, bucket, targets, offline: _ }
                if format < 2 =>
            {
                Command::Fire { schedule, bucket, targets }
            }
            Command::FireEach { schedule, bucket, targets, offline } if format >= 4 => {
                Command::FireEachTracked { schedule, bucket, targets, offline }
            }
            Command::FireEachTracked { schedule, bucket, targets, offline } if format < 4 => {
                Command::FireEach { schedule, bucket, targets, offline }
            }
            Command::PutSchedule { spec } if format >= 4 => Command::PutScheduleRetimed { spec },
            Command::PutScheduleRetimed { spec } if format < 4 => Command::PutSchedule { spec },
            Command::ResumeSchedule { name, .. } if format < 6 => {
                Command::SetPaused { name, paused: false }
            }
            Command::Planned { command, .. } if format < 7 => command.for_log_format(format),
            Command::Planned { created_at_ms, command } => Command::Planned {
                created_at_ms,
                command: Box::new(command.for_log_format(format)),
            },
            Command::Ruled { command, .. } if format < 2 => command.for_log_format(format),
            Command::Ruled { limits, command } => {
                Command::Ruled { limits, command: Box::new(command.for_log_format(format)) }
            }
            Command::Batch { commands } => Command::Batch {
                commands: commands.into_iter().map(|c| c.for_log_format(format)).collect(),
            },
            other => other,
        }
    }

    /// The schedule a tick (`Fire`, `FireEach`, `FireEachTracked` or
    /// `Skip`) is of; `None` for any other command.
    pub fn tick_schedule(&self) -> Option<&str> {
        match self {
            Command::Fire { schedule, .. }
            | Command::FireEach { schedule, .. }
            | Command::FireEachTracked { schedule, .. }
            | Command::Skip { schedule, .. } => Some(schedule),
            _ => None,
        }
    }

    /// Roughly how many bytes the command takes encoded: every payload,
    /// string and list it carries, plus a fixed allowance for its numbers.
    /// The journal bounds a merged log entry by this, so it must count
    /// every field a caller can fill (a nack's error and a job's tags
    /// weigh as much as a payload). The match names every variant, so a
    /// new one must say what it weighs.
    pub fn size_hint(&self) -> usize {
        // A length prefix and the bytes, for each string or byte list.
        fn text(text: &str) -> usize {
            8 + text.len()
        }
        fn bytes(bytes: &[u8]) -> usize {
            8 + bytes.len()
        }
        fn maybe(option: &Option<String>) -> usize {
            option.as_deref().map_or(1, |t| 1 + text(t))
        }
        fn texts(texts: &[String]) -> usize {
            8 + texts.iter().map(|t| text(t)).sum::<usize>()
        }
        fn numbers(list: &[u64]) -> usize {
            8 + list.len() * 8
        }
        // The variant, the numbers, and the options' tags.
        const FIXED: usize = 64;
        let variable = match self {
            Command::Enqueue { jobs } => jobs
                .iter()
                .map(|job| {
                    FIXED
                        + text(&job.queue)
                        + bytes(&job.payload)
                        + maybe(&job.idempotency_key)
                        + texts(&job.tags)
                })
                .sum(),
            Command::Claim { worker, queue, selector, .. } => {
                text(worker) + text(queue) + texts(selector)
            }
            Command::ClaimOnce { request_id, worker, queue, selector, .. } => {
                text(request_id) + text(worker) + text(queue) + texts(selector)
            }
            Command::Refresh { worker, leases, .. } => text(worker) + 8 + leases.len() * 16,
            Command::Ack { result, .. } | Command::AckLean { result, .. } => {
                result.as_deref().map_or(0, bytes)
            }
            Command::Nack { error, .. } => text(error),
            Command::Release { .. }
            | Command::Sweep
            | Command::Purge
            | Command::SweepBounded { .. }
            | Command::SweepKeepingTokens { .. }
            | Command::SetDraining { .. } => 0,
            Command::Redrive { target: RedriveTarget::Queue(queue) } => text(queue),
            Command::Redrive { target: RedriveTarget::Ids(ids) } => numbers(ids),
            Command::PutSchedule { spec } | Command::PutScheduleRetimed { spec } => {
                let template = &spec.template;
                FIXED
                    + text(&spec.name)
                    + text(&spec.cron)
                    + text(&spec.timezone)
                    + maybe(&template.queue)
                    + bytes(&template.payload)
                    + texts(&template.tags)
                    + maybe(&template.command)
            }
            Command::DeleteSchedule { name }
            | Command::SetPaused { name, .. }
            | Command::ResumeSchedule { name, .. } => text(name),
            Command::Fire { schedule, targets, .. }
            | Command::Trigger { schedule, targets, .. } => text(schedule) + numbers(targets),
            Command::FireEach { schedule, targets, offline, .. }
            | Command::FireEachTracked { schedule, targets, offline, .. } => {
                text(schedule) + numbers(targets) + numbers(offline)
            }
            Command::Skip { schedule, .. } => text(schedule),
            Command::TriggerOnce { request_id, schedule, targets, .. } => {
                text(request_id) + text(schedule) + numbers(targets)
            }
            Command::RegisterNode { tags, .. } => texts(tags),
            Command::Batch { commands } => {
                8 + commands.iter().map(Command::size_hint).sum::<usize>()
            }
            Command::Ruled { command, .. } => FIXED + command.size_hint(),
            Command::Planned { command, .. } => command.size_hint(),
        };
        FIXED + variable
    }

    /// The most bytes this command's answer can take, when a lease it
    /// grants takes at most `grant_bytes` ([`Limits::grant_bytes_bound`]):
    /// a follower's merged batch goes to the leader as one message and its
    /// answers come back as one, so what a claim could hand out counts.
    pub fn answer_bound(&self, grant_bytes: usize) -> usize {
        const FIXED: usize = 64;
        let leases = |max: u32| usize::try_from(max).unwrap_or(usize::MAX);
        match self {
            Command::Claim { max, .. } | Command::ClaimOnce { max, .. } => {
                FIXED.saturating_add(leases(*max).saturating_mul(grant_bytes))
            }
            Command::Enqueue { jobs } => FIXED + jobs.len() * FIXED,
            Command::Refresh { leases, .. } => FIXED + leases.len() * FIXED,
            Command::Batch { commands } => commands
                .iter()
                .fold(FIXED, |sum, c| sum.saturating_add(c.answer_bound(grant_bytes))),
            Command::Ruled { command, .. } => {
                FIXED.saturating_add(command.answer_bound(grant_bytes))
            }
            _ => FIXED,
        }
    }

    /// The command with every claim in it asking for at most `most`
    /// leases (a claim grants up to its `max`, so fewer is an answer it
    /// may give): what a follower forwards, so the answer it gets back
    /// fits in one message.
    pub fn with_claims_capped(self, most: u32) -> Command {
        match self {
            Command::Claim { worker, queue, max, lease_ttl_ms, selector } => {
                Command::Claim { worker, queue, max: max.min(most), lease_ttl_ms, selector }
            }
            Command::ClaimOnce { request_id, worker, queue, max, lease_ttl_ms, selector } => {
                let max = max.min(most);
                Command::ClaimOnce { request_id, worker, queue, max, lease_ttl_ms, selector }
            }
            Command::Batch { commands } => Command::Batch {
                commands: commands.into_iter().map(|c| c.with_claims_capped(most)).collect(),
            },
            Command::Ruled { limits, command } => {
                Command::Ruled { limits, command: Box::new(command.with_claims_capped(most)) }
            }
            other => other,
        }
    }

    /// The command with a nack's error cut to `limits.max_error_bytes`, as
    /// `apply` would cut it: the cut is made before the command enters the
    /// log, so a long error costs the log, the wire and every replica
    /// nothing, and the applied state is the same.
    pub fn with_texts_cut(self, limits: &Limits) -> Command {
        match self {
            Command::Nack { job_id, token, error, retry_after_ms }
                if error.len() > limits.max_error_bytes =>
            {
                let error = crate::validate::truncate_text(&error, limits.max_error_bytes);
                Command::Nack { job_id, token, error, retry_after_ms }
            }
            Command::Batch { commands } => Command::Batch {
                commands: commands.into_iter().map(|c| c.with_texts_cut(limits)).collect(),
            },
            Command::Ruled { limits: ruled, command } => {
                let command = Box::new(command.with_texts_cut(&ruled));
                Command::Ruled { limits: ruled, command }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> String {
        "x".repeat(len)
    }

    fn texts(count: usize, len: usize) -> Vec<String> {
        (0..count).map(|_| text(len)).collect()
    }

    /// Each command filled to what validation lets a caller send.
    fn filled() -> Vec<Command> {
        let limits = Limits::default();
        let (tags, text_len) = (limits.max_tags, limits.max_text_bytes);
        let job = JobSpec {
            queue: text(64),
            payload: vec![7; 16],
            idempotency_key: Some(text(text_len)),
            tags: texts(tags, text_len),
            ..JobSpec::default()
        };
        let spec = ScheduleSpec {
            name: text(64),
            cron: text(10_000),
            timezone: text(1_000),
            template: crate::schedule::JobTemplate {
                queue: Some(text(64)),
                payload: vec![1; 1_000],
                tags: texts(tags, text_len),
                command: Some(text(crate::validate::MAX_COMMAND_BYTES)),
                ..Default::default()
            },
            ..ScheduleSpec::default()
        };
        let ids: Vec<u64> = (1..=1_000).collect();
        vec![
            Command::Enqueue { jobs: vec![job; limits.max_batch] },
            Command::Nack { job_id: 1, token: 1, error: text(1 << 20), retry_after_ms: Some(1) },
            Command::Ack { job_id: 1, token: 1, result: Some(vec![0; limits.max_result_bytes]) },
            Command::AckLean { job_id: 1, token: 1, result: Some(vec![0; 100]) },
            Command::ClaimOnce {
                request_id: text(text_len),
                worker: text(text_len),
                queue: text(64),
                max: 1,
                lease_ttl_ms: None,
                selector: texts(tags, text_len),
            },
            Command::Refresh {
                worker: text(text_len),
                leases: ids.iter().map(|&id| (id, id)).collect(),
                lease_ttl_ms: Some(1),
            },
            Command::Redrive { target: RedriveTarget::Ids(ids.clone()) },
            Command::PutSchedule { spec },
            Command::FireEach {
                schedule: text(64),
                bucket: 1,
                targets: ids.clone(),
                offline: ids.clone(),
            },
            Command::FireEachTracked {
                schedule: text(64),
                bucket: 1,
                targets: ids.clone(),
                offline: ids.clone(),
            },
            Command::TriggerOnce {
                request_id: text(text_len),
                schedule: text(64),
                force: true,
                targets: ids,
            },
            Command::RegisterNode { node: 1, tags: texts(tags, text_len) },
            Command::Release { job_id: 1, token: 1 },
        ]
    }

    #[test]
    fn every_field_a_caller_fills_is_weighed() {
        let commands = filled();
        let batch = Command::Batch { commands: commands.clone() };
        let ruled = Command::Ruled { limits: Limits::default(), command: Box::new(batch.clone()) };
        for (index, command) in commands.iter().chain([&batch, &ruled]).enumerate() {
            let encoded = bincode::serialize(command).expect("encodes").len();
            let hint = command.size_hint();
            assert!(hint >= encoded, "command {index}: {hint} < {encoded} encoded bytes");
            assert!(hint <= 2 * encoded + 256, "command {index}: {hint} far above {encoded}");
        }
    }

    #[test]
    fn a_nack_error_is_cut_before_the_log_as_apply_would_cut_it() {
        let limits = Limits::default();
        // Multi-byte characters across the limit: the cut lands on a boundary.
        let error = "é".repeat(limits.max_error_bytes);
        let nack =
            Command::Nack { job_id: 3, token: 4, error: error.clone(), retry_after_ms: None };
        let expected = crate::validate::truncate_text(&error, limits.max_error_bytes);
        assert!(
            expected.len() <= limits.max_error_bytes && expected.len() + 2 > limits.max_error_bytes
        );
        let cut = |command: Command| command.with_texts_cut(&limits);
        let Command::Nack { error: kept, job_id: 3, token: 4, .. } = cut(nack.clone()) else {
            panic!("still the nack")
        };
        assert_eq!(kept, expected);
        let Command::Batch { commands } = cut(Command::Batch { commands: vec![nack.clone()] })
        else {
            panic!("still a batch")
        };
        assert!(matches!(&commands[0], Command::Nack { error, .. } if *error == expected));
        let ruled = Command::Ruled { limits: limits.clone(), command: Box::new(nack) };
        let Command::Ruled { command, .. } = cut(ruled) else { panic!("still ruled") };
        assert!(matches!(*command, Command::Nack { ref error, .. } if *error == expected));
        let short =
            Command::Nack { job_id: 1, token: 1, error: "oops".into(), retry_after_ms: None };
        assert_eq!(cut(short.clone()), short);
    }

    #[test]
    fn the_agreed_format_is_the_least_any_member_reads() {
        assert_eq!(agreed_log_format(2, []), 2);
        assert_eq!(agreed_log_format(2, [Some(2), None]), 2, "unheard: assumed current");
        assert_eq!(agreed_log_format(2, [Some(2), Some(0)]), 1, "no format advertised: 1");
        assert_eq!(agreed_log_format(2, [Some(3)]), 2, "never above this build's");
        assert_eq!(agreed_log_format(1, [Some(2)]), 1);
    }

    #[test]
    fn at_format_1_only_format_1_variants_remain() {
        let claim = Command::ClaimOnce {
            request_id: "r".into(),
            worker: "w".into(),
            queue: "q".into(),
            max: 2,
            lease_ttl_ms: Some(5_000),
            selector: vec!["eu".into()],
        };
        let fire = Command::FireEach {
            schedule: "s".into(),
            bucket: 9,
            targets: vec![1, 2],
            offline: vec![3],
        };
        let ruled = Command::Ruled {
            limits: Limits::default(),
            command: Box::new(Command::Batch {
                commands: vec![
                    claim.clone(),
                    fire.clone(),
                    Command::SweepBounded { max_clock_offset_ms: 500 },
                    Command::TriggerOnce {
                        request_id: "t".into(),
                        schedule: "s".into(),
                        force: true,
                        targets: vec![],
                    },
                    Command::Purge,
                ],
            }),
        };
        let expected = Command::Batch {
            commands: vec![
                Command::Claim {
                    worker: "w".into(),
                    queue: "q".into(),
                    max: 2,
                    lease_ttl_ms: Some(5_000),
                    selector: vec!["eu".into()],
                },
                Command::Fire { schedule: "s".into(), bucket: 9, targets: vec![1, 2] },
                Command::Sweep,
                Command::Trigger { schedule: "s".into(), force: true, targets: vec![] },
                Command::Purge,
            ],
        };
        assert_eq!(ruled.clone().for_log_format(1), expected);
        assert_eq!(ruled.clone().for_log_format(3), ruled, "format 3 keeps them all");
        assert_eq!(claim.clone().for_log_format(2), claim);
    }

    /// The log and the node-to-node wire encode a command's variant by its
    /// position (bincode): an older build reads the same number as the same
    /// command only if no variant moved. Every variant's number is pinned
    /// here; a new one goes last, with the next number.
    #[test]
    fn every_variant_keeps_its_number_on_the_wire() {
        let s = String::new;
        let pinned: Vec<(u32, Command)> = vec![
            (0, Command::Enqueue { jobs: vec![] }),
            (
                1,
                Command::Claim {
                    worker: s(),
                    queue: s(),
                    max: 1,
                    lease_ttl_ms: None,
                    selector: vec![],
                },
            ),
            (2, Command::Refresh { worker: s(), leases: vec![], lease_ttl_ms: None }),
            (3, Command::Ack { job_id: 1, token: 1, result: None }),
            (4, Command::Nack { job_id: 1, token: 1, error: s(), retry_after_ms: None }),
            (5, Command::Release { job_id: 1, token: 1 }),
            (6, Command::Sweep),
            (7, Command::Redrive { target: RedriveTarget::Ids(vec![]) }),
            (8, Command::Purge),
            (
                9,
                Command::PutSchedule {
                    spec: ScheduleSpec {
                        name: s(),
                        cron: s(),
                        timezone: s(),
                        template: Default::default(),
                        overlap: Default::default(),
                        catchup: Default::default(),
                        catchup_window_ms: 0,
                        catchup_max: 0,
                        target: Default::default(),
                        paused: false,
                    },
                },
            ),
            (10, Command::DeleteSchedule { name: s() }),
            (11, Command::SetPaused { name: s(), paused: true }),
            (12, Command::Fire { schedule: s(), bucket: 1, targets: vec![] }),
            (13, Command::Skip { schedule: s(), bucket: 1, reason: SkipReason::Overlap, ticks: 1 }),
            (14, Command::Trigger { schedule: s(), force: false, targets: vec![] }),
            (15, Command::RegisterNode { node: 1, tags: vec![] }),
            (16, Command::SetDraining { node: 1, draining: true }),
            (17, Command::Batch { commands: vec![] }),
            (
                18,
                Command::ClaimOnce {
                    request_id: s(),
                    worker: s(),
                    queue: s(),
                    max: 1,
                    lease_ttl_ms: None,
                    selector: vec![],
                },
            ),
            (
                19,
                Command::TriggerOnce {
                    request_id: s(),
                    schedule: s(),
                    force: false,
                    targets: vec![],
                },
            ),
            (20, Command::FireEach { schedule: s(), bucket: 1, targets: vec![], offline: vec![] }),
            (21, Command::SweepBounded { max_clock_offset_ms: 1 }),
            (22, Command::Ruled { limits: Limits::default(), command: Box::new(Command::Sweep) }),
            (23, Command::AckLean { job_id: 1, token: 1, result: None }),
            (
                24,
                Command::FireEachTracked {
                    schedule: s(),
                    bucket: 1,
                    targets: vec![],
                    offline: vec![],
                },
            ),
            (25, Command::PutScheduleRetimed { spec: ScheduleSpec::default() }),
            (26, Command::SweepKeepingTokens { max_clock_offset_ms: 1 }),
            (
                27,
                Command::ResumeSchedule {
                    name: s(),
                    counted_after_ms: 1,
                    paused_through: 1,
                    paused_ticks: 1,
                },
            ),
            (28, Command::Planned { created_at_ms: 1, command: Box::new(Command::Sweep) }),
        ];
        for (number, command) in pinned {
            let bytes = bincode::serialize(&command).expect("encodes");
            let written = bytes.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            assert_eq!(written, Some(number), "{command:?}");
        }
    }

    #[test]
    fn from_format_3_an_ack_keeps_no_payload_and_below_it_is_a_plain_ack() {
        let ack = Command::Ack { job_id: 4, token: 9, result: Some(b"out".to_vec()) };
        let lean = Command::AckLean { job_id: 4, token: 9, result: Some(b"out".to_vec()) };
        let ruled = |command: Command| Command::Ruled {
            limits: Limits::default(),
            command: Box::new(Command::Batch { commands: vec![command, Command::Purge] }),
        };
        assert_eq!(ruled(ack.clone()).for_log_format(3), ruled(lean.clone()));
        assert_eq!(ruled(lean.clone()).for_log_format(2), ruled(ack.clone()));
        assert_eq!(
            ruled(lean.clone()).for_log_format(1),
            Command::Batch { commands: vec![ack.clone(), Command::Purge] }
        );
        assert_eq!(lean.clone().for_log_format(3), lean);
        assert_eq!(ack.clone().for_log_format(2), ack);
    }

    #[test]
    fn from_format_4_fire_each_and_put_schedule_are_their_new_forms_and_below_it_plain() {
        let (schedule, targets, offline) = ("s".to_string(), vec![1, 2], vec![3]);
        let plain = Command::FireEach {
            schedule: schedule.clone(),
            bucket: 9,
            targets: targets.clone(),
            offline: offline.clone(),
        };
        let tracked = Command::FireEachTracked {
            schedule: schedule.clone(),
            bucket: 9,
            targets: targets.clone(),
            offline,
        };
        let ruled = |command: Command| Command::Ruled {
            limits: Limits::default(),
            command: Box::new(command),
        };
        assert_eq!(ruled(plain.clone()).for_log_format(4), ruled(tracked.clone()));
        assert_eq!(ruled(tracked.clone()).for_log_format(3), ruled(plain.clone()));
        assert_eq!(tracked.clone().for_log_format(4), tracked);
        assert_eq!(plain.clone().for_log_format(3), plain);
        assert_eq!(tracked.for_log_format(1), Command::Fire { schedule, bucket: 9, targets });
        let spec = ScheduleSpec { name: "s".into(), ..ScheduleSpec::default() };
        let put = Command::PutSchedule { spec: spec.clone() };
        let retimed = Command::PutScheduleRetimed { spec };
        assert_eq!(ruled(put.clone()).for_log_format(4), ruled(retimed.clone()));
        assert_eq!(ruled(retimed.clone()).for_log_format(3), ruled(put.clone()));
        assert_eq!(retimed.clone().for_log_format(1), put);
    }

    /// At format 5 a sweep keeps the tokens it takes back; below it the
    /// older sweeps are written, down to the plain one at format 1.
    #[test]
    fn a_sweep_keeps_its_tokens_from_format_5() {
        let bounded = Command::SweepBounded { max_clock_offset_ms: 500 };
        let keeping = Command::SweepKeepingTokens { max_clock_offset_ms: 500 };
        let ruled = |command: Command| Command::Ruled {
            limits: Limits::default(),
            command: Box::new(Command::Batch { commands: vec![command] }),
        };
        assert_eq!(ruled(bounded.clone()).for_log_format(5), ruled(keeping.clone()));
        assert_eq!(ruled(keeping.clone()).for_log_format(4), ruled(bounded.clone()));
        assert_eq!(keeping.clone().for_log_format(5), keeping);
        assert_eq!(bounded.clone().for_log_format(4), bounded);
        assert_eq!(keeping.for_log_format(1), Command::Sweep);
    }

    /// From format 6 a resume records the ticks due while paused; below
    /// it, it is a plain resume.
    #[test]
    fn a_resume_records_its_paused_ticks_from_format_6() {
        let resume = Command::ResumeSchedule {
            name: "s".into(),
            counted_after_ms: 1_000,
            paused_through: 60,
            paused_ticks: 3,
        };
        let plain = Command::SetPaused { name: "s".into(), paused: false };
        let ruled = |command: Command| Command::Ruled {
            limits: Limits::default(),
            command: Box::new(Command::Batch { commands: vec![command] }),
        };
        assert_eq!(ruled(resume.clone()).for_log_format(6), ruled(resume.clone()));
        assert_eq!(ruled(resume.clone()).for_log_format(5), ruled(plain.clone()));
        assert_eq!(resume.for_log_format(1), plain);
    }

    /// From format 7 a tick names the schedule it was planned from; below
    /// it, it is the bare tick, itself in the older format's form.
    #[test]
    fn a_tick_names_its_schedule_from_format_7() {
        let each = |tracked: bool| {
            let (schedule, targets, offline) = ("s".to_string(), vec![1], vec![2]);
            match tracked {
                true => Command::FireEachTracked { schedule, bucket: 60, targets, offline },
                false => Command::FireEach { schedule, bucket: 60, targets, offline },
            }
        };
        let planned = |command: Command| Command::Planned {
            created_at_ms: 1_000,
            command: Box::new(command),
        };
        let ruled = |command: Command| Command::Ruled {
            limits: Limits::default(),
            command: Box::new(Command::Batch { commands: vec![command] }),
        };
        assert_eq!(
            ruled(planned(each(false))).for_log_format(7),
            ruled(planned(each(true))),
            "format 7 keeps the wrapper and writes the tick in its own form"
        );
        assert_eq!(ruled(planned(each(true))).for_log_format(6), ruled(each(true)));
        assert_eq!(ruled(planned(each(true))).for_log_format(3), ruled(each(false)));
        assert_eq!(planned(each(false)).tick_schedule(), None, "a wrapper is no tick itself");
        assert_eq!(each(false).tick_schedule(), Some("s"));
    }
}
