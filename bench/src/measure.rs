//! The workload and its measurement, the same for every system: N clients,
//! each looping enqueue one job → claim one job → ack it (one *cycle*), for a
//! warm-up and then a measured window, with a latency histogram per
//! operation and per cycle.
//!
//! A cycle counts when it started inside the measured window and finished
//! before the window closed, so throughput is `recorded cycles / window`.
//! Every call has a deadline ([`CALL_TIMEOUT`]); a failed call is counted,
//! its cycle abandoned, and the client goes on after a short pause, so one
//! wedged server cannot hang the run.

use std::future::Future;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::System;

/// Deadline of one call (a claim includes its own retries).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed call, so a broken server is not spun against.
const ERROR_PAUSE: Duration = Duration::from_millis(20);
/// Errors printed per run; the rest are only counted.
const MAX_PRINTED_ERRORS: u64 = 5;
/// Histogram range: 1 µs … 60 s, three significant digits.
const HISTOGRAM_MAX_US: u64 = 60_000_000;

/// A job a client holds: its id and the fencing token the ack presents.
#[derive(Clone, Copy, Debug)]
pub struct Claimed {
    /// The job's id in the system under test.
    pub job_id: u64,
    /// Fencing token (leasehold token, etcd claim revision, PostgreSQL token).
    pub token: u64,
    /// Tries that found nothing or lost a race before this one succeeded.
    pub retries: u64,
}

/// One client's connection to the system under test.
pub trait Connection: Send + 'static {
    /// Adds one ready job carrying `payload`.
    fn enqueue(&mut self, payload: &[u8]) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Takes one ready job under a lease; retries internally until it has
    /// one or the call's deadline passes.
    fn claim(&mut self) -> impl Future<Output = anyhow::Result<Claimed>> + Send;
    /// Finishes a claimed job, presenting its token; an `Err` if refused.
    fn ack(&mut self, claimed: Claimed) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// A system under test: hands out one connection per client.
pub trait Target: Sync {
    /// The per-client connection type.
    type Conn: Connection;
    /// Opens client number `index`'s connection.
    fn connect(&self, index: usize) -> impl Future<Output = anyhow::Result<Self::Conn>> + Send;
}

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Servers the clients are spread over (1, or the cluster's size).
    pub nodes: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Driven but not recorded.
    pub warmup: Duration,
    /// Recorded.
    pub duration: Duration,
    /// Bytes per job payload.
    pub payload_bytes: usize,
}

/// Latency percentiles of one operation, microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Samples recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest sample.
    pub max_us: u64,
}

