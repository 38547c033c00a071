//! The public `leasehold.v1.Schedules` service, and the target selection a
//! `target = each` tick uses (shared with the node's ticker).

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_core::schedule::{Schedule, TickOutcome};
use leasehold_core::schedule::{is_command_queue, resume_command};
use leasehold_core::validate::{self, schedule_spec};
use leasehold_core::{Command, Response};
use leasehold_proto::convert;
use leasehold_proto::v1;
use leasehold_proto::v1::schedules_server::Schedules;
use tonic::{Request, Response as Reply, Status};

use crate::error::Error;
use leasehold_replica::Journal;

/// Serves `leasehold.v1.Schedules`.
#[derive(Clone)]
pub struct SchedulesService {
    journal: Journal,
    /// The ticks counted so far for each schedule's `expected_ticks`, so a
    /// read counts only those since the last one. Held while counting, so
    /// reads at once do not count the same ticks twice.
    counted: Arc<tokio::sync::Mutex<HashMap<String, Counted>>>,
}

/// The ticks a schedule had in `(created_at_ms, until_ms]`, as counted for
/// the expression and zone it had then.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Counted {
    created_at_ms: u64,
    cron: String,
    timezone: String,
    until_ms: u64,
    ticks: usize,
}

/// A schedule read out of the state: its wire form (without the figures
/// that need the cron math) and what counting its ticks needs.
struct Read {
    wire: v1::Schedule,
    name: String,
    cron: String,
    timezone: String,
    created_at_ms: u64,
}

impl Read {
    fn of(schedule: &Schedule) -> Read {
        Read {
            wire: convert::schedule_to_wire(schedule, None),
            name: schedule.spec.name.clone(),
            cron: schedule.spec.cron.clone(),
            timezone: schedule.spec.timezone.clone(),
            created_at_ms: schedule.created_at_ms,
        }
    }
}

impl SchedulesService {
    /// A service proposing through `journal`.
    pub fn new(journal: Journal) -> Self {
        SchedulesService { journal, counted: Arc::default() }
    }

    /// `read`'s wire form as of `now_ms`, with its next tick and the ticks
    /// its expression had since it was created (if it still parses). The
    /// state's lock is not held here: counting walks the cron calendar,
    /// up to [`MAX_EXPECTED_TICKS`] steps the first time.
    fn complete(read: Read, now_ms: u64, counted: &mut HashMap<String, Counted>) -> v1::Schedule {
        let Read { mut wire, name, cron: expression, timezone, created_at_ms } = read;
        let Ok(cron) = leasehold_core::cron::parse(&expression, &timezone) else {
            counted.remove(&name);
            return wire;
        };
        wire.next_tick_ms = cron.next_after(now_ms);
        let earlier = counted.get(&name).filter(|c| {
            c.created_at_ms == created_at_ms
                && c.cron == expression
                && c.timezone == timezone
                && c.until_ms <= now_ms
        });
        let ticks = match earlier {
            Some(c) => {
                let more = MAX_EXPECTED_TICKS.saturating_sub(c.ticks);
                c.ticks + cron.count_ticks_between(c.until_ms, now_ms, more)
            }
            None => cron.count_ticks_between(created_at_ms, now_ms, MAX_EXPECTED_TICKS),
        };
        wire.expected_ticks = Some(u64::try_from(ticks).unwrap_or(u64::MAX));
        let now = Counted { created_at_ms, cron: expression, timezone, until_ms: now_ms, ticks };
        counted.insert(name, now);
        wire
    }

    async fn submit(&self, command: Command) -> Result<Response, Error> {
        leasehold_core::validate_command(&command, self.journal.limits())?;
        match self.journal.propose(command).await? {
            Response::Refused(refusal) => Err(refusal.into()),
            response => Ok(response),
        }
    }
}

fn unexpected(response: &Response) -> Status {
    Error::Internal(format!("unexpected journal response {response:?}")).into()
}

