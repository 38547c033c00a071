//! Goal: the client SDK's lease guard keeps its promises against a real
//! node (issue "The operator's view", item 4; docs/sdk.md): renewal keeps
//! a long job's lease even while its handler blocks a thread; a lease that
//! is really lost fires the handler's cancellation token; a worker's
//! shutdown releases the jobs it claimed but never started; and the
//! producer example does what it says.
//!
//! Method: one `leasehold serve` process per story, a `leasehold-client`
//! worker in the test process driving it over real gRPC, and the node's raw
//! stubs to watch and to play the other party (a rival worker that claims
//! whenever it can, an operator who gives a lease back). The shutdown story
//! puts the worker behind the clock stories' answer-delaying proxy, so its
//! claim is granted on the node while the answer is still on the way when
//! the worker is told to stop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use leasehold_client::worker::{self, CancelReason, LeaseGuard, Outcome, WorkerConfig};
use leasehold_client::{Client, WorkerReport};
use leasehold_proto::v1;
use leasehold_proto::v1::queue_client::QueueClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::support::{
    Check, Node, Sandbox, binary, deadline_in, enqueue_job, get_job, phase, wait_until,
};

/// The clock stories' proxy, compiled here too (it lives in their private
/// module, and one copy in the binary twice costs less than opening it up);
/// only its delaying half is used.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "cluster/clocks/proxy.rs"]
mod proxy;

/// How long a stopped worker may take to hand back its report.
const WORKER_STOPS_WITHIN: Duration = Duration::from_secs(15);

/// A worker running in this process, with the switch that stops it.
struct RunningWorker {
    stop: watch::Sender<bool>,
    task: JoinHandle<WorkerReport>,
}

