//! The worker loop: claim jobs up to a concurrency bound, run each under a
//! lease that is renewed every third of its TTL, and finish it with ack, nack
//! or release using the lease's fencing token.
//!
//! A lease is treated as lost at the worker's own monotonic
//! `sent + ttl - margin`, where `sent` is when the claim (plus the time the
//! node says it held it) or the last successful renewal was sent — never
//! when its answer arrived — or as soon as the server reports it lost;
//! the job's handler future is then dropped (a command it runs should be
//! killed on drop), and the job is not acked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto::v1;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::Client;

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
}

/// Runs a worker until `shutdown` turns true, then lets running jobs finish
/// within the grace period, releases what remains, and answers its report.
pub async fn run<H, Fut>(
    client: Client,
    config: WorkerConfig,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
) -> WorkerReport
where
    H: Fn(v1::Grant) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Outcome> + Send + 'static,
{
    let report = Arc::new(Mutex::new(WorkerReport::default()));
    let concurrency = config.concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut running = JoinSet::new();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let first = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = shutdown.changed() => continue,
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
            ..Default::default()
        };
        // The lease's local deadline counts from here (plus the time the
        // node says it held the call), never from the answer's arrival: a
        // slow answer must eat into the lease, not extend it.
        let sent_at = Instant::now();
        let claim = tokio::select! {
            claim = client.claim_with_wait(request) => claim,
            _ = shutdown.changed() => continue,
        };
        let (grants, granted_by) = match claim {
            Ok(reply) => (reply.grants, sent_at + Duration::from_millis(reply.waited_ms)),
            Err(error) => {
                tracing::warn!(%error, "claim failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        for grant in grants {
            let Some(permit) = held.pop() else {
                // The server never grants more than asked; if it did, give
                // the extra back rather than exceed the bound.
                if let Some(lease) = &grant.lease {
                    let _ = client.release(lease.job_id, lease.token).await;
                }
                continue;
            };
            let client = client.clone();
            let handler = handler.clone();
            let report = report.clone();
            let worker_id = config.worker_id.clone();
            let lease_ttl_ms = config.lease_ttl_ms;
            running.spawn(async move {
                run_one(client, worker_id, lease_ttl_ms, grant, granted_by, handler, report).await;
                drop(permit);
            });
        }
        while let Some(done) = running.try_join_next() {
            if let Err(error) = done {
                tracing::warn!(%error, "job task failed");
            }
        }
    }
    let deadline = Instant::now() + config.grace;
    while !running.is_empty() {
        match tokio::time::timeout_at(deadline, running.join_next()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(left = running.len(), "grace period over; abandoning running jobs");
                running.abort_all();
                while running.join_next().await.is_some() {}
            }
        }
    }
    report.lock().map(|r| r.clone()).unwrap_or_default()
}

/// The safety margin subtracted from a lease's TTL on the worker's clock.
pub fn lease_margin(ttl: Duration) -> Duration {
    (ttl / 5).min(Duration::from_secs(2))
}

/// Runs one job under its lease; `claimed_at` is no later than the grant
/// (the claim's send time plus the node's hold), where the lease's local
/// deadline starts.
async fn run_one<H, Fut>(
    client: Client,
    worker_id: String,
    lease_ttl_ms: Option<u64>,
    grant: v1::Grant,
    claimed_at: Instant,
    handler: H,
    report: Arc<Mutex<WorkerReport>>,
) where
    H: Fn(v1::Grant) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let Some(lease) = grant.lease.clone() else { return };
    let ttl = Duration::from_millis(lease.expires_at_ms.saturating_sub(lease.granted_at_ms));
    let (job_id, token) = (lease.job_id, lease.token);
    let outcome = tokio::select! {
        outcome = handler(grant) => Some(outcome),
        () = keep_renewed(&client, &worker_id, lease_ttl_ms, job_id, token, ttl, claimed_at) => None,
    };
    let record = |f: &dyn Fn(&mut WorkerReport)| {
        if let Ok(mut report) = report.lock() {
            f(&mut report);
        }
    };
    let Some(outcome) = outcome else {
        tracing::warn!(
            event = "lease.contend",
            job = job_id,
            token,
            "lease lost while running; not acking"
        );
        record(&|r| r.lost.push(job_id));
        return;
    };
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
    match finished {
        Ok(()) => {
            tracing::info!(
                event = "lease.release",
                job = job_id,
                token,
                outcome = outcome.name(),
                "job finished"
            );
            record(&|r| match outcome {
                Outcome::Ack { .. } => r.acked.push((job_id, token)),
                Outcome::Nack { .. } => r.nacked.push(job_id),
                Outcome::Release => r.released.push(job_id),
            })
        }
        Err(error) => {
            tracing::warn!(job = job_id, token, %error, "finishing the job failed");
            record(&|r| r.failed_finishes.push((job_id, error.to_string())));
        }
    }
}

/// Renews one lease every third of its TTL; returns when the lease is lost
/// (server says so, or the local deadline passes without a renewal).
async fn keep_renewed(
    client: &Client,
    worker_id: &str,
    lease_ttl_ms: Option<u64>,
    job_id: u64,
    token: u64,
    ttl: Duration,
    claimed_at: Instant,
) {
    let margin = lease_margin(ttl);
    let mut deadline = claimed_at + ttl.saturating_sub(margin);
    let period = (ttl / 3).max(Duration::from_millis(100));
    loop {
        let next = (Instant::now() + period).min(deadline);
        tokio::time::sleep_until(next).await;
        if Instant::now() >= deadline {
            return;
        }
        let sent_at = Instant::now();
        let request = v1::RefreshRequest {
            worker: worker_id.to_string(),
            leases: vec![v1::LeaseRef { job_id, token }],
            lease_ttl_ms,
        };
        match tokio::time::timeout_at(deadline, client.refresh(request)).await {
            Ok(Ok(reply))
                if reply.renewed.iter().any(|l| l.job_id == job_id && l.token == token) =>
            {
                let renewed_ttl = reply
                    .renewed
                    .iter()
                    .find(|l| l.job_id == job_id)
                    .map(|l| Duration::from_millis(l.expires_at_ms.saturating_sub(l.granted_at_ms)))
                    .unwrap_or(ttl);
                deadline = sent_at + renewed_ttl.saturating_sub(lease_margin(renewed_ttl));
            }
            Ok(Ok(_)) => return,
            Ok(Err(error)) => {
                tracing::warn!(job = job_id, %error, "lease renewal failed; will retry")
            }
            Err(_) => return,
        }
    }
}
