//! The worker loop: claim jobs up to a concurrency bound, run each under a
//! lease that is renewed every third of its TTL, and finish it with ack, nack
//! or release using the lease's fencing token.
//!
//! A lease is treated as lost at the worker's own monotonic
//! `sent + ttl - margin`, where `sent` is when the claim (plus the time the
//! node says it held it) or the last successful renewal was sent — never
//! when its answer arrived — or as soon as the server reports it lost;
//! the job's handler future is then dropped (a command it runs should be
//! killed on drop), its [`LeaseGuard`]'s token fires, and the job is not
//! acked.
//!
//! Each job runs as three parts: the handler in a task of its own, a
//! renewal task for its lease, and the job's task that waits for either
//! and finishes the job. So a handler that blocks its thread cannot stop
//! its lease's renewals — on a multi-threaded runtime, where the renewal
//! task runs on another thread. On a current-thread runtime (or with every
//! worker thread blocked) nothing else runs while a handler blocks:
//! renewals stop, the lease lapses on the node, and the worker, seeing its
//! deadline passed when the handler returns, does not ack. A renewal that
//! runs late logs `lease.renew_late`; blocking work belongs in
//! `tokio::task::spawn_blocking`, with the guard's token checked.
//!
//! Shutdown (the `shutdown` channel turning true) is a drain: no new
//! claims; every guard's token fires with [`CancelReason::Draining`];
//! jobs claimed but not started — a claim answered after shutdown was
//! asked, or one cut off mid-call, whose grants the worker collects by
//! asking again under the same request id — are released at once, no
//! attempt charged; running jobs get the grace period, their leases still
//! renewed; what still runs after it is dropped (and released, with
//! [`WorkerConfig::release_abandoned`]).
//!
//! A claim that fails is asked again after a pause. Claims refused for a
//! reason waiting cannot change (the credentials are unknown or lack the
//! worker role, a field the node refuses) are asked again slower and
//! slower, and once refused so for 10 s the worker stops as a drain does,
//! the refusal kept in [`WorkerReport::claims_refused`], unless
//! [`WorkerConfig::stop_on_refusal`] is off: then it asks on, the pause
//! doubling up to 30 s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto::v1;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{Client, ClientError, RetryPolicy, new_request_id};
pub use crate::guard::{CancelReason, LeaseGuard};

/// How a run of a job ended, as the handler reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: ack with the lease's token, keeping `result` on the job
    /// (empty = none; at most 16 KiB).
    Ack {
        /// The job's result (a command's standard output).
        result: Vec<u8>,
    },
    /// Failed: nack, retried after backoff (or `retry_after_ms`), or dead.
    Nack {
        /// Kept as the job's last_error.
        error: String,
        /// Overrides the job's backoff.
        retry_after_ms: Option<u64>,
    },
    /// Not run: give the job back without charging an attempt.
    Release,
}

impl Outcome {
    /// `ack`, `nack` or `release`, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Ack { .. } => "ack",
            Outcome::Nack { .. } => "nack",
            Outcome::Release => "release",
        }
    }
}

/// Settings of a worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Queue to claim from.
    pub queue: String,
    /// Worker id recorded as the lease holder.
    pub worker_id: String,
    /// Most jobs run at once.
    pub concurrency: usize,
    /// Lease length; `None` = each job's own.
    pub lease_ttl_ms: Option<u64>,
    /// This worker's tags.
    pub selector: Vec<String>,
    /// Long-poll wait of each claim.
    pub poll_wait_ms: u64,
    /// How long running jobs may continue after shutdown is asked.
    pub grace: Duration,
    /// Release the jobs still running when the grace period ends (they are
    /// dropped either way). Off by default: a node's executor leaves that
    /// to the node's drain, which releases and logs what it still holds;
    /// a standalone worker turns it on so its jobs need not wait out their
    /// TTL.
    pub release_abandoned: bool,
    /// Stop once claims have been refused for 10 s for a reason retrying
    /// cannot change (see the module docs). On by default, so a misconfigured worker
    /// ends, naming the refusal, rather than asking on; a node's executor
    /// turns it off and keeps asking, slower and slower.
    pub stop_on_refusal: bool,
}

