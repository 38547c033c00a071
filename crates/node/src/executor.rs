//! The built-in executor: every node runs command jobs itself (unless turned
//! off), through the same worker loop `leasehold worker` uses, against its
//! own gRPC address. A job's payload is the shell command; it runs under
//! `sh -c` with the job's environment, a timeout, and its lease renewed
//! while it runs. Its selector carries the node's tags and `node:ID`, so a
//! `target = each` job addressed to this node is claimable only here.

use std::sync::Arc;
use std::time::Duration;

use leasehold_client::Client;
use leasehold_client::exec::{self, CommandLine};
use leasehold_client::worker::{self, Outcome, WorkerConfig};
use leasehold_core::schedule::NODE_TAG_PREFIX;
use leasehold_proto::v1;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::commands::RunCommand;

/// Settings of the built-in executor.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// This node's id (worker id `node-ID`, tag `node:ID`).
    pub node_id: u64,
    /// Queues whose jobs are shell commands run here.
    pub queues: Vec<String>,
    /// Commands run at once, per queue.
    pub concurrency: usize,
    /// A command still running after this long is killed and nacked.
    pub timeout: Duration,
    /// This node's tags.
    pub tags: Vec<String>,
    /// How long running commands may finish after shutdown is asked.
    pub grace: Duration,
    /// What runs a job's command ([`crate::commands::Shell`] on a node).
    pub commands: Arc<dyn RunCommand>,
}

/// The selector the executor claims with: the node's tags plus `node:ID`.
pub fn selector(node_id: u64, tags: &[String]) -> Vec<String> {
    let mut selector = tags.to_vec();
    selector.push(format!("{NODE_TAG_PREFIX}{node_id}"));
    selector
}

/// Runs the executor with `client` (a client of its own node, carrying the
/// node's credentials) until `shutdown` turns true; then running commands
/// get the grace period.
pub async fn run(config: ExecutorConfig, client: Client, shutdown: watch::Receiver<bool>) {
    let mut workers = JoinSet::new();
    for queue in &config.queues {
        let mut worker_config =
            WorkerConfig::new(queue.clone(), format!("node-{}", config.node_id));
        worker_config.concurrency = config.concurrency.max(1);
        worker_config.selector = selector(config.node_id, &config.tags);
        worker_config.grace = config.grace;
        worker_config.poll_wait_ms = 5_000;
        // A refusal here is the node's own configuration (its credentials);
        // the node runs on and keeps asking, slower, rather than silently
        // stop running commands.
        worker_config.stop_on_refusal = false;
        let timeout = config.timeout;
        let node_id = config.node_id;
        let commands = config.commands.clone();
        let handler = move |grant: v1::Grant| {
            let commands = commands.clone();
            async move { run_job(node_id, grant, timeout, commands.as_ref()).await }
        };
        workers.spawn(worker::run(client.clone(), worker_config, handler, shutdown.clone()));
    }
    while let Some(done) = workers.join_next().await {
        match done {
            Ok(report) => tracing::info!(
                acked = report.acked.len(),
                nacked = report.nacked.len(),
                lost = report.lost.len(),
                "executor worker stopped"
            ),
            Err(error) => tracing::warn!(%error, "executor worker failed"),
        }
    }
}

async fn run_job(
    node_id: u64,
    grant: v1::Grant,
    timeout: Duration,
    commands: &dyn RunCommand,
) -> Outcome {
    let (Some(job), Some(lease)) = (grant.job, grant.lease) else {
        return Outcome::Release;
    };
    let script = String::from_utf8_lossy(&job.payload).into_owned();
    let mut env = exec::job_env(&job, &lease);
    // Which node ran it (a `target = each` tick runs once on each).
    env.push(("LEASEHOLD_NODE_ID".to_string(), node_id.to_string()));
    let schedule = env.iter().find(|(k, _)| k == "LEASEHOLD_SCHEDULE").map(|(_, v)| v.clone());
    let bucket = env.iter().find(|(k, _)| k == "LEASEHOLD_BUCKET").map(|(_, v)| v.clone());
    tracing::info!(
        event = "lease.acquire",
        node = node_id,
        job = job.id,
        token = lease.token,
        schedule = schedule.as_deref().unwrap_or(""),
        bucket = bucket.as_deref().unwrap_or(""),
        "executor running command"
    );
    let command = CommandLine {
        argv: vec!["sh".to_string(), "-c".to_string(), script],
        env,
        timeout: Some(timeout),
    };
    let run = commands.run(&command).await;
    // Output is a command's text: logged quoted, with its line breaks and
    // control characters escaped, so it cannot forge log lines.
    tracing::info!(
        node = node_id,
        job = job.id,
        outcome = run.outcome.name(),
        stdout = ?run.stdout.trim_end(),
        stderr = ?run.stderr.trim_end(),
        "executor command finished"
    );
    run.outcome
}
