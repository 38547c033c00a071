//! `leasehold-bench`: the load generator behind `scripts/bench`.
//!
//! It drives one workload against four systems — leasehold, etcd as the
//! classic lease-and-transaction queue, etcd as a compare-and-swap queue
//! (serializable candidate reads, the deadline in the value) and PostgreSQL
//! (the `SKIP LOCKED` queue, alone or with two synchronous standbys) — so
//! their numbers can be read as ratios from one invocation on one machine. The script owns the servers (it starts and stops them); this
//! binary only connects, loads, measures and reports:
//!
//! - `run` drives N clients for a warm-up plus a measured window and prints
//!   one JSON summary line (appended to `--results` too); with `--backlog
//!   N` it first fills the queue with N jobs the clients can never claim;
//! - `report` turns those lines into the markdown tables of
//!   `docs/benchmarks.md`;
//! - `wait` blocks until a server answers (bounded), and for a PostgreSQL
//!   primary until its standbys stream;
//! - `memory` measures a leasehold node's resident set per ready job and
//!   per acked tombstone;
//! - `plot` draws cycles/s and cycle p99 by client count as SVG figures;
//! - `wait-cluster` blocks until a leasehold cluster is whole (bounded);
//! - `failover` SIGKILLs a leasehold cluster's leader and times the outage;
//! - `fire-lag` measures every-second cron schedules on a leasehold cluster;
//! - `free-port` prints a loopback port that was free a moment ago.

mod access;
mod cluster;
mod etcd;
mod etcd_cas;
mod failover;
mod firelag;
mod leasehold;
mod measure;
mod memory;
mod plot;
mod postgres;
mod repeats;
mod report;
mod stages;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use crate::access::{Access, AccessArgs};
use crate::measure::{RunConfig, RunSummary};

#[derive(Parser, Debug)]
#[command(name = "leasehold-bench", about = "Queue benchmark: leasehold vs etcd vs PostgreSQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Drive the enqueue → claim → ack workload against one running server.
    Run(RunArgs),
    /// Wait until a server accepts the calls the workload makes.
    Wait(WaitArgs),
    /// Wait until a leasehold cluster has one agreed leader, every node a
    /// caught-up, reachable voter.
    WaitCluster(WaitClusterArgs),
    /// One failover trial: SIGKILL the leader, time the first write after it.
    Failover(FailoverArgs),
    /// Fire lag of every-second cron schedules on a leasehold cluster.
    FireLag(FireLagArgs),
    /// Print a loopback TCP port that is free right now.
    FreePort,
    /// Resident set of a fresh leasehold node per ready job and per acked
    /// tombstone.
    Memory(MemoryArgs),
    /// Draw cycles/s and cycle p99 by client count, one line per system.
    Plot(PlotArgs),
    /// Render result lines as markdown tables with ratios.
    Report(ReportArgs),
}

/// Which system a run talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    /// A leasehold node, through `leasehold-client`.
    Leasehold,
    /// etcd v3, through its gRPC API.
    Etcd,
    /// PostgreSQL, through `tokio-postgres`.
    Postgres,
    /// etcd v3 as a compare-and-swap queue: serializable candidate reads,
    /// the lease deadline in the job's value.
    #[serde(rename = "etcd-cas")]
    EtcdCas,
}