impl Latency {
    fn of(histogram: &Histogram<u64>) -> Latency {
        if histogram.is_empty() {
            return Latency::default();
        }
        Latency {
            count: histogram.len(),
            p50_us: histogram.value_at_quantile(0.50),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

/// The result line of one run (one JSON object per line in the results file).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSummary {
    /// The system measured.
    pub system: System,
    /// Nodes (members) of the system under test; lines written before
    /// clusters were measured lack it and mean one.
    #[serde(default = "one")]
    pub nodes: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Measured window, seconds.
    pub duration_s: f64,
    /// Warm-up, seconds.
    pub warmup_s: f64,
    /// Payload bytes per job.
    pub payload_bytes: usize,
    /// Cycles completed inside the window.
    pub cycles: u64,
    /// `cycles / duration_s`.
    pub cycles_per_s: f64,
    /// Calls that failed (timeouts, errors, refused acks) inside the window.
    pub errors: u64,
    /// Claim tries that found nothing or lost a race (etcd txn conflicts).
    pub claim_retries: u64,
    /// Enqueue latency.
    pub enqueue: Latency,
    /// Claim latency (all of a claim's tries).
    pub claim: Latency,
    /// Ack latency.
    pub ack: Latency,
    /// Whole-cycle latency.
    pub cycle: Latency,
    /// Peak resident set of the server process (VmHWM), KiB, when known;
    /// for a cluster, the largest of its nodes'.
    pub server_peak_rss_kib: Option<u64>,
    /// CPU time (user + system) the server processes used inside the
    /// measured window, seconds, summed over the nodes; when known.
    #[serde(default)]
    pub server_cpu_s: Option<f64>,
    /// Elections during the run (warm-up and window) of a leasehold
    /// cluster: the largest term any node reports after the run minus the
    /// largest before it. Every one is spurious, since no node is stopped.
    #[serde(default)]
    pub elections: Option<u64>,
    /// Whether the clients (and so the nodes, which then also speak TLS to
    /// each other) used mutual TLS and tokens; lines from before TLS lack it.
    #[serde(default)]
    pub tls: bool,
    /// Jobs put in the queue before the warm-up that the workload's claims
    /// can never take (a tag no claim selects), ahead of its own jobs; lines
    /// from before the backlog parts lack it and mean none.
    #[serde(default)]
    pub backlog: u64,
    /// Where a commit round's time went over the window (leasehold runs
    /// given the nodes' HTTP addresses): each stage's count and mean,
    /// summed over the nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<crate::stages::StageMean>,
    /// The invocation of scripts/bench this run belongs to: the runs of one
    /// invocation with the same system, size and client count are repeats
    /// of each other (`--repeat`), and a later invocation's runs replace an
    /// earlier one's (`--merge`). Lines without it stand alone.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub invocation: String,
}

fn one() -> usize {
    1
}

#[cfg(test)]
impl RunSummary {
    /// A run for the report's and figures' tests: `system` on `nodes` with
    /// `clients`, a 10 s window at `cycles_per_s`, every latency `latency`,
    /// no server measurements.
    pub fn sample(
        system: System,
        nodes: usize,
        clients: usize,
        cycles_per_s: f64,
        latency: Latency,
    ) -> RunSummary {
        RunSummary {
            system,
            nodes,
            clients,
            duration_s: 10.0,
            warmup_s: 1.0,
            payload_bytes: 64,
            cycles: (cycles_per_s * 10.0) as u64,
            cycles_per_s,
            errors: 0,
            claim_retries: 0,
            enqueue: latency.clone(),
            claim: latency.clone(),
            ack: latency.clone(),
            cycle: latency,
            server_peak_rss_kib: None,
            server_cpu_s: None,
            elections: None,
            tls: false,
            backlog: 0,
            stages: Vec::new(),
            invocation: String::new(),
        }
    }
}

impl RunSummary {
    /// A short human-readable line for the log.
    pub fn one_line(&self) -> String {
        format!(
            "{}{} nodes={} backlog={} clients={} cycles/s={:.0} claim p50/p99={}/{} µs cycle p50/p99={}/{} µs errors={} retries={}",
            self.system.name(),
            if self.tls { " tls" } else { "" },
            self.nodes,
            self.backlog,
            self.clients,
            self.cycles_per_s,
            self.claim.p50_us,
            self.claim.p99_us,
            self.cycle.p50_us,
            self.cycle.p99_us,
            self.errors,
            self.claim_retries
        )
    }
}

/// Histograms and counters of one client; merged at the end.
struct Recorder {
    enqueue: Histogram<u64>,
    claim: Histogram<u64>,
    ack: Histogram<u64>,
    cycle: Histogram<u64>,
    cycles: u64,
    errors: u64,
    claim_retries: u64,
}

impl Recorder {
    fn new() -> anyhow::Result<Recorder> {
        let histogram = || Histogram::<u64>::new_with_bounds(1, HISTOGRAM_MAX_US, 3);
        Ok(Recorder {
            enqueue: histogram()?,
            claim: histogram()?,
            ack: histogram()?,
            cycle: histogram()?,
            cycles: 0,
            errors: 0,
            claim_retries: 0,
        })
    }

    fn merge(&mut self, other: &Recorder) -> anyhow::Result<()> {
        self.enqueue.add(&other.enqueue)?;
        self.claim.add(&other.claim)?;
        self.ack.add(&other.ack)?;
        self.cycle.add(&other.cycle)?;
        self.cycles += other.cycles;
        self.errors += other.errors;
        self.claim_retries += other.claim_retries;
        Ok(())
    }
}

/// Microseconds for a histogram: at least 1, at most the histogram's range.
pub fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).clamp(1, HISTOGRAM_MAX_US)
}

