//! Fire lag of every-second cron schedules on a running cluster.
//!
//! Puts `schedules` schedules (`* * * * * *`, UTC, the stock policies:
//! overlap skip, catch-up coalesce, target any) whose command, run by the
//! nodes' built-in executors, appends `NAME BUCKET $(date +%s.%N)` to a log
//! file. Over the window it reads each schedule's tick history (the node
//! keeps the newest 100 records per schedule, so it polls well inside that)
//! and afterwards the log, and reports two lags per tick, both measured from
//! the tick's instant (`LEASEHOLD_BUCKET`, Unix seconds):
//!
//! - **to enqueue**: the `lag_ms` the journal records with a fired tick —
//!   the cluster time of the `Fire` command (the leader's clock when it
//!   proposed it) minus the instant; it excludes the commit that follows;
//! - **to command start**: the wall-clock time the command's `date` printed,
//!   so it includes the commit, the claim by an executor, the fork of `sh`
//!   and of `date` itself.
//!
//! Every process runs on one machine, so both sides read the same clock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_client::{Client, RetryPolicy};
use leasehold_proto::v1;
use serde::{Deserialize, Serialize};

/// Name prefix of the benchmark's schedules.
const PREFIX: &str = "bench-lag-";
/// How often the histories are read (100 records per schedule = 100 s).
const POLL: Duration = Duration::from_secs(20);
/// Wait after the window for the last ticks' commands.
const GRACE: Duration = Duration::from_secs(5);
/// Retries of a schedule put, about 30 s in all: a cluster that has just
/// formed refuses writes (UNAVAILABLE) until its leader's clock has been
/// measured against a majority, and a put of the same spec is one put.
const PUT_RETRY: RetryPolicy = RetryPolicy {
    attempts: 32,
    first_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(1),
};

/// The shape of one fire-lag run.
#[derive(Clone, Debug)]
pub struct FireLagConfig {
    /// gRPC addresses of the nodes.
    pub addrs: String,
    /// Schedules to create.
    pub schedules: usize,
    /// Measured window.
    pub duration: Duration,
    /// Time between creating the schedules and the window.
    pub warmup: Duration,
    /// File the commands append to.
    pub fires_log: PathBuf,
}

/// Percentiles of a lag, milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LagStats {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl LagStats {
    fn of(mut samples: Vec<f64>) -> LagStats {
        if samples.is_empty() {
            return LagStats::default();
        }
        samples.sort_by(f64::total_cmp);
        // Nearest rank.
        let at = |q: f64| {
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1]
        };
        LagStats {
            count: samples.len() as u64,
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: samples[samples.len() - 1],
        }
    }
}

/// The result of one run (one JSON line).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FireLagSummary {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Schedules, each firing every second.
    pub schedules: usize,
    /// Measured window, seconds.
    pub duration_s: f64,
    /// Ticks due inside the window (schedules × seconds).
    pub expected_ticks: u64,
    /// Ticks inside the window the histories record as fired.
    pub fired: u64,
    /// Ticks recorded as skipped, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Ticks due inside the window with no history record at all.
    pub unrecorded: u64,
    /// Fired ticks flagged late (two seconds or more).
    pub late: u64,
    /// Tick instant → fire (journal's lag_ms).
    pub to_enqueue: LagStats,
    /// Tick instant → the command's first line.
    pub to_start: LagStats,
    /// Fired ticks whose command never wrote its line.
    pub never_started: u64,
    /// Ticks whose command wrote more than one line (ran more than once).
    pub started_twice: u64,
    /// Median lag to enqueue of each schedule, in creation order (the
    /// leader proposes the due ticks one schedule after another).
    #[serde(default)]
    pub by_schedule_p50_ms: Vec<f64>,
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

fn name(index: usize) -> String {
    format!("{PREFIX}{index:02}")
}