impl System {
    /// The lowercase name used in tables and result lines.
    pub fn name(self) -> &'static str {
        match self {
            System::Leasehold => "leasehold",
            System::Etcd => "etcd",
            System::Postgres => "postgres",
            System::EtcdCas => "etcd-cas",
        }
    }
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The system behind `--addr`.
    #[arg(long, value_enum)]
    system: System,
    /// `host:port` of the server (leasehold gRPC, etcd client URL, PostgreSQL);
    /// for a leasehold or etcd cluster, every member's, separated by commas
    /// (the clients are spread over them).
    #[arg(long)]
    addr: String,
    /// Concurrent clients, each with its own connection.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Measured window, seconds.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Warm-up before the measured window, seconds (run but not recorded).
    #[arg(long, default_value_t = 3.0)]
    warmup: f64,
    /// Payload bytes per job (the same for every system).
    #[arg(long, default_value_t = 64)]
    payload_bytes: usize,
    /// Server processes (comma-separated) whose CPU time inside the window
    /// and peak RSS (VmHWM) at the end are recorded.
    #[arg(long, value_delimiter = ',')]
    server_pid: Vec<u32>,
    /// leasehold nodes' HTTP addresses (comma-separated) whose commit-stage
    /// timings are read on the measured window's two edges, so the result
    /// says where a commit round's time went.
    #[arg(long, value_delimiter = ',')]
    stages_from: Vec<String>,
    /// PostgreSQL user (the script's initdb creates it).
    #[arg(long, default_value = "bench")]
    pg_user: String,
    /// Append the JSON summary line to this file.
    #[arg(long)]
    results: Option<PathBuf>,
    /// Jobs put in the queue before the warm-up, ahead of the workload's
    /// own, that its claims can never take (leasehold: tag `absent`;
    /// PostgreSQL: `tag_key = 'absent'`); waited for until committed.
    #[arg(long, default_value_t = 0)]
    backlog: usize,
    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Servers of the system under test when that is not the number of
    /// `--addr`es: a PostgreSQL primary with two standbys, whose clients all
    /// connect to the primary, is 3.
    #[arg(long)]
    nodes: Option<usize>,
    /// How leasehold's clients call it: a worker session each (frames on
    /// one stream), or a unary call per call (leasehold only).
    #[arg(long, value_enum, default_value_t = leasehold::Api::Session)]
    leasehold_api: leasehold::Api,
    /// TLS and token (leasehold only).
    #[command(flatten)]
    access: AccessArgs,
    /// Names the invocation this run belongs to in its result line, so the
    /// report takes the median of an invocation's repeats of one row.
    #[arg(long, default_value = "")]
    invocation: String,
}

#[derive(clap::Args, Debug)]
struct WaitArgs {
    #[arg(long, value_enum)]
    system: System,
    #[arg(long)]
    addr: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    #[arg(long, default_value = "bench")]
    pg_user: String,
    /// PostgreSQL only: also wait until this many standbys stream from the
    /// primary at `--addr` as quorum-synchronous ones.
    #[arg(long, default_value_t = 0)]
    standbys: u32,
    /// TLS and token (leasehold only).
    #[command(flatten)]
    access: AccessArgs,
}

