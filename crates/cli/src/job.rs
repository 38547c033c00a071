//! `leasehold job …`: the Queue API from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use leasehold_proto::v1;
use serde_json::json;

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
    /// Enqueue one job; prints its id.
    Enqueue {
        /// Queue name.
        #[arg(long)]
        queue: String,
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
    Ack {
        /// Job id.
        #[arg(long)]
        job: u64,
        /// Fencing token of the lease (from the claim).
        #[arg(long = "fencing-token")]
        fencing_token: u64,
    },
    /// Fail an attempt.
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
    Release {
        /// Job id.
        #[arg(long)]
        job: u64,
        /// Fencing token of the lease (from the claim).
        #[arg(long = "fencing-token")]
        fencing_token: u64,
    },
    /// Show one job.
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

/// Runs a job subcommand.
pub async fn run(args: JobArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        JobCommand::Enqueue {
            queue,
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
                    Output::Text if result.duplicate => println!("{} (duplicate)", result.job_id),
                    Output::Text => println!("{}", result.job_id),
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
                        println!("no job ready");
                    }
                    for grant in &grants {
                        if let Some(lease) = &grant.lease {
                            println!(
                                "job {} token {} expires_at_ms {}",
                                lease.job_id, lease.token, lease.expires_at_ms
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
                        println!("job {job} token {token} renewed until {}", lease.expires_at_ms)
                    }
                    None => println!("job {job}: lease lost"),
                },
            }
            if renewed.is_none() {
                return Ok(ExitCode::from(3));
            }
        }
        JobCommand::Ack { job, fencing_token: token } => {
            client.ack(job, token).await?;
            println!("job {job} acked");
        }
        JobCommand::Nack { job, fencing_token: token, error, retry_after_ms } => {
            let reply =
                client.nack(v1::NackRequest { job_id: job, token, error, retry_after_ms }).await?;
            println!(
                "job {job} {} (not before {})",
                render::state_name(reply.state),
                reply.not_before_ms
            );
        }
        JobCommand::Release { job, fencing_token: token } => {
            client.release(job, token).await?;
            println!("job {job} released");
        }
        JobCommand::Get { id, stale, output } => {
            let job = client.get_job(id, stale).await?;
            match output {
                Output::Json => render::print_json(&render::job(&job)),
                Output::Text => {
                    println!("{}", render::job_line(&job));
                    if !job.result.is_empty() {
                        println!("result:\n{}", String::from_utf8_lossy(&job.result).trim_end());
                    }
                }
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
                    for job in &reply.jobs {
                        println!("{}", render::job_line(job));
                    }
                    if !reply.next_page_token.is_empty() {
                        println!("more: --page-token {}", reply.next_page_token);
                    }
                }
            }
        }
        JobCommand::Stats { queue, stale, output } => {
            let stats = client.stats(queue, stale).await?;
            match output {
                Output::Json => render::print_json(&render::stats(&stats)),
                Output::Text => {
                    for q in &stats.queues {
                        println!(
                            "{}: ready={} delayed={} claimed={} acked={} dead={}",
                            q.queue, q.ready, q.delayed, q.claimed, q.acked, q.dead
                        );
                    }
                    if stats.queues.is_empty() {
                        println!("no jobs");
                    }
                }
            }
        }
        JobCommand::Redrive { queue, jobs } => {
            let count = client.redrive(v1::RedriveRequest { queue, job_ids: jobs }).await?;
            println!("{count} redriven");
        }
    }
    Ok(ExitCode::SUCCESS)
}
