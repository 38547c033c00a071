//! Goal: SIGKILL of the leader in the middle of a steady enqueue/claim/ack
//! load loses nothing and breaks no lease guarantee; a new leader takes
//! over and writes succeed again; the killed node restarts on its data
//! directory and catches up (issue 3 acceptance; SPEC §7 guarantees 1-3).
//!
//! Method: eight clients, each connected to all three addresses (starting
//! at different ones), loop: enqueue one job under a unique idempotency
//! key, claim up to two jobs with a 3 s lease, ack what they got — except
//! every tenth grant, which they hold back and ack 5 s later, after it has
//! lapsed and (usually) been redelivered to someone else, so superseded
//! tokens and redeliveries are part of every run. Every operation and its
//! answer is recorded (see `history.rs` for the rules checked). Once 200
//! acks are in, SIGKILL the leader and probe with small writes to the two
//! survivors: the time from the kill to the first successful write is the
//! failover time. The load must then make progress again (200 more acks).
//! Restart the killed node on its data directory and wait until it has
//! applied what the leader had committed. Stop the load, work the queue
//! off, wait for equal digests on all three nodes, and check the records
//! against every job of the queue.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_client::{Client, RetryPolicy};
use leasehold_proto::v1;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, Sandbox, deadline_in, job, phase, queue_stats,
    wait_until,
};
use super::cluster_slot;
use super::history::{History, no_answer};

const QUEUE: &str = "load";
const CLIENTS: usize = 8;
const LEASE_TTL_MS: u64 = 3_000;
/// Every this many grants a client holds one back instead of acking it.
const HOLD_BACK_EVERY: u64 = 10;
/// How long a held-back grant waits for its ack: past the lease and the
/// sweep after it (about a second), so it has usually been redelivered.
const HOLD_BACK_FOR: Duration = Duration::from_millis(LEASE_TTL_MS + 2_000);
/// A job survives this many lapsed leases before it would go dead; the
/// story wants every job to end acked.
const MAX_ATTEMPTS: u32 = 100;
/// Acks before the kill, so the load is steady when it comes.
const ACKS_BEFORE_KILL: u64 = 200;
/// Acks after the first successful write, to show the load goes on.
const ACKS_AFTER_FAILOVER: u64 = 200;
/// Bound on the failover time in this debug build on a shared machine. The
/// issue's target (1.5 s median) is the benchmark's business; this only
/// catches a cluster that does not recover.
const FAILOVER_WITHIN: Duration = Duration::from_secs(10);
/// Deadline of one probe write after the kill.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_sigkill_under_load_loses_nothing() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-failover")?;
    sandbox.run(Duration::from_secs(150), story(&sandbox)).await
}

/// The retries of every load client: enough to ride out an election
/// (about 5 s of retrying), not so many that a client hides a cluster that
/// stays down. A call that still fails is recorded as unanswered and the
/// loop goes on.
fn load_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 8,
        first_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
    }
}

fn worker_name(client: usize) -> String {
    format!("client-{client}")
}

/// Acks `job_id` under `token`, records the answer, and counts an accepted ack.
async fn ack(client: &Client, history: &mut History, acked: &AtomicU64, job_id: u64, token: u64) {
    let outcome = client.ack(job_id, token).await;
    if history.record_ack(job_id, token, outcome) {
        acked.fetch_add(1, Ordering::SeqCst);
    }
}

