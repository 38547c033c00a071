//! Validation of every field a command carries, against [`crate::Limits`].
//! The server calls it before proposing (so bad input changes nothing and
//! gets a clear error) and `apply` calls it again with the default limits (so
//! a replica never trusts the proposer).
//!
//! Fields are named as the API spells them, with indexes into lists
//! (`jobs[3].queue`, `selector[2]`, `leases[1].job_id`), so a client can find
//! the offending value without guessing. Validation stops at the first
//! problem: one clear message beats a list nobody reads.

use std::collections::BTreeSet;
use std::fmt::Display;

use serde::{Deserialize, Serialize};

use crate::command::{Command, RedriveTarget};
use crate::job::{Backoff, JobSpec};
use crate::limits::Limits;
use crate::schedule::ScheduleSpec;

/// Whether a field is malformed or merely too large; the server maps these to
/// `INVALID_ARGUMENT` and `RESOURCE_EXHAUSTED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValidationKind {
    /// Malformed, empty or out of range.
    Invalid,
    /// Over a size limit.
    TooLarge,
}

/// A field that failed validation: `field` names it as the API does
/// (`jobs[3].queue`, `lease_ttl_ms`), `problem` says what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ValidationError {
    /// Kind of failure.
    pub kind: ValidationKind,
    /// Field path.
    pub field: String,
    /// Lower-case description of the problem.
    pub problem: String,
}