#[derive(clap::Args, Debug)]
struct MemoryArgs {
    /// gRPC `host:port` of the node.
    #[arg(long)]
    addr: String,
    /// HTTP `host:port` of the node (its `/metrics`).
    #[arg(long)]
    http: String,
    /// The node's process id, whose VmRSS is read.
    #[arg(long)]
    pid: u32,
    /// Jobs to enqueue, then claim and ack.
    #[arg(long, default_value_t = 1_000_000)]
    jobs: usize,
    /// Payload bytes per job.
    #[arg(long, default_value_t = 64)]
    payload_bytes: usize,
    /// Append the JSON summary line to this file.
    #[arg(long)]
    results: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct PlotArgs {
    /// JSON lines written by `run --results`.
    #[arg(long)]
    results: PathBuf,
    /// Where to write the cycles/s figure (SVG).
    #[arg(long)]
    throughput: PathBuf,
    /// Where to write the cycle p99 figure (SVG).
    #[arg(long)]
    p99: PathBuf,
}

#[derive(clap::Args, Debug)]
struct WaitClusterArgs {
    /// gRPC addresses of nodes 1..=n, separated by commas.
    #[arg(long)]
    addrs: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// TLS and token.
    #[command(flatten)]
    access: AccessArgs,
}

#[derive(clap::Args, Debug)]
struct FailoverArgs {
    /// gRPC addresses of nodes 1..=n, separated by commas.
    #[arg(long)]
    addrs: String,
    /// Process ids of nodes 1..=n, separated by commas.
    #[arg(long)]
    pids: String,
    /// Trial number, for the report.
    #[arg(long, default_value_t = 1)]
    trial: u32,
    /// Light-load clients on the survivors.
    #[arg(long, default_value_t = 2)]
    load_clients: usize,
    /// Pause between a light-load client's cycles, milliseconds.
    #[arg(long, default_value_t = 100)]
    load_pause_ms: u64,
    /// Light load before the kill, seconds.
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    /// Probe interval (enqueue and leader watch), milliseconds.
    #[arg(long, default_value_t = 10)]
    probe_interval_ms: u64,
    /// Give up after this many seconds without a write.
    #[arg(long, default_value_t = 30.0)]
    give_up: f64,
    /// Append the trial's JSON line to this file.
    #[arg(long)]
    results: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct FireLagArgs {
    /// gRPC addresses of the nodes, separated by commas.
    #[arg(long)]
    addrs: String,
    /// Every-second schedules to create.
    #[arg(long, default_value_t = 20)]
    schedules: usize,
    /// Measured window, seconds.
    #[arg(long, default_value_t = 600.0)]
    duration: f64,
    /// Time between creating the schedules and the window, seconds.
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// File the schedules' commands append their start times to.
    #[arg(long)]
    fires_log: PathBuf,
    /// Append the JSON summary line to this file.
    #[arg(long)]
    results: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// JSON lines written by `run --results`.
    #[arg(long)]
    results: PathBuf,
    /// JSON lines written by `failover --results`.
    #[arg(long)]
    failover: Option<PathBuf>,
    /// JSON lines written by `fire-lag --results`.
    #[arg(long)]
    fire_lag: Option<PathBuf>,
    /// JSON lines written by `memory --results`.
    #[arg(long)]
    memory: Option<PathBuf>,
    /// The product's single-node throughput goal, cycles per second.
    #[arg(long, default_value_t = 3000.0)]
    target_cycles_per_s: f64,
    /// The client count at which the goals apply.
    #[arg(long, default_value_t = 32)]
    target_clients: usize,
    /// The three-node goal: this many times the three-member etcd's cycles/s
    /// (the faster of its two clients).
    #[arg(long, default_value_t = 8.0)]
    target_cluster_ratio: f64,
    /// The three-node goal: this many times PostgreSQL with two synchronous
    /// standbys.
    #[arg(long, default_value_t = 2.0)]
    target_pg_cluster_ratio: f64,
    /// The one-node goal: this many times single-node PostgreSQL.
    #[arg(long, default_value_t = 1.5)]
    target_pg_single_ratio: f64,
    /// Three nodes at one client: claim p50 at most this, ms.
    #[arg(long, default_value_t = 1.0)]
    target_claim_p50_ms: f64,
    /// Three nodes: server CPU per cycle (all nodes) at most this, ms.
    #[arg(long, default_value_t = 0.3)]
    target_cpu_ms_per_cycle: f64,
    /// Memory: RSS per ready job at most this, bytes.
    #[arg(long, default_value_t = 300.0)]
    target_ready_job_bytes: f64,
    /// Memory: RSS per acked tombstone at most this, bytes.
    #[arg(long, default_value_t = 120.0)]
    target_tombstone_bytes: f64,
    /// The failover goal: median time to the first write below this, ms.
    #[arg(long, default_value_t = 1500.0)]
    target_failover_ms: f64,
    /// The fire-lag goal: p99 tick → enqueue below this, ms.
    #[arg(long, default_value_t = 100.0)]
    target_fire_lag_ms: f64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
        Command::Wait(args) => {
            single_thread_runtime()?.block_on(wait(args))?;
            Ok(())
        }
        Command::WaitCluster(args) => {
            let addrs = cluster::split_addrs(&args.addrs);
            let timeout = Duration::from_secs_f64(args.timeout);
            let access = Access::from_args(&args.access)?;
            single_thread_runtime()?.block_on(cluster::wait_whole(&addrs, &access, timeout))
        }
        Command::Failover(args) => failover(args),
        Command::FireLag(args) => fire_lag(args),
        Command::FreePort => {
            // Port 0 asks the kernel for a free ephemeral port; the script
            // binds it a moment later (a small, accepted race).
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            println!("{}", listener.local_addr()?.port());
            Ok(())
        }
        Command::Memory(args) => memory(args),
        Command::Plot(args) => {
            let runs: Vec<RunSummary> = read_lines(&args.results)?;
            let (throughput, p99) = plot::figures(&runs)?;
            for (path, svg) in [(&args.throughput, throughput), (&args.p99, p99)] {
                std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::Report(args) => {
            let runs: Vec<RunSummary> = read_lines(&args.results)?;
            let memories = match &args.memory {
                Some(path) => read_lines(path)?,
                None => Vec::new(),
            };
            let failovers = match &args.failover {
                Some(path) => read_lines(path)?,
                None => Vec::new(),
            };
            let fire_lags = match &args.fire_lag {
                Some(path) => read_lines(path)?,
                None => Vec::new(),
            };
            let targets = report::Targets {
                cycles_per_s: args.target_cycles_per_s,
                clients: args.target_clients,
                cluster_ratio: args.target_cluster_ratio,
                pg_cluster_ratio: args.target_pg_cluster_ratio,
                pg_single_ratio: args.target_pg_single_ratio,
                claim_p50_ms: args.target_claim_p50_ms,
                cpu_ms_per_cycle: args.target_cpu_ms_per_cycle,
                ready_job_bytes: args.target_ready_job_bytes,
                tombstone_bytes: args.target_tombstone_bytes,
                failover_ms: args.target_failover_ms,
                fire_lag_ms: args.target_fire_lag_ms,
            };
            print!("{}", report::render(&runs, &failovers, &fire_lags, &memories, &targets));
            Ok(())
        }
    }
}

/// Every non-empty line of `path` as JSON; a missing file is no lines.
fn read_lines<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> anyhow::Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        lines.push(
            serde_json::from_str(line)
                .with_context(|| format!("{} line {}", path.display(), number + 1))?,
        );
    }
    Ok(lines)
}

/// Appends `line` to `path`.
fn append_line(path: &std::path::Path, line: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(file, "{line}")?;
    Ok(())
}

fn failover(args: FailoverArgs) -> anyhow::Result<()> {
    let pids = args
        .pids
        .split(',')
        .map(|p| p.trim().parse::<i32>().with_context(|| format!("--pids: {p:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = failover::FailoverConfig {
        addrs: cluster::split_addrs(&args.addrs),
        pids,
        trial: args.trial,
        load_clients: args.load_clients.max(1),
        load_pause: Duration::from_millis(args.load_pause_ms),
        settle: Duration::from_secs_f64(args.settle),
        probe_interval: Duration::from_millis(args.probe_interval_ms.max(1)),
        give_up: Duration::from_secs_f64(args.give_up),
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let trial = runtime.block_on(failover::trial(&config))?;
    let line = serde_json::to_string(&trial)?;
    eprintln!("failover: {line}");
    if let Some(path) = &args.results {
        append_line(path, &line)?;
    }
    println!("killed={}", trial.killed);
    Ok(())
}

fn fire_lag(args: FireLagArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.duration >= 1.0 && args.duration <= 24.0 * 3600.0,
        "--duration must be 1 ..= 86400"
    );
    let config = firelag::FireLagConfig {
        addrs: args.addrs.clone(),
        schedules: args.schedules,
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup.max(0.0)),
        fires_log: args.fires_log.clone(),
    };
    let nodes = cluster::split_addrs(&args.addrs).len();
    let summary = single_thread_runtime()?.block_on(firelag::run(&config, nodes))?;
    let line = serde_json::to_string(&summary)?;
    println!("{line}");
    if let Some(path) = &args.results {
        append_line(path, &line)?;
    }
    Ok(())
}

fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=memory::MAX_JOBS).contains(&args.jobs),
        "--jobs must be 1 ..= {}",
        memory::MAX_JOBS
    );
    anyhow::ensure!(args.payload_bytes <= 64 * 1024, "--payload-bytes must be <= 65536");
    let config = memory::MemoryConfig {
        addr: args.addr.clone(),
        http: args.http.clone(),
        pid: args.pid,
        jobs: args.jobs,
        payload_bytes: args.payload_bytes,
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let summary = runtime.block_on(memory::run(&config))?;
    let line = serde_json::to_string(&summary)?;
    println!("{line}");
    if let Some(path) = &args.results {
        append_line(path, &line)?;
    }
    Ok(())
}

