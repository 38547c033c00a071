//! Goal: a worker whose Claim answer arrives late cancels its handler
//! before the server may hand the job to another claimant: the lease's
//! local deadline counts from the claim's send time, never from the
//! answer's arrival (issue acceptance, clocks; docs/safety.md).
//!
//! Method: one node, one job, and a `leasehold-client` worker (concurrency
//! one, 4 s leases) whose only path to the node is a proxy that delivers
//! every answer 2.5 s late — more than half the TTL; its requests pass at
//! once, so the node grants the lease the moment the claim is sent. The
//! handler would run for a minute; a guard inside it notes when the worker
//! drops it (the cancellation) and asks the worker to stop, so the worker
//! cannot claim the job again itself. Meanwhile a second claimant polls the
//! node directly. The handler must have started no earlier than the delay
//! after the worker started (the answer really was late), must be cancelled
//! before the worker's start plus the TTL (the claim was sent after that
//! start, and the node cannot hand the job over before the claim's arrival
//! plus the TTL), and the second claimant's granting request must have been
//! sent after the cancellation, under a larger token. The worker reports
//! the job as lost, never acked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use leasehold_client::Client;
use leasehold_client::worker::{self, Outcome, WorkerConfig};
use leasehold_proto::v1;
use tokio::sync::watch;
use tokio::time::Instant;

use super::proxy::Proxy;
use crate::e2e::cluster::cluster_slot;
use crate::e2e::support::{Check, Node, Sandbox, deadline_in, enqueue_job, phase, wait_until};

