//! Replays the committed corpus through every target: the seeds, the
//! inputs kept from fuzzing runs, and every regression input (a finding,
//! named `regression-*`, kept after its fix). A plain `cargo test` runs
//! it, with no fuzzer installed; it is the step `scripts/check.sh` runs.
//!
//! It also checks that the generated seeds are current: each committed
//! `seed-*` file equals what `leasehold_fuzz::seeds` generates, and every
//! envelope and proto seed still decodes, so a change of encoding shows
//! up here instead of silently leaving the fuzzer with dead seeds.

use std::path::{Path, PathBuf};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let directory = corpus().join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&directory)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", directory.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    paths
}

#[test]
fn every_corpus_input_passes_its_target() {
    for target in leasehold_fuzz::TARGETS {
        let paths = inputs(target.name);
        assert!(!paths.is_empty(), "target {} has no corpus", target.name);
        for path in &paths {
            let data = std::fs::read(path).expect("a corpus input reads");
            // A panic names the input: the check's own message follows.
            eprintln!("{}: {}", target.name, path.display());
            (target.check)(&data);
        }
        println!("{}: {} inputs replayed", target.name, paths.len());
    }
}

#[test]
fn committed_seeds_are_the_generated_ones() {
    for seed in leasehold_fuzz::seeds::all() {
        let path = corpus().join(seed.target).join(&seed.name);
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == seed.bytes,
            "{} is missing or stale: run `cargo run --bin seeds` in fuzz/",
            path.display()
        );
        let decodes = match seed.target {
            "envelope" => leasehold_fuzz::envelope::check_decoded(&seed.bytes),
            "proto" => leasehold_fuzz::proto::check_decoded(&seed.bytes),
            _ => true,
        };
        assert!(decodes, "seed {} no longer decodes", path.display());
    }
}

#[test]
fn every_target_is_listed_once() {
    let mut names: Vec<&str> = leasehold_fuzz::TARGETS.iter().map(|t| t.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), leasehold_fuzz::TARGETS.len());
    for name in names {
        assert!(leasehold_fuzz::target(name).is_some());
    }
}
