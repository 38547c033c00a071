//! `leasehold`: `serve` starts a node; every other subcommand is a client of
//! a node's gRPC API (`--addr` or `LEASEHOLD_ADDR`).

mod cluster;
mod cron;
mod dev_certs;
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
    /// Write a throwaway CA, node and client certificates, and tokens, to
    /// try a secure cluster on one machine.
    DevCerts(dev_certs::DevCertsArgs),
}

/// How a client subcommand reaches a node and proves who it is.
#[derive(clap::Args, Clone, Debug)]
pub struct Connection {
    /// Any node's gRPC address (several, comma-separated, are tried in turn).
    #[arg(long, env = "LEASEHOLD_ADDR", default_value = "http://127.0.0.1:7070", global = true)]
    pub addr: String,
    /// The cluster's CA certificate (PEM); with --tls-cert and --tls-key,
    /// talk TLS (addresses then default to https://).
    #[arg(long, env = "LEASEHOLD_TLS_CA", global = true)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), signed by the cluster's CA.
    #[arg(long, env = "LEASEHOLD_TLS_CERT", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_KEY", global = true)]
    pub tls_key: Option<std::path::PathBuf>,
    /// A bearer token with the role the command needs (prefer the
    /// environment variable: a flag shows in the process list).
    #[arg(long, env = "LEASEHOLD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

impl Connection {
    /// A client for these settings.
    pub fn client(&self) -> anyhow::Result<leasehold_client::Client> {
        let mut builder = leasehold_client::Client::builder(&self.addr);
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => {
                builder = builder.tls(leasehold_client::ClientTls::from_files(ca, cert, key)?);
            }
            (None, None, None) => {}
            _ => anyhow::bail!(
                "--tls-ca, --tls-cert and --tls-key go together (LEASEHOLD_TLS_CA, \
                 LEASEHOLD_TLS_CERT, LEASEHOLD_TLS_KEY): give all three or none"
            ),
        }
        if let Some(token) = &self.token {
            builder = builder.token(token.clone());
        }
        Ok(builder.build()?)
    }
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
            Top::DevCerts(args) => dev_certs::run(args),
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
