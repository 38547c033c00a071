//! What a job costs a leasehold node in memory: the resident set (VmRSS) of
//! one fresh node, idle, then holding N ready jobs, then holding their N
//! acked tombstones.
//!
//! 1. *idle*: the node's RSS once start-up has settled (see [`settled_rss`]);
//! 2. enqueue N untagged jobs of the workload's payload size in batches of
//!    the enqueue limit, several batches in flight, and read the queue's
//!    counts back with a linearizable stats read: every job is committed and
//!    applied; then the *ready* RSS;
//! 3. claim them all (`max` = the batch limit, no wait, several workers) and
//!    ack each one with its token, many acks in flight; read the counts back
//!    (N acked, none ready or claimed); then the *acked* RSS, the tombstones
//!    being kept for the retention (24 h by default).
//!
//! Bytes per ready job = (ready RSS − idle RSS) / N, bytes per tombstone =
//! (acked RSS − idle RSS) / N. The node's `/metrics` gauge
//! `leasehold_snapshot_lock_hold_longest_seconds` (the longest time a
//! snapshot build held the state lock) is read at the end, when the node
//! exports it, with `leasehold_snapshot_lock_hold_longest_cpu_seconds`
//! (the most CPU time the building thread spent inside one hold: the
//! difference is time it was descheduled while holding the lock).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use leasehold_client::Client;
use leasehold_proto::v1;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::measure;

/// Most jobs one measurement enqueues (ten times the default).
pub const MAX_JOBS: usize = 10_000_000;
/// The queue the jobs go to.
const QUEUE: &str = "memory";
/// Jobs per enqueue and most leases per claim: the batch limit.
const BATCH_JOBS: usize = 1_000;
/// Enqueue batches in flight, each on its own connection.
const ENQUEUE_IN_FLIGHT: usize = 4;
/// Claiming workers, each on its own connection.
const WORKERS: usize = 4;
/// Acks in flight per worker.
const ACKS_IN_FLIGHT: usize = 128;
/// Long enough that no lease lapses while its worker acks its batch.
const LEASE_TTL_MS: u64 = 600_000;
/// The gauge read from `/metrics`.
pub const SNAPSHOT_LOCK_METRIC: &str = "leasehold_snapshot_lock_hold_longest_seconds";
/// The gauge of the build's CPU time inside one hold.
pub const SNAPSHOT_LOCK_CPU_METRIC: &str = "leasehold_snapshot_lock_hold_longest_cpu_seconds";
/// RSS samples are this far apart while waiting for it to settle.
const SETTLE_INTERVAL: Duration = Duration::from_millis(500);
/// Longest wait for the RSS to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(15);
/// Largest `/metrics` answer read.
const MAX_METRICS_BYTES: u64 = 4 * 1024 * 1024;

/// What to measure.
#[derive(Clone, Debug)]
pub struct MemoryConfig {
    /// gRPC `host:port` of the node.
    pub addr: String,
    /// HTTP `host:port` of the node.
    pub http: String,
    /// The node's process id.
    pub pid: u32,
    /// Jobs to enqueue, claim and ack.
    pub jobs: usize,
    /// Payload bytes per job.
    pub payload_bytes: usize,
}

/// The result line of one memory measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Jobs enqueued, then acked.
    pub jobs: u64,
    /// Payload bytes per job.
    pub payload_bytes: usize,
    /// VmRSS of the idle node, KiB.
    pub idle_rss_kib: u64,
    /// VmRSS holding the ready jobs, KiB.
    pub ready_rss_kib: u64,
    /// VmRSS holding their tombstones, KiB.
    pub acked_rss_kib: u64,
    /// VmHWM at the end, KiB.
    pub peak_rss_kib: Option<u64>,
    /// (ready − idle) / jobs.
    pub bytes_per_ready_job: f64,
    /// (acked − idle) / jobs.
    pub bytes_per_tombstone: f64,
    /// Seconds from the first enqueue to the committed count.
    pub enqueue_s: f64,
    /// Seconds from the first claim to the last ack's committed count.
    pub ack_s: f64,
    /// The node's longest snapshot-build hold of its state lock, seconds;
    /// `None` when the node does not export the gauge.
    pub snapshot_lock_hold_longest_s: Option<f64>,
    /// The most CPU time the build spent inside one hold, seconds; `None`
    /// when the node does not export it (results saved before it did).
    #[serde(default)]
    pub snapshot_lock_hold_longest_cpu_s: Option<f64>,
}

