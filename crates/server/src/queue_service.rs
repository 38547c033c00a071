//! The public `leasehold.v1.Queue` service: validates input, proposes journal
//! commands, and turns responses and refusals into replies and statuses.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use leasehold_core::schedule::is_command_queue;
use leasehold_core::validate::{self, validate_command};
use leasehold_core::{
    Command, JobFilter, RedriveTarget, Response, ValidationError, ValidationKind,
};
use leasehold_proto::convert;
use leasehold_proto::v1;
use leasehold_proto::v1::queue_server::Queue;
use leasehold_security::Role;
use tonic::{Request, Response as Reply, Status};

use crate::auth::Caller;
pub use session::{MAX_SESSION_IN_FLIGHT, SESSION_IDLE, SessionStream};

mod session;

/// The service's gRPC name.
const SERVICE: &str = "leasehold.v1.Queue";
use crate::error::Error;
use leasehold_replica::Journal;
use leasehold_replica::Unavailable;

/// Longest long-poll a claim may ask for.
pub const MAX_CLAIM_WAIT: Duration = Duration::from_secs(30);
/// Page size when a list request names none.
const DEFAULT_PAGE_SIZE: u32 = 100;

/// Most queues a `Stats` reply lists when no queue is named: the ones
/// holding the most jobs (`queue_count` counts them all).
pub const MAX_LISTED_QUEUES: usize = 1_000;
/// How often a long-poll re-checks when nothing wakes it (a job may become
/// due on its own clock, which no apply announces).
const CLAIM_RECHECK: Duration = Duration::from_millis(250);

/// Serves `leasehold.v1.Queue`.
#[derive(Clone)]
pub struct QueueService {
    journal: Journal,
    /// Set when the node shuts down: open sessions end.
    closing: Option<tokio::sync::watch::Receiver<bool>>,
}

impl QueueService {
    /// A service proposing through `journal`.
    pub fn new(journal: Journal) -> Self {
        QueueService { journal, closing: None }
    }

    /// The same service, ending its open sessions when `closing` turns
    /// true (a long-lived stream would otherwise hold the server's
    /// graceful shutdown open).
    pub fn with_shutdown(mut self, closing: tokio::sync::watch::Receiver<bool>) -> Self {
        self.closing = Some(closing);
        self
    }

    /// Whether the node has started to shut down.
    fn is_closing(&self) -> bool {
        self.closing.as_ref().is_some_and(|closing| *closing.borrow())
    }

    /// Validates `command` (once: the edge's one check before proposing;
    /// apply checks again, as every replica must) and proposes it.
    async fn submit(&self, command: Command) -> Result<Response, Error> {
        validate_command(&command, self.journal.limits())?;
        self.propose_valid(command).await
    }

    /// Proposes a command the caller has validated; a refusal becomes its
    /// status.
    async fn propose_valid(&self, command: Command) -> Result<Response, Error> {
        match self.journal.propose(command).await? {
            Response::Refused(refusal) => Err(refusal.into()),
            response => Ok(response),
        }
    }

    /// One claim round of a long-poll; `command` was validated when the
    /// call came in.
    async fn claim_once(&self, command: &Command) -> Result<Vec<v1::Grant>, Error> {
        let queue = match command {
            Command::Claim { queue, .. } | Command::ClaimOnce { queue, .. } => queue.as_str(),
            other => return Err(Error::Internal(format!("not a claim: {other:?}"))),
        };
        match self.propose_valid(command.clone()).await? {
            // Only leases on the queue the caller was checked for: a leader
            // of an older version answers a retried claim with the first
            // try's leases whatever queue the retry names.
            Response::Claimed(grants) => Ok(grants
                .iter()
                .filter(|grant| grant.job.queue == queue)
                .map(convert::grant_to_wire)
                .collect()),
            other => Err(unexpected(&other)),
        }
    }
}

impl QueueService {
    /// Counts and times a call that started at `started` and ended with
    /// `result`, and on a follower adds the leader hint
    /// ([`leasehold_proto::LEADER_HINT_HEADER`]) to its answer. The calls
    /// await their handlers themselves and hand the result here: an async
    /// wrapper taking the handler's future by value would keep it twice
    /// (rustc), and tonic boxes and moves every call's future.
    fn finish<T>(
        &self,
        method: &'static str,
        started: std::time::Instant,
        mut result: Result<Reply<T>, Status>,
    ) -> Result<Reply<T>, Status> {
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.journal.metrics().observe_rpc(method, code, started.elapsed());
        self.hint_leader(&mut result);
        result
    }