#[tonic::async_trait]
impl Schedules for SchedulesService {
    async fn put(
        &self,
        request: Request<v1::PutScheduleRequest>,
    ) -> Result<Reply<v1::PutScheduleResponse>, Status> {
        let spec = request.into_inner().spec.ok_or_else(|| {
            Error::Invalid(leasehold_core::ValidationError::invalid("spec", "is required"))
        })?;
        let spec = convert::schedule_spec_from_wire(spec).map_err(Error::from)?;
        schedule_spec(&spec, self.journal.limits()).map_err(Error::from)?;
        if spec.template.command.is_none() && spec.template.queue.is_none() {
            // The default queue is the executor's: the payload would run as
            // a shell command on whichever node took it.
            return Err(Error::Invalid(leasehold_core::ValidationError::invalid(
                "spec.template.queue",
                "is required for a schedule without a command (the default, exec, runs its \
                 payload as a shell command)",
            ))
            .into());
        }
        let queue = spec.template.queue_name();
        if spec.template.command.is_some() && !is_command_queue(queue) {
            // Only command queues feed executors: the command would never run.
            return Err(Error::Invalid(leasehold_core::ValidationError::invalid(
                "spec.template.queue",
                format!("a schedule with a command must use a command queue (exec or exec.NAME), not {queue:?}"),
            ))
            .into());
        }
        match self.submit(Command::PutSchedule { spec }).await? {
            Response::ScheduleChanged => Ok(Reply::new(v1::PutScheduleResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    async fn delete(
        &self,
        request: Request<v1::DeleteScheduleRequest>,
    ) -> Result<Reply<v1::DeleteScheduleResponse>, Status> {
        let name = request.into_inner().name;
        match self.submit(Command::DeleteSchedule { name: name.clone() }).await? {
            Response::ScheduleChanged => {
                self.counted.lock().await.remove(&name);
                Ok(Reply::new(v1::DeleteScheduleResponse {}))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn get(
        &self,
        request: Request<v1::GetScheduleRequest>,
    ) -> Result<Reply<v1::Schedule>, Status> {
        let request = request.into_inner();
        validate::queue_name("name", &request.name).map_err(Error::from)?;
        let found = self
            .journal
            .read(request.stale, |state| state.schedule(&request.name).map(Read::of))
            .await
            .map_err(Error::from)?;
        let Some(found) = found else {
            self.counted.lock().await.remove(&request.name);
            return Err(Error::NotFound(format!("schedule {:?} not found", request.name)).into());
        };
        let mut counted = self.counted.lock().await;
        let now_ms = self.journal.clock().now_ms();
        Ok(Reply::new(Self::complete(found, now_ms, &mut counted)))
    }

    async fn list(
        &self,
        request: Request<v1::ListSchedulesRequest>,
    ) -> Result<Reply<v1::ListSchedulesResponse>, Status> {
        let stale = request.into_inner().stale;
        let read: Vec<Read> = self
            .journal
            .read(stale, |state| state.schedules().values().map(Read::of).collect())
            .await
            .map_err(Error::from)?;
        let mut counted = self.counted.lock().await;
        // Only schedules that still exist keep their counts.
        let names: std::collections::HashSet<&str> = read.iter().map(|r| r.name.as_str()).collect();
        counted.retain(|name, _| names.contains(name.as_str()));
        let now_ms = self.journal.clock().now_ms();
        let schedules =
            read.into_iter().map(|read| Self::complete(read, now_ms, &mut counted)).collect();
        Ok(Reply::new(v1::ListSchedulesResponse { schedules }))
    }

    async fn pause(
        &self,
        request: Request<v1::PauseScheduleRequest>,
    ) -> Result<Reply<v1::PauseScheduleResponse>, Status> {
        let name = request.into_inner().name;
        match self.submit(Command::SetPaused { name, paused: true }).await? {
            Response::ScheduleChanged => Ok(Reply::new(v1::PauseScheduleResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    async fn resume(
        &self,
        request: Request<v1::ResumeScheduleRequest>,
    ) -> Result<Reply<v1::ResumeScheduleResponse>, Status> {
        let name = request.into_inner().name;
        // The ticks due while it was paused that left no record go with
        // the resume, so the leader does not plan them as missed. Proposed
        // in the format every member is known to decode, so a follower
        // never forwards a command an older leader cannot read (below
        // format 6, or before every member's advert was heard, a plain
        // resume).
        let now_ms = if self.journal.is_leader() {
            self.journal.cluster_now_ms()
        } else {
            self.journal.clock().now_ms()
        };
        // Counted outside the state's lock: a long pause has many ticks.
        let schedule = self.journal.read_stale(|state| state.schedule(&name).cloned());
        let command = resume_command(&name, schedule.as_ref(), now_ms)
            .for_log_format(self.journal.heard_log_format());
        match self.submit(command).await? {
            Response::ScheduleChanged => Ok(Reply::new(v1::ResumeScheduleResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    async fn trigger(
        &self,
        request: Request<v1::TriggerScheduleRequest>,
    ) -> Result<Reply<v1::TriggerScheduleResponse>, Status> {
        let request = request.into_inner();
        validate::queue_name("name", &request.name).map_err(Error::from)?;
        let targets = self
            .journal
            .read_stale(|state| state.schedule(&request.name).cloned())
            .map(|schedule| self.journal.each_targets(&schedule.spec.template.tags))
            .unwrap_or_default();
        let command = if request.request_id.is_empty() {
            Command::Trigger { schedule: request.name, force: request.force, targets }
        } else {
            Command::TriggerOnce {
                request_id: request.request_id,
                schedule: request.name,
                force: request.force,
                targets,
            }
        };
        match self.submit(command).await? {
            Response::Tick(Some(TickOutcome::Fired { job_ids, .. })) => {
                Ok(Reply::new(v1::TriggerScheduleResponse { job_ids, skip_reason: String::new() }))
            }
            Response::Tick(Some(TickOutcome::Skipped { reason, .. })) => {
                Ok(Reply::new(v1::TriggerScheduleResponse {
                    job_ids: Vec::new(),
                    skip_reason: reason.as_str().to_string(),
                }))
            }
            other => Err(unexpected(&other)),
        }
    }
}

/// Most ticks counted for `expected_ticks`: counting is bounded work.
pub const MAX_EXPECTED_TICKS: usize = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE_MS: u64 = 60_000;

    fn read(cron: &str, timezone: &str, created_at_ms: u64) -> Read {
        Read {
            wire: v1::Schedule::default(),
            name: "s".into(),
            cron: cron.into(),
            timezone: timezone.into(),
            created_at_ms,
        }
    }

    fn expected(wire: &v1::Schedule) -> u64 {
        wire.expected_ticks.unwrap_or(u64::MAX)
    }

    #[test]
    fn counts_carried_over_from_read_to_read_equal_a_count_from_scratch() {
        let (cron, zone) = ("*/7 9-17 * * 1-5", "Europe/Berlin");
        let created = 1_767_225_600_000; // 2026-01-01T00:00Z
        let schedule = leasehold_core::cron::parse(cron, zone).expect("parses");
        let mut counted = HashMap::new();
        let mut now = created;
        for step in [1, 59, 600, 3, 2_000, 17, 9_000] {
            now += step * MINUTE_MS;
            let wire = SchedulesService::complete(read(cron, zone, created), now, &mut counted);
            let scratch = schedule.count_ticks_between(created, now, MAX_EXPECTED_TICKS);
            assert_eq!(expected(&wire), scratch as u64, "at {now}");
            assert_eq!(wire.next_tick_ms, schedule.next_after(now));
        }
        assert!(
            expected(&SchedulesService::complete(read(cron, zone, created), now, &mut counted))
                > 100
        );
    }

    #[test]
    fn a_changed_expression_or_a_clock_gone_back_is_counted_afresh() {
        let mut counted = HashMap::new();
        let at = |minutes: u64| minutes * MINUTE_MS;
        let mut complete = |cron: &str, created: u64, now: u64| {
            expected(&SchedulesService::complete(read(cron, "UTC", created), now, &mut counted))
        };
        assert_eq!(complete("* * * * *", 0, at(10)), 10);
        assert_eq!(complete("* * * * *", 0, at(20)), 20);
        assert_eq!(complete("*/2 * * * *", 0, at(30)), 15, "a new expression");
        assert_eq!(complete("*/2 * * * *", at(10), at(30)), 10, "recreated later");
        assert_eq!(complete("*/2 * * * *", at(10), at(20)), 5, "the clock went back");
        assert_eq!(complete("not cron", 0, at(20)), u64::MAX, "no count when it does not parse");
        assert_eq!(complete("*/2 * * * *", at(10), at(40)), 15);
    }
}