/// One load client: enqueue one, claim up to two, ack — holding every tenth
/// grant back — until `stop`; then acks whatever it still holds.
async fn load_client(
    index: usize,
    client: Client,
    mut stop: watch::Receiver<bool>,
    acked: Arc<AtomicU64>,
) -> History {
    let mut history = History::default();
    let worker = worker_name(index);
    let mut held_back: VecDeque<(Instant, u64, u64)> = VecDeque::new();
    let mut granted = 0_u64;
    for n in 0_u64.. {
        if *stop.borrow_and_update() {
            break;
        }
        let key = format!("load-{index}-{n}");
        let spec = v1::JobSpec {
            max_attempts: Some(MAX_ATTEMPTS),
            idempotency_key: Some(key.clone()),
            ..job(QUEUE, key.as_bytes())
        };
        let outcome = match client.enqueue(vec![spec]).await {
            Ok(results) => match results.as_slice() {
                [result] => Ok(result.job_id),
                other => {
                    history.problems.push(format!("enqueue of {key} answered {other:?}"));
                    continue;
                }
            },
            Err(error) if no_answer(&error) => Err(error.to_string()),
            Err(error) => {
                history.problems.push(format!("enqueue of {key}: {error}"));
                continue;
            }
        };
        history.enqueues.push(super::history::Enqueue { key, outcome });

        let claim = v1::ClaimRequest {
            worker: worker.clone(),
            queue: QUEUE.to_string(),
            max: 2,
            lease_ttl_ms: Some(LEASE_TTL_MS),
            selector: Vec::new(),
            wait_ms: 0,
        };
        match client.claim(claim).await {
            Ok(grants) => {
                for grant in grants {
                    let Some((job_id, token)) = history.record_grant(&worker, grant) else {
                        continue;
                    };
                    granted += 1;
                    if granted.is_multiple_of(HOLD_BACK_EVERY) {
                        held_back.push_back((Instant::now() + HOLD_BACK_FOR, job_id, token));
                    } else {
                        ack(&client, &mut history, &acked, job_id, token).await;
                    }
                }
            }
            Err(error) if no_answer(&error) => history.failed_claims.push(error.to_string()),
            Err(error) => history.problems.push(format!("claim: {error}")),
        }
        while let Some(&(due, job_id, token)) = held_back.front()
            && due <= Instant::now()
        {
            held_back.pop_front();
            ack(&client, &mut history, &acked, job_id, token).await;
        }
    }
    for (_, job_id, token) in held_back {
        ack(&client, &mut history, &acked, job_id, token).await;
    }
    history
}

/// Waits until the shared ack count reaches `target`.
async fn wait_acks(acked: &AtomicU64, target: u64, within: Duration) -> Result<()> {
    wait_until(&format!("{target} accepted acks"), deadline_in(within), || {
        let now = acked.load(Ordering::SeqCst);
        async move {
            Ok(if now >= target { Check::Done(()) } else { Check::NotYet(format!("{now} acks")) })
        }
    })
    .await
}

