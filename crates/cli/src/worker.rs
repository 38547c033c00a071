//! `leasehold worker --queue Q -- CMD ARGS…`: runs a command per job with
//! the fencing token in its environment and the payload on stdin, renewing
//! the lease while it runs; exit 0 acks, anything else nacks with the tail
//! of stderr. SIGTERM stops claiming, lets running commands finish within
//! the grace period, then exits 0; a claim refused for good (credentials
//! without the worker role, a flag the node refuses) stops it the same
//! way, exiting 1 with the refusal.

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
    /// Seconds a command may run before it is killed (with its process
    /// group) and its job nacked (default: no limit; the lease is renewed
    /// while it runs).
    #[arg(long)]
    timeout_s: Option<u64>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs the worker until SIGTERM or Ctrl-C.
pub async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let worker_id = args.worker_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    check(&args, &worker_id)?;
    let client = args.connection.client()?;
    let mut config = WorkerConfig::new(args.queue.clone(), worker_id);
    config.concurrency = args.concurrency;
    config.lease_ttl_ms = args.lease_ttl_ms;
    config.selector = args.tags.clone();
    config.grace = Duration::from_secs(args.grace_s);
    // A command still running after the grace is killed; its job goes back
    // to the queue at once rather than after its lease's TTL.
    config.release_abandoned = true;
    let command = args.command.clone();
    let timeout = args.timeout_s.map(Duration::from_secs);
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
        async move { run_command(&command, timeout, grant).await }
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
    if let Some(refused) = report.claims_refused {
        // Refused for good (a token without the worker role, a field the
        // node refuses): asking on would change nothing, so the worker
        // ends non-zero for its supervisor to see, naming why.
        anyhow::bail!("claims refused ({:?}): {}", refused.code, refused.message);
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks the flags as the node would, so a bad one stops the worker at
/// once, named, instead of every claim being refused while it runs on.
fn check(args: &WorkerArgs, worker_id: &str) -> anyhow::Result<()> {
    use leasehold_core::validate;
    let limits = leasehold_core::Limits::default();
    validate::queue_name("--queue", &args.queue)?;
    validate::tags("--tag", &args.tags, &limits)?;
    if let Some(ttl_ms) = args.lease_ttl_ms {
        validate::lease_ttl("--lease-ttl-ms", ttl_ms, &limits)?;
    }
    validate::worker_id("--worker-id", worker_id, &limits)?;
    validate::claim_worker("--worker-id", worker_id)?;
    if args.concurrency == 0 || args.concurrency > limits.max_batch {
        anyhow::bail!("--concurrency: must be 1 ..= {}", limits.max_batch);
    }
    if args.timeout_s == Some(0) {
        anyhow::bail!("--timeout-s: must be at least 1");
    }
    Ok(())
}

/// Runs the command for one job. The child is killed if this future is
/// dropped (the lease was lost).
async fn run_command(argv: &[String], timeout: Option<Duration>, grant: v1::Grant) -> Outcome {
    let (Some(job), Some(lease)) = (grant.job, grant.lease) else {
        return Outcome::Release;
    };
    tracing::info!(event = "lease.acquire", job = job.id, token = lease.token, "running command");
    let command =
        exec::CommandLine { argv: argv.to_vec(), env: exec::job_env(&job, &lease), timeout };
    let run = exec::run(&command, job.payload).await;
    // The command's output is captured (so the executor can keep it); the
    // worker passes it on once the command is done.
    use std::io::IsTerminal;
    pass_on(std::io::stdout().lock(), std::io::stdout().is_terminal(), &run.stdout);
    pass_on(std::io::stderr().lock(), std::io::stderr().is_terminal(), &run.stderr);
    run.outcome
}

/// Passes a command's output on. To a terminal its control characters are
/// shown escaped, as the CLI prints anything producers wrote (a payload the
/// command echoes could otherwise retitle or clear the operator's screen);
/// to a pipe or file it goes as it came. A write that fails (a reader gone
/// away, a full disk) is ignored: it must not turn a command that
/// succeeded into a failure, which would run it again.
fn pass_on(mut out: impl std::io::Write, terminal: bool, text: &str) {
    let text = if terminal {
        crate::render::terminal_safe(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    };
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Worker {
        #[command(flatten)]
        args: WorkerArgs,
    }

    #[test]
    fn bad_flags_are_refused_by_name_before_anything_runs() {
        let refused = |flags: &[&str]| {
            let line = ["worker", "--queue", "emails"].iter().chain(flags).chain(&["--", "true"]);
            let args = Worker::try_parse_from(line).map_err(|e| e.to_string())?.args;
            let id = args.worker_id.clone().unwrap_or_else(|| "host-1".to_string());
            check(&args, &id).map_err(|e| e.to_string())
        };
        assert_eq!(refused(&[]), Ok(()));
        for (flags, named) in [
            (&["--queue", "Emails"][..], "--queue"),
            (&["--tag", ""], "--tag[0]"),
            (&["--lease-ttl-ms", "500"], "--lease-ttl-ms"),
            (&["--concurrency", "0"], "--concurrency"),
            (&["--concurrency", "1001"], "--concurrency"),
            (&["--worker-id", "schedule nightly"], "--worker-id"),
            (&["--timeout-s", "0"], "--timeout-s"),
        ] {
            let error = refused(flags).err().unwrap_or_default();
            assert!(error.contains(named), "{flags:?}: {error}");
        }
    }

    #[test]
    fn output_to_a_reader_gone_away_is_dropped_quietly() {
        struct Gone;
        impl std::io::Write for Gone {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
        }
        pass_on(Gone, false, "the command's output");
        pass_on(Gone, true, "the command's output");
        let mut shown = Vec::new();
        pass_on(&mut shown, true, "a title\u{1b}]0;owned\u{7}\n");
        assert_eq!(String::from_utf8_lossy(&shown), "a title\\u{1b}]0;owned\\u{7}\n");
        let mut piped = Vec::new();
        pass_on(&mut piped, false, "raw\u{1b}[2J\n");
        assert_eq!(piped, b"raw\x1b[2J\n");
    }
}
