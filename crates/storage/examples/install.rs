//! What installing a received snapshot costs in memory: a store with JOBS
//! 64-byte jobs builds a snapshot and writes its body to a file; then, in a
//! process of its own, a fresh store receives that body in openraft's
//! 3 MiB chunks through the state machine's snapshot data and installs it.
//! The first reports the build's longest hold of the state lock (with
//! nothing else running, so the figure is the build's own, not a wait for
//! the CPU). The second process reports its peak resident set above where it started
//! (`VmHWM`), its resident set after the install, and the body's size: a
//! receiver that holds the body in memory peaks at the body plus the
//! state; one that streams it, at about the state alone.
//!
//! `cargo run --release -p leasehold-storage --example install [DIR] [JOBS]`
//! (DIR must not exist; default: a temporary directory, 1,000,000 jobs).

// A measuring program beside the library, not part of it: it reads /proc
// and starts its own phases.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::io::{Read, SeekFrom};
use std::path::Path;

use anyhow::Context;
use leasehold_core::{Command, JobSpec, Proposal};
use openraft::storage::RaftStateMachine;
use openraft::{Entry, EntryPayload, LogId, RaftSnapshotBuilder};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// openraft 0.9's default snapshot chunk.
const CHUNK: usize = 3 * 1024 * 1024;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some("--receive") {
        let dir = args.next().context("--receive DIR")?;
        let meta = args.next().context("--receive DIR META")?;
        return receive(Path::new(&dir), &meta).await;
    }
    let jobs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1_000_000);
    let temp = tempfile::tempdir()?;
    let dir = first.map_or_else(|| temp.path().join("install"), Into::into);
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let meta = prepare(&dir, jobs).await?;
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--receive", &dir.to_string_lossy(), &meta])
        .status()?;
    anyhow::ensure!(status.success(), "the receiving process failed");
    Ok(())
}

/// Builds a snapshot of `jobs` jobs in `dir/sender`, writes its body to
/// `dir/body`, and returns its meta (JSON).
async fn prepare(dir: &Path, jobs: usize) -> anyhow::Result<String> {
    let (_log, mut state_machine) = leasehold_storage::open(&dir.join("sender"))?;
    let mut entries = Vec::new();
    let mut index = 0;
    while index * 1_000 < jobs {
        index += 1;
        let specs = (0..1_000.min(jobs - (index - 1) * 1_000))
            .map(|i| JobSpec {
                queue: "bench".into(),
                payload: format!("{:064}", index * 1_000 + i).into_bytes(),
                ..JobSpec::default()
            })
            .collect();
        entries.push(Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index as u64),
            payload: EntryPayload::Normal(Proposal {
                now_ms: 1_000 + index as u64,
                command: Command::Enqueue { jobs: specs },
            }),
        });
    }
    state_machine.apply(entries).await?;
    let built = state_machine.get_snapshot_builder().await.build_snapshot().await?;
    if let Some(build) = state_machine.last_snapshot_build() {
        println!(
            "build of {} jobs ({:.1} MiB): longest state-lock hold {:?} (at most {:?} on CPU)",
            build.jobs,
            build.bytes as f64 / (1024.0 * 1024.0),
            build.longest_lock_hold,
            build.longest_lock_hold_cpu
        );
    }
    let mut current =
        state_machine.get_current_snapshot().await?.context("no snapshot after a build")?;
    let mut body = Vec::new();
    AsyncSeekExt::seek(&mut *current.snapshot, SeekFrom::Start(0)).await?;
    AsyncReadExt::read_to_end(&mut *current.snapshot, &mut body).await?;
    std::fs::write(dir.join("body"), &body)?;
    Ok(serde_json::to_string(&built.meta)?)
}

/// Receives `dir/body` into a fresh store at `dir/receiver` and reports
/// the memory it took.
async fn receive(dir: &Path, meta: &str) -> anyhow::Result<()> {
    let meta = serde_json::from_str(meta)?;
    let (_log, mut state_machine) = leasehold_storage::open(&dir.join("receiver"))?;
    let before = status("VmRSS")?;
    reset_peak()?;
    let mut body = std::fs::File::open(dir.join("body"))?;
    let size = body.metadata()?.len();
    let mut data = state_machine.begin_receiving_snapshot().await?;
    let mut chunk = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let read = body.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        AsyncSeekExt::seek(&mut *data, SeekFrom::Start(offset)).await?;
        AsyncWriteExt::write_all(&mut *data, &chunk[..read]).await?;
        offset += read as u64;
    }
    AsyncWriteExt::shutdown(&mut *data).await?;
    state_machine.install_snapshot(&meta, data).await?;
    let peak = status("VmHWM")?;
    let after = status("VmRSS")?;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "install of a {:.1} MiB snapshot body: peak {:.1} MiB above the start, {:.1} MiB above it after",
        mib(size),
        mib(peak.saturating_sub(before)),
        mib(after.saturating_sub(before)),
    );
    Ok(())
}

/// A `/proc/self/status` figure in bytes.
fn status(field: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    let line = text
        .lines()
        .find(|line| line.starts_with(field))
        .with_context(|| format!("no {field} in /proc/self/status"))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{field}: {line}"))?;
    Ok(kib * 1024)
}

/// Resets `VmHWM` to the current resident set (writing 5 to
/// `/proc/self/clear_refs`).
fn reset_peak() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting the peak resident set")
}