/// Runs the workload against `target` and summarizes it.
pub async fn drive<T: Target>(
    target: &T,
    system: System,
    config: &RunConfig,
    server_pids: &[u32],
) -> anyhow::Result<RunSummary> {
    drive_with_stages(target, system, config, server_pids, &[]).await
}

/// [`drive`], reading the commit-stage timings of the leasehold nodes at
/// `stage_addrs` (HTTP) on the window's two edges.
pub async fn drive_with_stages<T: Target>(
    target: &T,
    system: System,
    config: &RunConfig,
    server_pids: &[u32],
    stage_addrs: &[String],
) -> anyhow::Result<RunSummary> {
    // Connect everyone first, so connection setup is not in the window.
    let mut connections = Vec::with_capacity(config.clients);
    for index in 0..config.clients {
        let connection = tokio::time::timeout(CALL_TIMEOUT, target.connect(index))
            .await
            .map_err(|_| anyhow::anyhow!("client {index}: connect timed out"))??;
        connections.push(connection);
    }
    let start = Instant::now();
    let window_start = start + config.warmup;
    let window_end = window_start + config.duration;
    let payload = vec![0x5a_u8; config.payload_bytes];
    // The servers' CPU time inside the window, read on its two edges.
    let pids = server_pids.to_vec();
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(window_start).await;
        let before = cpu_seconds(&pids);
        tokio::time::sleep_until(window_end).await;
        let after = cpu_seconds(&pids);
        before.zip(after).map(|(before, after)| (after - before).max(0.0))
    });
    let addrs = stage_addrs.to_vec();
    let stages = tokio::spawn(async move {
        if addrs.is_empty() {
            return anyhow::Ok(Vec::new());
        }
        tokio::time::sleep_until(window_start).await;
        let before = crate::stages::scrape_all(&addrs).await?;
        tokio::time::sleep_until(window_end).await;
        let after = crate::stages::scrape_all(&addrs).await?;
        Ok(crate::stages::means(&before, &after))
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (index, connection) in connections.into_iter().enumerate() {
        let payload = payload.clone();
        tasks.spawn(client_loop(index, connection, payload, window_start, window_end));
    }
    let mut total = Recorder::new()?;
    while let Some(joined) = tasks.join_next().await {
        total.merge(&joined??)?;
    }
    let duration_s = config.duration.as_secs_f64();
    Ok(RunSummary {
        system,
        nodes: config.nodes,
        clients: config.clients,
        duration_s,
        warmup_s: config.warmup.as_secs_f64(),
        payload_bytes: config.payload_bytes,
        cycles: total.cycles,
        cycles_per_s: total.cycles as f64 / duration_s,
        errors: total.errors,
        claim_retries: total.claim_retries,
        enqueue: Latency::of(&total.enqueue),
        claim: Latency::of(&total.claim),
        ack: Latency::of(&total.ack),
        cycle: Latency::of(&total.cycle),
        server_peak_rss_kib: None,
        server_cpu_s: cpu.await.ok().flatten(),
        elections: None,
        tls: false,
        backlog: 0,
        stages: stages.await??,
        invocation: String::new(),
    })
}

/// One client: cycles until the window closes.
async fn client_loop<C: Connection>(
    index: usize,
    mut connection: C,
    payload: Vec<u8>,
    window_start: Instant,
    window_end: Instant,
) -> anyhow::Result<Recorder> {
    let mut recorder = Recorder::new()?;
    let mut printed = 0_u64;
    while Instant::now() < window_end {
        let cycle_start = Instant::now();
        let recording = cycle_start >= window_start;
        let outcome = cycle(&mut connection, &payload).await;
        let cycle_end = Instant::now();
        match outcome {
            Ok(times) => {
                if recording && cycle_end <= window_end {
                    recorder.enqueue.record(micros(times.enqueue))?;
                    recorder.claim.record(micros(times.claim))?;
                    recorder.ack.record(micros(times.ack))?;
                    recorder.cycle.record(micros(cycle_end - cycle_start))?;
                    recorder.claim_retries += times.claim_retries;
                    recorder.cycles += 1;
                }
            }
            Err(error) => {
                if recording {
                    recorder.errors += 1;
                }
                if printed < MAX_PRINTED_ERRORS {
                    printed += 1;
                    eprintln!("client {index}: {error:#}");
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    Ok(recorder)
}

struct CycleTimes {
    enqueue: Duration,
    claim: Duration,
    ack: Duration,
    claim_retries: u64,
}

async fn cycle<C: Connection>(connection: &mut C, payload: &[u8]) -> anyhow::Result<CycleTimes> {
    let started = Instant::now();
    bounded("enqueue", connection.enqueue(payload)).await?;
    let enqueued = Instant::now();
    let claimed = bounded("claim", connection.claim()).await?;
    let claimed_at = Instant::now();
    bounded("ack", connection.ack(claimed)).await?;
    let acked = Instant::now();
    Ok(CycleTimes {
        enqueue: enqueued - started,
        claim: claimed_at - enqueued,
        ack: acked - claimed_at,
        claim_retries: claimed.retries,
    })
}

async fn bounded<T>(
    what: &str,
    call: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result.map_err(|e| e.context(what.to_string())),
        Err(_) => anyhow::bail!("{what}: no answer within {} s", CALL_TIMEOUT.as_secs()),
    }
}

/// User + system CPU seconds of the process trees rooted at `pids` so far,
/// if every root is still there: each root's own time and the time of the
/// children it has reaped (`cutime`, `cstime`), plus the same for each of
/// its live descendants. A PostgreSQL server does its work in backends,
/// children of the postmaster, so its tree is what it costs; leasehold and
/// etcd run in one process each, where the tree is that process.
pub fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    let ticks_per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let processes = processes();
    let mut ticks = 0_u64;
    for &root in pids {
        ticks += process_ticks(root)?;
        for descendant in descendants(root, &processes) {
            // A descendant may exit between the scan and this read; its time
            // then moves to its parent's reaped-children count.
            ticks += process_ticks(descendant).unwrap_or(0);
        }
    }
    Some(ticks as f64 / ticks_per_s as f64)
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold
/// spaces and parentheses), from field 3 (state) on.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// utime + stime + cutime + cstime of `pid`, in clock ticks.
fn process_ticks(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    let field = |n: usize| fields.get(n)?.parse::<u64>().ok();
    Some(field(11)? + field(12)? + field(13)? + field(14)?)
}

/// Every process on the machine with its parent: (pid, ppid).
fn processes() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat_fields(pid)?.get(1)?.parse::<u32>().ok()?)))
        .collect()
}

/// The live descendants of `root` among `processes` (children, their
/// children, …), `root` itself excluded.
fn descendants(root: u32, processes: &[(u32, u32)]) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in processes {
            if ppid == parent && pid != root && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// Resident set (VmRSS, KiB) of process `pid` now, if it is still there.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Peak resident set (VmHWM, KiB) of process `pid`, if it is still there.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    //! The process-tree CPU count on this test's own process: a child that
    //! burns CPU and is reaped adds its time to the tree's, which is the
    //! time a PostgreSQL backend adds to its postmaster's tree.

    use super::*;

    #[test]
    fn a_reaped_child_counts_in_its_parents_tree() -> anyhow::Result<()> {
        let me = std::process::id();
        let before = cpu_seconds(&[me]).ok_or_else(|| anyhow::anyhow!("no stat for self"))?;
        // About 0.3 s of CPU in a child shell, then reaped by `status()`.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()?;
        anyhow::ensure!(status.success(), "the child failed");
        let after = cpu_seconds(&[me]).ok_or_else(|| anyhow::anyhow!("no stat for self"))?;
        assert!(after - before >= 0.05, "before {before} s, after {after} s");
        assert!(cpu_seconds(&[]).is_none());
        Ok(())
    }
}
