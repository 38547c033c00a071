//! Markdown tables from run summaries: absolute numbers per system and
//! client count, then leasehold's ratios against each peer measured in the
//! same invocation, then leasehold's peak memory and the throughput goal.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::System;
use crate::measure::RunSummary;

const PEERS: [System; 2] = [System::Etcd, System::Postgres];

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// `leasehold / peer`, or a dash when either side is missing or zero.
fn ratio(ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if theirs > 0.0 && ours > 0.0 => {
            format!("{:.2}×", ours / theirs)
        }
        _ => "–".to_string(),
    }
}

/// Renders the tables for `runs` (later lines win for the same system and
/// client count).
pub fn render(runs: &[RunSummary], target_cycles_per_s: f64, target_clients: usize) -> String {
    let mut by_key: BTreeMap<(usize, u8), &RunSummary> = BTreeMap::new();
    for run in runs {
        by_key.insert((run.clients, run.system as u8), run);
    }
    let get = |clients: usize, system: System| by_key.get(&(clients, system as u8)).copied();
    let mut client_counts: Vec<usize> = runs.iter().map(|r| r.clients).collect();
    client_counts.sort_unstable();
    client_counts.dedup();

    let mut out = String::new();
    let window = runs.first().map(|r| (r.duration_s, r.warmup_s, r.payload_bytes));
    if let Some((duration, warmup, payload)) = window {
        let _ = writeln!(
            out,
            "Each run: {warmup:.0} s warm-up, then {duration:.0} s measured; {payload}-byte payloads; \
             one connection per client. Latencies in milliseconds.\n"
        );
    }
    out.push_str(
        "| clients | system | cycles/s | claim p50 | claim p99 | cycle p50 | cycle p99 | errors | claim retries |\n",
    );
    out.push_str("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for &clients in &client_counts {
        for system in [System::Leasehold, System::Etcd, System::Postgres] {
            if let Some(run) = get(clients, system) {
                let _ = writeln!(
                    out,
                    "| {clients} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
                    system.name(),
                    run.cycles_per_s,
                    ms(run.claim.p50_us),
                    ms(run.claim.p99_us),
                    ms(run.cycle.p50_us),
                    ms(run.cycle.p99_us),
                    run.errors,
                    run.claim_retries
                );
            }
        }
    }

    out.push_str(
        "\nRatios leasehold ÷ peer, same invocation. Throughput above 1× means leasehold is \
         faster; p99 below 1× means leasehold is faster.\n\n",
    );
    out.push_str("| clients | cycles/s vs etcd | cycles/s vs postgres | cycle p99 vs etcd | cycle p99 vs postgres | claim p99 vs etcd | claim p99 vs postgres |\n");
    out.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for &clients in &client_counts {
        let ours = get(clients, System::Leasehold);
        let mut cells = Vec::new();
        for peer in PEERS {
            let theirs = get(clients, peer);
            cells.push(ratio(ours.map(|r| r.cycles_per_s), theirs.map(|r| r.cycles_per_s)));
        }
        for peer in PEERS {
            let theirs = get(clients, peer);
            cells.push(ratio(
                ours.map(|r| r.cycle.p99_us as f64),
                theirs.map(|r| r.cycle.p99_us as f64),
            ));
        }
        for peer in PEERS {
            let theirs = get(clients, peer);
            cells.push(ratio(
                ours.map(|r| r.claim.p99_us as f64),
                theirs.map(|r| r.claim.p99_us as f64),
            ));
        }
        let _ = writeln!(out, "| {clients} | {} |", cells.join(" | "));
    }

    out.push_str("\n| clients | leasehold peak RSS (VmHWM) |\n| ---: | ---: |\n");
    for &clients in &client_counts {
        let rss = get(clients, System::Leasehold)
            .and_then(|r| r.server_peak_rss_kib)
            .map(|kib| format!("{:.1} MiB", kib as f64 / 1024.0))
            .unwrap_or_else(|| "–".to_string());
        let _ = writeln!(out, "| {clients} | {rss} |");
    }

    let verdict = match get(target_clients, System::Leasehold) {
        Some(run) if run.cycles_per_s > target_cycles_per_s => format!(
            "**met**: {:.0} cycles/s at {target_clients} clients (goal: above {target_cycles_per_s:.0}).",
            run.cycles_per_s
        ),
        Some(run) => format!(
            "**not met**: {:.0} cycles/s at {target_clients} clients, {:.0}% of the goal of \
             {target_cycles_per_s:.0}.",
            run.cycles_per_s,
            100.0 * run.cycles_per_s / target_cycles_per_s
        ),
        None => format!("not measured (no leasehold run with {target_clients} clients)."),
    };
    let _ = writeln!(
        out,
        "\nSingle-node goal, above {target_cycles_per_s:.0} cycles/s at {target_clients} clients: {verdict}"
    );
    out
}