const QUEUE: &str = "deadline";
const WORKER: &str = "worker-slow-link";
const LEASE_TTL_MS: u64 = 4_000;
/// How late every answer reaches the worker: more than half the TTL.
const ANSWER_DELAY: Duration = Duration::from_millis(2_500);
/// How long the handler would run if nobody cancelled it.
const HANDLER_RUNS_FOR: Duration = Duration::from_secs(60);
/// How long after the worker starts the second claimant must have the job:
/// the TTL, the leader's sweep (about a second) and slack.
const SECOND_CLAIM_WITHIN: Duration = Duration::from_millis(LEASE_TTL_MS + 6_000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_claim_answer_cancels_the_handler_before_the_lease_ends() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("clocks-worker-deadline")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

/// What the handler saw, on the test's monotonic clock.
#[derive(Debug, Default)]
struct Seen {
    /// When the worker called the handler (the grant had arrived).
    started: Option<Instant>,
    /// The lease the handler was given.
    lease: Option<v1::Lease>,
    /// When the worker dropped the handler before it finished.
    cancelled: Option<Instant>,
}

/// Lives inside the handler's future: dropped before `finished` is set,
/// it notes the cancellation and asks the worker to stop.
struct CancelGuard {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<watch::Sender<bool>>,
    finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let at = Instant::now();
        if let Ok(mut seen) = self.seen.lock() {
            seen.cancelled = Some(at);
        }
        // Before the worker gets its permit back, so it claims no more.
        self.stop.send_replace(true);
    }
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a node and enqueue one job");
    let node = Node::start(sandbox).await?;
    let mut direct = node.stub()?;
    let job_id = enqueue_job(&mut direct, QUEUE, b"slow answer").await?;

    phase("start a worker whose answers come 2.5 s late (4 s leases)");
    let proxy = Proxy::start(node.grpc, ANSWER_DELAY).await?;
    let client = Client::connect(&proxy.addr()).map_err(|e| anyhow!("client: {e}"))?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop, stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    let handler = {
        let (seen, stop) = (seen.clone(), stop.clone());
        move |grant: v1::Grant| {
            let guard = CancelGuard { seen: seen.clone(), stop: stop.clone(), finished: false };
            async move {
                let mut guard = guard;
                if let Ok(mut seen) = guard.seen.lock() {
                    seen.started = Some(Instant::now());
                    seen.lease = grant.lease.clone();
                }
                tokio::time::sleep(HANDLER_RUNS_FOR).await;
                guard.finished = true;
                Outcome::Ack { result: Vec::new() }
            }
        }
    };
    let mut config = WorkerConfig::new(QUEUE, WORKER);
    config.lease_ttl_ms = Some(LEASE_TTL_MS);
    config.grace = Duration::from_secs(1);
    let worker_started = Instant::now();
    let worker = tokio::spawn(worker::run(client, config, handler, stopped));

    phase("the node grants the worker's claim at once (the answer is on its way)");
    let holder = wait_until("the worker to hold the job", deadline_in(ANSWER_DELAY), || {
        let mut direct = direct.clone();
        async move {
            let job = direct
                .get_job(v1::GetJobRequest { job_id, stale: false })
                .await
                .context("get job")?
                .into_inner()
                .job
                .context("the job is missing")?;
            Ok(match job.lease {
                Some(lease) if job.state == v1::JobState::Claimed as i32 => Check::Done(lease),
                _ => Check::NotYet(format!("job state {}", job.state)),
            })
        }
    })
    .await?;
    ensure!(holder.holder == WORKER, "the job went to {holder:?}, not to the worker");

    phase("a second claimant polls the node directly until it gets the job");
    let second_claim = v1::ClaimRequest {
        worker: "worker-direct".to_string(),
        queue: QUEUE.to_string(),
        max: 1,
        lease_ttl_ms: Some(LEASE_TTL_MS),
        wait_ms: 0,
        ..Default::default()
    };
    let (second_sent, second_lease) = wait_until(
        "the second claimant to be granted the job",
        deadline_in(SECOND_CLAIM_WITHIN),
        || {
            let mut direct = direct.clone();
            let request = second_claim.clone();
            async move {
                let sent = Instant::now();
                let answer = match direct.claim(request).await {
                    Ok(answer) => answer.into_inner(),
                    Err(status) => return Ok(Check::NotYet(format!("claim: {status}"))),
                };
                Ok(match answer.grants.into_iter().next() {
                    Some(v1::Grant { lease: Some(lease), .. }) => Check::Done((sent, lease)),
                    Some(other) => bail!("a grant without a lease: {other:?}"),
                    None => Check::NotYet("nothing granted".to_string()),
                })
            }
        },
    )
    .await?;

    phase("stop the worker and the proxy");
    let report = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .context("the worker did not stop within 10 s")?
        .context("the worker task failed")?;
    proxy.stop().await;

    phase("judge: late answer, cancellation before the TTL, hand-over after it");
    let seen = seen.lock().map_err(|_| anyhow!("the handler's record is poisoned"))?;
    eprintln!("handler saw {seen:?}; worker report {report:?}");
    let since_start = |at: Instant| at.saturating_duration_since(worker_started);
    let started = seen.started.context("the worker never ran the handler")?;
    let cancelled = seen.cancelled.context("the worker never cancelled the handler")?;
    let first = seen.lease.clone().context("the handler got no lease")?;
    let ttl = Duration::from_millis(LEASE_TTL_MS);
    eprintln!(
        "after the worker started: answer {} ms, cancellation {} ms, second claim sent {} ms \
         (TTL {LEASE_TTL_MS} ms)",
        since_start(started).as_millis(),
        since_start(cancelled).as_millis(),
        since_start(second_sent).as_millis()
    );
    ensure!(
        first == holder
            && first.expires_at_ms.checked_sub(first.granted_at_ms) == Some(LEASE_TTL_MS),
        "the worker's lease {first:?}, the node showed {holder:?}"
    );
    ensure!(
        since_start(started) >= ANSWER_DELAY,
        "the grant reached the handler {} ms after the worker started: the proxy did not delay \
         it by {} ms",
        since_start(started).as_millis(),
        ANSWER_DELAY.as_millis()
    );
    ensure!(
        since_start(cancelled) < ttl,
        "the handler was cancelled {} ms after the worker started, not within the {LEASE_TTL_MS} \
         ms lease counted from before the claim was sent",
        since_start(cancelled).as_millis()
    );
    ensure!(
        second_sent >= cancelled,
        "the second claimant's granting claim was sent {} ms after the worker started, before \
         the handler was cancelled ({} ms)",
        since_start(second_sent).as_millis(),
        since_start(cancelled).as_millis()
    );
    ensure!(
        second_lease.job_id == job_id && second_lease.token > first.token,
        "the second lease {second_lease:?} does not supersede the first {first:?}"
    );
    ensure!(
        report.lost == vec![job_id] && report.acked.is_empty(),
        "the worker's report: {report:?}"
    );
    Ok(())
}
