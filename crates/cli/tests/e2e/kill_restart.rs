//! Goal: a node SIGKILLed in the middle of a busy queue loses nothing and
//! delivers nothing twice once it is back (SPEC §7, guarantees 2 and 3).
//!
//! Method: enqueue 2,000 keyed jobs over gRPC, run four worker loops from
//! `leasehold_client::worker` against the node, SIGKILL the node once about a
//! third are acked, restart it on the same data directory and ports, and let
//! the same workers (same clients) carry on. Then judge by the workers' own
//! records: every enqueued id acked exactly once, by the token the server
//! kept; Stats agree; and a stale token is still refused after the restart.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_client::RetryPolicy;
use leasehold_client::worker::{self, Outcome, WorkerConfig, WorkerReport};
use leasehold_proto::v1;
use tokio::sync::watch;

use super::support::{
    Check, Node, Sandbox, deadline_in, job, phase, queue_stats, stats_snapshot, wait_until,
};

const QUEUE: &str = "durable";
const JOBS: usize = 2_000;
const BATCH: usize = 100;
const WORKERS: usize = 4;
/// Short leases, so a lease whose ack was cut off by the kill is swept and
/// redelivered in seconds rather than the default 30 s.
const LEASE_TTL_MS: u64 = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_and_restart_loses_nothing() -> Result<()> {
    let sandbox = Sandbox::new("kill-restart")?;
    sandbox.run(Duration::from_secs(100), story(&sandbox)).await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1");
    let mut node = Node::start(sandbox).await?;
    let client = node.client()?;
    let mut stub = node.stub()?;

    phase("enqueue 2,000 keyed jobs in batches of 100");
    let mut enqueued = BTreeSet::new();
    for batch in 0..JOBS / BATCH {
        let specs = (0..BATCH)
            .map(|i| {
                let n = batch * BATCH + i;
                v1::JobSpec {
                    idempotency_key: Some(format!("kill-restart-{n}")),
                    ..job(QUEUE, format!("job {n}").as_bytes())
                }
            })
            .collect();
        let results = client.enqueue(specs).await.context("enqueue")?;
        ensure!(results.len() == BATCH, "batch {batch}: {} results", results.len());
        for result in results {
            ensure!(!result.duplicate, "fresh key reported duplicate: job {}", result.job_id);
            ensure!(enqueued.insert(result.job_id), "job id {} assigned twice", result.job_id);
        }
    }
    ensure!(enqueued.len() == JOBS, "{} distinct ids for {JOBS} jobs", enqueued.len());
    let before_work = queue_stats(&mut stub, QUEUE).await?;
    ensure!(before_work.ready == JOBS as u64, "before any claim: {before_work:?}");

    phase("run 4 workers, concurrency 4 each");
    let (stop, stopped) = watch::channel(false);
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let mut config = WorkerConfig::new(QUEUE, format!("e2e-worker-{w}"));
        config.concurrency = 4;
        config.poll_wait_ms = 500;
        config.lease_ttl_ms = Some(LEASE_TTL_MS);
        config.grace = Duration::from_secs(5);
        // Each worker has its own connection, as separate machines would,
        // and retries long enough to outlast the restart: a call cut off by
        // the kill must be repeated, not given up, or an ack that committed
        // just before the kill would go unrecorded.
        let worker_client = node.client()?.with_retry(RetryPolicy {
            attempts: 12,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        });
        let handler = |_grant: v1::Grant| async { Outcome::Ack { result: Vec::new() } };
        workers.push(tokio::spawn(worker::run(worker_client, config, handler, stopped.clone())));
    }

    phase("wait until about a third are acked");
    let acked_at_kill =
        wait_until("a third of the jobs acked", deadline_in(Duration::from_secs(40)), || {
            let mut stub = stub.clone();
            async move {
                let stats = queue_stats(&mut stub, QUEUE).await?;
                Ok(if stats.acked >= (JOBS / 3) as u64 {
                    Check::Done(stats.acked)
                } else {
                    Check::NotYet(format!("{stats:?}"))
                })
            }
        })
        .await?;
    let tokens_at_kill = stats_snapshot(&mut stub).await?.last_token;

    phase("SIGKILL node 1 mid-stream");
    node.kill()?;
    ensure!(
        acked_at_kill < JOBS as u64,
        "all {JOBS} jobs were acked before the kill ({acked_at_kill}); the kill proved nothing"
    );
    eprintln!("acked before the kill: at least {acked_at_kill}; last token {tokens_at_kill}");

    phase("restart node 1 on the same data dir and ports");
    node.restart(sandbox).await?;
    let after_restart = stats_snapshot(&mut stub).await?;
    let acked_after_restart =
        after_restart.queues.iter().find(|q| q.queue == QUEUE).map(|q| q.acked).unwrap_or_default();
    ensure!(
        acked_after_restart >= acked_at_kill,
        "acks lost in the crash: {acked_at_kill} committed before, {acked_after_restart} after"
    );
    ensure!(
        after_restart.last_token >= tokens_at_kill && after_restart.last_job_id == JOBS as u64,
        "counters went back in the crash: {after_restart:?}, last token before {tokens_at_kill}"
    );

    phase("let the same workers finish; wait for 2,000 acked");
    wait_until("all 2,000 jobs acked", deadline_in(Duration::from_secs(60)), || {
        let running = node.ensure_running();
        let mut stub = stub.clone();
        async move {
            running?;
            let stats = queue_stats(&mut stub, QUEUE).await?;
            Ok(if stats.acked == JOBS as u64 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{stats:?}"))
            })
        }
    })
    .await?;

    phase("stop the workers and collect their reports");
    stop.send(true).context("signalling the workers to stop")?;
    let mut reports = Vec::new();
    for handle in workers {
        let report = tokio::time::timeout(Duration::from_secs(15), handle)
            .await
            .context("a worker did not stop within 15 s")?
            .context("a worker task panicked")?;
        reports.push(report);
    }
    for (w, report) in reports.iter().enumerate() {
        eprintln!(
            "worker {w}: acked {} nacked {} released {} lost {} failed finishes {:?}",
            report.acked.len(),
            report.nacked.len(),
            report.released.len(),
            report.lost.len(),
            report.failed_finishes
        );
    }

    phase("check the workers' records: every job acked exactly once");
    let acked = acks_by_job(&reports)?;
    let acked_ids: BTreeSet<u64> = acked.keys().copied().collect();
    let missing: Vec<_> = enqueued.difference(&acked_ids).take(10).collect();
    let unknown: Vec<_> = acked_ids.difference(&enqueued).take(10).collect();
    ensure!(
        acked_ids == enqueued,
        "acked ids differ from enqueued ids: {} acked; first missing {missing:?}; first unknown \
         {unknown:?}",
        acked_ids.len()
    );
    for (w, report) in reports.iter().enumerate() {
        ensure!(report.nacked.is_empty(), "worker {w}: a handler that always acks nacked");
        // A call cut off by the kill must be retried until the node is back,
        // not given up: an ack that committed just before the kill and was
        // then given up would leave the worker unaware of its own ack.
        ensure!(
            report.failed_finishes.is_empty(),
            "worker {w}: finishes failed instead of being retried: {:?}",
            report.failed_finishes
        );
    }

    phase("check the server kept the token each worker acked with");
    let mut page_token = String::new();
    let mut checked = 0;
    loop {
        let page = stub
            .list_jobs(v1::ListJobsRequest {
                queue: Some(QUEUE.to_string()),
                state: v1::JobState::Acked as i32,
                page_size: 1_000,
                page_token: page_token.clone(),
                stale: false,
            })
            .await
            .context("list acked jobs")?
            .into_inner();
        for job in &page.jobs {
            let kept = job.lease.as_ref().map(|lease| lease.token);
            ensure!(
                kept == acked.get(&job.id).copied(),
                "job {}: server kept token {kept:?}, worker acked with {:?}",
                job.id,
                acked.get(&job.id)
            );
            checked += 1;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    ensure!(checked == JOBS, "listed {checked} acked jobs, expected {JOBS}");

    phase("check Stats: 2,000 acked, nothing left");
    let final_stats = queue_stats(&mut stub, QUEUE).await?;
    let expected = v1::QueueStats {
        queue: QUEUE.to_string(),
        acked: JOBS as u64,
        ready: 0,
        delayed: 0,
        claimed: 0,
        dead: 0,
    };
    ensure!(final_stats == expected, "final stats {final_stats:?}, expected {expected:?}");

    phase("an ack with a stale token is refused and changes nothing");
    let before = stats_snapshot(&mut stub).await?;
    let mut acks = acked.iter();
    let (Some((&job_a, &token_a)), Some((_, &token_b))) = (acks.next(), acks.next()) else {
        anyhow::bail!("fewer than two acked jobs");
    };
    for (label, token) in [
        ("an older token", token_a.saturating_sub(1)),
        ("another lease's token", token_b),
        ("a token never issued", before.last_token + 1_000),
    ] {
        let refused = stub.ack(v1::AckRequest { job_id: job_a, token, ..Default::default() }).await;
        let status = match refused {
            Ok(_) => anyhow::bail!("ack of job {job_a} with {label} ({token}) was accepted"),
            Err(status) => status,
        };
        ensure!(
            status.code() == tonic::Code::FailedPrecondition,
            "ack of job {job_a} with {label} ({token}): {status:?}, expected FailedPrecondition"
        );
        ensure!(status.message().contains("stale"), "message does not say stale: {status:?}");
    }
    let after = stats_snapshot(&mut stub).await?;
    ensure!(after == before, "stale acks changed Stats: before {before:?}, after {after:?}");
    Ok(())
}

/// Job id → the token it was acked with, over all reports; fails on a job
/// acked twice (by one worker or by two).
fn acks_by_job(reports: &[WorkerReport]) -> Result<BTreeMap<u64, u64>> {
    let mut acked = BTreeMap::new();
    for (w, report) in reports.iter().enumerate() {
        for &(job_id, token) in &report.acked {
            if let Some(first) = acked.insert(job_id, token) {
                anyhow::bail!("job {job_id} acked twice: token {first}, then {token} (worker {w})");
            }
        }
    }
    Ok(acked)
}
