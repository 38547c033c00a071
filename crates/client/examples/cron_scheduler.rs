//! Puts a cron schedule and watches it fire: every second it prints the
//! schedule's fired and skipped counts, its next tick and each new record
//! of its history (fired with the job ids and lag, or skipped with the
//! reason). With `--work`, it also claims and acks the jobs the schedule
//! enqueues, so an `overlap = skip` schedule keeps firing.
//!
//! The cluster fires each tick exactly once, whichever node leads, so any
//! number of these may run against one cluster: they only put and watch.
//!
//! ```text
//! LEASEHOLD_ADDR=http://127.0.0.1:7070 cargo run -p leasehold-client \
//!     --example cron_scheduler -- --name heartbeat --cron '@every 2s' \
//!     --queue beats --watch-s 10 --work --delete
//! ```

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Parser;
use leasehold_proto::v1;

#[derive(Parser, Debug)]
#[command(about = "Put a cron schedule and watch it fire")]
struct Args {
    #[command(flatten)]
    connection: common::Connection,
    /// Schedule name.
    #[arg(long)]
    name: String,
    /// 5 or 6 fields (seconds first), a macro (@hourly), or "@every 30s".
    #[arg(long)]
    cron: String,
    /// IANA time zone (default UTC).
    #[arg(long, default_value = "")]
    timezone: String,
    /// Queue of the jobs it enqueues.
    #[arg(long)]
    queue: String,
    /// Payload of those jobs.
    #[arg(long, default_value = "tick")]
    payload: String,
    /// How long to watch, in seconds.
    #[arg(long, default_value_t = 30)]
    watch_s: u64,
    /// Also claim and ack the jobs it enqueues.
    #[arg(long)]
    work: bool,
    /// Delete the schedule when done watching.
    #[arg(long)]
    delete: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = args.connection.client()?;
    let spec = v1::ScheduleSpec {
        name: args.name.clone(),
        cron: args.cron.clone(),
        timezone: args.timezone.clone(),
        template: Some(v1::JobTemplate {
            queue: Some(args.queue.clone()),
            payload: args.payload.clone().into_bytes(),
            ..Default::default()
        }),
        overlap: v1::Overlap::Skip as i32,
        catchup: v1::Catchup::Coalesce as i32,
        ..Default::default()
    };
    client.put_schedule(spec).await?;
    println!("put schedule {} ({})", args.name, args.cron);

    let mut printed = BTreeSet::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(args.watch_s);
    while tokio::time::Instant::now() < until {
        let schedule = client.get_schedule(&args.name, false).await?;
        for record in &schedule.history {
            if printed.insert((record.bucket, record.outcome.clone())) {
                match record.outcome.as_str() {
                    "fired" => println!(
                        "tick {} fired: jobs {:?}, lag {} ms",
                        record.bucket, record.job_ids, record.lag_ms
                    ),
                    _ => println!(
                        "tick {} {}: {} ({} ticks)",
                        record.bucket, record.outcome, record.skip_reason, record.ticks
                    ),
                }
            }
        }
        println!(
            "fired {}, skipped {}, next tick at {:?} ms",
            schedule.fired_count, schedule.skipped_count, schedule.next_tick_ms
        );
        if args.work {
            work_once(&client, &args.queue).await?;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if args.delete {
        client.delete_schedule(&args.name).await?;
        println!("deleted schedule {}", args.name);
    }
    Ok(())
}

/// Claims whatever is ready in `queue` and acks it with its token.
async fn work_once(client: &leasehold_client::Client, queue: &str) -> anyhow::Result<()> {
    let request = v1::ClaimRequest {
        worker: format!("cron-scheduler-{}", std::process::id()),
        queue: queue.to_string(),
        max: 100,
        ..Default::default()
    };
    for lease in client.claim(request).await?.into_iter().filter_map(|g| g.lease) {
        client.ack(lease.job_id, lease.token).await?;
        println!("acked job {} (token {})", lease.job_id, lease.token);
    }
    Ok(())
}