    /// On a follower, names the leader on an answer
    /// ([`leasehold_proto::LEADER_HINT_HEADER`]).
    fn hint_leader<T>(&self, result: &mut Result<Reply<T>, Status>) {
        if let Ok(reply) = result
            && let Some(leader) = self.journal.leader_hint()
            && let Ok(value) = tonic::metadata::MetadataValue::try_from(leader.as_str())
        {
            reply.metadata_mut().insert(leasehold_proto::LEADER_HINT_HEADER, value);
        }
    }
}

fn unexpected(response: &Response) -> Error {
    Error::Internal(format!("unexpected journal response {response:?}"))
}

/// The field of a refresh's lease at `index`.
fn leases_field(index: usize) -> String {
    format!("leases[{index}].job_id")
}

fn invalid(field: &str, problem: impl Into<String>) -> Error {
    Error::Invalid(ValidationError {
        kind: ValidationKind::Invalid,
        field: field.to_string(),
        problem: problem.into(),
    })
}

impl QueueService {
    /// PERMISSION_DENIED unless `caller` is an admin (or a node), when any
    /// of `job_ids` is a job of a command queue: settling, renewing or
    /// handing back a command's lease decides whether a shell command runs
    /// (again), so it is for the executors and admins alone, like claiming
    /// one. A fencing token is no proof of the right: readers see it
    /// (GetJob, ListJobs). `field` names the request's field of the id at
    /// a position (`leases[2].job_id`), for the refusal.
    ///
    /// A job's queue never changes and ids are never reused, so the local
    /// state decides when it knows the job. A job it does not know (this
    /// node trails the leader) is looked up again after a read barrier.
    /// Answers, for a caller that is not an admin, the ids that name no job
    /// even then (id 0 aside, which validation refuses): the call must not
    /// propose for those, since ids and tokens are counters anyone may read
    /// (Stats) and a job enqueued and claimed between the barrier and the
    /// apply could be a command.
    async fn require_admin_on_command_jobs(
        &self,
        caller: &Caller,
        what: &str,
        field: impl Fn(usize) -> String,
        job_ids: &[u64],
    ) -> Result<HashSet<u64>, Status> {
        if caller.may(Role::Admin) {
            return Ok(HashSet::new());
        }
        let refusal =
            |index: usize, job_id: u64| format!("{}: {what} of command job {job_id}", field(index));
        let mut unknown = Vec::new();
        let refused = self.journal.read_stale(|state| {
            for (index, &job_id) in job_ids.iter().enumerate() {
                match state.job_queue(job_id) {
                    Some(queue) if is_command_queue(queue) => return Some(refusal(index, job_id)),
                    Some(_) => {}
                    // Job 0 is refused as invalid once the call runs.
                    None if job_id != 0 => unknown.push(index),
                    None => {}
                }
            }
            None
        });
        if let Some(refused) = refused {
            caller.require(Role::Admin, &refused)?;
        }
        if unknown.is_empty() {
            return Ok(HashSet::new());
        }
        let (refused, unknown) = self
            .journal
            .read(false, |state| {
                let mut still_unknown = HashSet::new();
                for index in unknown {
                    let job_id = job_ids[index];
                    match state.job_queue(job_id) {
                        Some(queue) if is_command_queue(queue) => {
                            return (Some(refusal(index, job_id)), HashSet::new());
                        }
                        Some(_) => {}
                        None => {
                            still_unknown.insert(job_id);
                        }
                    }
                }
                (None, still_unknown)
            })
            .await
            .map_err(Error::from)?;
        if let Some(refused) = refused {
            caller.require(Role::Admin, &refused)?;
        }
        Ok(unknown)
    }