impl WorkerConfig {
    /// Defaults for `queue` and `worker_id`: one job at a time, 5 s polls,
    /// 30 s grace.
    pub fn new(queue: impl Into<String>, worker_id: impl Into<String>) -> Self {
        WorkerConfig {
            queue: queue.into(),
            worker_id: worker_id.into(),
            concurrency: 1,
            lease_ttl_ms: None,
            selector: Vec::new(),
            poll_wait_ms: 5_000,
            grace: Duration::from_secs(30),
            release_abandoned: false,
            stop_on_refusal: true,
        }
    }
}

/// What a worker did, from its own records: the basis for checking that no
/// job was acked twice or lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// `(job_id, token)` of every ack the server accepted.
    pub acked: Vec<(u64, u64)>,
    /// Jobs nacked.
    pub nacked: Vec<u64>,
    /// Jobs released.
    pub released: Vec<u64>,
    /// Jobs whose lease was lost while running (not acked).
    pub lost: Vec<u64>,
    /// Acks, nacks or releases the server refused or that failed.
    pub failed_finishes: Vec<(u64, String)>,
    /// Jobs claimed but released on shutdown before their handler started.
    pub unstarted: Vec<u64>,
    /// Jobs still running when the grace period ended: dropped (and
    /// released, with [`WorkerConfig::release_abandoned`]).
    pub abandoned: Vec<u64>,
    /// The refusal that stopped the worker, with
    /// [`WorkerConfig::stop_on_refusal`]; `None` when it stopped because
    /// shutdown was asked.
    pub claims_refused: Option<ClaimsRefused>,
}

/// A claim refused for a reason retrying cannot change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimsRefused {
    /// The gRPC code of the refusal.
    pub code: tonic::Code,
    /// What the node (or the client, for a credential it could not send)
    /// said.
    pub message: String,
}

/// Whether a failed claim will be refused again however long the worker
/// waits: its credentials are unknown or lack the role, or the node
/// refuses a field of the request (which the worker sends unchanged).
/// Everything else — a node unreachable, draining or without a leader, a
/// deadline, an outcome unknown — can pass.
fn refused_for_good(error: &ClientError) -> bool {
    matches!(
        error.code(),
        tonic::Code::Unauthenticated
            | tonic::Code::PermissionDenied
            | tonic::Code::InvalidArgument
            | tonic::Code::Unimplemented
    )
}

/// The pause before a failed claim is asked again; doubled, up to
/// [`LONGEST_CLAIM_PAUSE`], while it is refused for good.
const CLAIM_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between claims refused for good.
const LONGEST_CLAIM_PAUSE: Duration = Duration::from_secs(30);
/// How long claims must have been refused for good, without a success or
/// another failure between, before the worker stops: long enough to ride
/// out one node that has not yet reloaded a token the others took, or a
/// proxy reloading its configuration.
const REFUSAL_PATIENCE: Duration = Duration::from_secs(10);

/// The failed claims since the last that succeeded: when to ask again, and
/// whether to stop.
#[derive(Debug)]
struct ClaimFailures {
    /// When the current run of refusals for good began.
    refused_since: Option<Instant>,
    /// The pause after the next refusal for good.
    pause: Duration,
}

impl Default for ClaimFailures {
    fn default() -> Self {
        ClaimFailures { refused_since: None, pause: CLAIM_PAUSE }
    }
}

/// What a worker does after a failed claim.
#[derive(Debug, PartialEq, Eq)]
enum AfterFailure {
    /// Ask again after this pause.
    Wait(Duration),
    /// Stop: refused for good for [`REFUSAL_PATIENCE`].
    Stop,
}

