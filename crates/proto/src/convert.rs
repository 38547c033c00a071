//! Wire ↔ core conversions, the only place they happen.
//!
//! Inbound conversions can fail only on shapes the wire allows and the domain
//! does not (two ways of saying "not before"); they answer with the core
//! [`ValidationError`] so the server maps every input problem the same way.

use leasehold_core as core;
use leasehold_core::schedule;
use leasehold_core::{ValidationError, ValidationKind};

use crate::v1;

fn invalid(field: String, problem: &str) -> ValidationError {
    ValidationError { kind: ValidationKind::Invalid, field, problem: problem.to_string() }
}

/// A wire job spec as a core spec. `delay_ms` becomes an absolute
/// `not_before_ms` measured from `now_ms`.
pub fn job_spec_from_wire(
    spec: v1::JobSpec,
    index: usize,
    now_ms: u64,
) -> Result<core::JobSpec, ValidationError> {
    let not_before_ms = match (spec.not_before_ms, spec.delay_ms) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                format!("jobs[{index}].delay_ms"),
                "at most one of not_before_ms and delay_ms may be set",
            ));
        }
        (Some(at), None) => Some(at),
        (None, Some(delay)) => Some(now_ms.saturating_add(delay)),
        (None, None) => None,
    };
    Ok(core::JobSpec {
        queue: spec.queue,
        payload: spec.payload,
        priority: spec.priority,
        not_before_ms,
        max_attempts: spec.max_attempts,
        backoff: spec.backoff.map(backoff_from_wire),
        lease_ttl_ms: spec.lease_ttl_ms,
        idempotency_key: spec.idempotency_key,
        tags: spec.tags,
    })
}

/// A wire backoff as the core one.
pub fn backoff_from_wire(backoff: v1::Backoff) -> core::Backoff {
    core::Backoff { base_ms: backoff.base_ms, cap_ms: backoff.cap_ms }
}

/// A core backoff on the wire.
pub fn backoff_to_wire(backoff: core::Backoff) -> v1::Backoff {
    v1::Backoff { base_ms: backoff.base_ms, cap_ms: backoff.cap_ms }
}

/// A core job state on the wire.
pub fn job_state_to_wire(state: core::JobState) -> v1::JobState {
    match state {
        core::JobState::Ready => v1::JobState::Ready,
        core::JobState::Claimed => v1::JobState::Claimed,
        core::JobState::Acked => v1::JobState::Acked,
        core::JobState::Dead => v1::JobState::Dead,
    }
}

/// A wire job-state filter: `Ok(None)` for "any state", an error for a value
/// this version does not know.
pub fn job_state_filter_from_wire(
    field: &str,
    raw: i32,
) -> Result<Option<core::JobState>, ValidationError> {
    match v1::JobState::try_from(raw) {
        Ok(v1::JobState::Unspecified) => Ok(None),
        Ok(v1::JobState::Ready) => Ok(Some(core::JobState::Ready)),
        Ok(v1::JobState::Claimed) => Ok(Some(core::JobState::Claimed)),
        Ok(v1::JobState::Acked) => Ok(Some(core::JobState::Acked)),
        Ok(v1::JobState::Dead) => Ok(Some(core::JobState::Dead)),
        Err(_) => Err(invalid(field.to_string(), "is not a known job state")),
    }
}

/// A core lease on the wire.
pub fn lease_to_wire(lease: &core::Lease) -> v1::Lease {
    v1::Lease {
        job_id: lease.job_id,
        holder: lease.holder.clone(),
        token: lease.token,
        epoch: lease.epoch,
        granted_at_ms: lease.granted_at_ms,
        expires_at_ms: lease.expires_at_ms,
    }
}

/// A core job on the wire.
pub fn job_to_wire(job: &core::Job) -> v1::Job {
    v1::Job {
        id: job.id,
        queue: job.queue.clone(),
        payload: job.payload.clone(),
        priority: job.priority,
        not_before_ms: job.not_before_ms,
        max_attempts: job.max_attempts,
        backoff: Some(backoff_to_wire(job.backoff)),
        lease_ttl_ms: job.lease_ttl_ms,
        idempotency_key: job.idempotency_key.clone(),
        tags: job.tags.clone(),
        attempts: job.attempts,
        last_error: job.last_error.clone(),
        state: job_state_to_wire(job.state) as i32,
        lease: job.lease.as_ref().map(lease_to_wire),
        enqueued_at_ms: job.enqueued_at_ms,
        finished_at_ms: job.finished_at_ms,
        result: job.result.clone().unwrap_or_default(),
    }
}