    /// [`Self::require_admin_on_command_jobs`] for a call's one job, and
    /// NOT_FOUND (as apply would answer) for a job that does not exist.
    async fn require_known_job(
        &self,
        caller: &Caller,
        what: &str,
        job_id: u64,
    ) -> Result<(), Status> {
        let unknown = self
            .require_admin_on_command_jobs(caller, what, |_| "job_id".into(), &[job_id])
            .await?;
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(Error::NotFound(format!("job {job_id} not found")).into())
        }
    }

    async fn enqueue_call(
        &self,
        request: Request<v1::EnqueueRequest>,
    ) -> Result<Reply<v1::EnqueueResponse>, Status> {
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        for (index, spec) in request.jobs.iter().enumerate() {
            if is_command_queue(&spec.queue) {
                let what = format!("jobs[{index}].queue: enqueue on command queue {}", spec.queue);
                caller.require(Role::Admin, &what)?;
            }
            if let Some(key) = &spec.idempotency_key {
                let field = format!("jobs[{index}].idempotency_key");
                validate::enqueue_key(&field, key).map_err(Error::from)?;
            }
        }
        let now_ms = self.journal.clock().now_ms();
        let jobs = request
            .jobs
            .into_iter()
            .enumerate()
            .map(|(index, spec)| convert::job_spec_from_wire(spec, index, now_ms))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::from)?;
        match self.submit(Command::Enqueue { jobs }).await? {
            Response::Enqueued(outcomes) => Ok(Reply::new(v1::EnqueueResponse {
                results: outcomes
                    .iter()
                    .map(|o| v1::EnqueueResult { job_id: o.job_id, duplicate: o.duplicate })
                    .collect(),
            })),
            other => Err(unexpected(&other).into()),
        }
    }

    async fn claim_call(
        &self,
        request: Request<v1::ClaimRequest>,
    ) -> Result<Reply<v1::ClaimResponse>, Status> {
        // The node's hold on the call is measured from here, on its
        // monotonic clock, and told to the client (`waited_ms`).
        let received = tokio::time::Instant::now();
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        if is_command_queue(&request.queue) {
            // The commands of the fleet are for the nodes' executors.
            let what = format!("queue: claim on command queue {}", request.queue);
            caller.require(Role::Admin, &what)?;
        }
        if self.journal.is_draining() {
            return Err(Error::Unavailable(Unavailable::Draining).into());
        }
        let wait = Duration::from_millis(request.wait_ms);
        if wait > MAX_CLAIM_WAIT {
            return Err(invalid(
                "wait_ms",
                format!("is {}, limit {}", request.wait_ms, MAX_CLAIM_WAIT.as_millis()),
            )
            .into());
        }
        let (queue, selector) = (request.queue.clone(), request.selector.clone());
        // With a request id the claim is answered once: its retries get
        // the leases it granted, not new ones.
        let command = if request.request_id.is_empty() {
            Command::Claim {
                worker: request.worker,
                queue: request.queue,
                max: request.max,
                lease_ttl_ms: request.lease_ttl_ms,
                selector: request.selector,
            }
        } else {
            Command::ClaimOnce {
                request_id: request.request_id,
                worker: request.worker,
                queue: request.queue,
                max: request.max,
                lease_ttl_ms: request.lease_ttl_ms,
                selector: request.selector,
            }
        };
        validate_command(&command, self.journal.limits()).map_err(Error::from)?;
        if let Command::ClaimOnce { worker, .. } = &command {
            validate::claim_worker("worker", worker).map_err(Error::from)?;
        }
        // A retry of a claim that granted is answered from the request log,
        // though the queue may hold nothing claimable now (its first try
        // took the job): it is proposed at once, and answered as is. The
        // lease predates this call, so no hold is counted (`waited_ms` 0).
        // Checked on every pass: on a follower the first try's claim may
        // apply while this one waits.
        let remembered = || match &command {
            Command::ClaimOnce { request_id, worker, .. } => {
                self.journal.read_stale(|state| state.remembers_claim(worker, request_id))
            }
            _ => false,
        };
        let (queue, selector) = (&queue, &selector);
        let deadline = tokio::time::Instant::now() + wait;
        let mut applied = self.journal.state_machine().subscribe();
        loop {
            // A node shutting down grants nothing more (a session answers
            // its running frames for a little while, but a claim granted
            // then might not be answered in time).
            if self.is_closing() {
                return Err(Error::Unavailable(Unavailable::ShuttingDown).into());
            }
            if remembered() {
                // Answered with every lease the first try granted, whatever
                // this try's `max`: a follower forwarding it must be able to
                // carry them back, or the client asks the leader.
                if let Command::ClaimOnce { request_id, worker, .. } = &command
                    && !self.journal.is_leader()
                {
                    let leases = self
                        .journal
                        .read_stale(|state| state.remembered_claim_leases(worker, request_id));
                    let cap = self.journal.forwarded_lease_cap();
                    if leases > cap as usize {
                        return Err(Error::Unavailable(Unavailable::Peer(format!(
                            "the first try of request {request_id} holds {leases} leases, more \
                             than a follower carries back ({cap}): retry it at the leader"
                        )))
                        .into());
                    }
                }
                let grants = self.claim_once(&command).await?;
                return Ok(Reply::new(v1::ClaimResponse { grants, waited_ms: 0 }));
            }
            // Propose only when the local state shows something claimable. On
            // the leader that state is current; on a follower it trails by a
            // replication round, which the wait below absorbs (it wakes on
            // every apply). Proposing blindly from followers made idle
            // long-polls feed each other: every empty claim is an apply that
            // wakes the other pollers.
            let worth_proposing = self.journal.read_stale(|state| {
                state.has_claimable(queue, selector, self.journal.clock().now_ms())
            });
            if worth_proposing {
                let waited_ms = u64::try_from(received.elapsed().as_millis()).unwrap_or(u64::MAX);
                let grants = self.claim_once(&command).await?;
                if !grants.is_empty() {
                    self.journal.metrics().leases_granted.inc_by(grants.len() as u64);
                    return Ok(Reply::new(v1::ClaimResponse { grants, waited_ms }));
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Reply::new(v1::ClaimResponse { grants: Vec::new(), waited_ms: 0 }));
            }
            if self.journal.is_draining() {
                return Err(Error::Unavailable(Unavailable::Draining).into());
            }
            let next_check = (now + CLAIM_RECHECK).min(deadline);
            applied.borrow_and_update();
            let _ = tokio::time::timeout_at(next_check, applied.changed()).await;
        }
    }

    async fn refresh_call(
        &self,
        request: Request<v1::RefreshRequest>,
    ) -> Result<Reply<v1::RefreshResponse>, Status> {
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        let mut command = Command::Refresh {
            worker: request.worker,
            leases: request.leases.iter().map(|l| (l.job_id, l.token)).collect(),
            lease_ttl_ms: request.lease_ttl_ms,
        };
        validate_command(&command, self.journal.limits()).map_err(Error::from)?;
        let job_ids: Vec<u64> = request.leases.iter().map(|lease| lease.job_id).collect();
        let unknown =
            self.require_admin_on_command_jobs(&caller, "refresh", leases_field, &job_ids).await?;
        // A lease on no job is lost, as apply would say; it is not proposed.
        let mut lost: Vec<u64> = job_ids.into_iter().filter(|id| unknown.contains(id)).collect();
        if let Command::Refresh { leases, .. } = &mut command {
            leases.retain(|(job_id, _)| !unknown.contains(job_id));
            if leases.is_empty() {
                return Ok(Reply::new(v1::RefreshResponse { renewed: Vec::new(), lost }));
            }
        }
        match self.propose_valid(command).await? {
            Response::Refreshed { renewed, lost: also_lost } => {
                lost.extend(also_lost);
                Ok(Reply::new(v1::RefreshResponse {
                    renewed: renewed.iter().map(convert::lease_to_wire).collect(),
                    lost,
                }))
            }
            other => Err(unexpected(&other).into()),
        }
    }

    async fn ack_call(
        &self,
        request: Request<v1::AckRequest>,
    ) -> Result<Reply<v1::AckResponse>, Status> {
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        self.require_known_job(&caller, "ack", request.job_id).await?;
        let result = (!request.result.is_empty()).then_some(request.result);
        let command = Command::Ack { job_id: request.job_id, token: request.token, result };
        match self.submit(command).await? {
            Response::Acked => Ok(Reply::new(v1::AckResponse {})),
            other => Err(unexpected(&other).into()),
        }
    }

    async fn nack_call(
        &self,
        request: Request<v1::NackRequest>,
    ) -> Result<Reply<v1::NackResponse>, Status> {
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        self.require_known_job(&caller, "nack", request.job_id).await?;
        let command = Command::Nack {
            job_id: request.job_id,
            token: request.token,
            error: request.error,
            retry_after_ms: request.retry_after_ms,
        };
        match self.submit(command).await? {
            Response::Nacked { state, not_before_ms } => Ok(Reply::new(v1::NackResponse {
                state: convert::job_state_to_wire(state) as i32,
                not_before_ms,
            })),
            other => Err(unexpected(&other).into()),
        }
    }

    async fn release_call(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Reply<v1::ReleaseResponse>, Status> {
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        self.require_known_job(&caller, "release", request.job_id).await?;
        match self.submit(Command::Release { job_id: request.job_id, token: request.token }).await?
        {
            Response::Released => Ok(Reply::new(v1::ReleaseResponse {})),
            other => Err(unexpected(&other).into()),
        }
    }

    async fn get_job_call(
        &self,
        request: Request<v1::GetJobRequest>,
    ) -> Result<Reply<v1::GetJobResponse>, Status> {
        let request = request.into_inner();
        if request.job_id == 0 {
            return Err(invalid("job_id", "must be at least 1").into());
        }
        let job = self
            .journal
            .read(request.stale, |state| {
                state.job(request.job_id).map(|job| convert::job_to_wire(&job))
            })
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("job {} not found", request.job_id)))?;
        Ok(Reply::new(v1::GetJobResponse { job: Some(job) }))
    }

    async fn list_jobs_call(
        &self,
        request: Request<v1::ListJobsRequest>,
    ) -> Result<Reply<v1::ListJobsResponse>, Status> {
        let request = request.into_inner();
        let limits = self.journal.limits();
        if let Some(queue) = &request.queue {
            validate::queue_name("queue", queue).map_err(Error::from)?;
        }
        let state =
            convert::job_state_filter_from_wire("state", request.state).map_err(Error::from)?;
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n as usize > limits.max_batch => {
                return Err(
                    invalid("page_size", format!("is {n}, limit {}", limits.max_batch)).into()
                );
            }
            n => n,
        };
        let after_id = if request.page_token.is_empty() {
            0
        } else {
            request
                .page_token
                .parse::<u64>()
                .map_err(|_| invalid("page_token", "is not a token this server issued"))?
        };
        let filter = JobFilter { queue: request.queue, state };
        let (jobs, more) = self
            .journal
            .read(request.stale, |state| {
                let mut jobs = state.jobs(&filter, after_id, page_size as usize + 1);
                let more = jobs.len() > page_size as usize;
                jobs.truncate(page_size as usize);
                (jobs.iter().map(convert::job_to_wire).collect::<Vec<_>>(), more)
            })
            .await
            .map_err(Error::from)?;
        let next_page_token = match (more, jobs.last()) {
            (true, Some(last)) => last.id.to_string(),
            _ => String::new(),
        };
        Ok(Reply::new(v1::ListJobsResponse { jobs, next_page_token }))
    }

    async fn stats_call(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Reply<v1::StatsResponse>, Status> {
        let request = request.into_inner();
        if let Some(queue) = &request.queue {
            validate::queue_name("queue", queue).map_err(Error::from)?;
        }
        let now_ms = self.journal.clock().now_ms();
        let reply = self
            .journal
            .read(request.stale, |state| {
                let asked = |queue: &str| request.queue.as_deref().is_none_or(|q| q == queue);
                let at_ms = state.cluster_time_ms().max(now_ms);
                // One queue is looked up; all of them are ranked by size and
                // the largest listed, since producers name queues and a
                // reply must not grow with their number.
                let (listed, queue_count) = match request.queue.as_deref() {
                    Some(queue) => {
                        let one: BTreeMap<_, _> = state
                            .stats_of(queue, now_ms)
                            .map(|stats| (queue.to_string(), stats))
                            .into_iter()
                            .collect();
                        let count = one.len();
                        (one, count)
                    }
                    None => state.largest_queue_stats(now_ms, MAX_LISTED_QUEUES),
                };
                v1::StatsResponse {
                    queues: listed
                        .iter()
                        .map(|(queue, stats)| convert::queue_stats_to_wire(queue, stats))
                        .collect(),
                    queue_count: u64::try_from(queue_count).unwrap_or(u64::MAX),
                    cluster_time_ms: state.cluster_time_ms(),
                    last_token: state.last_token(),
                    last_job_id: state.last_job_id(),
                    oldest_ready: listed
                        .keys()
                        .filter_map(|queue| {
                            let due = state.oldest_ready_in(queue, now_ms)?;
                            Some(convert::oldest_ready_to_wire(queue, due, at_ms))
                        })
                        .collect(),
                    recent_expiries: state
                        .recent_expiries()
                        .iter()
                        .filter(|expired| asked(&expired.queue))
                        .map(convert::expired_lease_to_wire)
                        .collect(),
                    recent_redeliveries: state
                        .recent_redeliveries()
                        .iter()
                        .filter(|again| asked(&again.queue))
                        .map(convert::redelivery_to_wire)
                        .collect(),
                }
            })
            .await
            .map_err(Error::from)?;
        Ok(Reply::new(reply))
    }

    async fn redrive_call(
        &self,
        request: Request<v1::RedriveRequest>,
    ) -> Result<Reply<v1::RedriveResponse>, Status> {
        let caller = Caller::of(&request)?.clone();
        let request = request.into_inner();
        // Redriving a dead command runs it again.
        if let Some(queue) = request.queue.as_deref().filter(|q| is_command_queue(q)) {
            caller.require(Role::Admin, &format!("queue: redrive on command queue {queue}"))?;
        }
        let target = match (request.queue, request.job_ids.is_empty()) {
            (Some(queue), true) => RedriveTarget::Queue(queue),
            (None, false) => RedriveTarget::Ids(request.job_ids),
            (Some(_), false) => {
                return Err(invalid("queue", "give either queue or job_ids, not both").into());
            }
            (None, true) => return Err(invalid("queue", "give a queue or job_ids").into()),
        };
        let mut command = Command::Redrive { target };
        validate_command(&command, self.journal.limits()).map_err(Error::from)?;
        if let Command::Redrive { target: RedriveTarget::Ids(job_ids) } = &mut command {
            let field = |index: usize| format!("job_ids[{index}]");
            let unknown =
                self.require_admin_on_command_jobs(&caller, "redrive", field, job_ids).await?;
            // A job unknown even after the read barrier is not proposed: a
            // command job could be enqueued, fail and die before the apply.
            // The redrive would have skipped it had it applied at once.
            job_ids.retain(|job_id| !unknown.contains(job_id));
            if job_ids.is_empty() {
                return Ok(Reply::new(v1::RedriveResponse { redriven: 0 }));
            }
        }
        match self.propose_valid(command).await? {
            Response::Redriven(count) => Ok(Reply::new(v1::RedriveResponse { redriven: count })),
            other => Err(unexpected(&other).into()),
        }
    }
}