impl RunningWorker {
    fn start<H, A, Fut>(client: Client, config: WorkerConfig, handler: H) -> RunningWorker
    where
        H: Fn(A) -> Fut + Clone + Send + Sync + 'static,
        A: From<LeaseGuard> + Send + 'static,
        Fut: std::future::Future<Output = Outcome> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(worker::run(client, config, handler, stopped));
        RunningWorker { stop, task }
    }

    /// Asks the worker to stop and waits (bounded) for its report.
    async fn stop(mut self) -> Result<WorkerReport> {
        self.stop.send_replace(true);
        tokio::time::timeout(WORKER_STOPS_WITHIN, &mut self.task)
            .await
            .map_err(|_| anyhow!("the worker did not stop within {WORKER_STOPS_WITHIN:?}"))?
            .context("the worker task failed")
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn claim_request(worker: &str, queue: &str, lease_ttl_ms: u64) -> v1::ClaimRequest {
    v1::ClaimRequest {
        worker: worker.to_string(),
        queue: queue.to_string(),
        max: 1,
        lease_ttl_ms: Some(lease_ttl_ms),
        wait_ms: 0,
        ..Default::default()
    }
}

/// Waits until job `job_id` is in `state`; answers the job.
async fn wait_for_state(
    stub: &QueueClient<Channel>,
    job_id: u64,
    state: v1::JobState,
    within: Duration,
) -> Result<v1::Job> {
    wait_until(&format!("job {job_id} to be {state:?}"), deadline_in(within), || {
        let mut stub = stub.clone();
        async move {
            let job = get_job(&mut stub, job_id).await?;
            Ok(if job.state == state as i32 {
                Check::Done(job)
            } else {
                Check::NotYet(format!("state {}, lease {:?}", job.state, job.lease))
            })
        }
    })
    .await
}

mod renewal {
    //! A handler that blocks its thread for 7 s under a 2 s lease: the
    //! renewal task keeps the lease on another runtime thread, so a rival
    //! that claims every 200 ms never gets the job, and the job is acked
    //! once, under the token of its first and only grant.

    use super::*;

    const QUEUE: &str = "sdk-long";
    const LEASE_TTL_MS: u64 = 2_000;
    const HANDLER_BLOCKS_FOR: Duration = Duration::from_secs(7);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewal_keeps_the_lease_of_a_handler_that_blocks_its_thread() -> Result<()> {
        let sandbox = Sandbox::new("sdk-renewal")?;
        sandbox.run(Duration::from_secs(60), story(&sandbox)).await
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("start a node and enqueue one job");
        let node = Node::start(sandbox).await?;
        let mut direct = node.stub()?;
        let job_id = enqueue_job(&mut direct, QUEUE, b"long").await?;

        phase("a worker with 2 s leases runs a handler that blocks its thread for 7 s");
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(None::<(u64, u64, Instant)>));
        let handler = {
            let (calls, seen) = (calls.clone(), seen.clone());
            move |guard: LeaseGuard| {
                let (calls, seen) = (calls.clone(), seen.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut seen) = seen.lock() {
                        *seen = Some((
                            guard.fencing_token(),
                            guard.lease().granted_at_ms,
                            Instant::now(),
                        ));
                    }
                    // Blocks the runtime thread this task runs on, as CPU
                    // work or a synchronous client would.
                    std::thread::sleep(HANDLER_BLOCKS_FOR);
                    Outcome::Ack { result: b"done".to_vec() }
                }
            }
        };
        let mut config = WorkerConfig::new(QUEUE, "sdk-worker");
        config.lease_ttl_ms = Some(LEASE_TTL_MS);
        config.poll_wait_ms = 1_000;
        config.grace = Duration::from_secs(2);
        let worker = RunningWorker::start(node.client()?, config, handler);

        phase("once the handler runs, a rival claims every 200 ms");
        wait_until("the handler to start", deadline_in(Duration::from_secs(10)), || {
            let seen = seen.clone();
            async move {
                let started = seen.lock().map_err(|_| anyhow!("poisoned"))?.is_some();
                Ok(if started { Check::Done(()) } else { Check::NotYet("not started".into()) })
            }
        })
        .await?;
        let rival = {
            let mut rival = node.stub()?;
            tokio::spawn(async move {
                let mut granted = Vec::new();
                let until = Instant::now() + HANDLER_BLOCKS_FOR + Duration::from_secs(3);
                while Instant::now() < until {
                    if let Ok(reply) = rival.claim(claim_request("rival", QUEUE, 30_000)).await {
                        granted.extend(reply.into_inner().grants);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                granted
            })
        };

        phase("the job is acked");
        let acked =
            wait_for_state(&direct, job_id, v1::JobState::Acked, Duration::from_secs(20)).await?;
        let rival_grants = rival.await.context("the rival task failed")?;
        let report = worker.stop().await?;

        phase("acked once, under the first token, never redelivered");
        let (token, first_granted_at_ms, started) =
            seen.lock().map_err(|_| anyhow!("poisoned"))?.context("the handler never ran")?;
        ensure!(rival_grants.is_empty(), "the lease lapsed: the rival got {rival_grants:?}");
        ensure!(
            calls.load(Ordering::SeqCst) == 1,
            "handler ran {} times",
            calls.load(Ordering::SeqCst)
        );
        ensure!(report.acked == vec![(job_id, token)], "report {report:?}");
        ensure!(report.lost.is_empty() && report.failed_finishes.is_empty(), "report {report:?}");
        let lease = acked.lease.context("an acked job keeps its last lease")?;
        ensure!(lease.token == token, "acked under token {}, first grant was {token}", lease.token);
        ensure!(acked.attempts == 0, "attempts {}", acked.attempts);
        ensure!(acked.result == b"done", "result {:?}", acked.result);
        // The node stamps each renewal as the lease's grant time: the last
        // one came well past the first grant's TTL, while the handler still
        // held its thread.
        ensure!(
            lease.granted_at_ms >= first_granted_at_ms + 2 * LEASE_TTL_MS,
            "last renewal at {} ms, first grant at {first_granted_at_ms} ms",
            lease.granted_at_ms
        );
        ensure!(started.elapsed() >= HANDLER_BLOCKS_FOR, "the handler ran shorter than it blocks");
        Ok(())
    }
}

mod lost_lease {
    //! The lease is taken away for real: an operator releases it with its
    //! token and a rival claims the job under a larger one, so the node
    //! refuses the worker's next renewal. A thread the handler started (a
    //! side effect the worker cannot drop) must see the guard's token fire
    //! with `LeaseLost` within a renewal period and some slack; the worker
    //! drops the handler, reports the job lost and never acks it.

    use super::*;

    const QUEUE: &str = "sdk-lost";
    /// Renewals every second.
    const LEASE_TTL_MS: u64 = 3_000;
    /// From the take-away to the token firing: a renewal period and slack.
    const CANCELLED_WITHIN: Duration = Duration::from_secs(3);

    #[derive(Debug, Default)]
    struct Seen {
        token: Option<u64>,
        /// When and why the side thread saw the token fire.
        cancelled: Option<(Instant, Option<CancelReason>)>,
        /// When the worker dropped the handler's future.
        dropped: Option<Instant>,
    }

    /// Lives in the handler's future; notes when it is dropped unfinished.
    struct DropNote(Arc<Mutex<Seen>>);

    impl Drop for DropNote {
        fn drop(&mut self) {
            if let Ok(mut seen) = self.0.lock() {
                seen.dropped = Some(Instant::now());
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_lease_fires_the_handler_token() -> Result<()> {
        let sandbox = Sandbox::new("sdk-lost-lease")?;
        sandbox.run(Duration::from_secs(60), story(&sandbox)).await
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("start a node and enqueue one job");
        let node = Node::start(sandbox).await?;
        let mut direct = node.stub()?;
        let job_id = enqueue_job(&mut direct, QUEUE, b"side effect").await?;

        phase("a worker's handler starts a side thread that watches the guard");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let handler = {
            let seen = seen.clone();
            move |guard: LeaseGuard| {
                let seen = seen.clone();
                async move {
                    let note = DropNote(seen.clone());
                    if let Ok(mut seen) = seen.lock() {
                        seen.token = Some(guard.fencing_token());
                    }
                    let side = {
                        let (guard, seen) = (guard.clone(), seen.clone());
                        move || {
                            let until = std::time::Instant::now() + Duration::from_secs(30);
                            while std::time::Instant::now() < until {
                                if guard.is_cancelled() {
                                    if let Ok(mut seen) = seen.lock() {
                                        seen.cancelled =
                                            Some((Instant::now(), guard.cancel_reason()));
                                    }
                                    return;
                                }
                                std::thread::sleep(Duration::from_millis(20));
                            }
                        }
                    };
                    // Not awaited: the worker cannot drop this thread, only
                    // the token can stop it.
                    std::thread::spawn(side);
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(note);
                    Outcome::Ack { result: Vec::new() }
                }
            }
        };
        let mut config = WorkerConfig::new(QUEUE, "sdk-worker");
        config.lease_ttl_ms = Some(LEASE_TTL_MS);
        config.poll_wait_ms = 1_000;
        config.grace = Duration::from_secs(1);
        let worker = RunningWorker::start(node.client()?, config, handler);
        let token =
            wait_until("the handler to start", deadline_in(Duration::from_secs(10)), || {
                let seen = seen.clone();
                async move {
                    let token = seen.lock().map_err(|_| anyhow!("poisoned"))?.token;
                    Ok(token.map_or(Check::NotYet("not started".into()), Check::Done))
                }
            })
            .await?;

        phase("an operator gives the lease back and a rival claims the job");
        let taken_at = Instant::now();
        direct
            .release(v1::ReleaseRequest { job_id, token })
            .await
            .context("release of the worker's lease")?;
        let grants = direct
            .claim(claim_request("rival", QUEUE, 30_000))
            .await
            .context("rival claim")?
            .into_inner()
            .grants;
        let rival = match grants.as_slice() {
            [v1::Grant { lease: Some(lease), .. }] if lease.job_id == job_id => lease.clone(),
            other => bail!("the rival expected the job, got {other:?}"),
        };
        ensure!(rival.token > token, "rival token {} not above {token}", rival.token);

        phase("the side thread sees the token fire, for the lost lease");
        let (cancelled_at, reason) =
            wait_until("the guard's token to fire", deadline_in(CANCELLED_WITHIN), || {
                let seen = seen.clone();
                async move {
                    let seen = seen.lock().map_err(|_| anyhow!("poisoned"))?;
                    Ok(match seen.cancelled {
                        Some(cancelled) => Check::Done(cancelled),
                        None => Check::NotYet(format!("{seen:?}")),
                    })
                }
            })
            .await?;
        ensure!(reason == Some(CancelReason::LeaseLost), "cancelled for {reason:?}");
        eprintln!("token fired {} ms after the take-away", (cancelled_at - taken_at).as_millis());

        phase("the worker dropped the handler, reports the job lost, never acked it");
        let report = worker.stop().await?;
        let dropped = seen.lock().map_err(|_| anyhow!("poisoned"))?.dropped;
        ensure!(dropped.is_some(), "the handler's future was not dropped");
        ensure!(report.lost == vec![job_id], "report {report:?}");
        ensure!(report.acked.is_empty(), "report {report:?}");
        let job = get_job(&mut direct, job_id).await?;
        ensure!(job.state == v1::JobState::Claimed as i32, "state {}", job.state);
        ensure!(job.lease.as_ref() == Some(&rival), "lease {:?}, rival {rival:?}", job.lease);
        direct
            .ack(v1::AckRequest { job_id, token: rival.token, ..Default::default() })
            .await
            .context("the rival's ack")?;
        Ok(())
    }
}

mod drain {
    //! A worker told to stop while its claim's answer is on the way: the
    //! node has granted the job (seen through its own stub), the answer is
    //! 2.5 s late behind a proxy. The worker must collect that grant and
    //! release it — the job ready again with no attempt charged long before
    //! its 30 s lease would lapse — and never start its handler.

    use super::*;

    const QUEUE: &str = "sdk-drain";
    const LEASE_TTL_MS: u64 = 30_000;
    const ANSWER_DELAY: Duration = Duration::from_millis(2_500);
    /// The worker asks again and releases, each answer 2.5 s late: well
    /// under the TTL.
    const READY_AGAIN_WITHIN: Duration = Duration::from_secs(10);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_releases_a_claim_granted_but_not_started() -> Result<()> {
        let sandbox = Sandbox::new("sdk-drain")?;
        sandbox.run(Duration::from_secs(60), story(&sandbox)).await
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("start a node and enqueue one job");
        let node = Node::start(sandbox).await?;
        let mut direct = node.stub()?;
        let job_id = enqueue_job(&mut direct, QUEUE, b"never started").await?;

        phase("a worker behind a proxy that delivers answers 2.5 s late");
        let proxy = proxy::Proxy::start(node.grpc, ANSWER_DELAY).await?;
        let client = Client::connect(&proxy.addr()).map_err(|e| anyhow!("client: {e}"))?;
        let calls = Arc::new(AtomicUsize::new(0));
        let handler = {
            let calls = calls.clone();
            move |_guard: LeaseGuard| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Outcome::Ack { result: Vec::new() } }
            }
        };
        let mut config = WorkerConfig::new(QUEUE, "sdk-draining-worker");
        config.lease_ttl_ms = Some(LEASE_TTL_MS);
        config.poll_wait_ms = 5_000;
        let worker = RunningWorker::start(client, config, handler);

        phase("the node grants the claim; the answer is still on its way");
        let claimed =
            wait_for_state(&direct, job_id, v1::JobState::Claimed, ANSWER_DELAY / 2).await?;
        let granted = claimed.lease.context("a claimed job has a lease")?;
        ensure!(granted.holder == "sdk-draining-worker", "held by {}", granted.holder);

        phase("the worker is told to stop");
        let stopped_at = Instant::now();
        let report = worker.stop().await?;
        let job = get_job(&mut direct, job_id).await?;
        ensure!(
            stopped_at.elapsed() < READY_AGAIN_WITHIN,
            "the worker took {:?} to stop",
            stopped_at.elapsed()
        );

        phase("the job is ready again, no attempt charged, the handler never ran");
        ensure!(
            job.state == v1::JobState::Ready as i32,
            "state {}, lease {:?}",
            job.state,
            job.lease
        );
        ensure!(job.attempts == 0, "attempts {}", job.attempts);
        ensure!(calls.load(Ordering::SeqCst) == 0, "the handler ran");
        ensure!(report.unstarted == vec![job_id], "report {report:?}");
        ensure!(report.acked.is_empty() && report.lost.is_empty(), "report {report:?}");
        let grants = direct
            .claim(claim_request("next", QUEUE, 5_000))
            .await
            .context("next claim")?
            .into_inner()
            .grants;
        match grants.as_slice() {
            [v1::Grant { lease: Some(lease), .. }] if lease.job_id == job_id => {
                ensure!(
                    lease.token > granted.token,
                    "token {} not above {}",
                    lease.token,
                    granted.token
                )
            }
            other => bail!("the job was not claimable again: {other:?}"),
        }
        proxy.stop().await;
        Ok(())
    }
}

mod lost_answer {
    //! A worker's claim is granted on the node, but its answer never
    //! arrives: the proxy in front of the node swallows it, then goes away
    //! and comes back on the same address 3 s later, and the worker's
    //! client tries each call once. The worker must ask again under the
    //! failed claim's request id and get that lease back, running the job
    //! under the token it was first granted, long before the 60 s lease
    //! would lapse. (Under a new id the job sat claimed by nobody until
    //! then.) And the lease's local deadline must not run past its end on
    //! the node: the lease was granted seconds before the repeat was sent.

    use leasehold_client::RetryPolicy;

    use super::*;

    const QUEUE: &str = "sdk-lost-answer";
    const LEASE_TTL_MS: u64 = 60_000;
    /// The lease's holder asks again and gets it back within a few claim
    /// passes: far under the TTL.
    const RUN_WITHIN: Duration = Duration::from_secs(15);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_whose_answer_was_lost_is_asked_again_under_its_id() -> Result<()> {
        let sandbox = Sandbox::new("sdk-lost-answer")?;
        sandbox.run(Duration::from_secs(60), story(&sandbox)).await
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("start a node, and a proxy in front of it that swallows answers");
        let node = Node::start(sandbox).await?;
        let mut direct = node.stub()?;
        let proxy = proxy::Proxy::start(node.grpc, Duration::ZERO).await?;
        proxy.cut_answers();
        let once = RetryPolicy { attempts: 1, ..Default::default() };
        let client =
            Client::connect(&proxy.addr()).map_err(|e| anyhow!("client: {e}"))?.with_retry(once);
        let ran = Arc::new(Mutex::new(Vec::new()));
        let handler = {
            let (ran, direct) = (ran.clone(), direct.clone());
            move |guard: LeaseGuard| {
                let (ran, mut direct) = (ran.clone(), direct.clone());
                async move {
                    // What is left of the lease here and on the node.
                    let local = guard.deadline().saturating_duration_since(Instant::now());
                    let job = get_job(&mut direct, guard.job_id()).await;
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(u64::MAX, |since| since.as_millis() as u64);
                    let on_node = job.ok().and_then(|job| job.lease).map(|lease| {
                        Duration::from_millis(lease.expires_at_ms.saturating_sub(now_ms))
                    });
                    if let Ok(mut ran) = ran.lock() {
                        ran.push((guard.job_id(), guard.fencing_token(), local, on_node));
                    }
                    Outcome::Ack { result: Vec::new() }
                }
            }
        };
        let mut config = WorkerConfig::new(QUEUE, "sdk-lost-answer-worker");
        config.lease_ttl_ms = Some(LEASE_TTL_MS);
        config.poll_wait_ms = 20_000;
        let worker = RunningWorker::start(client, config, handler);

        phase("a job is enqueued; the node grants it to the waiting claim");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let job_id = enqueue_job(&mut direct, QUEUE, b"answer lost").await?;
        let claimed = wait_for_state(&direct, job_id, v1::JobState::Claimed, RUN_WITHIN).await?;
        let granted = claimed.lease.context("a claimed job has a lease")?;
        ensure!(granted.holder == "sdk-lost-answer-worker", "held by {}", granted.holder);

        phase("the proxy goes away, cutting the claim, and comes back passing answers");
        let listen = proxy.listen();
        proxy.stop().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let proxy = proxy::Proxy::start_on(listen, node.grpc, Duration::ZERO).await?;

        phase("the worker runs the job under its first grant's token and acks it");
        let acked = wait_for_state(&direct, job_id, v1::JobState::Acked, RUN_WITHIN).await;
        let report = worker.stop().await?;
        proxy.stop().await;
        let job = acked.with_context(|| format!("worker report {report:?}"))?;
        let runs = ran.lock().map(|ran| ran.clone()).unwrap_or_default();
        let [(ran_job, token, local, Some(on_node))] = runs[..] else {
            bail!("runs {runs:?}");
        };
        ensure!((ran_job, token) == (job_id, granted.token), "runs {runs:?}");
        ensure!(
            local <= on_node,
            "the local deadline ({local:?} on) outlives the lease ({on_node:?})"
        );
        ensure!(job.attempts == 0, "no attempt charged: {}", job.attempts);
        ensure!(report.acked == vec![(job_id, granted.token)], "report {report:?}");
        Ok(())
    }
}

mod dropped_worker {
    //! An embedder drops a worker's future while its handler is in the
    //! middle of a job (a `select!` or a timeout around `worker::run`). The
    //! job's renewals must stop with it: the 2 s lease lapses and the job
    //! is ready again, not renewed for as long as the process lives.

    use super::*;

    const QUEUE: &str = "sdk-dropped";
    const LEASE_TTL_MS: u64 = 2_000;
    /// The lease lapses and the node's sweep finds it: a few TTLs.
    const LAPSES_WITHIN: Duration = Duration::from_secs(15);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_worker_renews_no_lease() -> Result<()> {
        let sandbox = Sandbox::new("sdk-dropped")?;
        sandbox.run(Duration::from_secs(60), story(&sandbox)).await
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("a worker runs a job whose handler takes a minute");
        let node = Node::start(sandbox).await?;
        let mut direct = node.stub()?;
        let job_id = enqueue_job(&mut direct, QUEUE, b"long").await?;
        let client = Client::connect(&node.addr()).map_err(|e| anyhow!("client: {e}"))?;
        let started = Arc::new(AtomicUsize::new(0));
        let handler = {
            let started = started.clone();
            move |_guard: LeaseGuard| {
                started.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Outcome::Ack { result: Vec::new() }
                }
            }
        };
        let mut config = WorkerConfig::new(QUEUE, "sdk-dropped-worker");
        config.lease_ttl_ms = Some(LEASE_TTL_MS);
        let worker = RunningWorker::start(client, config, handler);
        let claimed = wait_for_state(&direct, job_id, v1::JobState::Claimed, LAPSES_WITHIN).await?;
        let granted = claimed.lease.context("a claimed job has a lease")?;
        wait_until("the handler to start", deadline_in(LAPSES_WITHIN), || {
            let started = started.load(Ordering::SeqCst);
            async move {
                Ok(if started > 0 { Check::Done(()) } else { Check::NotYet(started.to_string()) })
            }
        })
        .await?;
        // Renewed at least once, so the renewals are known to run.
        tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS)).await;
        let renewed = get_job(&mut direct, job_id).await?.lease.context("still held")?;
        ensure!(
            renewed.token == granted.token && renewed.expires_at_ms > granted.expires_at_ms,
            "not renewed: {renewed:?} after {granted:?}"
        );

        phase("the embedder drops the worker's future; the lease lapses");
        drop(worker);
        wait_for_state(&direct, job_id, v1::JobState::Ready, LAPSES_WITHIN).await?;
        Ok(())
    }
}