/// A core grant on the wire.
pub fn grant_to_wire(grant: &core::Grant) -> v1::Grant {
    v1::Grant { job: Some(job_to_wire(&grant.job)), lease: Some(lease_to_wire(&grant.lease)) }
}

/// One queue's counts on the wire.
pub fn queue_stats_to_wire(queue: &str, stats: &core::QueueStats) -> v1::QueueStats {
    v1::QueueStats {
        queue: queue.to_string(),
        ready: stats.ready,
        delayed: stats.delayed,
        claimed: stats.claimed,
        acked: stats.acked,
        dead: stats.dead,
    }
}

/// A queue's oldest due ready job, as of cluster time `at_ms`.
pub fn oldest_ready_to_wire(queue: &str, due_at_ms: u64, at_ms: u64) -> v1::OldestReady {
    v1::OldestReady { queue: queue.to_string(), due_at_ms, age_ms: at_ms.saturating_sub(due_at_ms) }
}

/// A job whose last attempt ended in a lease expiry.
pub fn expired_lease_to_wire(expired: &core::state::ExpiredLease) -> v1::LeaseExpiry {
    v1::LeaseExpiry {
        job_id: expired.job_id,
        queue: expired.queue.clone(),
        attempts: expired.attempts,
        state: expired.state.as_str().to_string(),
        expired_at_ms: expired.expired_at_ms.unwrap_or(0),
    }
}

/// A job held again after a failed attempt.
pub fn redelivery_to_wire(again: &core::state::Redelivery) -> v1::Redelivery {
    v1::Redelivery {
        job_id: again.job_id,
        queue: again.queue.clone(),
        delivery: again.delivery,
        holder: again.holder.clone(),
        granted_at_ms: again.granted_at_ms,
        last_error: again.last_error.clone(),
    }
}

/// Default catch-up window when a spec leaves it 0.
pub const DEFAULT_CATCHUP_WINDOW_MS: u64 = 3_600_000;
/// Default catch-up bound when a spec leaves it 0.
pub const DEFAULT_CATCHUP_MAX: u32 = 10;

/// A wire schedule spec as the core one; unspecified enums and zero bounds
/// take their defaults.
pub fn schedule_spec_from_wire(
    spec: v1::ScheduleSpec,
) -> Result<schedule::ScheduleSpec, ValidationError> {
    let template = spec.template.unwrap_or_default();
    let overlap = match v1::Overlap::try_from(spec.overlap) {
        Ok(v1::Overlap::Unspecified | v1::Overlap::Skip) => schedule::Overlap::Skip,
        Ok(v1::Overlap::Allow) => schedule::Overlap::Allow,
        Err(_) => return Err(invalid("overlap".into(), "is not a known overlap policy")),
    };
    let catchup = match v1::Catchup::try_from(spec.catchup) {
        Ok(v1::Catchup::Unspecified | v1::Catchup::Coalesce) => schedule::Catchup::Coalesce,
        Ok(v1::Catchup::Skip) => schedule::Catchup::Skip,
        Ok(v1::Catchup::All) => schedule::Catchup::All,
        Err(_) => return Err(invalid("catchup".into(), "is not a known catch-up policy")),
    };
    let target = match v1::Target::try_from(spec.target) {
        Ok(v1::Target::Unspecified | v1::Target::Any) => schedule::Target::Any,
        Ok(v1::Target::Each) => schedule::Target::Each,
        Err(_) => return Err(invalid("target".into(), "is not a known target")),
    };
    Ok(schedule::ScheduleSpec {
        name: spec.name,
        cron: spec.cron,
        timezone: spec.timezone,
        template: schedule::JobTemplate {
            queue: template.queue,
            payload: template.payload,
            priority: template.priority,
            lease_ttl_ms: template.lease_ttl_ms,
            max_attempts: template.max_attempts,
            tags: template.tags,
            command: template.command,
        },
        overlap,
        catchup,
        catchup_window_ms: if spec.catchup_window_ms == 0 {
            DEFAULT_CATCHUP_WINDOW_MS
        } else {
            spec.catchup_window_ms
        },
        catchup_max: if spec.catchup_max == 0 { DEFAULT_CATCHUP_MAX } else { spec.catchup_max },
        target,
        paused: spec.paused,
    })
}