/// Runs the measurement against the node of `config`.
pub async fn run(config: &MemoryConfig) -> anyhow::Result<MemorySummary> {
    let idle = settled_rss(config.pid).await?;
    eprintln!("memory: idle RSS {idle} KiB; enqueuing {} jobs", config.jobs);

    let started = Instant::now();
    enqueue_all(config).await?;
    let counts = queue_counts(&config.addr).await?;
    anyhow::ensure!(
        counts.ready == config.jobs as u64,
        "after enqueuing {} jobs, {} are ready",
        config.jobs,
        counts.ready
    );
    let enqueue_s = started.elapsed().as_secs_f64();
    let ready = settled_rss(config.pid).await?;
    eprintln!("memory: {} ready after {enqueue_s:.1} s, RSS {ready} KiB; acking", counts.ready);

    let started = Instant::now();
    let acked = claim_and_ack_all(config).await?;
    let counts = queue_counts(&config.addr).await?;
    anyhow::ensure!(
        acked == config.jobs as u64 && counts.acked == acked && counts.ready + counts.claimed == 0,
        "acked {acked} of {} jobs; the node counts {} acked, {} ready, {} claimed",
        config.jobs,
        counts.acked,
        counts.ready,
        counts.claimed
    );
    let ack_s = started.elapsed().as_secs_f64();
    let tombstones = settled_rss(config.pid).await?;
    eprintln!("memory: {acked} acked after {ack_s:.1} s, RSS {tombstones} KiB");

    let (snapshot_lock_hold_longest_s, snapshot_lock_hold_longest_cpu_s) =
        match metrics(&config.http).await {
            Ok(text) => {
                (gauge(&text, SNAPSHOT_LOCK_METRIC), gauge(&text, SNAPSHOT_LOCK_CPU_METRIC))
            }
            Err(error) => {
                eprintln!("memory: /metrics unreadable: {error:#}");
                (None, None)
            }
        };
    let per_job = |rss_kib: u64| (rss_kib as f64 - idle as f64) * 1024.0 / config.jobs as f64;
    Ok(MemorySummary {
        jobs: config.jobs as u64,
        payload_bytes: config.payload_bytes,
        idle_rss_kib: idle,
        ready_rss_kib: ready,
        acked_rss_kib: tombstones,
        peak_rss_kib: measure::peak_rss_kib(config.pid),
        bytes_per_ready_job: per_job(ready),
        bytes_per_tombstone: per_job(tombstones),
        enqueue_s,
        ack_s,
        snapshot_lock_hold_longest_s,
        snapshot_lock_hold_longest_cpu_s,
    })
}