impl ClaimFailures {
    /// A claim failed at `now`, refused for good or not.
    fn failed(&mut self, for_good: bool, stop_on_refusal: bool, now: Instant) -> AfterFailure {
        if !for_good {
            *self = ClaimFailures::default();
            return AfterFailure::Wait(CLAIM_PAUSE);
        }
        let since = *self.refused_since.get_or_insert(now);
        if stop_on_refusal && now.saturating_duration_since(since) >= REFUSAL_PATIENCE {
            return AfterFailure::Stop;
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(LONGEST_CLAIM_PAUSE);
        AfterFailure::Wait(pause)
    }
}

/// How long releasing the lease of an unstarted or abandoned job may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long job tasks may take to wind up once the grace period is over
/// (the wait for their commands' groups to be gone, then their releases),
/// before they are aborted.
const WIND_UP: Duration = Duration::from_secs(8);

/// What every job task of one worker shares.
struct Shared {
    client: Client,
    worker_id: String,
    lease_ttl_ms: Option<u64>,
    release_abandoned: bool,
    report: Mutex<WorkerReport>,
    /// Fires when shutdown is asked: each guard's token is its child.
    drain: CancellationToken,
    /// Fires when the grace period is over: running handlers are dropped.
    abandon: CancellationToken,
}

impl Shared {
    fn record(&self, f: impl FnOnce(&mut WorkerReport)) {
        if let Ok(mut report) = self.report.lock() {
            f(&mut report);
        }
    }

    /// Gives back the lease of a job this worker will not finish; answers
    /// whether the node took it.
    async fn give_back(&self, job_id: u64, token: u64, why: &'static str) -> bool {
        match tokio::time::timeout(RELEASE_TIMEOUT, self.client.release(job_id, token)).await {
            Ok(Ok(())) => {
                tracing::info!(
                    event = "lease.release",
                    job = job_id,
                    token,
                    outcome = why,
                    "lease given back"
                );
                true
            }
            Ok(Err(error)) => {
                tracing::warn!(job = job_id, token, %error, "release failed; the lease will lapse");
                self.record(|r| r.failed_finishes.push((job_id, error.to_string())));
                false
            }
            Err(_) => {
                tracing::warn!(job = job_id, token, "release timed out; the lease will lapse");
                self.record(|r| r.failed_finishes.push((job_id, "release timed out".into())));
                false
            }
        }
    }
}

/// Runs a worker until `shutdown` turns true (or its sender is dropped),
/// then drains: no new claims, jobs not started released, running jobs
/// given the grace period, what remains released; answers its report.
///
/// The handler takes a [`LeaseGuard`] — or, when it needs only the job,
/// the bare [`v1::Grant`] — and runs in a task of its own (see the module
/// docs for what that buys and where it stops).
pub async fn run<H, A, Fut>(
    client: Client,
    config: WorkerConfig,
    handler: H,
    shutdown: watch::Receiver<bool>,
) -> WorkerReport
where
    H: Fn(A) -> Fut + Clone + Send + Sync + 'static,
    A: From<LeaseGuard> + Send + 'static,
    Fut: std::future::Future<Output = Outcome> + Send + 'static,
{
    let shared = Arc::new(Shared {
        client: client.clone(),
        worker_id: config.worker_id.clone(),
        lease_ttl_ms: config.lease_ttl_ms,
        release_abandoned: config.release_abandoned,
        report: Mutex::new(WorkerReport::default()),
        drain: CancellationToken::new(),
        abandon: CancellationToken::new(),
    });
    let watcher = tokio::spawn(watch_shutdown(shutdown, shared.drain.clone()));
    let concurrency = config.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut running = JoinSet::new();
    // A claim that failed: it may have been granted with its answer lost
    // (a node gone between commit and reply, a timeout), so the next claim
    // asks under its id, and the node answers those leases again instead
    // of leaving them to lapse unheld, each charging its job an attempt.
    let mut unanswered: Option<v1::ClaimRequest> = None;
    let mut failures = ClaimFailures::default();
    while !shared.drain.is_cancelled() {
        let first = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shared.drain.cancelled() => break,
        };
        let mut held = vec![first];
        while let Ok(permit) = permits.clone().try_acquire_owned() {
            held.push(permit);
        }
        let request = v1::ClaimRequest {
            worker: config.worker_id.clone(),
            queue: config.queue.clone(),
            max: held.len() as u32,
            lease_ttl_ms: config.lease_ttl_ms,
            selector: config.selector.clone(),
            wait_ms: config.poll_wait_ms,
            // Named here, so a claim cut off by shutdown or by a failure can
            // be asked again for what it was granted.
            request_id: unanswered
                .as_ref()
                .map_or_else(new_request_id, |failed| failed.request_id.clone()),
        };
        let carried = unanswered.take().is_some();
        // The lease's local deadline counts from here (plus the time the
        // node says it held the call), never from the answer's arrival: a
        // slow answer must eat into the lease, not extend it.
        let sent_at = Instant::now();
        let claim = tokio::select! {
            claim = client.claim_with_wait(request.clone()) => claim,
            () = shared.drain.cancelled() => {
                release_cut_off(&shared, request).await;
                break;
            }
        };
        let (grants, granted_by) = match claim {
            // Under a carried id the node may answer the failed try's
            // leases, granted before this try was sent: counted from this
            // send, their deadlines would run past their real ends. So they
            // are renewed first, and count from the renewal's send.
            Ok(reply) if carried && !reply.grants.is_empty() => {
                renewed_grants(&shared, reply.grants).await
            }
            Ok(reply) => (reply.grants, sent_at + Duration::from_millis(reply.waited_ms)),
            Err(error) => {
                let for_good = refused_for_good(&error);
                let pause = match failures.failed(for_good, config.stop_on_refusal, Instant::now())
                {
                    AfterFailure::Wait(pause) => pause,
                    AfterFailure::Stop => {
                        // Nothing to collect: asked again, under the same id
                        // and credentials, the claim is refused the same way.
                        tracing::error!(%error, "claims refused; the worker stops");
                        let message = match &error {
                            ClientError::Status(status) => status.message().to_string(),
                            other => other.to_string(),
                        };
                        let refused = ClaimsRefused { code: error.code(), message };
                        shared.record(|r| r.claims_refused = Some(refused));
                        // As a drain: guards fire, unstarted jobs go back,
                        // running ones get the grace period.
                        shared.drain.cancel();
                        break;
                    }
                };
                unanswered = Some(request);
                tracing::warn!(%error, pause_ms = pause.as_millis() as u64, "claim failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = shared.drain.cancelled() => {}
                }
                continue;
            }
        };
        failures = ClaimFailures::default();
        for grant in grants {
            let Some(permit) = held.pop() else {
                // The server never grants more than asked; if it did, give
                // the extra back rather than exceed the bound.
                if let Some(lease) = &grant.lease {
                    let _ = client.release(lease.job_id, lease.token).await;
                }
                continue;
            };
            let shared = shared.clone();
            let handler = handler.clone();
            running.spawn(async move {
                run_job(shared, grant, granted_by, handler).await;
                drop(permit);
            });
        }
        while let Some(done) = running.try_join_next() {
            if let Err(error) = done {
                tracing::warn!(%error, "job task failed");
            }
        }
    }
    // Stopped between a failed claim and its repeat: what it may have been
    // granted is collected and given back, as for a claim cut off.
    if let Some(failed) = unanswered {
        release_cut_off(&shared, failed).await;
    }
    let deadline = Instant::now() + config.grace;
    if tokio::time::timeout_at(deadline, join_all(&mut running)).await.is_err() {
        tracing::warn!(
            left = running.len(),
            "grace period over; dropping and releasing running jobs"
        );
        shared.abandon.cancel();
        if tokio::time::timeout(WIND_UP, join_all(&mut running)).await.is_err() {
            running.abort_all();
            join_all(&mut running).await;
        }
    }
    watcher.abort();
    let _ = watcher.await;
    shared.report.lock().map(|r| r.clone()).unwrap_or_default()
}