mod example {
    //! The examples, built by cargo as examples of `leasehold-client`, run
    //! as a user would (address from `LEASEHOLD_ADDR`): the jobs the
    //! producer says it enqueued are on the node, in its queue, with its
    //! payloads; the fenced worker writes with its lease's token and its
    //! store turns a stale token away.

    use std::path::{Path, PathBuf};

    use super::*;

    const QUEUE: &str = "sdk-produced";
    const COUNT: usize = 5;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_producer_example_enqueues_its_jobs() -> Result<()> {
        let sandbox = Sandbox::new("sdk-example")?;
        sandbox.run(Duration::from_secs(300), story(&sandbox)).await
    }

    /// The newest modification time of the files under `dir`.
    fn newest_under(dir: &Path) -> Result<std::time::SystemTime> {
        let mut newest = std::time::UNIX_EPOCH;
        for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
            let entry = entry?;
            let modified = if entry.file_type()?.is_dir() {
                newest_under(&entry.path())?
            } else {
                entry.metadata()?.modified()?
            };
            newest = newest.max(modified);
        }
        Ok(newest)
    }

    /// `target/<profile>/examples/NAME`, as a workspace test run builds it.
    /// Missing or older than the client crate's sources, it fails the test
    /// rather than build it here: a cargo run from inside a test sees the
    /// test's environment and would rebuild dependencies back and forth
    /// with the outer build.
    fn example(name: &str) -> Result<PathBuf> {
        let leasehold = PathBuf::from(binary());
        let profile_dir = leasehold.parent().context("the binary's directory")?;
        let path = profile_dir.join("examples").join(name);
        let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client");
        let build = "`cargo test --workspace` builds the examples (or `cargo build --workspace \
                     --examples`)";
        let built = std::fs::metadata(&path).and_then(|m| m.modified()).with_context(|| {
            format!("example {name} is not built at {}: {build}", path.display())
        })?;
        for dir in ["src", "examples"] {
            let newest = newest_under(&sources.join(dir))?;
            ensure!(newest <= built, "example {name} is older than its sources: {build}");
        }
        Ok(path)
    }

    /// Runs example `path` with `args` against `node`; its standard output.
    async fn run_example(path: &Path, node: &Node, args: &[&str]) -> Result<String> {
        let mut command = tokio::process::Command::new(path);
        command
            .args(args)
            .env("LEASEHOLD_ADDR", node.addr())
            .env_remove("LEASEHOLD_TOKEN")
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(30), command.output())
            .await
            .with_context(|| format!("{} did not finish", path.display()))?
            .with_context(|| format!("running {}", path.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        ensure!(
            output.status.success(),
            "{} failed: {}\n{stdout}\n{}",
            path.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(stdout)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_fenced_worker_example_writes_with_its_token_and_is_refused_when_stale()
    -> Result<()> {
        let sandbox = Sandbox::new("sdk-fenced-example")?;
        sandbox.run(Duration::from_secs(300), fenced_story(&sandbox)).await
    }

    /// The fenced worker's store refuses a write whose token is below the
    /// highest it has seen for the key (here seeded as a later holder's),
    /// and keeps an accepted write under the token of the lease that made
    /// it.
    async fn fenced_story(sandbox: &Sandbox) -> Result<()> {
        phase("start a node; enqueue b=2, then a=1");
        let node = Node::start(sandbox).await?;
        let fenced_worker = example("fenced_worker")?;
        let mut direct = node.stub()?;
        let stale = enqueue_job(&mut direct, "sdk-kv", b"b=2").await?;
        let fresh = enqueue_job(&mut direct, "sdk-kv", b"a=1").await?;

        phase("the store has seen token 1000000 for b (a later holder's write)");
        let store = sandbox.path().join("store");
        std::fs::create_dir_all(&store).context("store directory")?;
        std::fs::write(store.join("b"), "1000000\nlater").context("seeding b")?;

        phase("run the fenced worker until one job is written");
        let args = ["--queue", "sdk-kv", "--concurrency", "1", "--max-jobs", "1", "--store"];
        let mut args: Vec<&str> = args.to_vec();
        let store_arg = store.to_string_lossy().into_owned();
        args.push(&store_arg);
        let stdout = run_example(&fenced_worker, &node, &args).await?;

        phase("a is written under its lease's token; b was refused as stale");
        let a = get_job(&mut direct, fresh).await?;
        ensure!(a.state == v1::JobState::Acked as i32, "a: state {}", a.state);
        let token = a.lease.context("an acked job keeps its lease")?.token;
        let written = std::fs::read_to_string(store.join("a")).context("reading a")?;
        ensure!(written == format!("{token}\n1"), "a holds {written:?}, token {token}");
        ensure!(stdout.contains(&format!("wrote a under token {token}")), "stdout:\n{stdout}");
        let b = get_job(&mut direct, stale).await?;
        let error = b.last_error.unwrap_or_default();
        ensure!(b.attempts >= 1 && error.contains("stale fencing token"), "b: {error:?}");
        let kept = std::fs::read_to_string(store.join("b")).context("reading b")?;
        ensure!(kept == "1000000\nlater", "b was overwritten: {kept:?}");
        Ok(())
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("start a node");
        let node = Node::start(sandbox).await?;
        let producer = example("producer")?;

        phase("run the producer example against it");
        let count = COUNT.to_string();
        let args = ["--queue", QUEUE, "--count", &count, "--payload", "hello"];
        let stdout = run_example(&producer, &node, &args).await?;

        phase("the jobs it printed are on the node");
        let ids: Vec<u64> = stdout
            .lines()
            .filter_map(|line| line.strip_prefix("enqueued job "))
            .map(|id| id.trim().parse().context("job id"))
            .collect::<Result<_>>()?;
        ensure!(ids.len() == COUNT, "the producer printed {ids:?}:\n{stdout}");
        let mut direct = node.stub()?;
        for (n, id) in ids.iter().enumerate() {
            let job = get_job(&mut direct, *id).await?;
            ensure!(job.queue == QUEUE, "job {id} in queue {}", job.queue);
            ensure!(
                job.payload == format!("hello {n}").into_bytes(),
                "job {id} payload {:?}",
                job.payload
            );
            ensure!(job.state == v1::JobState::Ready as i32, "job {id} state {}", job.state);
        }
        Ok(())
    }
}

mod dead_link {
    //! The link to a node dies without closing (the proxy in front of it
    //! swallows every answer from some moment on, as behind a lost machine
    //! or a link that drops packets). The client's pings go unanswered, so
    //! it drops the connection, and a session on it ends: its calls fail
    //! within a few pings, saying the session ended, rather than each
    //! waiting out its own timeout on a connection nothing will ever answer
    //! again (and, 16 calls on, every call failing "in flight" for good).
    //! Checked once against a client without pings: the call waited out its
    //! 10 s timeout.

    use leasehold_client::Keepalive;

    use super::super::support::job;
    use super::*;

    const QUEUE: &str = "sdk-dead-link";
    /// A ping every 300 ms, 300 ms to answer it.
    const KEEPALIVE: Keepalive =
        Keepalive { interval: Duration::from_millis(300), timeout: Duration::from_millis(300) };
    /// Far under the client's call timeout (10 s), far over a few pings.
    const FAILS_WITHIN: Duration = Duration::from_secs(5);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_on_a_link_that_died_without_closing_ends() -> Result<()> {
        let sandbox = Sandbox::new("sdk-dead-link")?;
        sandbox.run(Duration::from_secs(60), story(&sandbox)).await
    }

    async fn story(sandbox: &Sandbox) -> Result<()> {
        phase("a session through a proxy in front of a node");
        let node = Node::start(sandbox).await?;
        let proxy = proxy::Proxy::start(node.grpc, Duration::ZERO).await?;
        let client = Client::builder(&proxy.addr())
            .keepalive(KEEPALIVE)
            .build()
            .map_err(|e| anyhow!("client: {e}"))?;
        let session = client.session().await.map_err(|e| anyhow!("session: {e}"))?;
        session
            .enqueue(vec![job(QUEUE, b"before the cut")])
            .await
            .map_err(|e| anyhow!("an enqueue before the cut: {e}"))?;

        phase("no answer comes back any more: a call on the session fails within seconds");
        proxy.cut_answers();
        let started = Instant::now();
        let cut = session.enqueue(vec![job(QUEUE, b"after the cut")]).await;
        let took = started.elapsed();
        let error = match cut {
            Ok(results) => bail!("answered through a link that answers nothing: {results:?}"),
            Err(error) => error.to_string(),
        };
        ensure!(took < FAILS_WITHIN, "the call failed only after {took:?}: {error}");
        ensure!(error.contains("session ended"), "the call failed otherwise: {error}");

        phase("the session stays ended: the next call fails at once");
        let started = Instant::now();
        let next = session.enqueue(vec![job(QUEUE, b"later")]).await;
        let took = started.elapsed();
        proxy.stop().await;
        ensure!(next.is_err(), "a call on the ended session was answered");
        ensure!(took < Duration::from_secs(1), "the next call failed only after {took:?}");
        Ok(())
    }
}
