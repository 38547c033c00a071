//! Repeated runs of one row (system, size, TLS, backlog, client count):
//! which run the tables and figures show for it, and the spread of all.
//!
//! An invocation with `--repeat N` runs every row N times, interleaved with
//! the other systems, and writes one result line per run. A row shows its
//! median run by cycles/s, whole (its latencies and CPU are that run's, so a
//! row never mixes runs). When result lines of several invocations are
//! merged (`--merge`), a row keeps only the runs of its latest invocation,
//! as a re-run part replaces its rows; a line without an invocation stands
//! alone.

use std::collections::BTreeMap;

use crate::measure::RunSummary;

/// A row: (nodes, clients, system, TLS, backlog).
pub type Key = (usize, usize, u8, bool, u64);

/// The row a run belongs to.
pub fn key(run: &RunSummary) -> Key {
    (run.nodes, run.clients, run.system as u8, run.tls, run.backlog)
}

/// Each row's runs of its latest invocation, in the order they were written.
pub fn latest(runs: &[RunSummary]) -> BTreeMap<Key, Vec<&RunSummary>> {
    let mut rows: BTreeMap<Key, Vec<&RunSummary>> = BTreeMap::new();
    for run in runs {
        let row = rows.entry(key(run)).or_default();
        let same = row
            .last()
            .is_some_and(|last| !run.invocation.is_empty() && last.invocation == run.invocation);
        if !same {
            row.clear();
        }
        row.push(run);
    }
    rows
}

/// The run a row shows: the median by cycles/s (of an even number, the
/// slower of the two middle ones).
pub fn median<'a>(row: &[&'a RunSummary]) -> Option<&'a RunSummary> {
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| a.cycles_per_s.total_cmp(&b.cycles_per_s));
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// Every row's median run, in row order.
pub fn medians(runs: &[RunSummary]) -> Vec<RunSummary> {
    latest(runs).values().filter_map(|row| median(row)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::System;
    use crate::measure::Latency;

    fn run(invocation: &str, clients: usize, cycles_per_s: f64, p99_us: u64) -> RunSummary {
        let cycle = Latency { p99_us, ..Latency::default() };
        let sample =
            RunSummary::sample(System::Leasehold, 3, clients, cycles_per_s, Latency::default());
        RunSummary { cycle, invocation: invocation.to_string(), ..sample }
    }

    #[test]
    fn a_row_shows_its_median_run_whole() {
        let runs = [
            run("a", 32, 4_000.0, 9_000),
            run("a", 32, 5_000.0, 12_000),
            run("a", 32, 3_000.0, 8_000),
        ];
        let shown = medians(&runs);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].cycles_per_s, 4_000.0);
        assert_eq!(shown[0].cycle.p99_us, 9_000, "the p99 is the median run's own");
    }

    #[test]
    fn of_an_even_number_the_slower_middle_run_is_shown() {
        let runs = [
            run("a", 32, 5_000.0, 1),
            run("a", 32, 3_000.0, 2),
            run("a", 32, 4_000.0, 3),
            run("a", 32, 6_000.0, 4),
        ];
        assert_eq!(medians(&runs)[0].cycles_per_s, 4_000.0);
    }

    #[test]
    fn a_later_invocation_replaces_a_rows_runs_and_leaves_other_rows() {
        let runs = [
            run("a", 32, 1_000.0, 1),
            run("a", 32, 2_000.0, 1),
            run("a", 1, 300.0, 1),
            run("b", 32, 9_000.0, 1),
        ];
        let rows = latest(&runs);
        let row32: Vec<f64> = rows[&key(&runs[0])].iter().map(|r| r.cycles_per_s).collect();
        assert_eq!(row32, vec![9_000.0]);
        let row1: Vec<f64> = rows[&key(&runs[2])].iter().map(|r| r.cycles_per_s).collect();
        assert_eq!(row1, vec![300.0]);
    }

    #[test]
    fn lines_without_an_invocation_stand_alone() {
        let runs = [run("", 32, 1_000.0, 1), run("", 32, 2_000.0, 1)];
        let shown = medians(&runs);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].cycles_per_s, 2_000.0, "the later line wins, as before repeats");
    }
}
