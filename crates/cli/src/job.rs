//! `leasehold job …`: the Queue API from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use leasehold_proto::v1;
use serde_json::json;

use crate::render::say;
use crate::{Connection, Output, render};

/// `leasehold job` arguments.
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: JobCommand,
}

#[derive(clap::Subcommand, Debug)]
enum JobCommand {
    /// Enqueue one job (prints its id), or every job of a JSON-lines file
    /// (`--file`, in batches, with a progress bar and a summary).
    #[command(after_help = "Examples:
  leasehold job enqueue --queue emails --payload '{\"to\":\"ana@example.com\"}'
  leasehold job enqueue --queue reports --payload-file report.json --priority 5 --tag gpu
  leasehold job enqueue --queue emails --payload hi --key welcome-ana --delay-ms 60000
  leasehold job enqueue --file jobs.jsonl --queue emails
  # jobs.jsonl, one job per line:
  #   {\"queue\":\"emails\",\"payload\":\"hi\",\"priority\":2,\"idempotency_key\":\"a-1\"}
  #   {\"payload\":{\"to\":\"bo@example.com\"},\"tags\":[\"eu\"],\"delay_ms\":5000}")]
    Enqueue {
        /// Queue name (with --file: the queue of lines that name none).
        #[arg(long, required_unless_present = "file")]
        queue: Option<String>,
        /// Enqueue every job of this file: one JSON object per line, with
        /// the fields queue, payload, priority, delay_ms, not_before_ms,
        /// max_attempts, lease_ttl_ms, idempotency_key (or key), tags and
        /// backoff ({"base_ms","cap_ms"}); `-` for stdin. Every line is
        /// checked first: one bad line and nothing is sent.
        #[arg(long, conflicts_with_all = [
            "payload", "payload_file", "key", "tags", "delay_ms", "priority", "max_attempts",
            "lease_ttl_ms",
        ])]
        file: Option<PathBuf>,
        /// With --file: most jobs per Enqueue call (each call is atomic).
        #[arg(long, default_value_t = crate::bulk::DEFAULT_BATCH_JOBS, requires = "file")]
        batch_size: usize,
        /// Payload text.
        #[arg(long, conflicts_with = "payload_file")]
        payload: Option<String>,
        /// Read the payload from this file (`-` for stdin).
        #[arg(long)]
        payload_file: Option<PathBuf>,
        /// Higher is claimed first.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Not claimable for this many milliseconds.
        #[arg(long)]
        delay_ms: Option<u64>,
        /// Attempts before the job is dead.
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Default lease length of the job.
        #[arg(long)]
        lease_ttl_ms: Option<u64>,
        /// Idempotency key: a second enqueue with it returns the first id.
        #[arg(long)]
        key: Option<String>,
        /// Tags a worker's selector must include (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Claim jobs (prints their leases and tokens).
    #[command(after_help = "Examples:
  leasehold job claim --queue emails
  leasehold job claim --queue emails --max 10 --wait-ms 5000 --worker mailer-1 --output json")]
    Claim {
        /// Queue name.
        #[arg(long)]
        queue: String,
        /// Worker id recorded as holder.
        #[arg(long, default_value = "cli")]
        worker: String,
        /// Most jobs to claim.
        #[arg(long, default_value_t = 1)]
        max: u32,
        /// Lease length.
        #[arg(long)]
        lease_ttl_ms: Option<u64>,
        /// Wait up to this long for a job (<= 30000).
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
        /// This worker's tags (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Extend a lease.
    #[command(after_help = "Examples:
  leasehold job refresh --job 42 --fencing-token 1007 --lease-ttl-ms 60000")]
    Refresh {
        /// Job id.
        #[arg(long)]
        job: u64,
        /// Fencing token of the lease (from the claim).
        #[arg(long = "fencing-token")]
        fencing_token: u64,
        /// Worker id.
        #[arg(long, default_value = "cli")]
        worker: String,
        /// New lease length.
        #[arg(long)]
        lease_ttl_ms: Option<u64>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Finish a job.
    #[command(after_help = "Examples:
  leasehold job ack --job 42 --fencing-token 1007")]
    Ack {
        /// Job id.
        #[arg(long)]
        job: u64,
        /// Fencing token of the lease (from the claim).
        #[arg(long = "fencing-token")]
        fencing_token: u64,
    },
    /// Fail an attempt.
    #[command(after_help = "Examples:
  leasehold job nack --job 42 --fencing-token 1007 --error 'smtp timeout'
  leasehold job nack --job 42 --fencing-token 1007 --retry-after-ms 30000")]
    Nack {
        /// Job id.
        #[arg(long)]
        job: u64,
        /// Fencing token of the lease (from the claim).
        #[arg(long = "fencing-token")]
        fencing_token: u64,
        /// What went wrong.
        #[arg(long, default_value = "")]
        error: String,
        /// Retry after this long instead of the backoff.
        #[arg(long)]
        retry_after_ms: Option<u64>,
    },
    /// Give a job back without charging an attempt.
    #[command(after_help = "Examples:
  leasehold job release --job 42 --fencing-token 1007")]
    Release {
        /// Job id.
        #[arg(long)]
        job: u64,
        /// Fencing token of the lease (from the claim).
        #[arg(long = "fencing-token")]
        fencing_token: u64,
    },
    /// Show one job.
    #[command(after_help = "Examples:
  leasehold job get 42
  leasehold job get 42 --output json
  leasehold job get 42 --stale --addr http://10.0.0.12:7070")]
    Get {
        /// Job id.
        id: u64,
        /// Read this node's state without a linearizability check.
        #[arg(long)]
        stale: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// List jobs in id order.
    #[command(after_help = "Examples:
  leasehold job list --queue emails
  leasehold job list --queue emails --state dead --limit 20
  leasehold job list --output json --page-token 1200")]
    List {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only this state: ready, claimed, acked, dead.
        #[arg(long)]
        state: Option<StateArg>,
        /// Page size (<= 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue after a previous page.
        #[arg(long, default_value = "")]
        page_token: String,
        /// Read this node's state without a linearizability check.
        #[arg(long)]
        stale: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Counts per queue.
    #[command(after_help = "Examples:
  leasehold job stats
  leasehold job stats --queue emails --output json")]
    Stats {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Read this node's state without a linearizability check.
        #[arg(long)]
        stale: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Dead jobs back to ready.
    #[command(after_help = "Examples:
  leasehold job redrive --queue emails
  leasehold job redrive --job 41 --job 42")]
    Redrive {
        /// Every dead job of this queue.
        #[arg(long, conflicts_with = "jobs")]
        queue: Option<String>,
        /// These jobs (repeatable).
        #[arg(long = "job")]
        jobs: Vec<u64>,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum StateArg {
    Ready,
    Claimed,
    Acked,
    Dead,
}

impl StateArg {
    fn to_wire(self) -> v1::JobState {
        match self {
            StateArg::Ready => v1::JobState::Ready,
            StateArg::Claimed => v1::JobState::Claimed,
            StateArg::Acked => v1::JobState::Acked,
            StateArg::Dead => v1::JobState::Dead,
        }
    }
}

fn read_payload(payload: Option<String>, file: Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    match (payload, file) {
        (Some(text), _) => Ok(text.into_bytes()),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .context("reading stdin")?;
            Ok(bytes)
        }
        (None, Some(path)) => {
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        }
        (None, None) => Ok(Vec::new()),
    }
}

impl JobArgs {
    /// How this subcommand reaches a node.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Whether the subcommand writes (anything but a read).
    pub fn writes(&self) -> bool {
        !matches!(
            self.command,
            JobCommand::Get { .. } | JobCommand::List { .. } | JobCommand::Stats { .. }
        )
    }
}

/// Runs a job subcommand.
pub async fn run(args: JobArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        JobCommand::Enqueue { queue, file: Some(file), batch_size, output, .. } => {
            return crate::bulk::enqueue_file(&client, &file, queue.as_deref(), batch_size, output)
                .await;
        }
        JobCommand::Enqueue {
            queue,
            file: None,
            batch_size: _,
            payload,
            payload_file,
            priority,
            delay_ms,
            max_attempts,
            lease_ttl_ms,
            key,
            tags,
            output,
        } => {
            // clap requires --queue when --file is absent.
            let queue = queue.context("--queue is required")?;
            let spec = v1::JobSpec {
                queue,
                payload: read_payload(payload, payload_file)?,
                priority,
                delay_ms,
                max_attempts,
                lease_ttl_ms,
                idempotency_key: key,
                tags,
                ..Default::default()
            };
            let results = client.enqueue(vec![spec]).await?;
            for result in &results {
                match output {
                    Output::Json => render::print_json(
                        &json!({"job_id": result.job_id, "duplicate": result.duplicate}),
                    ),
                    Output::Text if result.duplicate => say!("{} (duplicate)", result.job_id),
                    Output::Text => say!("{}", result.job_id),
                }
            }
        }
        JobCommand::Claim { queue, worker, max, lease_ttl_ms, wait_ms, tags, output } => {
            let grants = client
                .claim(v1::ClaimRequest {
                    worker,
                    queue,
                    max,
                    lease_ttl_ms,
                    selector: tags,
                    wait_ms,
                    ..Default::default()
                })
                .await?;
            match output {
                Output::Json => {
                    render::print_json(&json!(grants.iter().map(render::grant).collect::<Vec<_>>()))
                }
                Output::Text => {
                    if grants.is_empty() {
                        say!("no job ready");
                    }
                    for grant in &grants {
                        if let Some(lease) = &grant.lease {
                            say!(
                                "job {} token {} expires_at_ms {}",
                                lease.job_id,
                                lease.token,
                                lease.expires_at_ms
                            );
                        }
                    }
                }
            }
        }
        JobCommand::Refresh { job, fencing_token: token, worker, lease_ttl_ms, output } => {
            let reply = client
                .refresh(v1::RefreshRequest {
                    worker,
                    leases: vec![v1::LeaseRef { job_id: job, token }],
                    lease_ttl_ms,
                })
                .await?;
            let renewed = reply.renewed.iter().find(|l| l.job_id == job);
            match output {
                Output::Json => render::print_json(&json!({
                    "renewed": reply.renewed.iter().map(render::lease).collect::<Vec<_>>(),
                    "lost": reply.lost,
                })),
                Output::Text => match renewed {
                    Some(lease) => {
                        say!("job {job} token {token} renewed until {}", lease.expires_at_ms)
                    }
                    None => say!("job {job}: lease lost"),
                },
            }
            if renewed.is_none() {
                return Ok(ExitCode::from(3));
            }
        }
        JobCommand::Ack { job, fencing_token: token } => {
            client.ack(job, token).await?;
            say!("job {job} acked");
        }
        JobCommand::Nack { job, fencing_token: token, error, retry_after_ms } => {
            let reply =
                client.nack(v1::NackRequest { job_id: job, token, error, retry_after_ms }).await?;
            say!(
                "job {job} {} (not before {})",
                render::state_name(reply.state),
                reply.not_before_ms
            );
        }
        JobCommand::Release { job, fencing_token: token } => {
            client.release(job, token).await?;
            say!("job {job} released");
        }
        JobCommand::Get { id, stale, output } => {
            let job = client.get_job(id, stale).await?;
            match output {
                Output::Json => render::print_json(&render::job(&job)),
                Output::Text => render::print_text(&render::job_text(&job)),
            }
        }
        JobCommand::List { queue, state, limit, page_token, stale, output } => {
            let reply = client
                .list_jobs(v1::ListJobsRequest {
                    queue,
                    state: state.map(|s| s.to_wire() as i32).unwrap_or(0),
                    page_size: limit,
                    page_token,
                    stale,
                })
                .await?;
            match output {
                Output::Json => render::print_json(&json!({
                    "jobs": reply.jobs.iter().map(render::job).collect::<Vec<_>>(),
                    "next_page_token": reply.next_page_token,
                })),
                Output::Text => {
                    render::print_text(&render::jobs_text(&reply.jobs, &reply.next_page_token))
                }
            }
        }
        JobCommand::Stats { queue, stale, output } => {
            let stats = client.stats(queue, stale).await?;
            match output {
                Output::Json => render::print_json(&render::stats(&stats)),
                Output::Text => render::print_text(&render::stats_text(&stats)),
            }
        }
        JobCommand::Redrive { queue: Some(queue), .. } => {
            // One Redrive call moves the whole queue in one log entry; the
            // dead count read first is the total the answer is measured by.
            let stats = client.stats(Some(queue.clone()), false).await?;
            let dead = stats.queues.iter().find(|q| q.queue == queue).map_or(0, |q| q.dead);
            render::write_stderr(&format!("redriving the {dead} dead jobs of {queue}…\n"));
            let count = client
                .redrive(v1::RedriveRequest { queue: Some(queue.clone()), job_ids: Vec::new() })
                .await?;
            say!("{count} redriven ({count}/{dead} dead jobs of {queue})");
        }
        JobCommand::Redrive { queue: None, jobs } => {
            if jobs.is_empty() {
                anyhow::bail!("nothing to redrive: give --queue or --job");
            }
            // The node takes at most a batch of ids per call: larger lists
            // go in batches, with a count after each.
            let total = jobs.len();
            let (mut asked, mut count) = (0, 0);
            for chunk in jobs.chunks(crate::bulk::DEFAULT_BATCH_JOBS) {
                count += client
                    .redrive(v1::RedriveRequest { queue: None, job_ids: chunk.to_vec() })
                    .await?;
                asked += chunk.len();
                render::write_stderr(&format!(
                    "redrive: {asked}/{total} jobs asked, {count} redriven so far\n"
                ));
            }
            say!("{count} redriven ({count}/{total} listed jobs were dead)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
