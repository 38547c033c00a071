//! A worker that writes to a store with fencing. Each job's payload is
//! `KEY=VALUE`; the handler writes VALUE under KEY into a tiny file store
//! (`--store DIR`, one file per key) and passes the lease's fencing token
//! with the write. The store keeps, per key, the highest token it has seen
//! and refuses a write carrying a lower one: a worker whose lease was lost
//! (paused, partitioned, too slow) and who wakes up to write after the job
//! went to another worker under a larger token is turned away by the store
//! itself, whatever the worker believes.
//!
//! The handler also looks at the guard's cancellation token before it
//! writes, and returns `Release` if the worker is draining — but that check
//! is only an optimisation: between the check and the write the lease can
//! still be lost, which is why the token goes with the write.
//!
//! ```text
//! LEASEHOLD_ADDR=http://127.0.0.1:7070 cargo run -p leasehold-client \
//!     --example fenced_worker -- --queue kv --store /tmp/kv --max-jobs 10
//! ```

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser;
use leasehold_client::worker::{self, LeaseGuard, Outcome, WorkerConfig};
use tokio::sync::{Mutex, watch};

#[derive(Parser, Debug)]
#[command(about = "Work a queue of KEY=VALUE jobs into a fenced file store")]
struct Args {
    #[command(flatten)]
    connection: common::Connection,
    /// Queue to work.
    #[arg(long)]
    queue: String,
    /// Directory of the store (created if missing).
    #[arg(long)]
    store: PathBuf,
    /// Worker id (default: fenced-worker-PID).
    #[arg(long)]
    worker_id: Option<String>,
    /// Jobs run at once.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Lease length in ms (default: each job's own).
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// Stop after this many jobs are written (default: run until Ctrl-C).
    #[arg(long)]
    max_jobs: Option<usize>,
}

/// Why the store refused a write.
#[derive(Debug, thiserror::Error)]
enum StoreError {
    #[error("stale fencing token {token} for key {key}: the store has seen {highest}")]
    Stale { key: String, token: u64, highest: u64 },
    #[error("key {0:?}: only [A-Za-z0-9._-] is allowed")]
    BadKey(String),
    #[error("store file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// A file per key holding `TOKEN\nVALUE`. The check and the write happen
/// under one lock, as a real store would do them in one transaction
/// (`UPDATE ... SET value = $v, token = $t WHERE key = $k AND token <= $t`).
struct FencedStore {
    dir: PathBuf,
    lock: Mutex<()>,
}

impl FencedStore {
    fn open(dir: &Path) -> Result<FencedStore, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| StoreError::Io { path: dir.to_path_buf(), source })?;
        Ok(FencedStore { dir: dir.to_path_buf(), lock: Mutex::new(()) })
    }

    /// Writes `value` under `key` unless the store has seen a larger token
    /// for `key`. The same token may write again (a retried write).
    async fn write(&self, key: &str, token: u64, value: &str) -> Result<(), StoreError> {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return Err(StoreError::BadKey(key.to_string()));
        }
        let _held = self.lock.lock().await;
        let path = self.dir.join(key);
        let io = |source| StoreError::Io { path: path.clone(), source };
        let highest = match tokio::fs::read_to_string(&path).await {
            Ok(text) => text.lines().next().and_then(|t| t.parse::<u64>().ok()).unwrap_or(0),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
            Err(error) => return Err(io(error)),
        };
        if token < highest {
            return Err(StoreError::Stale { key: key.to_string(), token, highest });
        }
        // Write aside and rename, so a reader never sees half a record.
        let staged = self.dir.join(format!(".{key}.tmp"));
        tokio::fs::write(&staged, format!("{token}\n{value}"))
            .await
            .map_err(|source| StoreError::Io { path: staged.clone(), source })?;
        tokio::fs::rename(&staged, &path).await.map_err(io)
    }
}

/// One job: parse `KEY=VALUE`, write it with the lease's token.
async fn handle(store: &FencedStore, guard: &LeaseGuard) -> Outcome {
    let payload = String::from_utf8_lossy(guard.payload()).into_owned();
    let Some((key, value)) = payload.split_once('=') else {
        // Bad input never gets better on a retry: let it go dead quickly.
        return Outcome::Nack {
            error: format!("payload {payload:?}: expected KEY=VALUE"),
            retry_after_ms: Some(0),
        };
    };
    if guard.is_cancelled() {
        // Draining (or already lost): give the job back unwritten.
        return Outcome::Release;
    }
    match store.write(key.trim(), guard.fencing_token(), value.trim()).await {
        Ok(()) => {
            println!("wrote {} under token {}", key.trim(), guard.fencing_token());
            Outcome::Ack { result: Vec::new() }
        }
        Err(error) => Outcome::Nack { error: error.to_string(), retry_after_ms: None },
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let client = args.connection.client()?;
    let store = Arc::new(FencedStore::open(&args.store)?);
    let worker_id =
        args.worker_id.clone().unwrap_or_else(|| format!("fenced-worker-{}", std::process::id()));
    let mut config = WorkerConfig::new(args.queue.clone(), worker_id);
    config.concurrency = args.concurrency.max(1);
    config.lease_ttl_ms = args.lease_ttl_ms;
    config.poll_wait_ms = 2_000;
    config.grace = Duration::from_secs(10);
    config.release_abandoned = true;

    let (stop, stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    let done = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (store, stop, done, max_jobs) =
            (store.clone(), stop.clone(), done.clone(), args.max_jobs);
        move |guard: LeaseGuard| {
            let (store, stop, done) = (store.clone(), stop.clone(), done.clone());
            async move {
                let outcome = handle(&store, &guard).await;
                if matches!(outcome, Outcome::Ack { .. }) {
                    let written = done.fetch_add(1, Ordering::SeqCst) + 1;
                    if max_jobs.is_some_and(|max| written >= max) {
                        stop.send_replace(true);
                    }
                }
                outcome
            }
        }
    };
    let ctrl_c = {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.send_replace(true);
            }
        })
    };
    let report = worker::run(client, config, handler, stopped).await;
    ctrl_c.abort();
    eprintln!(
        "acked {}, nacked {}, lost {}, released unstarted {}",
        report.acked.len(),
        report.nacked.len(),
        report.lost.len(),
        report.unstarted.len()
    );
    Ok(())
}