/// Cancels `drain` once `shutdown` turns true or its sender is gone.
async fn watch_shutdown(mut shutdown: watch::Receiver<bool>, drain: CancellationToken) {
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    drain.cancel();
}

async fn join_all(running: &mut JoinSet<()>) {
    while let Some(done) = running.join_next().await {
        if let Err(error) = done
            && !error.is_cancelled()
        {
            tracing::warn!(%error, "job task failed");
        }
    }
}

/// A claim cut off by shutdown may have been granted with its answer still
/// on the way: asks again under the same request id without waiting (the
/// node answers the first try's grants, or claims what is ready now) and
/// releases whatever comes back, so no lease waits out its TTL.
async fn release_cut_off(shared: &Shared, request: v1::ClaimRequest) {
    let again = v1::ClaimRequest { wait_ms: 0, ..request };
    // One try: a node that is draining refuses every claim (UNAVAILABLE),
    // and retrying that would only hold up this worker's own shutdown; the
    // node's drain releases what its executor holds.
    let once = shared.client.clone().with_retry(RetryPolicy { attempts: 1, ..Default::default() });
    let grants = match tokio::time::timeout(RELEASE_TIMEOUT, once.claim_with_wait(again)).await {
        Ok(Ok(reply)) => reply.grants,
        Ok(Err(error)) => {
            tracing::warn!(%error, "could not collect a claim cut off by shutdown");
            return;
        }
        Err(_) => {
            tracing::warn!("collecting a claim cut off by shutdown timed out");
            return;
        }
    };
    for lease in grants.into_iter().filter_map(|g| g.lease) {
        if shared.give_back(lease.job_id, lease.token, "unstarted").await {
            shared.record(|r| r.unstarted.push(lease.job_id));
        }
    }
}

