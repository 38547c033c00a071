//! Enqueues `--count` jobs into `--queue`, payloads `PAYLOAD 0`,
//! `PAYLOAD 1`, …, in atomic batches of up to 1,000, and prints
//! `enqueued job ID` for each.
//!
//! With `--key-prefix`, every job carries an idempotency key
//! (`PREFIX-N`): running the producer again enqueues nothing new, and the
//! client may retry a batch whose answer was lost without duplicating it.
//!
//! ```text
//! LEASEHOLD_ADDR=http://127.0.0.1:7070 cargo run -p leasehold-client \
//!     --example producer -- --queue emails --count 10 --payload hello
//! ```

mod common;

use clap::Parser;
use leasehold_proto::v1;

/// The most jobs one Enqueue carries.
const BATCH: usize = 1_000;

#[derive(Parser, Debug)]
#[command(about = "Enqueue jobs into a leasehold queue")]
struct Args {
    #[command(flatten)]
    connection: common::Connection,
    /// Queue to enqueue into.
    #[arg(long)]
    queue: String,
    /// How many jobs.
    #[arg(long, default_value_t = 1)]
    count: usize,
    /// Payload of each job, followed by a space and the job's number.
    #[arg(long, default_value = "job")]
    payload: String,
    /// Idempotency keys `PREFIX-N`, so a second run adds nothing.
    #[arg(long)]
    key_prefix: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = args.connection.client()?;
    let specs: Vec<v1::JobSpec> = (0..args.count)
        .map(|n| v1::JobSpec {
            queue: args.queue.clone(),
            payload: format!("{} {n}", args.payload).into_bytes(),
            idempotency_key: args.key_prefix.as_ref().map(|prefix| format!("{prefix}-{n}")),
            ..Default::default()
        })
        .collect();
    let mut duplicates = 0;
    for batch in specs.chunks(BATCH) {
        for result in client.enqueue(batch.to_vec()).await? {
            if result.duplicate {
                duplicates += 1;
                println!("already enqueued job {}", result.job_id);
            } else {
                println!("enqueued job {}", result.job_id);
            }
        }
    }
    eprintln!("{} jobs into {} ({duplicates} already there)", args.count, args.queue);
    Ok(())
}
