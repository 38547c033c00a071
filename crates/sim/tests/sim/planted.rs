//! Goal: the simulation finds each known bug class when it is planted
//! again, within the seed budget a test run can afford. Method: for every
//! [`Bug`], run `Plan::short(seed).with_bug(bug)` for seeds 0, 1, 2, … until
//! one fails (`Run::failures`, or a run that could not finish), and require
//! that to happen within [`SEED_BUDGET`] seeds; print the seeds-to-failure
//! (docs/reliability.md records them). The unplanted sweep (`sweep.rs`)
//! shows the same seeds pass without the bug.

use leasehold_sim::Bug;
use leasehold_sim::cluster::{Plan, run};

/// Seeds each planted bug may take to be found.
const SEED_BUDGET: u64 = 200;

/// The first seed on which a bug made the run fail, and why.
type Finding = Option<(u64, Vec<String>)>;

/// The first seed on which `bug` makes the run fail, and why.
fn first_failing_seed(bug: Bug) -> Finding {
    (0..SEED_BUDGET).find_map(|seed| {
        let plan = Plan::short(seed).with_bug(bug);
        // A checker that checked nothing is a weak run, not a finding.
        let failures: Vec<String> = match run(&plan) {
            Ok(record) => record
                .failures()
                .into_iter()
                .filter(|failure| !failure.ends_with("checked nothing"))
                .collect(),
            Err(error) => vec![error.to_string()],
        };
        (!failures.is_empty()).then_some((seed, failures))
    })
}

#[test]
fn every_planted_bug_is_found_within_the_seed_budget() {
    let found: Vec<(Bug, Finding)> = std::thread::scope(|scope| {
        let handles: Vec<_> = Bug::ALL
            .into_iter()
            .map(|bug| (bug, scope.spawn(move || first_failing_seed(bug))))
            .collect();
        handles.into_iter().map(|(bug, handle)| (bug, handle.join().unwrap_or(None))).collect()
    });
    let mut missed = Vec::new();
    for (bug, outcome) in &found {
        match outcome {
            Some((seed, failures)) => eprintln!(
                "planted {bug}: found on seed {seed} ({} seeds): {}",
                seed + 1,
                failures.first().map_or("", String::as_str)
            ),
            None => missed.push(bug.name()),
        }
    }
    assert!(missed.is_empty(), "not found within {SEED_BUDGET} seeds: {missed:?}");
}

#[test]
fn a_failing_seed_replays_to_the_same_failure() -> anyhow::Result<()> {
    // What `scripts/sim.sh --seed S --bug NAME` relies on: the planted
    // run that fails fails again, with the same history and findings.
    let bug = Bug::AckWithoutTokenCheck;
    let Some((seed, _)) = first_failing_seed(bug) else {
        anyhow::bail!("{bug} is not found within {SEED_BUDGET} seeds");
    };
    let plan = Plan::short(seed).with_bug(bug);
    let first = run(&plan)?;
    let again = run(&plan)?;
    assert!(!first.failures().is_empty(), "seed {seed} failed once and then not");
    assert_eq!(first.digest(), again.digest());
    assert_eq!(first.failures(), again.failures());
    Ok(())
}