/// `grants` answered to a repeated claim, renewed: those still held, with
/// their renewed leases, and the instant their deadlines count from (the
/// renewal's send). A lease the node says is lost is dropped; if the
/// renewal fails, nothing is known of when the leases were granted, so
/// none is started (each is released if the node can be reached, or
/// lapses).
async fn renewed_grants(shared: &Shared, grants: Vec<v1::Grant>) -> (Vec<v1::Grant>, Instant) {
    let sent_at = Instant::now();
    let request = v1::RefreshRequest {
        worker: shared.worker_id.clone(),
        leases: grants
            .iter()
            .filter_map(|grant| grant.lease.as_ref())
            .map(|lease| v1::LeaseRef { job_id: lease.job_id, token: lease.token })
            .collect(),
        lease_ttl_ms: shared.lease_ttl_ms,
    };
    let renewed = match shared.client.refresh(request).await {
        Ok(reply) => reply.renewed,
        Err(error) => {
            tracing::warn!(%error, "could not renew the leases of a repeated claim; giving them back");
            for lease in grants.iter().filter_map(|grant| grant.lease.as_ref()) {
                shared.give_back(lease.job_id, lease.token, "unconfirmed").await;
            }
            return (Vec::new(), sent_at);
        }
    };
    let still_held = grants
        .into_iter()
        .filter_map(|mut grant| {
            let lease = grant.lease.as_ref()?;
            let fresh = renewed
                .iter()
                .find(|renewed| renewed.job_id == lease.job_id && renewed.token == lease.token)?;
            grant.lease = Some(fresh.clone());
            Some(grant)
        })
        .collect();
    (still_held, sent_at)
}

/// The safety margin subtracted from a lease's TTL on the worker's clock.
pub fn lease_margin(ttl: Duration) -> Duration {
    (ttl / 5).min(Duration::from_secs(2))
}

/// How a job's run ended, before it is finished with the node.
enum Ended {
    /// Shutdown was asked before the handler started.
    Unstarted,
    /// The lease was lost while the handler ran.
    Lost,
    /// The grace period ended while the handler ran.
    Abandoned,
    /// The handler's task ended (its outcome, or its panic).
    Returned(Result<Outcome, tokio::task::JoinError>),
}

