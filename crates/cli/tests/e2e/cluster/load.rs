//! The queue load of the stories that judge a cluster by its clients'
//! records (the leader SIGKILL, the rolling restart): clients that loop
//! enqueue, claim, ack against every node, each recording every operation
//! and its answer (see `history.rs` for the rules checked); and what comes
//! after the load — working the queue off and checking the records against
//! every job the cluster holds.
//!
//! Every tenth grant is held back and acked only after its lease has
//! lapsed and (usually) been redelivered to another client, so superseded
//! tokens and redeliveries are part of every run and the lease checks
//! always have pairs of grants to compare.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use leasehold_client::{Client, RetryPolicy};
use leasehold_proto::v1;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::super::support::{Check, Cluster, deadline_in, job, wait_until};
use super::history::{Enqueue, History, Summary, no_answer};

/// The queue the load works.
pub const QUEUE: &str = "load";
/// The lease every load claim asks for.
pub const LEASE_TTL_MS: u64 = 3_000;
/// Every this many grants a client holds one back instead of acking it.
const HOLD_BACK_EVERY: u64 = 10;
/// How long a held-back grant waits for its ack: past the lease and the
/// sweep after it (about a second), so it has usually been redelivered.
const HOLD_BACK_FOR: Duration = Duration::from_millis(LEASE_TTL_MS + 2_000);
/// A job survives this many lapsed leases before it would go dead; the
/// stories want every job to end acked.
const MAX_ATTEMPTS: u32 = 100;
/// How long the clients may take to finish their last operations and stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long working the queue off may take.
const WORK_OFF_TIMEOUT: Duration = Duration::from_secs(60);

/// The retries of every load client: enough to ride out an election
/// (about 5 s of retrying), not so many that a client hides a cluster that
/// stays down. A call that still fails is recorded as unanswered and the
/// loop goes on.
pub fn load_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 8,
        first_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
    }
}

fn worker_name(client: usize) -> String {
    format!("client-{client}")
}

/// What the load clients have seen so far, shared between them.
#[derive(Default)]
struct Seen {
    /// Acks the cluster accepted.
    acked: AtomicU64,
    /// Every job granted so far.
    granted: Mutex<HashSet<u64>>,
    /// Grants of a job that had been granted before (redeliveries).
    redelivered: AtomicU64,
}