/// Creates the schedules, measures, deletes them, and summarizes.
pub async fn run(config: &FireLagConfig, nodes: usize) -> anyhow::Result<FireLagSummary> {
    anyhow::ensure!(config.schedules >= 1, "at least one schedule");
    let log = config.fires_log.display().to_string();
    anyhow::ensure!(!log.contains('\''), "the fires log path must not contain a quote");
    std::fs::write(&config.fires_log, b"")?;
    let client = Client::connect(&config.addrs)?;
    let command = format!(
        "printf '%s %s %s\\n' \"$LEASEHOLD_SCHEDULE\" \"$LEASEHOLD_BUCKET\" \"$(date +%s.%N)\" >> '{log}'"
    );
    for index in 0..config.schedules {
        let spec = v1::ScheduleSpec {
            name: name(index),
            cron: "* * * * * *".to_string(),
            template: Some(v1::JobTemplate {
                command: Some(command.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        client.clone().with_retry(PUT_RETRY).put_schedule(spec).await?;
    }
    // The window: whole seconds, starting after the warm-up.
    let first = (unix_now() + config.warmup).as_secs() + 1;
    let seconds = config.duration.as_secs().max(1);
    let end = first + seconds; // exclusive
    eprintln!(
        "fire lag: {} schedules, ticks {first}..{end} ({seconds} s), log {log}",
        config.schedules
    );

    let mut records: BTreeMap<(String, u64), v1::TickRecord> = BTreeMap::new();
    loop {
        let now = unix_now();
        let done = now.as_secs() >= end + GRACE.as_secs();
        collect(&client, first, end, &mut records).await?;
        eprintln!(
            "fire lag: {} of {} ticks recorded so far",
            records.len(),
            u64::try_from(config.schedules)? * seconds
        );
        if done {
            break;
        }
        let until_end = Duration::from_secs(end + GRACE.as_secs()).saturating_sub(now);
        tokio::time::sleep(POLL.min(until_end + Duration::from_millis(200))).await;
    }
    for index in 0..config.schedules {
        let request = v1::DeleteScheduleRequest { name: name(index) };
        if let Err(error) = client.schedules_stub().delete(request).await {
            eprintln!("fire lag: deleting {}: {error}", name(index));
        }
    }

    // Command start times from the log.
    let text = std::fs::read_to_string(&config.fires_log)?;
    let mut starts: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(schedule), Some(bucket), Some(at)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(bucket), Ok(at)) = (bucket.parse::<u64>(), at.parse::<f64>()) else { continue };
        if (first..end).contains(&bucket) {
            starts.entry((schedule.to_string(), bucket)).or_default().push(at);
        }
    }

    let mut summary = FireLagSummary {
        nodes,
        schedules: config.schedules,
        duration_s: seconds as f64,
        expected_ticks: u64::try_from(config.schedules)? * seconds,
        ..Default::default()
    };
    let mut to_enqueue = Vec::new();
    let mut fired_keys = BTreeSet::new();
    for (key, record) in &records {
        if record.outcome == "fired" {
            summary.fired += 1;
            summary.late += u64::from(record.late);
            to_enqueue.push(record.lag_ms as f64);
            fired_keys.insert(key.clone());
        } else {
            *summary.skipped.entry(record.skip_reason.clone()).or_default() += record.ticks.max(1);
        }
    }
    let recorded: u64 =
        records.values().map(|r| if r.outcome == "fired" { 1 } else { r.ticks.max(1) }).sum();
    summary.unrecorded = summary.expected_ticks.saturating_sub(recorded);
    let mut to_start = Vec::new();
    for key in &fired_keys {
        match starts.get(key) {
            None => summary.never_started += 1,
            Some(times) => {
                if times.len() > 1 {
                    summary.started_twice += 1;
                }
                let earliest = times.iter().copied().fold(f64::INFINITY, f64::min);
                to_start.push((earliest - key.1 as f64) * 1000.0);
            }
        }
    }
    for index in 0..config.schedules {
        let lags = records
            .iter()
            .filter(|((schedule, _), record)| *schedule == name(index) && record.outcome == "fired")
            .map(|(_, record)| record.lag_ms as f64)
            .collect();
        summary.by_schedule_p50_ms.push(LagStats::of(lags).p50_ms);
    }
    summary.to_enqueue = LagStats::of(to_enqueue);
    summary.to_start = LagStats::of(to_start);
    Ok(summary)
}

/// Adds every history record of a benchmark schedule with a bucket in
/// `first..end` to `records`.
async fn collect(
    client: &Client,
    first: u64,
    end: u64,
    records: &mut BTreeMap<(String, u64), v1::TickRecord>,
) -> anyhow::Result<()> {
    let reply = client.schedules_stub().list(v1::ListSchedulesRequest { stale: false }).await?;
    for schedule in reply.into_inner().schedules {
        let Some(name) = schedule.spec.as_ref().map(|s| s.name.clone()) else { continue };
        if !name.starts_with(PREFIX) {
            continue;
        }
        for record in schedule.history {
            if (first..end).contains(&record.bucket) {
                records.insert((name.clone(), record.bucket), record);
            }
        }
    }
    Ok(())
}