/// The node's RSS once two samples [`SETTLE_INTERVAL`] apart differ by less
/// than 1% (background work such as a snapshot build or sled's flush has
/// quietened), or the last sample after [`SETTLE_LIMIT`].
async fn settled_rss(pid: u32) -> anyhow::Result<u64> {
    let read = || measure::rss_kib(pid).ok_or_else(|| anyhow::anyhow!("node {pid} is gone"));
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut last = read()?;
    loop {
        tokio::time::sleep(SETTLE_INTERVAL).await;
        let now = read()?;
        if now.abs_diff(last) * 100 < last.max(1) || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// One job of the measurement.
fn job(payload_bytes: usize) -> v1::JobSpec {
    v1::JobSpec {
        queue: QUEUE.to_string(),
        payload: vec![0x5a_u8; payload_bytes],
        ..Default::default()
    }
}

/// Enqueues `config.jobs` jobs in batches of [`BATCH_JOBS`],
/// [`ENQUEUE_IN_FLIGHT`] at a time. No idempotency keys, so a failed batch
/// fails the measurement rather than being retried (it may have landed).
async fn enqueue_all(config: &MemoryConfig) -> anyhow::Result<()> {
    let batches = config.jobs.div_ceil(BATCH_JOBS);
    let next = Arc::new(AtomicUsize::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..ENQUEUE_IN_FLIGHT.min(batches) {
        let client = Client::connect(&config.addr)?;
        let next = Arc::clone(&next);
        let (jobs, payload_bytes) = (config.jobs, config.payload_bytes);
        senders.spawn(async move {
            loop {
                let batch = next.fetch_add(1, Ordering::Relaxed);
                if batch >= batches {
                    return anyhow::Ok(());
                }
                let count = BATCH_JOBS.min(jobs - batch * BATCH_JOBS);
                let specs = (0..count).map(|_| job(payload_bytes)).collect();
                let results = client
                    .enqueue(specs)
                    .await
                    .with_context(|| format!("enqueue batch {batch} of {batches}"))?;
                anyhow::ensure!(results.len() == count, "batch {batch}: {} results", results.len());
            }
        });
    }
    while let Some(joined) = senders.join_next().await {
        joined??;
    }
    Ok(())
}

/// Claims every ready job of the queue and acks each one; returns how many
/// were acked. [`WORKERS`] workers claim up to [`BATCH_JOBS`] at a time
/// without waiting; a worker stops when a claim finds nothing ready (no one
/// else adds jobs, so then none is left for it).
async fn claim_and_ack_all(config: &MemoryConfig) -> anyhow::Result<u64> {
    let acked = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for index in 0..WORKERS {
        let client = Client::connect(&config.addr)?;
        let acked = Arc::clone(&acked);
        workers.spawn(async move {
            loop {
                let request = v1::ClaimRequest {
                    worker: format!("memory-{index}"),
                    queue: QUEUE.to_string(),
                    max: BATCH_JOBS as u32,
                    lease_ttl_ms: Some(LEASE_TTL_MS),
                    wait_ms: 0,
                    ..Default::default()
                };
                let grants = client.claim(request).await.context("claim")?;
                let leases: Vec<v1::Lease> =
                    grants.into_iter().filter_map(|grant| grant.lease).collect();
                if leases.is_empty() {
                    return anyhow::Ok(());
                }
                let mut acks = tokio::task::JoinSet::new();
                for lease in leases {
                    while acks.len() >= ACKS_IN_FLIGHT {
                        if let Some(joined) = acks.join_next().await {
                            joined??;
                        }
                    }
                    let client = client.clone();
                    let acked = Arc::clone(&acked);
                    acks.spawn(async move {
                        client
                            .ack(lease.job_id, lease.token)
                            .await
                            .with_context(|| format!("ack of job {}", lease.job_id))?;
                        acked.fetch_add(1, Ordering::Relaxed);
                        anyhow::Ok(())
                    });
                }
                while let Some(joined) = acks.join_next().await {
                    joined??;
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(acked.load(Ordering::Relaxed))
}

/// The queue's counts, from a linearizable stats read.
async fn queue_counts(addr: &str) -> anyhow::Result<v1::QueueStats> {
    let client = Client::connect(addr)?;
    let stats = client.stats(Some(QUEUE.to_string()), false).await?;
    Ok(stats.queues.into_iter().find(|q| q.queue == QUEUE).unwrap_or_default())
}

/// The node's `/metrics` text, by one plain HTTP/1.0 GET (1.0, so the
/// answer is never chunked and a line is never split by a chunk header).
async fn metrics(http: &str) -> anyhow::Result<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(http).await?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {http}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(MAX_METRICS_BYTES).read_to_end(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10 s"))??;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.lines().next().unwrap_or_default();
    anyhow::ensure!(
        status.starts_with("HTTP/1.") && status.split_whitespace().nth(1) == Some("200"),
        "answered {status:?}"
    );
    Ok(text)
}

/// The value of the first sample of gauge `name` in OpenMetrics `text`
/// (labels, if any, ignored); `None` when it is not there.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let rest = match rest.strip_prefix('{') {
            Some(labelled) => &labelled[labelled.find('}')? + 1..],
            None => rest,
        };
        if !rest.starts_with(' ') {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    //! The gauge is found by its exact name, with or without labels, and a
    //! longer name that starts with it is not mistaken for it.

    use super::*;

    #[test]
    fn gauges_are_read_by_their_exact_name() {
        let text = "# TYPE leasehold_snapshot_lock_hold_longest_seconds gauge\n\
                    leasehold_snapshot_lock_hold_longest_seconds_other 7\n\
                    leasehold_snapshot_lock_hold_longest_seconds 0.0125\n\
                    labelled{node=\"1\"} 3.5 1700000000\n# EOF\n";
        assert_eq!(gauge(text, SNAPSHOT_LOCK_METRIC), Some(0.0125));
        assert_eq!(gauge(text, SNAPSHOT_LOCK_CPU_METRIC), None);
        assert_eq!(gauge(text, "labelled"), Some(3.5));
        assert_eq!(gauge(text, "absent"), None);
        assert_eq!(
            gauge("leasehold_snapshot_lock_hold_longest_seconds_other 7\n", SNAPSHOT_LOCK_METRIC),
            None
        );
    }
}
