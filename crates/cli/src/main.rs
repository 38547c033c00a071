//! `leasehold`: `serve` starts a node; every other subcommand is a client of
//! a node's gRPC API (`--addr` or `LEASEHOLD_ADDR`).

mod cluster;
mod cron;
mod job;
mod render;
mod serve;
mod worker;

use clap::{Parser, Subcommand, ValueEnum};

/// mimalloc instead of the system allocator: a node allocates and frees a
/// few small buffers per RPC on every runtime thread, and glibc's malloc
/// and free were about 7% of the CPU samples of a loaded three-node cluster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Output format of read commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON document.
    Json,
}

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "A fenced, Raft-replicated job scheduler for fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Start a node (with no flags: a single-node cluster on 127.0.0.1:7070).
    Serve(serve::ServeArgs),
    /// Enqueue, claim, finish and inspect jobs.
    Job(job::JobArgs),
    /// Manage cron schedules.
    Cron(cron::CronArgs),
    /// Inspect the cluster.
    Cluster(cluster::ClusterArgs),
    /// Run a command for each job of a queue, with its lease renewed while it runs.
    Worker(worker::WorkerArgs),
}

/// How a client subcommand reaches a node.
#[derive(clap::Args, Clone, Debug)]
pub struct Connection {
    /// Any node's gRPC address.
    #[arg(long, env = "LEASEHOLD_ADDR", default_value = "http://127.0.0.1:7070", global = true)]
    pub addr: String,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Top::Serve(args) => serve::run(args).await,
            Top::Job(args) => job::run(args).await,
            Top::Cluster(args) => cluster::run(args).await,
            Top::Cron(args) => cron::run(args).await,
            Top::Worker(args) => worker::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
