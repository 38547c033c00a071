//! The public `leasehold.v1.Schedules` service, and the target selection a
//! `target = each` tick uses (shared with the node's ticker).

use leasehold_core::schedule::is_command_queue;
use leasehold_core::schedule::{Schedule, TickOutcome};
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
}

impl SchedulesService {
    /// A service proposing through `journal`.
    pub fn new(journal: Journal) -> Self {
        SchedulesService { journal }
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
        match self.submit(Command::DeleteSchedule { name }).await? {
            Response::ScheduleChanged => Ok(Reply::new(v1::DeleteScheduleResponse {})),
            other => Err(unexpected(&other)),
        }
    }

    async fn get(
        &self,
        request: Request<v1::GetScheduleRequest>,
    ) -> Result<Reply<v1::Schedule>, Status> {
        let request = request.into_inner();
        validate::queue_name("name", &request.name).map_err(Error::from)?;
        let now_ms = self.journal.clock().now_ms();
        let found = self
            .journal
            .read(request.stale, |state| {
                state.schedule(&request.name).map(|s| schedule_to_wire(s, now_ms))
            })
            .await
            .map_err(Error::from)?;
        found
            .map(Reply::new)
            .ok_or_else(|| Error::NotFound(format!("schedule {:?} not found", request.name)).into())
    }

    async fn list(
        &self,
        request: Request<v1::ListSchedulesRequest>,
    ) -> Result<Reply<v1::ListSchedulesResponse>, Status> {
        let stale = request.into_inner().stale;
        let now_ms = self.journal.clock().now_ms();
        let schedules = self
            .journal
            .read(stale, |state| {
                state.schedules().values().map(|s| schedule_to_wire(s, now_ms)).collect()
            })
            .await
            .map_err(Error::from)?;
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
        match self.submit(Command::SetPaused { name, paused: false }).await? {
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

/// A schedule on the wire as of `now_ms`: with its next tick and the ticks
/// its expression had since it was created, if the expression still parses.
fn schedule_to_wire(schedule: &Schedule, now_ms: u64) -> v1::Schedule {
    let cron = leasehold_core::cron::parse(&schedule.spec.cron, &schedule.spec.timezone).ok();
    let mut wire =
        convert::schedule_to_wire(schedule, cron.as_ref().and_then(|c| c.next_after(now_ms)));
    wire.expected_ticks = cron.map(|cron| {
        let ticks = cron.ticks_between(schedule.created_at_ms, now_ms, MAX_EXPECTED_TICKS);
        u64::try_from(ticks.len()).unwrap_or(u64::MAX)
    });
    wire
}