fn single_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// Largest `--backlog`: ten times the benchmark's own, so a typo cannot fill
/// the disk.
const MAX_BACKLOG: usize = 1_000_000;

/// Fills the backlog through `fill` when there is one, saying how long it took.
async fn fill_backlog(
    args: &RunArgs,
    fill: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    if args.backlog == 0 {
        return Ok(());
    }
    let started = std::time::Instant::now();
    fill.await.with_context(|| format!("filling a backlog of {} jobs", args.backlog))?;
    eprintln!(
        "{}: backlog of {} jobs in place after {:.1} s",
        args.system.name(),
        args.backlog,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=1024).contains(&args.clients), "--clients must be 1 ..= 1024");
    anyhow::ensure!(
        args.duration > 0.0 && args.duration <= 3600.0,
        "--duration must be 0 < s <= 3600"
    );
    anyhow::ensure!(args.warmup >= 0.0 && args.warmup <= 600.0, "--warmup must be 0 ..= 600");
    anyhow::ensure!(args.payload_bytes <= 64 * 1024, "--payload-bytes must be <= 65536");
    anyhow::ensure!(args.backlog <= MAX_BACKLOG, "--backlog must be <= {MAX_BACKLOG}");
    anyhow::ensure!(
        args.stages_from.is_empty() || args.system == System::Leasehold,
        "--stages-from is for leasehold runs"
    );
    anyhow::ensure!(
        args.backlog == 0 || matches!(args.system, System::Leasehold | System::Postgres),
        "--backlog is for leasehold and postgres runs"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.clamp(1, 64))
        .enable_all()
        .build()?;
    let addrs = args.addr.split(',').filter(|a| !a.trim().is_empty()).count();
    anyhow::ensure!(addrs >= 1, "--addr names no server");
    anyhow::ensure!(
        args.nodes.is_none() || args.system == System::Postgres,
        "--nodes is for a PostgreSQL primary with standbys"
    );
    let nodes = args.nodes.unwrap_or(addrs);
    anyhow::ensure!((1..=16).contains(&nodes), "--nodes must be 1 ..= 16");
    let access = Access::from_args(&args.access)?;
    anyhow::ensure!(
        args.system == System::Leasehold || !access.is_tls(),
        "--tls-* is for leasehold runs only"
    );
    let tls = access.is_tls();
    let config = RunConfig {
        nodes,
        clients: args.clients,
        warmup: Duration::from_secs_f64(args.warmup),
        duration: Duration::from_secs_f64(args.duration),
        payload_bytes: args.payload_bytes,
    };
    let mut summary = runtime.block_on(async {
        match args.system {
            System::Leasehold => {
                let addrs = cluster::split_addrs(&args.addr);
                let system = leasehold::Leasehold::new(&args.addr, access.clone())
                    .with_api(args.leasehold_api);
                fill_backlog(&args, system.fill_backlog(args.backlog, args.payload_bytes)).await?;
                let before =
                    if nodes > 1 { Some(cluster::max_term(&addrs, &access).await?) } else { None };
                let mut summary = measure::drive_with_stages(
                    &system,
                    System::Leasehold,
                    &config,
                    &args.server_pid,
                    &args.stages_from,
                )
                .await?;
                if let Some(before) = before {
                    let after = cluster::max_term(&addrs, &access).await?;
                    summary.elections = Some(after.saturating_sub(before));
                }
                Ok(summary)
            }
            System::Etcd => {
                let system = etcd::Etcd::new(&args.addr, args.clients);
                measure::drive(&system, System::Etcd, &config, &args.server_pid).await
            }
            System::EtcdCas => {
                let system = etcd_cas::EtcdCas::new(&args.addr, args.clients);
                measure::drive(&system, System::EtcdCas, &config, &args.server_pid).await
            }
            System::Postgres => {
                let system = postgres::Postgres::new(&args.addr, &args.pg_user);
                system.create_schema().await?;
                fill_backlog(&args, system.fill_backlog(args.backlog, args.payload_bytes)).await?;
                measure::drive(&system, System::Postgres, &config, &args.server_pid).await
            }
        }
    })?;
    summary.tls = tls;
    summary.backlog = u64::try_from(args.backlog)?;
    summary.invocation = args.invocation.clone();
    summary.server_peak_rss_kib =
        args.server_pid.iter().filter_map(|pid| measure::peak_rss_kib(*pid)).max();
    let line = serde_json::to_string(&summary)?;
    println!("{line}");
    eprintln!("{}", summary.one_line());
    if let Some(path) = &args.results {
        append_line(path, &line)?;
    }
    Ok(())
}

async fn wait(args: WaitArgs) -> anyhow::Result<()> {
    let access = Access::from_args(&args.access)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(args.timeout);
    let mut last_error = String::from("never tried");
    while tokio::time::Instant::now() < deadline {
        let attempt = async {
            match args.system {
                System::Leasehold => {
                    leasehold::Leasehold::new(&args.addr, access.clone()).probe().await
                }
                System::Etcd | System::EtcdCas => etcd::Etcd::new(&args.addr, 1).probe().await,
                System::Postgres => {
                    let server = postgres::Postgres::new(&args.addr, &args.pg_user);
                    server.probe().await?;
                    server.standbys_streaming(args.standbys).await
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => last_error = format!("{error:#}"),
            Err(_) => last_error = "probe timed out after 5 s".to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!(
        "{} at {} not ready after {} s: {last_error}",
        args.system.name(),
        args.addr,
        args.timeout
    )
}
