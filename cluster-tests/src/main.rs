//! `leasehold-chaos`: runs chaos plans against real leasehold nodes and
//! checks the recorded histories.
//!
//! ```text
//! leasehold-chaos run --profile quick [--mode safety-liveness] [--seed N] [--regressions] [--plaintext]
//! leasehold-chaos run --replay plan.json
//! leasehold-chaos run --profile quick --seed N --only clock-bump,clock-handover
//! leasehold-chaos check RUN_DIR
//! ```
//!
//! Every run ends with its summary; the last line printed is
//! `N passed, N failed` over the checkers (across every run of the call).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use leasehold_cluster_tests::plan::{Mode, Plan, Profile};
use leasehold_cluster_tests::runner::{self, Options};
use leasehold_cluster_tests::summary::Summary;

/// The workspace root, from this crate's own location at build time.
fn workspace_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

#[derive(Parser)]
#[command(name = "leasehold-chaos", about = "chaos runs against real leasehold nodes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate (or replay) plans, run them, check them.
    Run(RunArgs),
    /// Check a finished run again from its directory.
    Check {
        /// The run directory (holds plan.json, history.jsonl, ...).
        run_dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Profile of a generated plan.
    #[arg(long, value_enum, default_value = "quick")]
    profile: Profile,
    /// Enforcement mode of a generated plan.
    #[arg(long, value_enum, default_value = "safety-liveness")]
    mode: Mode,
    /// Seed of a generated plan (default: from the clock; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Run this plan file instead of generating one.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Also replay every plan in the regressions directory.
    #[arg(long)]
    regressions: bool,
    /// Shorten a soak plan's fault phase to this many minutes.
    #[arg(long)]
    soak_minutes: Option<u64>,
    /// Keep only the rounds of these fault kinds (comma-separated, e.g.
    /// `clock-bump,clock-handover`): a focused run, say against a planted
    /// bug. Checkers that need another kind of round may then be vacuous.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The leasehold binary [default: target/debug/leasehold in the workspace].
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Where run directories go [default: target/chaos in the workspace].
    #[arg(long)]
    runs_dir: Option<PathBuf>,
    /// Where failing plans are kept [default: cluster-tests/regressions].
    #[arg(long)]
    regressions_dir: Option<PathBuf>,
    /// Node N listens on 127.0.0.(ip-base + N).
    #[arg(long, default_value_t = 10)]
    ip_base: u8,
    /// Run the nodes without TLS and tokens (every node gets one shared
    /// cluster secret). By default every run uses mutual TLS and a token
    /// per client role, from certificates `leasehold dev-certs` writes into
    /// the run directory.
    #[arg(long)]
    plaintext: bool,
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHAOS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn plans(args: &RunArgs, regressions_dir: &std::path::Path) -> anyhow::Result<Vec<Plan>> {
    let mut plans = Vec::new();
    match &args.replay {
        Some(path) => plans.push(Plan::read(path)?),
        None => {
            let seed = args.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64 % 1_000_000_007)
                    .unwrap_or(1)
            });
            let mut plan = Plan::generate(seed, args.profile, args.mode);
            if let Some(minutes) = args.soak_minutes {
                plan.limit_fault_phase(minutes);
            }
            plans.push(plan);
        }
    }
    if !args.only.is_empty()
        && let Some(plan) = plans.first_mut()
        && plan.keep_only(&args.only) == 0
    {
        anyhow::bail!("--only {:?}: the plan has no such round", args.only);
    }
    if args.regressions && regressions_dir.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(regressions_dir)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for file in files {
            println!("regression case: {}", file.display());
            plans.push(Plan::read(&file)?);
        }
    }
    Ok(plans)
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let root = workspace_root();
    let regressions_dir =
        args.regressions_dir.clone().unwrap_or_else(|| root.join("cluster-tests/regressions"));
    let options = Options {
        bin: args.bin.clone().unwrap_or_else(|| root.join("target/debug/leasehold")),
        runs_root: args.runs_dir.clone().unwrap_or_else(|| root.join("target/chaos")),
        ip_base: args.ip_base,
        regressions_dir: Some(regressions_dir.clone()),
        transport: if args.plaintext {
            leasehold_cluster_tests::security::Transport::Plaintext
        } else {
            leasehold_cluster_tests::security::Transport::Tls
        },
    };
    let plans = plans(&args, &regressions_dir)?;
    let mut summaries: Vec<Summary> = Vec::new();
    let mut errors = 0;
    let mut incomplete: Vec<String> = Vec::new();
    let mut interrupted = false;
    for plan in &plans {
        if interrupted {
            errors += 1;
            continue;
        }
        println!("seed {} ({} {})", plan.seed, plan.profile.name(), plan.mode.name());
        // The run owns the node processes: dropping it (time limit, Ctrl-C)
        // kills them.
        let limit = std::time::Duration::from_millis(plan.time_limit_ms());
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(limit, runner::run(plan, &options)) => match outcome {
                Ok(result) => result,
                Err(_) => Err(anyhow::anyhow!("run exceeded its time limit of {} s", limit.as_secs())),
            },
            _ = tokio::signal::ctrl_c() => {
                interrupted = true;
                Err(anyhow::anyhow!("interrupted"))
            }
        };
        match outcome {
            Ok(summary) => {
                println!("{}", summary.render());
                summaries.push(summary);
            }
            Err(error) => {
                errors += 1;
                println!("run of seed {} could not complete: {error:#}", plan.seed);
                incomplete
                    .push(format!("failed: seed {} could not complete: {error:#}", plan.seed));
            }
        }
    }
    // One closing line over every run: a checker passes only if it passed
    // in each run; a run that could not complete fails every checker.
    let names: Vec<String> =
        leasehold_cluster_tests::checkers::all().iter().map(|c| c.name().to_string()).collect();
    let passed = names
        .iter()
        .filter(|name| {
            errors == 0
                && summaries.iter().all(|s| s.checkers.iter().any(|c| &c.name == *name && c.passed))
        })
        .count();
    let failed = names.len() - passed;
    // A CI log is often read from its tail: repeat each failure (seed,
    // checker, its first anomalies) right above the closing line.
    for summary in &summaries {
        for checker in summary.checkers.iter().filter(|c| !c.passed) {
            println!(
                "failed: seed {} checker {} ({} safety, {} liveness{}) in {}",
                summary.seed,
                checker.name,
                checker.safety,
                checker.liveness,
                if checker.vacuous.is_empty() {
                    String::new()
                } else {
                    format!(", vacuous: {}", checker.vacuous.join(", "))
                },
                summary.run_dir
            );
            for anomaly in checker.anomalies.iter().take(3) {
                println!("  {:?}: {}", anomaly.severity, anomaly.message);
            }
        }
    }
    for line in &incomplete {
        println!("{line}");
    }
    if plans.len() > 1 {
        println!("over {} runs ({} could not complete):", plans.len(), errors);
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        Command::Check { run_dir } => runner::check_dir(&run_dir).map(|summary| {
            println!("{}", summary.render());
            if summary.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("leasehold-chaos: {error:#}");
            println!("0 passed, {} failed", leasehold_cluster_tests::checkers::all().len());
            ExitCode::FAILURE
        }
    }
}