impl Seen {
    /// Notes a grant of `job_id`.
    fn grant(&self, job_id: u64) {
        let first = match self.granted.lock() {
            Ok(mut granted) => granted.insert(job_id),
            Err(poisoned) => poisoned.into_inner().insert(job_id),
        };
        if !first {
            self.redelivered.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Running load clients and what they have seen.
pub struct Load {
    seen: Arc<Seen>,
    stop: watch::Sender<bool>,
    clients: Vec<JoinHandle<History>>,
}

impl Load {
    /// Starts `clients` load clients, each connected to every node of
    /// `cluster` and each starting at a different one; half of them follow
    /// the leader hint, half stay where they are, so that when a node goes
    /// away some calls are in flight to it directly and some through
    /// another node forwarding them.
    pub fn start(cluster: &Cluster, clients: usize) -> Result<Load> {
        let seen = Arc::new(Seen::default());
        let (stop, stopped) = watch::channel(false);
        let ids = cluster.ids();
        let mut handles = Vec::new();
        for index in 0..clients {
            let order: Vec<u64> = (0..ids.len()).map(|k| ids[(index + k) % ids.len()]).collect();
            // Half the clients follow the leader hint to the leader; the
            // other half stay where they start, so a failure finds some
            // calls in flight on the leader and some forwarded to it.
            let client = Client::connect(&cluster.addrs_of(&order)?)?
                .with_retry(load_retry())
                .follow_leader_hints(index.is_multiple_of(2));
            handles.push(tokio::spawn(load_client(index, client, stopped.clone(), seen.clone())));
        }
        Ok(Load { seen, stop, clients: handles })
    }

    /// Acks the cluster accepted so far.
    pub fn acked(&self) -> u64 {
        self.seen.acked.load(Ordering::SeqCst)
    }

    /// Grants so far of a job that had been granted before.
    pub fn redelivered(&self) -> u64 {
        self.seen.redelivered.load(Ordering::SeqCst)
    }

    /// Waits until the redeliveries reach `target`: the load has run long
    /// enough for a held-back lease to lapse and be granted again.
    pub async fn wait_redelivered(&self, target: u64, within: Duration) -> Result<()> {
        wait_count("redeliveries", &self.seen.redelivered, target, within).await
    }

    /// Waits until the accepted acks reach `target`.
    pub async fn wait_acks(&self, target: u64, within: Duration) -> Result<()> {
        wait_count("accepted acks", &self.seen.acked, target, within).await
    }

    /// Stops the clients (each acks what it still holds back) and answers
    /// their records merged.
    pub async fn stop(self) -> Result<History> {
        self.stop.send(true).context("stopping the load")?;
        let mut history = History::default();
        let deadline = Instant::now() + STOP_TIMEOUT;
        for handle in self.clients {
            let record = tokio::time::timeout_at(deadline, handle)
                .await
                .with_context(|| {
                    format!("the load clients did not stop within {} s", STOP_TIMEOUT.as_secs())
                })?
                .context("a load client panicked")?;
            history.merge(record);
        }
        Ok(history)
    }
}

/// Waits until `counter` (of `what`) reaches `target`.
async fn wait_count(what: &str, counter: &AtomicU64, target: u64, within: Duration) -> Result<()> {
    wait_until(&format!("{target} {what}"), deadline_in(within), || {
        let now = counter.load(Ordering::SeqCst);
        async move {
            Ok(if now >= target { Check::Done(()) } else { Check::NotYet(format!("{now} {what}")) })
        }
    })
    .await
}

/// Acks `job_id` under `token`, records the answer, and counts an accepted ack.
async fn ack(client: &Client, history: &mut History, seen: &Seen, job_id: u64, token: u64) {
    let outcome = client.ack(job_id, token).await;
    if history.record_ack(job_id, token, outcome) {
        seen.acked.fetch_add(1, Ordering::SeqCst);
    }
}

/// One load client: enqueue one, claim up to two, ack — holding every tenth
/// grant back — until `stop`; then acks whatever it still holds.
async fn load_client(
    index: usize,
    client: Client,
    mut stop: watch::Receiver<bool>,
    seen: Arc<Seen>,
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
        history.enqueues.push(Enqueue { key, outcome });

        let claim = v1::ClaimRequest {
            worker: worker.clone(),
            queue: QUEUE.to_string(),
            max: 2,
            lease_ttl_ms: Some(LEASE_TTL_MS),
            selector: Vec::new(),
            wait_ms: 0,
            ..Default::default()
        };
        match client.claim(claim).await {
            Ok(grants) => {
                for grant in grants {
                    let Some((job_id, token)) = history.record_grant(&worker, grant) else {
                        continue;
                    };
                    seen.grant(job_id);
                    granted += 1;
                    if granted.is_multiple_of(HOLD_BACK_EVERY) {
                        held_back.push_back((Instant::now() + HOLD_BACK_FOR, job_id, token));
                    } else {
                        ack(&client, &mut history, &seen, job_id, token).await;
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
            ack(&client, &mut history, &seen, job_id, token).await;
        }
    }
    for (_, job_id, token) in held_back {
        ack(&client, &mut history, &seen, job_id, token).await;
    }
    history
}

/// Claims and acks through `cluster` until nothing of the load queue is
/// ready, delayed or claimed, adding what it did to `history` under a
/// worker name of its own (`client-{clients}`).
pub async fn work_off(cluster: &Cluster, clients: usize, history: &mut History) -> Result<()> {
    let drainer = cluster.client()?.with_retry(load_retry());
    let worker = worker_name(clients);
    let drained = Arc::new(Mutex::new(History::default()));
    wait_until("the load queue to be worked off", deadline_in(WORK_OFF_TIMEOUT), || {
        let (drainer, worker, drained) = (drainer.clone(), worker.clone(), drained.clone());
        async move {
            let claim = v1::ClaimRequest {
                worker: worker.clone(),
                queue: QUEUE.to_string(),
                max: 100,
                lease_ttl_ms: Some(LEASE_TTL_MS),
                selector: Vec::new(),
                wait_ms: 500,
                ..Default::default()
            };
            let grants = drainer.claim(claim).await.context("claim while working off")?;
            let mut record = History::default();
            for grant in grants {
                if let Some((job_id, token)) = record.record_grant(&worker, grant) {
                    let outcome = drainer.ack(job_id, token).await;
                    record.record_ack(job_id, token, outcome);
                }
            }
            drained.lock().map_err(|_| anyhow!("record lock poisoned"))?.merge(record);
            let stats = load_stats(&drainer).await?;
            Ok(if stats.ready + stats.delayed + stats.claimed == 0 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{stats:?}"))
            })
        }
    })
    .await?;
    let drained =
        std::mem::take(&mut *drained.lock().map_err(|_| anyhow!("record lock poisoned"))?);
    history.merge(drained);
    Ok(())
}

/// Checks `history` against every job of the load queue as `cluster` holds
/// it once the load has stopped and the queue has been worked off: the
/// guarantees of `history.rs`, a load that did something and saw
/// redeliveries, and final counts with every job acked. Answers the counts.
pub async fn check(cluster: &Cluster, history: &History) -> Result<Summary> {
    let client = cluster.client()?;
    let jobs = all_jobs(&client).await?;
    let summary = history.check(&jobs, LEASE_TTL_MS)?;
    eprintln!("HISTORY: {summary}; {} jobs in the queue", jobs.len());
    ensure!(summary.enqueued > 0 && summary.acks_accepted > 0, "the load did nothing: {summary:?}");
    ensure!(
        summary.redelivered_jobs > 0,
        "no job was granted twice, so the lease checks compared nothing: {summary:?}"
    );
    let stats = load_stats(&client).await?;
    ensure!(
        stats.acked == jobs.len() as u64
            && stats.ready + stats.delayed + stats.claimed + stats.dead == 0,
        "final stats {stats:?} for {} jobs",
        jobs.len()
    );
    Ok(summary)
}

/// The load queue's counts, read linearizably (all zero before its first job).
async fn load_stats(client: &Client) -> Result<v1::QueueStats> {
    let stats = client.stats(Some(QUEUE.to_string()), false).await.context("stats")?;
    Ok(stats
        .queues
        .into_iter()
        .find(|q| q.queue == QUEUE)
        .unwrap_or(v1::QueueStats { queue: QUEUE.to_string(), ..Default::default() }))
}

/// Every job of the load queue, read linearizably through `client`.
async fn all_jobs(client: &Client) -> Result<BTreeMap<u64, v1::Job>> {
    let mut jobs = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_jobs(v1::ListJobsRequest {
                queue: Some(QUEUE.to_string()),
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
