//! Memory per job: applies 1,000,000 enqueues of 64-byte untagged jobs to a
//! [`State`] the way the state machine does (batches of 1,000 under the
//! leader's recorded limits), reads the resident set size before and after,
//! and (in a process of its own) the same for jobs claimed and acked batch
//! by batch, which leaves only tombstones. Runs with the node's
//! allocator so the figures match a node's.
//!
//! `cargo run --release -p leasehold-core --example memory [all|ready|acked] [JOBS]`

// A measuring program beside the library, not part of it: it reads
// /proc and starts its own phases, which the pure core never does.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use leasehold_core::command::MAX_BATCH_COMMANDS;
use leasehold_core::{Command, JobSpec, Limits, Proposal, Response, State};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 1_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let phase = args.next().unwrap_or_default();
    let jobs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1_000_000);
    match phase.as_str() {
        "ready" => measure(jobs, false),
        "acked" => measure(jobs, true),
        "snapshot" => snapshot(jobs),
        // Each phase in a process of its own: memory an allocator got back
        // is not returned to the system, so a second phase in the same
        // process would be measured against the first one's peak.
        _ => {
            let exe = std::env::current_exe().expect("own executable");
            for phase in ["ready", "acked", "snapshot"] {
                let status = std::process::Command::new(&exe)
                    .args([phase, &jobs.to_string()])
                    .status()
                    .expect("runs");
                assert!(status.success(), "{phase} phase failed");
            }
        }
    }
}

/// Enqueues `jobs` jobs in batches as the state machine applies them;
/// with `ack`, claims and acks each batch before the next, so what remains
/// is `jobs` tombstones and the peak is one batch of ready jobs.
fn measure(jobs: usize, ack: bool) {
    let limits = Limits::default();
    let mut state = State::new();
    let mut now_ms = 1_000u64;
    let mut apply = |state: &mut State, command: Command| {
        now_ms += 1;
        let ruled = Command::Ruled { limits: limits.clone(), command: Box::new(command) };
        state.apply(1, &Proposal { now_ms, command: ruled })
    };
    let idle = rss_bytes();
    let mut enqueued = 0;
    while enqueued < jobs {
        let n = BATCH.min(jobs - enqueued);
        let specs = (0..n)
            .map(|i| JobSpec {
                queue: "bench".into(),
                payload: format!("{:064}", enqueued + i).into_bytes(),
                ..JobSpec::default()
            })
            .collect();
        apply(&mut state, Command::Enqueue { jobs: specs });
        enqueued += n;
        // Each batch is claimed and acked before the next is enqueued.
        let mut claiming = ack;
        while claiming {
            let claim = Command::Claim {
                worker: "worker-1".into(),
                queue: "bench".into(),
                max: MAX_BATCH_COMMANDS as u32,
                lease_ttl_ms: None,
                selector: vec![],
            };
            let Response::Claimed(grants) = apply(&mut state, claim) else {
                panic!("a claim answers with grants");
            };
            if grants.is_empty() {
                claiming = false;
                continue;
            }
            let acks = grants
                .iter()
                .map(|grant| Command::AckLean {
                    job_id: grant.job.id,
                    token: grant.lease.token,
                    result: None,
                })
                .collect();
            apply(&mut state, Command::Batch { commands: acks });
        }
    }
    let after = rss_bytes();
    let what = if ack { "acked tombstones" } else { "ready jobs" };
    println!(
        "{jobs} {what}: +{} MB over idle ({} MB), {:.0} bytes each",
        (after - idle) / 1_000_000,
        idle / 1_000_000,
        (after - idle) as f64 / jobs as f64
    );
    std::hint::black_box(&state);
}

/// Enqueues `jobs` ready jobs, then reads them as a snapshot build does:
/// one freeze, then chunks of 1,024 jobs encoded under one hold each, with
/// a claim of ten jobs applied between chunks. Prints the longest hold.
fn snapshot(jobs: usize) {
    let limits = Limits::default();
    let mut state = State::new();
    let mut now_ms = 1_000u64;
    let mut apply = |state: &mut State, command: Command| {
        now_ms += 1;
        let ruled = Command::Ruled { limits: limits.clone(), command: Box::new(command) };
        state.apply(1, &Proposal { now_ms, command: ruled })
    };
    let mut enqueued = 0;
    while enqueued < jobs {
        let n = BATCH.min(jobs - enqueued);
        let specs = (0..n)
            .map(|i| JobSpec {
                queue: "bench".into(),
                payload: format!("{:064}", enqueued + i).into_bytes(),
                ..JobSpec::default()
            })
            .collect();
        apply(&mut state, Command::Enqueue { jobs: specs });
        enqueued += n;
    }
    // Workers name their claims, and the state remembers each named claim
    // for a while (at most 100,000): fill that log as busy workers do, since
    // a freeze copies it.
    for request in 0..jobs.min(100_000) {
        let claim = Command::ClaimOnce {
            request_id: format!("{request:016x}-{:016x}", request * 7),
            worker: "worker-1".into(),
            queue: "bench".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec![],
        };
        apply(&mut state, claim);
    }
    let started = std::time::Instant::now();
    let (head, tail) = state.freeze();
    let freeze = started.elapsed();
    let mut longest = freeze;
    let mut written = bincode::serialize(&(head.counters, head.job_count)).expect("encodes").len();
    // Reserved once, as a build does: growing it faults fresh pages in
    // under the lock.
    let mut chunk = Vec::with_capacity(1 << 20);
    let mut chunks = 0;
    loop {
        chunk.clear();
        let hold = std::time::Instant::now();
        let done = state
            .read_frozen_jobs(head.ticket, 1_024, |job| {
                bincode::serialize_into(&mut chunk, &job).map(|()| true)
            })
            .expect("the view is there")
            .expect("encodes");
        longest = longest.max(hold.elapsed());
        written += chunk.len();
        chunks += 1;
        if done {
            break;
        }
        let claim = Command::Claim {
            worker: "worker-1".into(),
            queue: "bench".into(),
            max: 10,
            lease_ttl_ms: None,
            selector: vec![],
        };
        apply(&mut state, claim);
    }
    written += bincode::serialize(&tail).expect("encodes").len();
    println!(
        "snapshot of {jobs} jobs: {written} bytes in {chunks} chunks, {:?} in all, longest lock hold {:?} (the freeze {:?})",
        started.elapsed(),
        longest,
        freeze
    );
}

/// Resident set size from `/proc/self/statm` (pages × 4 KiB).
fn rss_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}
