//! `leasehold worker --queue Q -- CMD ARGS…`: runs a command per job with
//! the fencing token in its environment and the payload on stdin, renewing
//! the lease while it runs; exit 0 acks, anything else nacks with the tail
//! of stderr. SIGTERM stops claiming, lets running commands finish within
//! the grace period, then exits.

use std::process::ExitCode;
use std::time::Duration;

use leasehold_client::exec;
use leasehold_client::worker::{self, Outcome, WorkerConfig};
use leasehold_proto::v1;
use tokio::sync::watch;

use crate::Connection;

/// `leasehold worker` arguments.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    connection: Connection,
    /// Queue to work.
    #[arg(long)]
    queue: String,
    /// Jobs run at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Worker id (default: host name and process id).
    #[arg(long)]
    worker_id: Option<String>,
    /// Lease length (default: each job's own).
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// This worker's tags (repeatable).
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Seconds running commands may continue after SIGTERM or Ctrl-C; then
    /// they are killed and their jobs released. A second signal stops at
    /// once: the commands are killed, their jobs wait out their leases.
    #[arg(long, default_value_t = 30)]
    grace_s: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs the worker until SIGTERM or Ctrl-C.
pub async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let client = args.connection.client()?;
    let worker_id = args.worker_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let mut config = WorkerConfig::new(args.queue.clone(), worker_id);
    config.concurrency = args.concurrency.max(1);
    config.lease_ttl_ms = args.lease_ttl_ms;
    config.selector = args.tags.clone();
    config.grace = Duration::from_secs(args.grace_s);
    // A command still running after the grace is killed; its job goes back
    // to the queue at once rather than after its lease's TTL.
    config.release_abandoned = true;
    let command = args.command.clone();
    let (stop, stopped) = watch::channel(false);
    let (abort, aborted) = tokio::sync::oneshot::channel::<()>();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping: no new claims; running jobs finish within the grace period");
        let _ = stop.send(true);
        // A second signal stops at once. Not by exiting the process here:
        // that would skip every drop, and the commands, each in a process
        // group of its own, would run on with their leases lapsing, for
        // another worker to start the same jobs. Returning from `run`
        // drops the worker, whose running commands are killed as they go.
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        let _ = abort.send(());
    });
    let handler = move |grant: v1::Grant| {
        let command = command.clone();
        async move { run_command(&command, grant).await }
    };
    let report = tokio::select! {
        report = worker::run(client, config, handler, stopped) => report,
        Ok(()) = aborted => {
            tracing::warn!("stopped at once by a second signal: running commands are killed");
            return Ok(ExitCode::FAILURE);
        }
    };
    tracing::info!(
        acked = report.acked.len(),
        nacked = report.nacked.len(),
        released = report.released.len(),
        lost = report.lost.len(),
        "worker stopped"
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs the command for one job. The child is killed if this future is
/// dropped (the lease was lost).
async fn run_command(argv: &[String], grant: v1::Grant) -> Outcome {
    let (Some(job), Some(lease)) = (grant.job, grant.lease) else {
        return Outcome::Release;
    };
    tracing::info!(event = "lease.acquire", job = job.id, token = lease.token, "running command");
    let command =
        exec::CommandLine { argv: argv.to_vec(), env: exec::job_env(&job, &lease), timeout: None };
    let run = exec::run(&command, job.payload).await;
    // The command's output is captured (so the executor can keep it); the
    // worker passes it on once the command is done.
    print!("{}", run.stdout);
    eprint!("{}", run.stderr);
    run.outcome
}