impl ValidationError {
    /// A malformed, empty or out-of-range field.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ValidationError {
        ValidationError {
            kind: ValidationKind::Invalid,
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A field over a size limit.
    pub fn too_large(field: impl Into<String>, problem: impl Into<String>) -> ValidationError {
        ValidationError {
            kind: ValidationKind::TooLarge,
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The queue-name pattern, as error messages quote it.
pub const QUEUE_NAME_PATTERN: &str = "[a-z0-9][a-z0-9._-]{0,63}";

/// Longest queue name (bytes), from [`QUEUE_NAME_PATTERN`].
const MAX_QUEUE_NAME_BYTES: usize = 64;

/// Checks one command against `limits`. `apply` calls this with
/// [`Limits::default`]; the server may call it with tighter limits first.
pub fn validate_command(command: &Command, limits: &Limits) -> Result<(), ValidationError> {
    match command {
        Command::Enqueue { jobs } => {
            batch_size("jobs", "jobs", jobs.len(), limits)?;
            for (index, spec) in jobs.iter().enumerate() {
                job_spec(&format_args!("jobs[{index}]"), spec, limits)?;
            }
            Ok(())
        }
        Command::ClaimOnce { request_id: id, worker, queue, max, lease_ttl_ms, selector } => {
            request_id("request_id", id, limits)?;
            worker_id("worker", worker, limits)?;
            queue_name("queue", queue)?;
            claim_max("max", *max, limits)?;
            if let Some(ttl_ms) = lease_ttl_ms {
                lease_ttl("lease_ttl_ms", *ttl_ms, limits)?;
            }
            tags("selector", selector, limits)
        }
        Command::TriggerOnce { request_id: id, schedule, targets, .. } => {
            request_id("request_id", id, limits)?;
            queue_name("schedule", schedule)?;
            node_list("targets", targets, limits)
        }
        Command::Claim { worker, queue, max, lease_ttl_ms, selector } => {
            worker_id("worker", worker, limits)?;
            queue_name("queue", queue)?;
            claim_max("max", *max, limits)?;
            if let Some(ttl_ms) = lease_ttl_ms {
                lease_ttl("lease_ttl_ms", *ttl_ms, limits)?;
            }
            tags("selector", selector, limits)
        }
        Command::Refresh { worker, leases, lease_ttl_ms } => {
            worker_id("worker", worker, limits)?;
            batch_size("leases", "leases", leases.len(), limits)?;
            // A job listed twice would be renewed once and then reported
            // lost (or renewed twice), which no client could interpret.
            let mut seen = BTreeSet::new();
            for (index, (job_id, _token)) in leases.iter().enumerate() {
                job_id_field(&format_args!("leases[{index}].job_id"), *job_id)?;
                if !seen.insert(*job_id) {
                    return Err(ValidationError::invalid(
                        format!("leases[{index}].job_id"),
                        format!("job {job_id} is listed twice"),
                    ));
                }
            }
            if let Some(ttl_ms) = lease_ttl_ms {
                lease_ttl("lease_ttl_ms", *ttl_ms, limits)?;
            }
            Ok(())
        }
        // Job ids start at 1, so 0 is malformed input. Otherwise an unknown
        // job or a stale token is a refusal decided by `apply`, not bad
        // input. The nack's error text is truncated, never refused, so a
        // failing worker can always report its failure.
        Command::Ack { job_id, result, .. } | Command::AckLean { job_id, result, .. } => {
            job_id_field("job_id", *job_id)?;
            match result {
                Some(result) if result.len() > limits.max_result_bytes => {
                    Err(ValidationError::too_large(
                        "result",
                        format!("is {} bytes, limit {}", result.len(), limits.max_result_bytes),
                    ))
                }
                _ => Ok(()),
            }
        }
        Command::Nack { job_id, .. } | Command::Release { job_id, .. } => {
            job_id_field("job_id", *job_id)
        }
        Command::Sweep | Command::Purge => Ok(()),
        Command::SweepBounded { max_clock_offset_ms }
        | Command::SweepKeepingTokens { max_clock_offset_ms } => {
            if *max_clock_offset_ms > crate::command::MAX_CLOCK_OFFSET_MS {
                return Err(ValidationError::invalid(
                    "max_clock_offset_ms",
                    format!(
                        "is {max_clock_offset_ms}, limit {}",
                        crate::command::MAX_CLOCK_OFFSET_MS
                    ),
                ));
            }
            Ok(())
        }
        Command::Redrive { target } => match target {
            RedriveTarget::Queue(queue) => queue_name("queue", queue),
            RedriveTarget::Ids(ids) => {
                batch_size("job_ids", "ids", ids.len(), limits)?;
                for (index, id) in ids.iter().enumerate() {
                    job_id_field(&format_args!("job_ids[{index}]"), *id)?;
                }
                Ok(())
            }
        },
        // The cron expression and timezone were checked by the proposer
        // (see [`schedule_expression`]).
        Command::PutSchedule { spec } | Command::PutScheduleRetimed { spec } => {
            schedule_fields(spec, limits)
        }
        Command::DeleteSchedule { name }
        | Command::SetPaused { name, .. }
        | Command::ResumeSchedule { name, .. } => queue_name("name", name),
        Command::Fire { schedule, bucket, targets } => {
            queue_name("schedule", schedule)?;
            positive("bucket", *bucket)?;
            node_list("targets", targets, limits)
        }
        Command::FireEach { schedule, bucket, targets, offline }
        | Command::FireEachTracked { schedule, bucket, targets, offline } => {
            queue_name("schedule", schedule)?;
            positive("bucket", *bucket)?;
            node_list("targets", targets, limits)?;
            node_list("offline", offline, limits)
        }
        Command::Skip { schedule, bucket, .. } => {
            queue_name("schedule", schedule)?;
            positive("bucket", *bucket)
        }
        Command::Trigger { schedule, targets, .. } => {
            queue_name("schedule", schedule)?;
            node_list("targets", targets, limits)
        }
        Command::RegisterNode { node, tags: node_tags } => {
            positive("node", *node)?;
            tags("tags", node_tags, limits)
        }
        Command::SetDraining { node, .. } => positive("node", *node),
        // The tick inside is validated when it is applied.
        Command::Planned { command, .. } => match command.tick_schedule() {
            Some(_) => Ok(()),
            None => Err(ValidationError::invalid(
                "command",
                "Planned holds one tick: Fire, FireEach, FireEachTracked or Skip",
            )),
        },
        Command::Ruled { command, .. } => match command.as_ref() {
            Command::Ruled { .. } => {
                Err(ValidationError::invalid("command", "Ruled does not nest"))
            }
            Command::Batch { commands } => {
                match commands.iter().position(|c| matches!(c, Command::Ruled { .. })) {
                    Some(index) => Err(ValidationError::invalid(
                        format!("command.commands[{index}]"),
                        "only the outermost command is ruled",
                    )),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        },
        // Each inner command is validated when it is applied, and answered
        // on its own; here only the batch's shape.
        Command::Batch { commands } => {
            if commands.is_empty() {
                return Err(ValidationError::invalid("commands", "must not be empty"));
            }
            if commands.len() > crate::command::MAX_BATCH_COMMANDS {
                return Err(ValidationError::too_large(
                    "commands",
                    format!(
                        "has {} commands, limit {}",
                        commands.len(),
                        crate::command::MAX_BATCH_COMMANDS
                    ),
                ));
            }
            if let Some(index) = commands.iter().position(|c| matches!(c, Command::Ruled { .. })) {
                return Err(ValidationError::invalid(
                    format!("commands[{index}]"),
                    "only the outermost command is ruled",
                ));
            }
            match commands.iter().position(|c| matches!(c, Command::Batch { .. })) {
                Some(index) => Err(ValidationError::invalid(
                    format!("commands[{index}]"),
                    "batches do not nest",
                )),
                None => Ok(()),
            }
        }
    }
}

/// Longest shell command a schedule may carry (bytes).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest cron expression a schedule may carry (bytes), checked by the
/// proposer only (see [`schedule_expression`]).
pub const MAX_CRON_BYTES: usize = 1_024;
/// Longest timezone name (bytes; IANA names are at most about 30).
pub const MAX_TIMEZONE_BYTES: usize = 64;
/// Most missed ticks `catchup = all` may run.
pub const MAX_CATCHUP: u32 = 1_000;

/// Checks a schedule as its proposer must: its cron expression and
/// timezone (by parsing them), then everything [`schedule_fields`] checks.
pub fn schedule_spec(spec: &ScheduleSpec, limits: &Limits) -> Result<(), ValidationError> {
    queue_name("name", &spec.name)?;
    schedule_expression(spec)?;
    schedule_fields(spec, limits)
}

/// Whether this build can parse the schedule's cron expression and
/// timezone. Decided once, by the node that takes the `Put` (the
/// proposer), never at apply: a timezone database or a cron parser
/// differs between versions, and replicas of two versions must not judge
/// one committed schedule differently.
pub fn schedule_expression(spec: &ScheduleSpec) -> Result<(), ValidationError> {
    // Bounded before they are parsed: an error echoes the text, and every
    // read of the schedule carries it.
    for (field, text, limit) in
        [("cron", &spec.cron, MAX_CRON_BYTES), ("timezone", &spec.timezone, MAX_TIMEZONE_BYTES)]
    {
        if text.len() > limit {
            return Err(ValidationError::too_large(
                field,
                format!("is {} bytes, limit {limit}", text.len()),
            ));
        }
    }
    match crate::cron::parse(&spec.cron, &spec.timezone) {
        Err(error) => {
            let field = if matches!(error, crate::cron::CronError::UnknownTimezone { .. }) {
                "timezone"
            } else {
                "cron"
            };
            Err(ValidationError::invalid(field.to_string(), error.to_string()))
        }
        // Accepted, it would never fire, and nothing would say why.
        Ok(schedule) if !schedule.matches_some_date() => Err(ValidationError::invalid(
            "cron",
            "matches no date: the months named never have that day of the month",
        )),
        Ok(_) => Ok(()),
    }
}

/// Checks a schedule's name, job template and catch-up bounds: what
/// `apply` checks, the same on every build given the same limits.
pub fn schedule_fields(spec: &ScheduleSpec, limits: &Limits) -> Result<(), ValidationError> {
    queue_name("name", &spec.name)?;
    let template = &spec.template;
    if let Some(queue) = &template.queue {
        queue_name("template.queue", queue)?;
    }
    if template.payload.len() > limits.max_payload_bytes {
        return Err(ValidationError::too_large(
            "template.payload",
            format!("is {} bytes, limit {}", template.payload.len(), limits.max_payload_bytes),
        ));
    }
    if let Some(command) = &template.command {
        if command.trim().is_empty() {
            return Err(ValidationError::invalid("template.command", "must not be empty"));
        }
        if command.len() > MAX_COMMAND_BYTES {
            return Err(ValidationError::too_large(
                "template.command",
                format!("is {} bytes, limit {MAX_COMMAND_BYTES}", command.len()),
            ));
        }
    }
    if let Some(ttl_ms) = template.lease_ttl_ms {
        lease_ttl("template.lease_ttl_ms", ttl_ms, limits)?;
    }
    if let Some(attempts) = template.max_attempts
        && (attempts == 0 || attempts > limits.max_max_attempts)
    {
        return Err(ValidationError::invalid(
            "template.max_attempts",
            format!("must be between 1 and {}, got {attempts}", limits.max_max_attempts),
        ));
    }
    tags("template.tags", &template.tags, limits)?;
    if spec.catchup_max > MAX_CATCHUP {
        return Err(ValidationError::invalid(
            "catchup_max",
            format!("must be at most {MAX_CATCHUP}, got {}", spec.catchup_max),
        ));
    }
    Ok(())
}

fn positive(field: &(impl Display + ?Sized), value: u64) -> Result<(), ValidationError> {
    if value == 0 {
        return Err(ValidationError::invalid(field.to_string(), "must be at least 1"));
    }
    Ok(())
}

fn node_list(
    field: &(impl Display + ?Sized),
    nodes: &[u64],
    limits: &Limits,
) -> Result<(), ValidationError> {
    if nodes.len() > limits.max_batch {
        return Err(ValidationError::too_large(
            field.to_string(),
            format!("has {} nodes, limit {}", nodes.len(), limits.max_batch),
        ));
    }
    for (index, node) in nodes.iter().enumerate() {
        positive(&format_args!("{field}[{index}]"), *node)?;
    }
    Ok(())
}

/// Job ids are assigned from 1; 0 names no job.
fn job_id_field(field: &(impl Display + ?Sized), job_id: u64) -> Result<(), ValidationError> {
    if job_id == 0 {
        return Err(ValidationError::invalid(field.to_string(), "must be at least 1"));
    }
    Ok(())
}

/// Checks a queue name against [`QUEUE_NAME_PATTERN`], by hand: the pattern
/// is small and a regex engine is not worth a dependency in core.
pub fn queue_name(field: &(impl Display + ?Sized), name: &str) -> Result<(), ValidationError> {
    let bytes = name.as_bytes();
    let first_ok = bytes.first().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes
        .iter()
        .skip(1)
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
    if first_ok && rest_ok && bytes.len() <= MAX_QUEUE_NAME_BYTES {
        Ok(())
    } else {
        Err(ValidationError::invalid(field.to_string(), format!("must match {QUEUE_NAME_PATTERN}")))
    }
}

/// Checks a worker id: non-empty, at most `max_text_bytes`, printable (it
/// A client's request id: 1 ..= `max_text_bytes` bytes.
fn request_id(
    field: &(impl Display + ?Sized),
    id: &str,
    limits: &Limits,
) -> Result<(), ValidationError> {
    if id.is_empty() {
        return Err(ValidationError::invalid(field.to_string(), "must not be empty"));
    }
    if id.len() > limits.max_text_bytes {
        return Err(ValidationError::too_large(
            field.to_string(),
            format!("is {} bytes, limit {}", id.len(), limits.max_text_bytes),
        ));
    }
    Ok(())
}

/// ends up in logs, the CLI and lease records).
pub fn worker_id(
    field: &(impl Display + ?Sized),
    worker: &str,
    limits: &Limits,
) -> Result<(), ValidationError> {
    non_empty_text(field, worker, limits.max_text_bytes)?;
    if worker.chars().any(char::is_control) {
        return Err(ValidationError::invalid(
            field.to_string(),
            "must be printable (no control characters)",
        ));
    }
    Ok(())
}

/// Checks a lease length against `min_lease_ttl_ms ..= max_lease_ttl_ms`.
pub fn lease_ttl(
    field: &(impl Display + ?Sized),
    ttl_ms: u64,
    limits: &Limits,
) -> Result<(), ValidationError> {
    in_range(field, ttl_ms, limits.min_lease_ttl_ms, limits.max_lease_ttl_ms)
}

/// Checks a list of tags (a job's tags or a worker's selector): at most
/// `max_tags`, each non-empty and at most `max_text_bytes`.
pub fn tags(
    field: &(impl Display + ?Sized),
    tags: &[String],
    limits: &Limits,
) -> Result<(), ValidationError> {
    if tags.len() > limits.max_tags {
        return Err(ValidationError::too_large(
            field.to_string(),
            format!("has {} tags, limit {}", tags.len(), limits.max_tags),
        ));
    }
    for (index, tag) in tags.iter().enumerate() {
        non_empty_text(&format_args!("{field}[{index}]"), tag, limits.max_text_bytes)?;
    }
    Ok(())
}

/// Checks one job spec; `field` is its path, such as `jobs[3]`.
fn job_spec(
    field: &(impl Display + ?Sized),
    spec: &JobSpec,
    limits: &Limits,
) -> Result<(), ValidationError> {
    queue_name(&format_args!("{field}.queue"), &spec.queue)?;
    if spec.payload.len() > limits.max_payload_bytes {
        return Err(ValidationError::too_large(
            format!("{field}.payload"),
            format!("is {} bytes, limit {}", spec.payload.len(), limits.max_payload_bytes),
        ));
    }
    if let Some(max_attempts) = spec.max_attempts {
        in_range(&format_args!("{field}.max_attempts"), max_attempts, 1, limits.max_max_attempts)?;
    }
    if let Some(backoff) = &spec.backoff {
        self::backoff(&format_args!("{field}.backoff"), backoff)?;
    }
    if let Some(ttl_ms) = spec.lease_ttl_ms {
        lease_ttl(&format_args!("{field}.lease_ttl_ms"), ttl_ms, limits)?;
    }
    if let Some(key) = &spec.idempotency_key {
        non_empty_text(&format_args!("{field}.idempotency_key"), key, limits.max_text_bytes)?;
    }
    tags(&format_args!("{field}.tags"), &spec.tags, limits)
}

/// Checks a producer's idempotency key as its proposer must: keys that
/// begin `cron:` are the schedules' ([`crate::schedule::CRON_KEY_PREFIX`]).
/// A producer who enqueued `cron:NAME:BUCKET` on a schedule's queue before
/// its tick would take the tick's place: the fire finds the key taken, is
/// recorded as fired, and the producer's payload runs under the schedule's
/// name. Checked by the proposer only, never at apply, so replicas of
/// builds before the rule apply the same log alike.
pub fn enqueue_key(field: &(impl Display + ?Sized), key: &str) -> Result<(), ValidationError> {
    if key.starts_with(crate::schedule::CRON_KEY_PREFIX) {
        return Err(ValidationError::invalid(
            format!("{field}"),
            format!(
                "keys beginning {:?} are reserved for the jobs schedules fire",
                crate::schedule::CRON_KEY_PREFIX
            ),
        ));
    }
    Ok(())
}

/// The scope of a schedule's triggers in the request log: a worker id
/// beginning with it would share the log's entries with that schedule's
/// triggers (see [`claim_worker`]).
pub const TRIGGER_SCOPE_PREFIX: &str = "schedule ";

/// Refuses a claiming worker id that begins [`TRIGGER_SCOPE_PREFIX`]: the
/// request log keys a claim by its worker and a forced trigger by
/// `schedule NAME`, so a worker named `schedule nightly` retrying a claim
/// under a trigger's request id would take that trigger's entry, and the
/// trigger's own retry would run the schedule again. Checked by the
/// proposer only, never at apply, so replicas of earlier builds apply the
/// same log alike.
pub fn claim_worker(field: &(impl Display + ?Sized), worker: &str) -> Result<(), ValidationError> {
    if worker.starts_with(TRIGGER_SCOPE_PREFIX) {
        return Err(ValidationError::invalid(
            format!("{field}"),
            format!("worker ids beginning {TRIGGER_SCOPE_PREFIX:?} are reserved for schedules"),
        ));
    }
    Ok(())
}

/// Checks a backoff: a zero base would retry in a hot loop, and a cap below
/// the base would make the "exponential" delay shrink.
fn backoff(field: &(impl Display + ?Sized), backoff: &Backoff) -> Result<(), ValidationError> {
    if backoff.base_ms < 1 {
        return Err(ValidationError::invalid(format!("{field}.base_ms"), "must be at least 1"));
    }
    if backoff.cap_ms < backoff.base_ms {
        return Err(ValidationError::invalid(
            format!("{field}.cap_ms"),
            format!("must be at least base_ms ({})", backoff.base_ms),
        ));
    }
    Ok(())
}

/// Checks a claim's `max`: at least one lease, at most a batch.
fn claim_max(
    field: &(impl Display + ?Sized),
    max: u32,
    limits: &Limits,
) -> Result<(), ValidationError> {
    if max == 0 {
        return Err(ValidationError::invalid(field.to_string(), "must be at least 1"));
    }
    // `usize` is at least 32 bits on every target we build for; if it were
    // not, the saturated value still compares correctly.
    let max_items = usize::try_from(max).unwrap_or(usize::MAX);
    if max_items > limits.max_batch {
        return Err(ValidationError::too_large(
            field.to_string(),
            format!("is {max}, limit {}", limits.max_batch),
        ));
    }
    Ok(())
}

/// Checks a list length against `1 ..= max_batch`; `noun` names the items.
fn batch_size(
    field: &(impl Display + ?Sized),
    noun: &str,
    length: usize,
    limits: &Limits,
) -> Result<(), ValidationError> {
    if length == 0 {
        return Err(ValidationError::invalid(field.to_string(), "must not be empty"));
    }
    if length > limits.max_batch {
        return Err(ValidationError::too_large(
            field.to_string(),
            format!("has {length} {noun}, limit {}", limits.max_batch),
        ));
    }
    Ok(())
}

/// Checks free text that must be present and bounded.
fn non_empty_text(
    field: &(impl Display + ?Sized),
    text: &str,
    max_bytes: usize,
) -> Result<(), ValidationError> {
    if text.is_empty() {
        return Err(ValidationError::invalid(field.to_string(), "must not be empty"));
    }
    if text.len() > max_bytes {
        return Err(ValidationError::too_large(
            field.to_string(),
            format!("is {} bytes, limit {max_bytes}", text.len()),
        ));
    }
    Ok(())
}

/// Checks `min <= value <= max`.
fn in_range<T: PartialOrd + Display>(
    field: &(impl Display + ?Sized),
    value: T,
    min: T,
    max: T,
) -> Result<(), ValidationError> {
    if value < min || value > max {
        return Err(ValidationError::invalid(
            field.to_string(),
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

/// Cuts `text` to at most `max_bytes`, at a char boundary so the result is
/// still valid UTF-8. Used for nack error text, which is kept, not refused.
pub fn truncate_text(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let mut end = max_bytes;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_may_not_use_a_schedules_key() {
        let error = enqueue_key("jobs[0].idempotency_key", "cron:nightly:1767225600");
        let error = error.expect_err("a schedule's key");
        assert_eq!(error.field, "jobs[0].idempotency_key");
        assert!(error.problem.contains("reserved"), "{}", error.problem);
        assert!(enqueue_key("k", "crontab-7").is_ok(), "only the prefix is reserved");
        assert!(enqueue_key("k", "order:cron:1").is_ok());
    }

    fn spec(queue: &str) -> JobSpec {
        JobSpec { queue: queue.to_owned(), ..JobSpec::default() }
    }

    fn enqueue(jobs: Vec<JobSpec>) -> Command {
        Command::Enqueue { jobs }
    }

    fn claim() -> Command {
        Command::Claim {
            worker: "w-1".to_owned(),
            queue: "emails".to_owned(),
            max: 10,
            lease_ttl_ms: None,
            selector: vec![],
        }
    }

    fn check(command: &Command) -> Result<(), ValidationError> {
        validate_command(command, &Limits::default())
    }

    fn assert_refused(command: &Command, kind: ValidationKind, field: &str, problem: &str) {
        let error = check(command).expect_err("command should be refused");
        assert_eq!(error.kind, kind, "{error}");
        assert_eq!(error.field, field, "{error}");
        assert_eq!(error.problem, problem, "{error}");
    }

    #[test]
    fn a_cron_that_matches_no_date_is_refused() {
        let spec = |cron: &str| ScheduleSpec {
            name: "never".into(),
            cron: cron.into(),
            ..ScheduleSpec::default()
        };
        let limits = Limits::default();
        for never in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 0 30 2 *", "0 0 30,31 2 *"] {
            let error = schedule_spec(&spec(never), &limits).expect_err(never);
            assert_eq!((error.kind, error.field.as_str()), (ValidationKind::Invalid, "cron"));
            assert!(error.problem.contains("matches no date"), "{error}");
        }
        // A leap day exists; so does a weekday in February (either field
        // matching is enough when both are given).
        for some in ["0 0 29 2 *", "0 0 30 2 1", "0 0 31 * *", "@every 1h"] {
            assert_eq!(schedule_spec(&spec(some), &limits), Ok(()), "{some}");
        }
    }

    #[test]
    fn a_long_cron_or_timezone_is_refused_before_it_is_parsed() {
        let spec = |cron: String, timezone: String| ScheduleSpec {
            name: "nightly".into(),
            cron,
            timezone,
            ..ScheduleSpec::default()
        };
        let limits = Limits::default();
        let fine = spec("0 3 * * *".into(), "Europe/Berlin".into());
        assert_eq!(schedule_spec(&fine, &limits), Ok(()));
        let long_cron = spec(format!("0 3 * * {}", "1,".repeat(MAX_CRON_BYTES)), String::new());
        let error = schedule_spec(&long_cron, &limits).expect_err("too long");
        assert_eq!((error.kind, error.field.as_str()), (ValidationKind::TooLarge, "cron"));
        assert!(error.problem.len() < 100, "the text is not echoed: {}", error.problem);
        let long_zone = spec("0 3 * * *".into(), "Europe/".repeat(MAX_TIMEZONE_BYTES));
        let error = schedule_spec(&long_zone, &limits).expect_err("too long");
        assert_eq!((error.kind, error.field.as_str()), (ValidationKind::TooLarge, "timezone"));
    }

    #[test]
    fn queue_names_follow_the_pattern() {
        for good in ["a", "0", "emails", "a.b_c-d", "9lives", &"q".repeat(64)] {
            assert_eq!(queue_name("queue", good), Ok(()), "{good}");
        }
        for bad in ["", "Emails", "-a", ".a", "_a", "a b", "a/b", "é", "a\n", &"q".repeat(65)] {
            let error = queue_name("queue", bad).expect_err(bad);
            assert_eq!(error.kind, ValidationKind::Invalid);
            assert_eq!(error.problem, "must match [a-z0-9][a-z0-9._-]{0,63}");
        }
    }

    #[test]
    fn a_plain_enqueue_is_valid() {
        assert_eq!(check(&enqueue(vec![spec("emails"), spec("sms")])), Ok(()));
    }

    #[test]
    fn enqueue_batch_must_be_one_to_max_batch() {
        assert_refused(&enqueue(vec![]), ValidationKind::Invalid, "jobs", "must not be empty");
        assert_eq!(check(&enqueue(vec![spec("q"); 1_000])), Ok(()));
        assert_refused(
            &enqueue(vec![spec("q"); 1_001]),
            ValidationKind::TooLarge,
            "jobs",
            "has 1001 jobs, limit 1000",
        );
    }

    #[test]
    fn enqueue_names_the_offending_job() {
        let jobs = vec![spec("a"), spec("b"), spec("c"), spec("Bad")];
        assert_refused(
            &enqueue(jobs),
            ValidationKind::Invalid,
            "jobs[3].queue",
            "must match [a-z0-9][a-z0-9._-]{0,63}",
        );
    }

    #[test]
    fn payload_is_bounded() {
        let mut job = spec("q");
        job.payload = vec![0; 256 * 1024];
        assert_eq!(check(&enqueue(vec![job.clone()])), Ok(()));
        job.payload = vec![0; 300_000];
        assert_refused(
            &enqueue(vec![job]),
            ValidationKind::TooLarge,
            "jobs[0].payload",
            "is 300000 bytes, limit 262144",
        );
    }

    #[test]
    fn max_attempts_is_one_to_the_limit() {
        for (value, ok) in [(0, false), (1, true), (1_000, true), (1_001, false)] {
            let mut job = spec("q");
            job.max_attempts = Some(value);
            let result = check(&enqueue(vec![job]));
            if ok {
                assert_eq!(result, Ok(()), "{value}");
            } else {
                let error = result.expect_err("out of range");
                assert_eq!(error.field, "jobs[0].max_attempts");
                assert_eq!(error.kind, ValidationKind::Invalid);
                assert_eq!(error.problem, format!("must be between 1 and 1000, got {value}"));
            }
        }
    }

    #[test]
    fn backoff_needs_a_base_and_a_cap_not_below_it() {
        let mut job = spec("q");
        job.backoff = Some(Backoff { base_ms: 0, cap_ms: 10 });
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::Invalid,
            "jobs[0].backoff.base_ms",
            "must be at least 1",
        );
        job.backoff = Some(Backoff { base_ms: 100, cap_ms: 99 });
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::Invalid,
            "jobs[0].backoff.cap_ms",
            "must be at least base_ms (100)",
        );
        job.backoff = Some(Backoff { base_ms: 100, cap_ms: 100 });
        assert_eq!(check(&enqueue(vec![job])), Ok(()));
    }

    #[test]
    fn job_lease_ttl_is_one_second_to_twelve_hours() {
        for (value, ok) in [(999, false), (1_000, true), (43_200_000, true), (43_200_001, false)] {
            let mut job = spec("q");
            job.lease_ttl_ms = Some(value);
            let result = check(&enqueue(vec![job]));
            if ok {
                assert_eq!(result, Ok(()), "{value}");
            } else {
                let error = result.expect_err("out of range");
                assert_eq!(error.field, "jobs[0].lease_ttl_ms");
                assert_eq!(error.kind, ValidationKind::Invalid);
            }
        }
    }

    #[test]
    fn idempotency_key_is_present_and_bounded_when_given() {
        let mut job = spec("q");
        job.idempotency_key = Some(String::new());
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::Invalid,
            "jobs[0].idempotency_key",
            "must not be empty",
        );
        job.idempotency_key = Some("k".repeat(257));
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::TooLarge,
            "jobs[0].idempotency_key",
            "is 257 bytes, limit 256",
        );
        job.idempotency_key = Some("k".repeat(256));
        assert_eq!(check(&enqueue(vec![job])), Ok(()));
    }

    #[test]
    fn job_tags_are_bounded() {
        let mut job = spec("q");
        job.tags = vec!["gpu".to_owned(), String::new()];
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::Invalid,
            "jobs[0].tags[1]",
            "must not be empty",
        );
        job.tags = vec!["t".repeat(257)];
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::TooLarge,
            "jobs[0].tags[0]",
            "is 257 bytes, limit 256",
        );
        job.tags = vec!["t".to_owned(); 33];
        assert_refused(
            &enqueue(vec![job.clone()]),
            ValidationKind::TooLarge,
            "jobs[0].tags",
            "has 33 tags, limit 32",
        );
        job.tags = vec!["t".to_owned(); 32];
        assert_eq!(check(&enqueue(vec![job])), Ok(()));
    }

    #[test]
    fn a_worker_named_like_a_schedules_triggers_is_refused_at_the_edge() {
        let refused = claim_worker("worker", "schedule nightly").err();
        assert!(refused.is_some_and(|e| e.field == "worker" && e.problem.contains("reserved")));
        assert_eq!(claim_worker("worker", "scheduler-1"), Ok(()));
        assert_eq!(claim_worker("worker", "nightly schedule"), Ok(()));
    }

    #[test]
    fn any_priority_and_not_before_are_valid() {
        for priority in [i32::MIN, -1, 0, i32::MAX] {
            let mut job = spec("q");
            job.priority = priority;
            job.not_before_ms = Some(u64::MAX);
            assert_eq!(check(&enqueue(vec![job])), Ok(()));
        }
    }

    #[test]
    fn a_plain_claim_is_valid() {
        assert_eq!(check(&claim()), Ok(()));
    }

    #[test]
    fn claim_worker_must_be_present_bounded_and_printable() {
        let with_worker = |worker: String| match claim() {
            Command::Claim { queue, max, lease_ttl_ms, selector, .. } => {
                Command::Claim { worker, queue, max, lease_ttl_ms, selector }
            }
            other => other,
        };
        assert_refused(
            &with_worker(String::new()),
            ValidationKind::Invalid,
            "worker",
            "must not be empty",
        );
        assert_refused(
            &with_worker("w".repeat(257)),
            ValidationKind::TooLarge,
            "worker",
            "is 257 bytes, limit 256",
        );
        assert_refused(
            &with_worker("w\u{7}".to_owned()),
            ValidationKind::Invalid,
            "worker",
            "must be printable (no control characters)",
        );
        assert_eq!(check(&with_worker("node-3/worker 7 ✓".to_owned())), Ok(()));
    }

    #[test]
    fn claim_fields_are_checked() {
        let base = claim();
        let Command::Claim { worker, queue, lease_ttl_ms, selector, .. } = base else {
            unreachable!("claim() builds a claim")
        };
        let claim_with =
            |queue: &str, max: u32, ttl: Option<u64>, selector: Vec<String>| Command::Claim {
                worker: worker.clone(),
                queue: queue.to_owned(),
                max,
                lease_ttl_ms: ttl,
                selector,
            };
        assert_refused(
            &claim_with("", 1, lease_ttl_ms, selector.clone()),
            ValidationKind::Invalid,
            "queue",
            "must match [a-z0-9][a-z0-9._-]{0,63}",
        );
        assert_refused(
            &claim_with(&queue, 0, None, vec![]),
            ValidationKind::Invalid,
            "max",
            "must be at least 1",
        );
        assert_refused(
            &claim_with(&queue, 1_001, None, vec![]),
            ValidationKind::TooLarge,
            "max",
            "is 1001, limit 1000",
        );
        assert_eq!(check(&claim_with(&queue, 1_000, None, vec![])), Ok(()));
        assert_refused(
            &claim_with(&queue, 1, Some(999), vec![]),
            ValidationKind::Invalid,
            "lease_ttl_ms",
            "must be between 1000 and 43200000, got 999",
        );
        assert_refused(
            &claim_with(&queue, 1, None, vec!["a".into(), "b".into(), String::new()]),
            ValidationKind::Invalid,
            "selector[2]",
            "must not be empty",
        );
        assert_refused(
            &claim_with(&queue, 1, None, vec!["s".into(); 33]),
            ValidationKind::TooLarge,
            "selector",
            "has 33 tags, limit 32",
        );
    }

    #[test]
    fn refresh_fields_are_checked() {
        let refresh = |worker: &str, leases: Vec<(u64, u64)>, ttl: Option<u64>| Command::Refresh {
            worker: worker.to_owned(),
            leases,
            lease_ttl_ms: ttl,
        };
        assert_eq!(check(&refresh("w", vec![(1, 1), (2, 1)], None)), Ok(()));
        assert_refused(
            &refresh("", vec![(1, 1)], None),
            ValidationKind::Invalid,
            "worker",
            "must not be empty",
        );
        assert_refused(
            &refresh("w", vec![], None),
            ValidationKind::Invalid,
            "leases",
            "must not be empty",
        );
        assert_refused(
            &refresh("w", vec![(1, 1); 1_001], None),
            ValidationKind::TooLarge,
            "leases",
            "has 1001 leases, limit 1000",
        );
        assert_refused(
            &refresh("w", vec![(1, 1), (7, 2), (7, 3)], None),
            ValidationKind::Invalid,
            "leases[2].job_id",
            "job 7 is listed twice",
        );
        assert_refused(
            &refresh("w", vec![(1, 1)], Some(43_200_001)),
            ValidationKind::Invalid,
            "lease_ttl_ms",
            "must be between 1000 and 43200000, got 43200001",
        );
    }

    #[test]
    fn token_commands_refuse_only_job_id_zero() {
        let long_error = "e".repeat(100_000);
        assert_refused(
            &Command::Ack { job_id: 0, token: 1, result: None },
            ValidationKind::Invalid,
            "job_id",
            "must be at least 1",
        );
        assert_refused(
            &Command::Release { job_id: 0, token: 1 },
            ValidationKind::Invalid,
            "job_id",
            "must be at least 1",
        );
        for command in [
            Command::Ack { job_id: 1, token: 0, result: None },
            Command::Nack {
                job_id: u64::MAX,
                token: 1,
                error: long_error,
                retry_after_ms: Some(u64::MAX),
            },
            Command::Release { job_id: 1, token: u64::MAX },
            Command::Sweep,
            Command::Purge,
        ] {
            assert_eq!(check(&command), Ok(()));
        }
    }

    #[test]
    fn redrive_target_is_checked() {
        let redrive = |target| Command::Redrive { target };
        assert_eq!(check(&redrive(RedriveTarget::Queue("q".into()))), Ok(()));
        assert_refused(
            &redrive(RedriveTarget::Queue("Q".into())),
            ValidationKind::Invalid,
            "queue",
            "must match [a-z0-9][a-z0-9._-]{0,63}",
        );
        assert_eq!(check(&redrive(RedriveTarget::Ids(vec![1, 2]))), Ok(()));
        assert_refused(
            &redrive(RedriveTarget::Ids(vec![])),
            ValidationKind::Invalid,
            "job_ids",
            "must not be empty",
        );
        assert_refused(
            &redrive(RedriveTarget::Ids(vec![1; 1_001])),
            ValidationKind::TooLarge,
            "job_ids",
            "has 1001 ids, limit 1000",
        );
    }

    #[test]
    fn tighter_server_limits_apply() {
        let limits = Limits { max_payload_bytes: 10, ..Limits::default() };
        let mut job = spec("q");
        job.payload = vec![0; 11];
        let error = validate_command(&enqueue(vec![job]), &limits).expect_err("too large");
        assert_eq!(error.to_string(), "jobs[0].payload: is 11 bytes, limit 10");
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_text("hello", 10), "hello");
        assert_eq!(truncate_text("hello", 3), "hel");
        // "é" is two bytes; cutting inside it backs off to the boundary.
        assert_eq!(truncate_text("aé", 2), "a");
        assert_eq!(truncate_text("aé", 3), "aé");
        assert_eq!(truncate_text("é", 0), "");
    }
}