/// Every job of `queue`, read linearizably through `client`.
async fn all_jobs(client: &Client, queue: &str) -> Result<BTreeMap<u64, v1::Job>> {
    let mut jobs = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_jobs(v1::ListJobsRequest {
                queue: Some(queue.to_string()),
                state: v1::JobState::Unspecified as i32,
                page_size: 1_000,
                page_token: page_token.clone(),
                stale: false,
            })
            .await
            .context("list jobs")?;
        for job in page.jobs {
            ensure!(jobs.insert(job.id, job).is_none(), "a job listed twice");
        }
        if page.next_page_token.is_empty() {
            return Ok(jobs);
        }
        page_token = page.next_page_token;
    }
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let first = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let old_leader = first.leader;
    let survivors: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old_leader).collect();

    phase("start 8 load clients, each connected to all three nodes");
    let acked = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);
    let mut clients = Vec::new();
    let ids = cluster.ids();
    for index in 0..CLIENTS {
        // Each client starts at a different node, so that when the leader
        // dies some writes are in flight to it directly and some through a
        // follower forwarding them.
        let order: Vec<u64> = (0..ids.len()).map(|k| ids[(index + k) % ids.len()]).collect();
        let client = Client::connect(&cluster.addrs_of(&order)?)?.with_retry(load_retry());
        clients.push(tokio::spawn(load_client(index, client, stopped.clone(), acked.clone())));
    }
    wait_acks(&acked, ACKS_BEFORE_KILL, Duration::from_secs(60)).await?;

    phase("SIGKILL the leader");
    let killed_at = Instant::now();
    cluster.node_mut(old_leader)?.kill()?;
    eprintln!(
        "killed leader {old_leader} (term {}) with {} acks in",
        first.term,
        acked.load(Ordering::SeqCst)
    );

    phase("probe the survivors until a write succeeds");
    let probes: Vec<_> =
        survivors.iter().map(|id| cluster.node(*id)?.stub()).collect::<Result<_>>()?;
    let mut attempt = 0_usize;
    let failover =
        wait_until("a write to succeed after the kill", deadline_in(FAILOVER_WITHIN), || {
            attempt += 1;
            let mut stub = probes[attempt % probes.len()].clone();
            async move {
                let request = v1::EnqueueRequest { jobs: vec![job("probe", b"failover")] };
                match tokio::time::timeout(PROBE_TIMEOUT, stub.enqueue(request)).await {
                    Ok(Ok(_)) => Ok(Check::Done(killed_at.elapsed())),
                    Ok(Err(status)) => {
                        Ok(Check::NotYet(format!("{:?}: {}", status.code(), status.message())))
                    }
                    Err(_) => Ok(Check::NotYet("no answer within 1 s".to_string())),
                }
            }
        })
        .await?;
    let new_leader = cluster.wait_leader_among(&survivors, Duration::from_secs(10)).await?;
    let failover_ms = failover.as_millis();
    eprintln!(
        "FAILOVER: {failover_ms} ms from SIGKILL of leader {old_leader} to a write; new leader {new_leader}"
    );

    phase("the load makes progress again");
    let after_failover = acked.load(Ordering::SeqCst);
    wait_acks(&acked, after_failover + ACKS_AFTER_FAILOVER, Duration::from_secs(60)).await?;

    phase("restart the killed node on its data directory; it catches up under load");
    cluster.restart(sandbox, old_leader).await?;
    let leader_status = cluster.node(new_leader)?.local_status().await?;
    let target = leader_status.commit_index;
    let restarted = cluster.node(old_leader)?.cluster_stub()?;
    wait_until(
        &format!("node {old_leader} to apply index {target}"),
        deadline_in(Duration::from_secs(60)),
        || {
            let running = cluster.node_mut(old_leader).and_then(|node| node.ensure_running());
            let mut stub = restarted.clone();
            async move {
                running?;
                let status = match stub.status(v1::StatusRequest { local_only: true }).await {
                    Ok(status) => status.into_inner(),
                    Err(error) => return Ok(Check::NotYet(error.message().to_string())),
                };
                let applied = status.nodes.iter().map(|n| n.applied_index).max().unwrap_or(0);
                Ok(if applied >= target {
                    Check::Done(())
                } else {
                    Check::NotYet(format!("applied {applied}"))
                })
            }
        },
    )
    .await?;

    phase("stop the load and collect every client's record");
    stop.send(true).context("stopping the load")?;
    let mut history = History::default();
    for handle in clients {
        let record = tokio::time::timeout(Duration::from_secs(60), handle)
            .await
            .context("a load client did not stop within 60 s")?
            .context("a load client panicked")?;
        history.merge(record);
    }

    phase("work the queue off: claim and ack until nothing is ready or claimed");
    let drainer = cluster.client()?.with_retry(load_retry());
    let worker = worker_name(CLIENTS);
    let drained = Arc::new(Mutex::new(History::default()));
    let mut stub = cluster.node(new_leader)?.stub()?;
    wait_until("the load queue to be worked off", deadline_in(Duration::from_secs(60)), || {
        let (drainer, worker, drained, mut stub) =
            (drainer.clone(), worker.clone(), drained.clone(), stub.clone());
        async move {
            let claim = v1::ClaimRequest {
                worker: worker.clone(),
                queue: QUEUE.to_string(),
                max: 100,
                lease_ttl_ms: Some(LEASE_TTL_MS),
                selector: Vec::new(),
                wait_ms: 500,
            };
            let grants = drainer.claim(claim).await.context("claim while working off")?;
            let mut record = History::default();
            for grant in grants {
                if let Some((job_id, token)) = record.record_grant(&worker, grant) {
                    let outcome = drainer.ack(job_id, token).await;
                    record.record_ack(job_id, token, outcome);
                }
            }
            drained.lock().map_err(|_| anyhow::anyhow!("record lock poisoned"))?.merge(record);
            let stats = queue_stats(&mut stub, QUEUE).await?;
            Ok(if stats.ready + stats.delayed + stats.claimed == 0 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{stats:?}"))
            })
        }
    })
    .await?;
    let drained =
        std::mem::take(&mut *drained.lock().map_err(|_| anyhow::anyhow!("record lock poisoned"))?);
    history.merge(drained);

    phase("all three nodes converge: equal digests at equal applied index");
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    eprintln!("converged after the restart: {converged:?}");

    phase("check the records against every job of the queue");
    let jobs = all_jobs(&cluster.client()?, QUEUE).await?;
    let summary = history.check(&jobs, LEASE_TTL_MS)?;
    eprintln!("HISTORY: {summary}; {} jobs in the queue", jobs.len());
    ensure!(summary.enqueued > 0 && summary.acks_accepted > 0, "the load did nothing: {summary:?}");
    ensure!(
        summary.redelivered_jobs > 0,
        "no job was granted twice, so the lease checks compared nothing: {summary:?}"
    );
    let stats = queue_stats(&mut stub, QUEUE).await?;
    ensure!(
        stats.acked == jobs.len() as u64
            && stats.ready + stats.delayed + stats.claimed + stats.dead == 0,
        "final stats {stats:?} for {} jobs",
        jobs.len()
    );
    Ok(())
}
