//! Goal: many short seeds, each a different interleaving of the same
//! faults, none with a safety anomaly; a failing seed can be replayed alone.
//! Method: run `Plan::short(seed)` for each seed on up to two threads;
//! judge each with `Run::failures`; for a failing seed keep its plan,
//! history and failures under the test's temporary directory and print the
//! command that replays it.
//!
//! `LEASEHOLD_SIM_SEEDS` sets how many seeds (default 1,000), starting at
//! `LEASEHOLD_SIM_FIRST_SEED` (default 0); `LEASEHOLD_SIM_SEED` runs that
//! one seed only; `LEASEHOLD_SIM_BUG` plants a known bug class in every
//! seed (`leasehold_sim::Bug`), to watch the sweep find it. `scripts/sim.sh`
//! sets them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use leasehold_sim::Bug;
use leasehold_sim::cluster::{Plan, Run, run};

/// Seeds the test command runs: about a minute on two cores with the
/// simulation's hot crates optimised (the workspace's dev profile).
const DEFAULT_SEEDS: u64 = 1_000;

fn env_u64(name: &str) -> anyhow::Result<Option<u64>> {
    match std::env::var(name) {
        Ok(text) => Ok(Some(text.parse().map_err(|e| anyhow::anyhow!("{name}={text}: {e}"))?)),
        Err(_) => Ok(None),
    }
}

/// Keeps what a failing seed needs for a post-mortem; returns its directory.
fn keep(
    dir: &Path,
    plan: &Plan,
    record: Option<&Run>,
    failures: &[String],
) -> std::io::Result<PathBuf> {
    let dir = dir.join(format!("seed-{}", plan.seed));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("plan.txt"), format!("{plan:#?}\n"))?;
    std::fs::write(dir.join("failures.txt"), failures.join("\n") + "\n")?;
    if let Some(record) = record {
        std::fs::write(dir.join("history.txt"), record.history.join("\n") + "\n")?;
        let ops: Vec<String> =
            record.ops.iter().map(|op| serde_json::to_string(op).unwrap_or_default()).collect();
        std::fs::write(dir.join("history.jsonl"), ops.join("\n") + "\n")?;
    }
    Ok(dir)
}

#[test]
fn a_sweep_of_short_seeds_finds_no_safety_anomaly() -> anyhow::Result<()> {
    let seeds: Vec<u64> = match env_u64("LEASEHOLD_SIM_SEED")? {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("LEASEHOLD_SIM_FIRST_SEED")?.unwrap_or(0);
            let count = env_u64("LEASEHOLD_SIM_SEEDS")?.unwrap_or(DEFAULT_SEEDS);
            (first..first + count).collect()
        }
    };
    let bug: Option<Bug> = match std::env::var("LEASEHOLD_SIM_BUG") {
        Ok(name) if !name.is_empty() => Some(name.parse()?),
        _ => None,
    };
    let replay_flag = bug.map_or_else(String::new, |bug| format!(" --bug {bug}"));
    let keep_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sim-failures");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(2);
    let next = AtomicU64::new(0);
    let failed: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let at = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(seed) = seeds.get(at).copied() else { break };
                    let mut plan = Plan::short(seed);
                    if let Some(bug) = bug {
                        plan = plan.with_bug(bug);
                    }
                    let (record, failures) = match run(&plan) {
                        Ok(record) => {
                            let failures = record.failures();
                            (Some(record), failures)
                        }
                        Err(error) => (None, vec![error.to_string()]),
                    };
                    if failures.is_empty() {
                        continue;
                    }
                    let kept = keep(&keep_dir, &plan, record.as_ref(), &failures)
                        .map_or_else(|e| format!("(not kept: {e})"), |d| d.display().to_string());
                    let report = format!(
                        "seed {seed} failed: {}\n  kept in {kept}\n  replay: scripts/sim.sh --seed {seed}{replay_flag}",
                        failures.join("; ")
                    );
                    eprintln!("{report}");
                    failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(report);
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    eprintln!("{} seeds, {} failed", seeds.len(), failed.len());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}