/// A core schedule spec on the wire.
pub fn schedule_spec_to_wire(spec: &schedule::ScheduleSpec) -> v1::ScheduleSpec {
    let template = &spec.template;
    v1::ScheduleSpec {
        name: spec.name.clone(),
        cron: spec.cron.clone(),
        timezone: spec.timezone.clone(),
        template: Some(v1::JobTemplate {
            queue: template.queue.clone(),
            payload: template.payload.clone(),
            priority: template.priority,
            lease_ttl_ms: template.lease_ttl_ms,
            max_attempts: template.max_attempts,
            tags: template.tags.clone(),
            command: template.command.clone(),
        }),
        overlap: match spec.overlap {
            schedule::Overlap::Skip => v1::Overlap::Skip,
            schedule::Overlap::Allow => v1::Overlap::Allow,
        } as i32,
        catchup: match spec.catchup {
            schedule::Catchup::Coalesce => v1::Catchup::Coalesce,
            schedule::Catchup::Skip => v1::Catchup::Skip,
            schedule::Catchup::All => v1::Catchup::All,
        } as i32,
        catchup_window_ms: spec.catchup_window_ms,
        catchup_max: spec.catchup_max,
        target: match spec.target {
            schedule::Target::Any => v1::Target::Any,
            schedule::Target::Each => v1::Target::Each,
        } as i32,
        paused: spec.paused,
    }
}

/// One history record on the wire.
pub fn tick_record_to_wire(record: &schedule::TickRecord) -> v1::TickRecord {
    let mut wire =
        v1::TickRecord { bucket: record.bucket, late: record.late, ..Default::default() };
    match &record.outcome {
        schedule::TickOutcome::Fired { job_ids, lag_ms } => {
            wire.outcome = "fired".into();
            wire.job_ids = job_ids.clone();
            wire.lag_ms = *lag_ms;
        }
        schedule::TickOutcome::Skipped { reason, ticks } => {
            wire.outcome = "skipped".into();
            wire.skip_reason = reason.as_str().into();
            wire.ticks = *ticks;
        }
    }
    wire
}

/// A core schedule on the wire, with its next tick after `now_ms`.
pub fn schedule_to_wire(schedule: &schedule::Schedule, next_tick_ms: Option<u64>) -> v1::Schedule {
    v1::Schedule {
        spec: Some(schedule_spec_to_wire(&schedule.spec)),
        last_fired_bucket: schedule.last_fired_bucket,
        created_at_ms: schedule.created_at_ms,
        history: schedule.history.iter().map(tick_record_to_wire).collect(),
        fired_count: schedule.fired_count,
        skipped_count: schedule.skipped_count,
        next_tick_ms,
        // Counting ticks needs the clock and the cron math: the service sets it.
        expected_ticks: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_becomes_absolute_and_both_forms_are_refused() {
        let spec = v1::JobSpec { queue: "q".into(), delay_ms: Some(500), ..Default::default() };
        let core_spec = job_spec_from_wire(spec, 0, 1_000);
        assert_eq!(core_spec.map(|s| s.not_before_ms), Ok(Some(1_500)));

        let both = v1::JobSpec {
            queue: "q".into(),
            delay_ms: Some(1),
            not_before_ms: Some(2),
            ..Default::default()
        };
        let err = job_spec_from_wire(both, 7, 0).err();
        assert_eq!(err.map(|e| e.field), Some("jobs[7].delay_ms".to_string()));
    }

    #[test]
    fn job_state_filter_round_trips_and_rejects_unknown() {
        for state in [
            core::JobState::Ready,
            core::JobState::Claimed,
            core::JobState::Acked,
            core::JobState::Dead,
        ] {
            let raw = job_state_to_wire(state) as i32;
            assert_eq!(job_state_filter_from_wire("state", raw), Ok(Some(state)));
        }
        assert_eq!(job_state_filter_from_wire("state", 0), Ok(None));
        assert!(job_state_filter_from_wire("state", 99).is_err());
    }
}