#[tonic::async_trait]
impl Queue for QueueService {
    async fn enqueue(
        &self,
        request: Request<v1::EnqueueRequest>,
    ) -> Result<Reply<v1::EnqueueResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.enqueue_call(request).await;
        self.finish("enqueue", started, result)
    }

    async fn claim(
        &self,
        request: Request<v1::ClaimRequest>,
    ) -> Result<Reply<v1::ClaimResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.claim_call(request).await;
        self.finish("claim", started, result)
    }

    async fn refresh(
        &self,
        request: Request<v1::RefreshRequest>,
    ) -> Result<Reply<v1::RefreshResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.refresh_call(request).await;
        self.finish("refresh", started, result)
    }

    async fn ack(
        &self,
        request: Request<v1::AckRequest>,
    ) -> Result<Reply<v1::AckResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.ack_call(request).await;
        self.finish("ack", started, result)
    }

    async fn nack(
        &self,
        request: Request<v1::NackRequest>,
    ) -> Result<Reply<v1::NackResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.nack_call(request).await;
        self.finish("nack", started, result)
    }

    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Reply<v1::ReleaseResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.release_call(request).await;
        self.finish("release", started, result)
    }

    async fn get_job(
        &self,
        request: Request<v1::GetJobRequest>,
    ) -> Result<Reply<v1::GetJobResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.get_job_call(request).await;
        self.finish("get_job", started, result)
    }

    async fn list_jobs(
        &self,
        request: Request<v1::ListJobsRequest>,
    ) -> Result<Reply<v1::ListJobsResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.list_jobs_call(request).await;
        self.finish("list_jobs", started, result)
    }

    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Reply<v1::StatsResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.stats_call(request).await;
        self.finish("stats", started, result)
    }

    async fn redrive(
        &self,
        request: Request<v1::RedriveRequest>,
    ) -> Result<Reply<v1::RedriveResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.redrive_call(request).await;
        self.finish("redrive", started, result)
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<tonic::Streaming<v1::SessionRequest>>,
    ) -> Result<Reply<SessionStream>, Status> {
        // Not counted as a call: it lasts as long as the session, and each
        // of its frames is counted under its own call's name.
        let mut result = self.session_call(request).await;
        self.hint_leader(&mut result);
        result
    }
}