/// Runs one job under its lease; `claimed_at` is no later than the grant
/// (the claim's send time plus the node's hold), where the lease's local
/// deadline starts.
async fn run_job<H, A, Fut>(shared: Arc<Shared>, grant: v1::Grant, claimed_at: Instant, handler: H)
where
    H: Fn(A) -> Fut,
    A: From<LeaseGuard> + Send + 'static,
    Fut: std::future::Future<Output = Outcome> + Send + 'static,
{
    let Some(lease) = grant.lease else { return };
    let job = grant.job.unwrap_or_else(|| v1::Job { id: lease.job_id, ..Default::default() });
    let ttl = Duration::from_millis(lease.expires_at_ms.saturating_sub(lease.granted_at_ms));
    let (job_id, token) = (lease.job_id, lease.token);
    let deadline = claimed_at + ttl.saturating_sub(lease_margin(ttl));
    let guard = LeaseGuard::new(job, lease, deadline, &shared.drain);
    // The renewals run in a task of their own, so a handler that blocks
    // its thread does not hold them up (on a multi-threaded runtime).
    let renewer = tokio::spawn(keep_renewed(shared.clone(), guard.clone(), ttl));
    // Tasks outlive a dropped handle: should this job's task be aborted (a
    // handler stuck past the wind-up, or the worker's future dropped by its
    // caller), these stop with it, so no lease is renewed for a job nobody
    // runs any more.
    let _renewer_stops = AbortOnDrop(renewer.abort_handle());
    let ended = if shared.drain.is_cancelled() {
        Ended::Unstarted
    } else {
        let mut handle = tokio::spawn(handler(A::from(guard.clone())));
        let _handler_stops = AbortOnDrop(handle.abort_handle());
        let ended = tokio::select! {
            biased;
            () = guard.lost() => Ended::Lost,
            () = shared.abandon.cancelled() => Ended::Abandoned,
            joined = &mut handle => Ended::Returned(joined),
        };
        if !matches!(ended, Ended::Returned(_)) {
            // Dropped at its next await; a handler blocked in a thread
            // holds its slot until it gets there.
            handle.abort();
            let _ = handle.await;
        }
        ended
    };
    let outcome = match ended {
        Ended::Returned(Ok(outcome)) if Instant::now() < guard.deadline() => Some(outcome),
        Ended::Returned(Ok(_)) => {
            // The renewals did not keep up (a blocked runtime): the lease
            // may be someone else's by now.
            tracing::warn!(
                event = "lease.renew_late",
                job = job_id,
                token,
                "the handler returned after the lease's local deadline; not finishing it"
            );
            guard.mark_lost();
            None
        }
        Ended::Returned(Err(error)) => {
            Some(Outcome::Nack { error: format!("handler failed: {error}"), retry_after_ms: None })
        }
        Ended::Lost => None,
        Ended::Unstarted => {
            if shared.give_back(job_id, token, "unstarted").await {
                shared.record(|r| r.unstarted.push(job_id));
            }
            stop(renewer).await;
            return;
        }
        Ended::Abandoned => {
            // A command the dropped handler ran was killed with it; given
            // back before that is gone, it would run beside the next
            // holder, so a group still there leaves the lease to lapse.
            let give_back = shared.release_abandoned
                && crate::exec::commands_gone(crate::exec::KILL_SETTLE).await;
            if !give_back || shared.give_back(job_id, token, "abandoned").await {
                shared.record(|r| r.abandoned.push(job_id));
            }
            stop(renewer).await;
            return;
        }
    };
    let Some(outcome) = outcome else {
        tracing::warn!(
            event = "lease.contend",
            job = job_id,
            token,
            "lease lost while running; not acking"
        );
        shared.record(|r| r.lost.push(job_id));
        stop(renewer).await;
        return;
    };
    let client = &shared.client;
    let finished = match &outcome {
        Outcome::Ack { result } => client.ack_with_result(job_id, token, result.clone()).await,
        Outcome::Nack { error, retry_after_ms } => client
            .nack(v1::NackRequest {
                job_id,
                token,
                error: error.clone(),
                retry_after_ms: *retry_after_ms,
            })
            .await
            .map(|_| ()),
        Outcome::Release => client.release(job_id, token).await,
    };
    stop(renewer).await;
    match finished {
        Ok(()) => {
            tracing::info!(
                event = "lease.release",
                job = job_id,
                token,
                outcome = outcome.name(),
                "job finished"
            );
            shared.record(|r| match outcome {
                Outcome::Ack { .. } => r.acked.push((job_id, token)),
                Outcome::Nack { .. } => r.nacked.push(job_id),
                Outcome::Release => r.released.push(job_id),
            })
        }
        Err(error) => {
            tracing::warn!(job = job_id, token, %error, "finishing the job failed");
            shared.record(|r| r.failed_finishes.push((job_id, error.to_string())));
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn stop(task: tokio::task::JoinHandle<()>) {
    task.abort();
    let _ = task.await;
}

/// Renews one lease every third of its TTL until the lease is lost (the
/// server says so, or the local deadline passes without a renewal), then
/// marks the guard lost. The job's task stops it once the job is done.
async fn keep_renewed(shared: Arc<Shared>, guard: LeaseGuard, ttl: Duration) {
    let (job_id, token) = (guard.job_id(), guard.fencing_token());
    let mut deadline = guard.deadline();
    let period = (ttl / 3).max(Duration::from_millis(100));
    loop {
        let next = (Instant::now() + period).min(deadline);
        tokio::time::sleep_until(next).await;
        let woke = Instant::now();
        let late = woke.saturating_duration_since(next);
        if late > period / 2 {
            tracing::warn!(
                event = "lease.renew_late",
                job = job_id,
                token,
                late_ms = late.as_millis() as u64,
                "lease renewal ran late; is a handler blocking the runtime's threads?"
            );
        }
        if woke >= deadline {
            guard.mark_lost();
            return;
        }
        let request = v1::RefreshRequest {
            worker: shared.worker_id.clone(),
            leases: vec![v1::LeaseRef { job_id, token }],
            lease_ttl_ms: shared.lease_ttl_ms,
        };
        match tokio::time::timeout_at(deadline, shared.client.refresh(request)).await {
            Ok(Ok(reply)) => {
                let Some(renewed) =
                    reply.renewed.iter().find(|l| l.job_id == job_id && l.token == token)
                else {
                    guard.mark_lost();
                    return;
                };
                let renewed_ttl = Duration::from_millis(
                    renewed.expires_at_ms.saturating_sub(renewed.granted_at_ms),
                );
                deadline = woke + renewed_ttl.saturating_sub(lease_margin(renewed_ttl));
                guard.renewed_until(deadline);
            }
            Ok(Err(error)) => {
                tracing::warn!(job = job_id, %error, "lease renewal failed; will retry")
            }
            Err(_) => {
                guard.mark_lost();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_waiting_cannot_change_stop_a_worker() {
        let failed = |code| ClientError::Status(tonic::Status::new(code, "the node's words"));
        for code in [
            tonic::Code::Unauthenticated,
            tonic::Code::PermissionDenied,
            tonic::Code::InvalidArgument,
            tonic::Code::Unimplemented,
        ] {
            assert!(refused_for_good(&failed(code)), "{code:?}");
        }
        for code in [
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::FailedPrecondition,
            tonic::Code::ResourceExhausted,
            tonic::Code::Unknown,
            tonic::Code::Internal,
        ] {
            assert!(!refused_for_good(&failed(code)), "{code:?}");
        }
        let unknown = ClientError::OutcomeUnknown {
            first: tonic::Status::unavailable("gone"),
            last: tonic::Status::failed_precondition("stale"),
        };
        assert!(!refused_for_good(&unknown));
        assert!(refused_for_good(&ClientError::Credential("a token with a newline".into())));
    }

    #[test]
    fn claims_refused_for_good_stop_a_worker_after_a_while_and_others_never() {
        let start = Instant::now();
        // Refused for good, each time after the pause asked for.
        let run = |stop_on_refusal: bool, tries: usize| {
            let mut failures = ClaimFailures::default();
            let mut now = start;
            let mut pauses = Vec::new();
            for _ in 0..tries {
                match failures.failed(true, stop_on_refusal, now) {
                    AfterFailure::Wait(pause) => {
                        pauses.push(pause.as_millis());
                        now += pause;
                    }
                    AfterFailure::Stop => return (pauses, Some(now - start)),
                }
            }
            (pauses, None)
        };
        let (pauses, stopped) = run(true, 20);
        assert_eq!(pauses, [500, 1_000, 2_000, 4_000, 8_000]);
        assert_eq!(stopped, Some(Duration::from_millis(15_500)));
        let (pauses, stopped) = run(false, 12);
        assert_eq!(stopped, None);
        assert_eq!(pauses[..4], [500, 1_000, 2_000, 4_000]);
        assert_eq!(pauses.last().copied(), Some(LONGEST_CLAIM_PAUSE.as_millis()));

        // Another failure between refusals starts the patience over, and
        // is asked again after the first pause, not the last long one.
        let mut failures = ClaimFailures::default();
        let mut now = start;
        for _ in 0..4 {
            assert!(matches!(failures.failed(true, true, now), AfterFailure::Wait(_)));
            now += Duration::from_secs(3);
        }
        assert_eq!(failures.failed(false, true, now), AfterFailure::Wait(CLAIM_PAUSE));
        assert_eq!(failures.failed(true, true, now), AfterFailure::Wait(CLAIM_PAUSE));
        now += Duration::from_secs(9);
        assert!(matches!(failures.failed(true, true, now), AfterFailure::Wait(_)));
        now += Duration::from_secs(1);
        assert_eq!(failures.failed(true, true, now), AfterFailure::Stop);
    }
}
