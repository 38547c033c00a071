//! Markdown tables from the result lines: for one node, absolute numbers per
//! system and client count, leasehold's ratios against each peer measured in
//! the same invocation, peak memory and the throughput goal; for three nodes,
//! leasehold against a three-member etcd (both clients) and PostgreSQL with
//! two synchronous standbys, the cluster goal, and the cost of mutual TLS
//! and tokens (the TLS cluster against the plaintext one); for one node
//! behind a backlog of jobs its claims cannot take, leasehold against itself
//! without the backlog and against PostgreSQL with the same backlog; then the
//! failover trials, the cron fire lag and the memory per job, each against
//! its goal, and last every target of the invocation, met or not.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::System;
use crate::failover::FailoverTrial;
use crate::firelag::FireLagSummary;
use crate::measure::RunSummary;
use crate::memory::MemorySummary;
use crate::repeats;

/// The peers, in table order: etcd with each client, then PostgreSQL.
const PEERS: [System; 3] = [System::Etcd, System::EtcdCas, System::Postgres];

/// A system's name in tables and figures: `leasehold ×3`, `etcd-cas ×3`,
/// `postgres ×1`, with ` TLS` for a TLS run.
pub fn label(system: System, nodes: usize, tls: bool) -> String {
    format!("{} ×{nodes}{}", system.name(), if tls { " TLS" } else { "" })
}

/// The goals the report checks.
#[derive(Clone, Copy, Debug)]
pub struct Targets {
    /// Single node: cycles/s above this at `clients`.
    pub cycles_per_s: f64,
    /// The client count both throughput goals apply at.
    pub clients: usize,
    /// Three nodes: at least this many times the three-member etcd (the
    /// faster of its two clients).
    pub cluster_ratio: f64,
    /// Three nodes: at least this many times PostgreSQL with two
    /// synchronous standbys.
    pub pg_cluster_ratio: f64,
    /// One node: at least this many times single-node PostgreSQL.
    pub pg_single_ratio: f64,
    /// Three nodes at one client: claim p50 at most this, ms.
    pub claim_p50_ms: f64,
    /// Three nodes: server CPU per cycle, all nodes summed, at most this, ms.
    pub cpu_ms_per_cycle: f64,
    /// Memory: bytes of RSS per ready job at most this.
    pub ready_job_bytes: f64,
    /// Memory: bytes of RSS per acked tombstone at most this.
    pub tombstone_bytes: f64,
    /// Failover: median kill → first write below this, ms.
    pub failover_ms: f64,
    /// Cron: p99 tick → enqueue below this, ms.
    pub fire_lag_ms: f64,
}

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

/// Server CPU milliseconds per cycle (all nodes), when measured.
fn cpu_ms_per_cycle(run: &RunSummary) -> Option<f64> {
    match run.server_cpu_s {
        Some(cpu) if run.cycles > 0 => Some(cpu * 1000.0 / run.cycles as f64),
        _ => None,
    }
}

/// Server CPU milliseconds per cycle (all nodes), or a dash.
fn cpu_per_cycle(run: &RunSummary) -> String {
    cpu_ms_per_cycle(run).map_or_else(|| "–".to_string(), |ms| format!("{ms:.2}"))
}

/// The run each row shows, by (nodes, clients, system, TLS, backlog).
type Runs<'a> = BTreeMap<repeats::Key, &'a RunSummary>;

/// Renders every section there are results for (a row shows the median of
/// its latest invocation's runs: `repeats`).
pub fn render(
    runs: &[RunSummary],
    failovers: &[FailoverTrial],
    fire_lags: &[FireLagSummary],
    memories: &[MemorySummary],
    targets: &Targets,
) -> String {
    let rows = repeats::latest(runs);
    let shown = repeats::medians(runs);
    let runs = &shown[..];
    let mut by_key: Runs = BTreeMap::new();
    for run in runs {
        by_key.insert(repeats::key(run), run);
    }
    let most_repeats = rows.values().map(Vec::len).max().unwrap_or(0);
    let fewest_repeats = rows.values().map(Vec::len).min().unwrap_or(0);
    let mut out = String::new();
    if let Some(run) = runs.first() {
        let _ = writeln!(
            out,
            "Each throughput run: {:.0} s warm-up, then {:.0} s measured; {}-byte payloads; \
             one connection per client. Latencies in milliseconds.\n",
            run.warmup_s, run.duration_s, run.payload_bytes
        );
    }
    if most_repeats > 1 {
        let times = if fewest_repeats == most_repeats {
            format!("Each row ran {most_repeats} times")
        } else {
            format!("Each row ran {fewest_repeats} to {most_repeats} times")
        };
        let _ = writeln!(
            out,
            "{times}, interleaved with the other systems; a row shows its median run by \
             cycles/s, whole (latencies and CPU are that run's), and *Repeats* below lists \
             every run.\n"
        );
    }
    if runs.iter().any(|r| r.nodes == 1 && r.backlog == 0) {
        out.push_str("### One node\n\n");
        single(&mut out, &by_key, targets);
    }
    let backlogs: Vec<u64> = {
        let mut sizes: Vec<u64> =
            runs.iter().filter(|r| r.nodes == 1).map(|r| r.backlog).filter(|b| *b > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    };
    for backlog in backlogs {
        let _ = writeln!(out, "\n### Claims behind {} unclaimable jobs\n", thousands(backlog));
        behind_backlog(&mut out, &by_key, backlog);
    }
    let cluster_sizes: Vec<usize> = {
        let mut sizes: Vec<usize> = runs.iter().map(|r| r.nodes).filter(|n| *n > 1).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    };
    for nodes in cluster_sizes {
        let _ = writeln!(out, "\n### {nodes} nodes\n");
        cluster(&mut out, &by_key, nodes, targets);
    }
    if most_repeats > 1 {
        out.push_str("\n### Repeats\n\n");
        repeats_table(&mut out, &rows);
    }
    if runs.iter().any(|r| !r.stages.is_empty()) {
        out.push_str("\n### Where a commit round's time goes\n\n");
        stage_table(&mut out, runs);
    }
    if !failovers.is_empty() {
        out.push_str("\n### Failover\n\n");
        failover(&mut out, failovers, targets);
    }
    if let Some(lag) = fire_lags.last() {
        out.push_str("\n### Cron fire lag\n\n");
        fire_lag(&mut out, lag, targets);
    }
    if let Some(memory) = memories.last() {
        out.push_str("\n### Memory per job (one node)\n\n");
        memory_table(&mut out, memory, targets);
    }
    if !runs.is_empty() || !memories.is_empty() {
        out.push_str("\n### Targets\n\n");
        targets_table(&mut out, &by_key, memories.last(), targets);
    }
    out
}

/// Every run of each row that ran more than once, in the order they ran:
/// cycles/s and cycle p99, and the spread of cycles/s.
fn repeats_table(out: &mut String, rows: &BTreeMap<repeats::Key, Vec<&RunSummary>>) {
    out.push_str(
        "| nodes | clients | system | runs | cycles/s of each run | median | fastest ÷ slowest | cycle p99 of each run |\n\
         | ---: | ---: | --- | ---: | --- | ---: | ---: | --- |\n",
    );
    for row in rows.values().filter(|row| row.len() > 1) {
        let (Some(first), Some(shown)) = (row.first(), repeats::median(row)) else { continue };
        let rates: Vec<f64> = row.iter().map(|run| run.cycles_per_s).collect();
        let fastest = rates.iter().copied().fold(f64::MIN, f64::max);
        let slowest = rates.iter().copied().fold(f64::MAX, f64::min);
        let each_rate: Vec<String> = rates.iter().map(|rate| format!("{rate:.0}")).collect();
        let each_p99: Vec<String> = row.iter().map(|run| ms(run.cycle.p99_us)).collect();
        let mut name = label(first.system, first.nodes, first.tls);
        if first.backlog > 0 {
            let _ = write!(name, " behind {}", thousands(first.backlog));
        }
        let _ = writeln!(
            out,
            "| {} | {} | {name} | {} | {} | {:.0} | {} | {} |",
            first.nodes,
            first.clients,
            row.len(),
            each_rate.join(", "),
            shown.cycles_per_s,
            ratio(Some(fastest), Some(slowest)),
            each_p99.join(", "),
        );
    }
}

/// The stages in the order of a round, as the nodes name them.
const STAGE_ORDER: [&str; 6] =
    ["queue", "forward", "write", "log_sync", "replicate", "follower_append"];

/// One row per leasehold run that read its nodes' stage timings: each
/// stage's mean (ms) and how many times it ran per cycle, summed over the
/// nodes, beside the client's view of a claim.
fn stage_table(out: &mut String, runs: &[RunSummary]) {
    out.push_str(
        "Each stage's mean over the window (ms) and, in brackets, how many times it ran per \
         cycle on all nodes together (a cycle is three writes; a batch of writes shares one \
         write, one sync and one replication). `write` is the leader's whole Raft write: its \
         log sync and the replication to a quorum run side by side inside it, then commit and \
         apply.\n\n",
    );
    out.push_str("| nodes | clients | client's claim p50 |");
    for stage in STAGE_ORDER {
        let _ = write!(out, " {stage} |");
    }
    out.push_str("\n| --- | --- | --- |");
    for _ in STAGE_ORDER {
        out.push_str(" --- |");
    }
    out.push('\n');
    for run in runs.iter().filter(|r| !r.stages.is_empty()) {
        let _ = write!(out, "| {} | {} | {} |", run.nodes, run.clients, ms(run.claim.p50_us));
        for stage in STAGE_ORDER {
            match run.stages.iter().find(|s| s.stage == stage) {
                Some(timed) if run.cycles > 0 => {
                    let per_cycle = timed.count as f64 / run.cycles as f64;
                    let _ = write!(out, " {:.2} ({per_cycle:.2}) |", timed.mean_us / 1000.0);
                }
                _ => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
}

/// The client counts of the runs with `nodes` nodes and `backlog` jobs of
/// backlog, ascending.
fn client_counts(by_key: &Runs, nodes: usize, backlog: u64) -> Vec<usize> {
    let mut counts: Vec<usize> = by_key
        .keys()
        .filter(|(n, _, _, _, b)| *n == nodes && *b == backlog)
        .map(|(_, c, _, _, _)| *c)
        .collect();
    counts.dedup();
    counts
}

/// `n` with a comma between each group of three digits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (position, digit) in digits.chars().enumerate() {
        if position > 0 && (digits.len() - position).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn single(out: &mut String, by_key: &Runs, targets: &Targets) {
    let get =
        |clients: usize, system: System| by_key.get(&(1, clients, system as u8, false, 0)).copied();
    let client_counts = client_counts(by_key, 1, 0);
    out.push_str(
        "| clients | system | cycles/s | server CPU ms/cycle | claim p50 | claim p99 | cycle p50 | cycle p99 | errors | claim retries |\n",
    );
    out.push_str("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for &clients in &client_counts {
        for system in [System::Leasehold, System::Etcd, System::EtcdCas, System::Postgres] {
            if let Some(run) = get(clients, system) {
                let _ = writeln!(
                    out,
                    "| {clients} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                    system.name(),
                    run.cycles_per_s,
                    cpu_per_cycle(run),
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
    out.push_str("| clients | cycles/s vs etcd | cycles/s vs etcd-cas | cycles/s vs postgres | cycle p99 vs etcd | cycle p99 vs etcd-cas | cycle p99 vs postgres | claim p99 vs etcd | claim p99 vs etcd-cas | claim p99 vs postgres |\n");
    out.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
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

    out.push_str(
        "\nServer CPU: user + system time of the server processes inside the window, all \
         nodes summed, per counted cycle; for PostgreSQL, each server's whole process tree \
         (postmaster, backends, WAL writer and senders, reaped children included).\n",
    );
    out.push_str("\n| clients | leasehold peak RSS (VmHWM) |\n| ---: | ---: |\n");
    for &clients in &client_counts {
        let rss = get(clients, System::Leasehold)
            .and_then(|r| r.server_peak_rss_kib)
            .map(|kib| format!("{:.1} MiB", kib as f64 / 1024.0))
            .unwrap_or_else(|| "–".to_string());
        let _ = writeln!(out, "| {clients} | {rss} |");
    }

    let (goal, at) = (targets.cycles_per_s, targets.clients);
    let verdict = match get(at, System::Leasehold) {
        Some(run) if run.cycles_per_s > goal => {
            format!(
                "**met**: {:.0} cycles/s at {at} clients (goal: above {goal:.0}).",
                run.cycles_per_s
            )
        }
        Some(run) => format!(
            "**not met**: {:.0} cycles/s at {at} clients, {:.0}% of the goal of {goal:.0}.",
            run.cycles_per_s,
            100.0 * run.cycles_per_s / goal
        ),
        None => format!("not measured (no single-node leasehold run with {at} clients)."),
    };
    let _ =
        writeln!(out, "\nSingle-node goal, above {goal:.0} cycles/s at {at} clients: {verdict}");
}

/// The faster of the two etcd clients' runs at `clients` (cycles/s), for
/// the goals: the strongest version of the peer a user could build.
fn best_etcd<'a>(by_key: &Runs<'a>, nodes: usize, clients: usize) -> Option<&'a RunSummary> {
    [System::Etcd, System::EtcdCas]
        .iter()
        .filter_map(|system| by_key.get(&(nodes, clients, *system as u8, false, 0)).copied())
        .max_by(|a, b| a.cycles_per_s.total_cmp(&b.cycles_per_s))
}

fn cluster(out: &mut String, by_key: &Runs, nodes: usize, targets: &Targets) {
    let get_tls = |n: usize, clients: usize, system: System, tls: bool| {
        by_key.get(&(n, clients, system as u8, tls, 0)).copied()
    };
    let get = |n: usize, clients: usize, system: System| get_tls(n, clients, system, false);
    let client_counts = client_counts(by_key, nodes, 0);
    out.push_str(
        "| clients | system | cycles/s | server CPU ms/cycle | enqueue p50 | enqueue p99 | claim p50 | claim p99 | ack p50 | ack p99 | cycle p50 | cycle p99 | errors | claim retries | elections |\n",
    );
    out.push_str("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let rows = [
        (System::Leasehold, false),
        (System::Leasehold, true),
        (System::Etcd, false),
        (System::EtcdCas, false),
        (System::Postgres, false),
    ];
    for &clients in &client_counts {
        for (system, tls) in rows {
            if let Some(run) = get_tls(nodes, clients, system, tls) {
                let _ = writeln!(
                    out,
                    "| {clients} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    label(system, nodes, tls),
                    run.cycles_per_s,
                    cpu_per_cycle(run),
                    ms(run.enqueue.p50_us),
                    ms(run.enqueue.p99_us),
                    ms(run.claim.p50_us),
                    ms(run.claim.p99_us),
                    ms(run.ack.p50_us),
                    ms(run.ack.p99_us),
                    ms(run.cycle.p50_us),
                    ms(run.cycle.p99_us),
                    run.errors,
                    run.claim_retries,
                    run.elections.map_or_else(|| "–".to_string(), |n| n.to_string())
                );
            }
        }
    }
    out.push_str(
        "\n*elections*: Raft elections during the run (largest term after minus \
         before, warm-up included); no node is stopped, so each one is spurious.\n",
    );
    if client_counts.iter().any(|&c| get(nodes, c, System::Postgres).is_some()) {
        let _ = writeln!(
            out,
            "\n*postgres ×{nodes}*: a primary and {} streaming standbys, \
             `synchronous_standby_names = 'ANY 1 (…)'` and `synchronous_commit = on` (a commit \
             waits for its own WAL flush and one standby's); every client on the primary.",
            nodes - 1
        );
    }
    let _ = writeln!(
        out,
        "\nRatios: leasehold ×{nodes} ÷ each peer with {nodes} members, and leasehold ×{nodes} \
         ÷ leasehold ×1, same invocation.\n"
    );
    out.push_str("| clients | cycles/s vs etcd | cycles/s vs etcd-cas | cycles/s vs postgres | cycle p99 vs etcd | cycle p99 vs etcd-cas | cycle p99 vs postgres | claim p99 vs etcd | claim p99 vs etcd-cas | claim p99 vs postgres | cycles/s vs one node |\n");
    out.push_str(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for &clients in &client_counts {
        let ours = get(nodes, clients, System::Leasehold);
        let mut cells = Vec::new();
        let measures: [fn(&RunSummary) -> f64; 3] =
            [|r| r.cycles_per_s, |r| r.cycle.p99_us as f64, |r| r.claim.p99_us as f64];
        for measure in measures {
            for peer in PEERS {
                let theirs = get(nodes, clients, peer);
                cells.push(ratio(ours.map(measure), theirs.map(measure)));
            }
        }
        let single = get(1, clients, System::Leasehold);
        cells.push(ratio(ours.map(|r| r.cycles_per_s), single.map(|r| r.cycles_per_s)));
        let _ = writeln!(out, "| {clients} | {} |", cells.join(" | "));
    }
    let (goal, at) = (targets.cluster_ratio, targets.clients);
    let verdict = match (get(nodes, at, System::Leasehold), best_etcd(by_key, nodes, at)) {
        (Some(ours), Some(etcd)) if etcd.cycles_per_s > 0.0 => {
            let times = ours.cycles_per_s / etcd.cycles_per_s;
            format!(
                "**{}**: {:.0} against {:.0} cycles/s ({}) at {at} clients, {times:.2}×.",
                if times >= goal { "met" } else { "not met" },
                ours.cycles_per_s,
                etcd.cycles_per_s,
                etcd.system.name()
            )
        }
        _ => format!("not measured (no {nodes}-node pair of runs with {at} clients)."),
    };
    let _ = writeln!(
        out,
        "\n{nodes}-node goal, at least {goal:.0}× the {nodes}-member etcd's cycles/s (the faster of its two clients) at {at} clients: {verdict}"
    );
    if client_counts.iter().any(|&c| get_tls(nodes, c, System::Leasehold, true).is_some()) {
        tls_cost(out, nodes, &client_counts, |clients, tls| {
            get_tls(nodes, clients, System::Leasehold, tls)
        });
    }
}

/// The memory measurement and its two goals.
fn memory_table(out: &mut String, memory: &MemorySummary, targets: &Targets) {
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let _ = writeln!(
        out,
        "One fresh node (release build, default configuration): its VmRSS idle, holding {} \
         ready {}-byte jobs (enqueued in batches of 1,000, committed: a linearizable stats read \
         counts them), and holding their acked tombstones (every job claimed and acked, \
         counted the same way). Per job: the RSS above idle ÷ {}.\n",
        thousands(memory.jobs),
        memory.payload_bytes,
        thousands(memory.jobs)
    );
    out.push_str("| jobs | idle RSS | RSS, ready | RSS, acked | peak RSS | bytes per ready job | bytes per tombstone | enqueue s | claim + ack s | snapshot build's longest state-lock hold |\n");
    out.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {} |",
        thousands(memory.jobs),
        mib(memory.idle_rss_kib),
        mib(memory.ready_rss_kib),
        mib(memory.acked_rss_kib),
        memory.peak_rss_kib.map_or_else(|| "–".to_string(), mib),
        memory.bytes_per_ready_job,
        memory.bytes_per_tombstone,
        memory.enqueue_s,
        memory.ack_s,
        lock_hold(memory)
    );
    let _ = writeln!(
        out,
        "\nMemory goals, at most {:.0} bytes per ready job and {:.0} per acked tombstone: {}",
        targets.ready_job_bytes,
        targets.tombstone_bytes,
        memory_verdict(memory, targets)
    );
}

/// The snapshot lock gauges as the report prints them: the longest hold,
/// and the most CPU time the build spent inside one when the node says.
fn lock_hold(memory: &MemorySummary) -> String {
    match (memory.snapshot_lock_hold_longest_s, memory.snapshot_lock_hold_longest_cpu_s) {
        (None, _) => "not reported".to_string(),
        (Some(wall), None) => format!("{:.2} ms", wall * 1000.0),
        (Some(wall), Some(cpu)) => {
            format!("{:.2} ms (at most {:.2} ms on CPU)", wall * 1000.0, cpu * 1000.0)
        }
    }
}

fn memory_verdict(memory: &MemorySummary, targets: &Targets) -> String {
    let check = |bytes: f64, goal: f64| if bytes <= goal { "met" } else { "not met" };
    format!(
        "ready **{}** ({:.0} B), tombstone **{}** ({:.0} B), with {} jobs.",
        check(memory.bytes_per_ready_job, targets.ready_job_bytes),
        memory.bytes_per_ready_job,
        check(memory.bytes_per_tombstone, targets.tombstone_bytes),
        memory.bytes_per_tombstone,
        thousands(memory.jobs)
    )
}

/// Every target of the throughput, latency, CPU and memory goals, one row
/// each, with what was measured and whether it is met.
fn targets_table(
    out: &mut String,
    by_key: &Runs,
    memory: Option<&MemorySummary>,
    targets: &Targets,
) {
    let get = |nodes: usize, clients: usize, system: System| {
        by_key.get(&(nodes, clients, system as u8, false, 0)).copied()
    };
    let at = targets.clients;
    let unmeasured = |what: &str| ("–".to_string(), format!("not measured ({what})"));
    let verdict = |met: bool| if met { "**met**" } else { "**not met**" }.to_string();
    let mut rows: Vec<(String, (String, String))> = Vec::new();

    let times =
        |ours: Option<&RunSummary>, theirs: Option<&RunSummary>, goal: f64, what: &str| match (
            ours, theirs,
        ) {
            (Some(ours), Some(theirs)) if theirs.cycles_per_s > 0.0 => {
                let times = ours.cycles_per_s / theirs.cycles_per_s;
                (
                    format!(
                        "{:.0} ÷ {:.0} cycles/s ({}) = {times:.2}×",
                        ours.cycles_per_s,
                        theirs.cycles_per_s,
                        theirs.system.name()
                    ),
                    verdict(times >= goal),
                )
            }
            _ => unmeasured(what),
        };
    rows.push((
        format!(
            "3 nodes at {at} clients: at least {:.1}× PostgreSQL with 2 synchronous standbys",
            targets.pg_cluster_ratio
        ),
        times(
            get(3, at, System::Leasehold),
            get(3, at, System::Postgres),
            targets.pg_cluster_ratio,
            "leasehold3 and pg3",
        ),
    ));
    rows.push((
        format!(
            "3 nodes at {at} clients: at least {:.0}× the 3-member etcd (faster client)",
            targets.cluster_ratio
        ),
        times(
            get(3, at, System::Leasehold),
            best_etcd(by_key, 3, at),
            targets.cluster_ratio,
            "leasehold3 and etcd3 or etcd3cas",
        ),
    ));
    let top = client_counts(by_key, 3, 0).into_iter().filter(|c| *c > at).max();
    rows.push((
        format!(
            "3 nodes: cycles/s at {} clients no lower than at {at}",
            top.map_or("128".to_string(), |c| c.to_string())
        ),
        match (get(3, at, System::Leasehold), top.and_then(|c| get(3, c, System::Leasehold))) {
            (Some(low), Some(high)) => (
                format!("{:.0} against {:.0} cycles/s", high.cycles_per_s, low.cycles_per_s),
                verdict(high.cycles_per_s >= low.cycles_per_s),
            ),
            _ => unmeasured("leasehold3 at 32 and at a higher count"),
        },
    ));
    rows.push((
        format!("3 nodes at 1 client: claim p50 at most {:.0} ms", targets.claim_p50_ms),
        match get(3, 1, System::Leasehold) {
            Some(run) => (
                format!("{} ms", ms(run.claim.p50_us)),
                verdict(run.claim.p50_us as f64 <= targets.claim_p50_ms * 1000.0),
            ),
            None => unmeasured("leasehold3 at 1 client"),
        },
    ));
    let counts = client_counts(by_key, 3, 0);
    let mut p99_cells = Vec::new();
    let mut p99_met = true;
    let mut p99_complete = !counts.is_empty();
    for &clients in &counts {
        let Some(ours) = get(3, clients, System::Leasehold) else { continue };
        let etcd = [System::Etcd, System::EtcdCas]
            .iter()
            .filter_map(|s| get(3, clients, *s))
            .map(|r| r.cycle.p99_us)
            .min();
        let postgres = get(3, clients, System::Postgres).map(|r| r.cycle.p99_us);
        match (etcd, postgres) {
            (Some(etcd), Some(postgres)) => {
                p99_met &= ours.cycle.p99_us < etcd.min(postgres);
                p99_cells.push(format!(
                    "{clients}: {} against etcd {} and postgres {}",
                    ms(ours.cycle.p99_us),
                    ms(etcd),
                    ms(postgres)
                ));
            }
            _ => p99_complete = false,
        }
    }
    rows.push((
        "3 nodes: cycle p99 below both peers' (etcd: the lower of its two clients) at every client count".to_string(),
        if p99_complete && !p99_cells.is_empty() {
            (format!("{} ms", p99_cells.join("; ")), verdict(p99_met))
        } else {
            unmeasured("leasehold3, an etcd3 part and pg3 at every client count")
        },
    ));
    rows.push((
        format!(
            "3 nodes at {at} clients: server CPU per cycle, all nodes summed, at most {:.1} ms",
            targets.cpu_ms_per_cycle
        ),
        match get(3, at, System::Leasehold).and_then(cpu_ms_per_cycle) {
            Some(cpu) => (format!("{cpu:.2} ms"), verdict(cpu <= targets.cpu_ms_per_cycle)),
            None => unmeasured("leasehold3 with CPU times"),
        },
    ));
    rows.push((
        format!(
            "1 node at {at} clients: at least {:.1}× single-node PostgreSQL",
            targets.pg_single_ratio
        ),
        times(
            get(1, at, System::Leasehold),
            get(1, at, System::Postgres),
            targets.pg_single_ratio,
            "leasehold and postgres",
        ),
    ));
    let memory_rows = [
        (
            format!(
                "memory: a ready {}-byte job at most {:.0} B of RSS",
                memory.map_or(64, |m| m.payload_bytes),
                targets.ready_job_bytes
            ),
            true,
        ),
        (
            format!("memory: an acked tombstone at most {:.0} B of RSS", targets.tombstone_bytes),
            false,
        ),
    ];
    for (name, ready) in memory_rows {
        rows.push((
            name,
            match memory {
                Some(m) => {
                    let (bytes, goal) = if ready {
                        (m.bytes_per_ready_job, targets.ready_job_bytes)
                    } else {
                        (m.bytes_per_tombstone, targets.tombstone_bytes)
                    };
                    (
                        format!("{bytes:.0} B with {} jobs", thousands(m.jobs)),
                        verdict(bytes <= goal),
                    )
                }
                None => unmeasured("memory"),
            },
        ));
    }
    rows.push((
        "snapshot build's longest state-lock hold reported".to_string(),
        match memory {
            Some(m) => {
                let reported = m.snapshot_lock_hold_longest_s.is_some();
                (lock_hold(m), verdict(reported))
            }
            None => unmeasured("memory"),
        },
    ));
    out.push_str("Each target as this invocation measured it (ratios within the invocation).\n\n");
    out.push_str("| target | measured | verdict |\n| --- | --- | --- |\n");
    for (name, (measured, verdict)) in rows {
        let _ = writeln!(out, "| {name} | {measured} | {verdict} |");
    }
}

/// One node behind `backlog` jobs no claim can take: leasehold with the
/// backlog against leasehold without it (the tag-set index's point is that
/// the backlog costs a claim nothing, so near 1×) and against PostgreSQL
/// with the same backlog, client count by client count.
fn behind_backlog(out: &mut String, by_key: &Runs, backlog: u64) {
    let get = |clients: usize, system: System, backlog: u64| {
        by_key.get(&(1, clients, system as u8, false, backlog)).copied()
    };
    let client_counts = client_counts(by_key, 1, backlog);
    let jobs = thousands(backlog);
    let _ = writeln!(
        out,
        "Before the warm-up the queue is filled with {jobs} jobs the workload's claims can never \
         take, ahead of its own jobs (leasehold: tag `absent`, claims with an empty selector; \
         PostgreSQL: `tag_key = 'absent'`, claims on `tag_key = ''`). The rows without a backlog \
         are the one-node runs of the same invocation.\n"
    );
    out.push_str(
        "| clients | system | backlog | cycles/s | server CPU ms/cycle | claim p50 | claim p99 | cycle p50 | cycle p99 | errors | claim retries |\n",
    );
    out.push_str("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for &clients in &client_counts {
        let rows = [
            (System::Leasehold, 0),
            (System::Leasehold, backlog),
            (System::Postgres, 0),
            (System::Postgres, backlog),
        ];
        for (system, jobs) in rows {
            if let Some(run) = get(clients, system, jobs) {
                let _ = writeln!(
                    out,
                    "| {clients} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
                    system.name(),
                    thousands(jobs),
                    run.cycles_per_s,
                    cpu_per_cycle(run),
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
    let _ = writeln!(
        out,
        "\nRatios of leasehold behind {jobs} jobs ÷ leasehold with none, and ÷ PostgreSQL \
         behind the same {jobs}, same invocation. Against itself, near 1× means the backlog \
         costs nothing; against PostgreSQL, throughput above 1× and latency below 1× mean \
         leasehold is faster.\n"
    );
    out.push_str(
        "| clients | cycles/s vs no backlog | claim p50 vs no backlog | claim p99 vs no backlog | cycles/s vs postgres | claim p50 vs postgres | claim p99 vs postgres |\n",
    );
    out.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let cycles = |run: Option<&RunSummary>| run.map(|r| r.cycles_per_s);
    let p50 = |run: Option<&RunSummary>| run.map(|r| r.claim.p50_us as f64);
    let p99 = |run: Option<&RunSummary>| run.map(|r| r.claim.p99_us as f64);
    for &clients in &client_counts {
        let ours = get(clients, System::Leasehold, backlog);
        let clear = get(clients, System::Leasehold, 0);
        let postgres = get(clients, System::Postgres, backlog);
        let _ = writeln!(
            out,
            "| {clients} | {} | {} | {} | {} | {} | {} |",
            ratio(cycles(ours), cycles(clear)),
            ratio(p50(ours), p50(clear)),
            ratio(p99(ours), p99(clear)),
            ratio(cycles(ours), cycles(postgres)),
            ratio(p50(ours), p50(postgres)),
            ratio(p99(ours), p99(postgres)),
        );
    }
}

/// The TLS cluster against the plaintext one, client count by client count.
fn tls_cost<'a>(
    out: &mut String,
    nodes: usize,
    client_counts: &[usize],
    get: impl Fn(usize, bool) -> Option<&'a RunSummary>,
) {
    let _ = writeln!(
        out,
        "\nCost of TLS: leasehold ×{nodes} with mutual TLS between all parties and a token on \
         every client call (*TLS*), against the same cluster in plaintext, same invocation \
         (the two alternate at each client count). Throughput below 1× and p99 or CPU above \
         1× is what TLS costs.\n"
    );
    out.push_str(
        "| clients | cycles/s plaintext | cycles/s TLS | TLS ÷ plaintext | cycle p99 plaintext | cycle p99 TLS | TLS ÷ plaintext | server CPU ms/cycle plaintext | server CPU ms/cycle TLS | TLS ÷ plaintext |\n",
    );
    out.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let dash = || "–".to_string();
    for &clients in client_counts {
        let (plain, tls) = (get(clients, false), get(clients, true));
        if tls.is_none() {
            continue;
        }
        let cycles = |run: Option<&RunSummary>| run.map(|r| r.cycles_per_s);
        let p99 = |run: Option<&RunSummary>| run.map(|r| r.cycle.p99_us as f64);
        let cpu = |run: Option<&RunSummary>| run.and_then(cpu_ms_per_cycle);
        let _ = writeln!(
            out,
            "| {clients} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cycles(plain).map_or_else(dash, |c| format!("{c:.0}")),
            cycles(tls).map_or_else(dash, |c| format!("{c:.0}")),
            ratio(cycles(tls), cycles(plain)),
            plain.map_or_else(dash, |r| ms(r.cycle.p99_us)),
            tls.map_or_else(dash, |r| ms(r.cycle.p99_us)),
            ratio(p99(tls), p99(plain)),
            cpu(plain).map_or_else(dash, |c| format!("{c:.2}")),
            cpu(tls).map_or_else(dash, |c| format!("{c:.2}")),
            ratio(cpu(tls), cpu(plain)),
        );
    }
}

/// The median of `values` (mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn opt_ms(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.0}")).unwrap_or_else(|| "–".to_string())
}

/// One column of the failover trials.
type Field = fn(&FailoverTrial) -> Option<f64>;

fn failover(out: &mut String, trials: &[FailoverTrial], targets: &Targets) {
    out.push_str(
        "Milliseconds from the SIGKILL of the leader. *first write*: the first enqueue the \
         survivors accept (a probe sends one every 10 ms, no client retries); *leader seen*: a \
         survivor first reports the new leader; *load client*: a light-load client (stock \
         client, default retries, connected to the survivors) completes its first enqueue.\n\n",
    );
    out.push_str(
        "| trial | killed | new leader | leader seen | first write | load client | load errors |\n",
    );
    out.push_str("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for trial in trials {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            trial.trial,
            trial.killed,
            if trial.new_leader == 0 { "–".to_string() } else { trial.new_leader.to_string() },
            opt_ms(trial.leader_seen_ms),
            opt_ms(trial.first_write_ms),
            opt_ms(trial.load_client_ms),
            trial.load_errors
        );
    }
    let column = |f: Field| -> Vec<f64> { trials.iter().filter_map(f).collect() };
    out.push_str(
        "\n| | median | min | max | trials with a value |\n| --- | ---: | ---: | ---: | ---: |\n",
    );
    let rows: [(&str, Field); 3] = [
        ("kill → first write", |t| t.first_write_ms),
        ("kill → leader seen", |t| t.leader_seen_ms),
        ("kill → load client's write", |t| t.load_client_ms),
    ];
    for (label, f) in rows {
        let values = column(f);
        let min = values.iter().copied().reduce(f64::min);
        let max = values.iter().copied().reduce(f64::max);
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} of {} |",
            opt_ms(median(&values)),
            opt_ms(min),
            opt_ms(max),
            values.len(),
            trials.len()
        );
    }
    let writes = column(|t| t.first_write_ms);
    let goal = targets.failover_ms;
    let verdict = match median(&writes) {
        Some(m) if writes.len() < trials.len() => format!(
            "**not met**: {} of {} trials saw no write within the probe's limit (median of the rest {m:.0} ms).",
            trials.len() - writes.len(),
            trials.len()
        ),
        Some(m) if m < goal => format!("**met**: median {m:.0} ms over {} trials.", trials.len()),
        Some(m) => format!("**not met**: median {m:.0} ms over {} trials.", trials.len()),
        None => "**not met**: no trial saw a write.".to_string(),
    };
    let _ =
        writeln!(out, "\nFailover goal, median kill → first write below {goal:.0} ms: {verdict}");
}

fn fire_lag(out: &mut String, lag: &FireLagSummary, targets: &Targets) {
    let skipped: Vec<String> = lag.skipped.iter().map(|(r, n)| format!("{n} ({r})")).collect();
    let _ = writeln!(
        out,
        "{} nodes, {} schedules `* * * * * *` (stock policies), {:.0} s window: {} ticks due, \
         {} fired, {} skipped{}, {} with no record, {} late (≥ 2 s); commands: {} never \
         started, {} started more than once.\n",
        lag.nodes,
        lag.schedules,
        lag.duration_s,
        lag.expected_ticks,
        lag.fired,
        lag.skipped.values().sum::<u64>(),
        if skipped.is_empty() { String::new() } else { format!(" ({})", skipped.join(", ")) },
        lag.unrecorded,
        lag.late,
        lag.never_started,
        lag.started_twice
    );
    out.push_str("| lag from the tick's instant | samples | p50 ms | p99 ms | max ms |\n");
    out.push_str("| --- | ---: | ---: | ---: | ---: |\n");
    for (label, stats) in [
        ("→ job enqueued (journal's lag_ms)", &lag.to_enqueue),
        ("→ command started", &lag.to_start),
    ] {
        let _ = writeln!(
            out,
            "| {label} | {} | {:.1} | {:.1} | {:.1} |",
            stats.count, stats.p50_ms, stats.p99_ms, stats.max_ms
        );
    }
    if !lag.by_schedule_p50_ms.is_empty() {
        let medians: Vec<String> =
            lag.by_schedule_p50_ms.iter().map(|m| format!("{m:.0}")).collect();
        let _ = writeln!(
            out,
            "\nMedian lag to enqueue per schedule, in creation order (ms): {}.",
            medians.join(", ")
        );
    }
    let goal = targets.fire_lag_ms;
    let verdict = if lag.to_enqueue.count == 0 {
        "**not met**: no tick fired.".to_string()
    } else if lag.to_enqueue.p99_ms < goal {
        format!("**met**: p99 {:.1} ms.", lag.to_enqueue.p99_ms)
    } else {
        format!("**not met**: p99 {:.1} ms.", lag.to_enqueue.p99_ms)
    };
    let _ = writeln!(out, "\nFire-lag goal, p99 tick → enqueue below {goal:.0} ms: {verdict}");
}

#[cfg(test)]
mod tests {
    //! The report's arithmetic on hand-made result lines: the TLS cost
    //! table pairs each TLS run with the plaintext run of the same cluster
    //! and client count, and a plaintext-only invocation prints no such table;
    //! a backlog run is set beside the same system's run without one and
    //! PostgreSQL's with the same backlog, and stays out of the one-node table.

    use super::*;
    use crate::measure::Latency;

    fn run(tls: bool, clients: usize, cycles: u64, p99_us: u64, cpu_s: f64) -> RunSummary {
        let latency = Latency { count: cycles, p50_us: p99_us / 2, p99_us, ..Latency::default() };
        let sample =
            RunSummary::sample(System::Leasehold, 3, clients, cycles as f64 / 10.0, latency);
        RunSummary { cycles, server_cpu_s: Some(cpu_s), elections: Some(0), tls, ..sample }
    }

    /// A one-node run of `system` behind `backlog` jobs.
    fn single_run(
        system: System,
        backlog: u64,
        clients: usize,
        cycles: u64,
        claim_p99_us: u64,
    ) -> RunSummary {
        RunSummary { system, nodes: 1, backlog, ..run(false, clients, cycles, claim_p99_us, 1.0) }
    }

    fn targets() -> Targets {
        Targets {
            cycles_per_s: 3000.0,
            clients: 32,
            cluster_ratio: 8.0,
            pg_cluster_ratio: 2.0,
            pg_single_ratio: 1.5,
            claim_p50_ms: 1.0,
            cpu_ms_per_cycle: 0.3,
            ready_job_bytes: 300.0,
            tombstone_bytes: 120.0,
            failover_ms: 1500.0,
            fire_lag_ms: 100.0,
        }
    }

    #[test]
    fn stage_rows_give_each_stage_its_mean_and_share_per_cycle() {
        let mut timed = run(false, 32, 1_000, 9_000, 1.0);
        timed.nodes = 3;
        timed.stages = vec![
            crate::stages::StageMean { stage: "log_sync".into(), count: 3_000, mean_us: 1_250.0 },
            crate::stages::StageMean { stage: "queue".into(), count: 500, mean_us: 40.0 },
        ];
        let untimed = run(false, 1, 10, 9_000, 1.0);
        let out = render(&[timed, untimed], &[], &[], &[], &targets());
        let section = out.split("### Where a commit round's time goes").nth(1).unwrap_or_default();
        let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| 3 |")).collect();
        assert_eq!(rows.len(), 1, "{section}");
        assert!(rows[0].contains("| 0.04 (0.50) |"), "{}", rows[0]);
        assert!(rows[0].contains("| 1.25 (3.00) |"), "{}", rows[0]);
        assert!(rows[0].contains("| – |"), "a stage not timed is a dash: {}", rows[0]);
        assert!(!section.contains("| 1 | 1 |"), "a run without stages has no row: {section}");
    }

    #[test]
    fn tls_runs_are_set_beside_the_plaintext_ones() {
        // 32 clients: 10,000 plaintext cycles on 10 s of CPU (1.00 ms a
        // cycle), 8,000 TLS cycles on 12 s (1.50 ms), p99 40 → 50 ms.
        let runs = [run(false, 32, 10_000, 40_000, 10.0), run(true, 32, 8_000, 50_000, 12.0)];
        let text = render(&runs, &[], &[], &[], &targets());
        assert!(text.contains("| 32 | leasehold ×3 | 1000 |"), "{text}");
        assert!(text.contains("| 32 | leasehold ×3 TLS | 800 |"), "{text}");
        let row = "| 32 | 1000 | 800 | 0.80× | 40.00 | 50.00 | 1.25× | 1.00 | 1.50 | 1.50× |";
        assert!(text.contains(row), "{text}");
        // The goal stays a plaintext one: no etcd run, so not measured.
        assert!(text.contains("not measured"), "{text}");
    }

    #[test]
    fn backlog_runs_are_set_beside_the_clear_queue_and_postgres() {
        // 8 clients: 20,000 cycles without a backlog (claim p99 4 ms),
        // 19,000 behind 100,000 jobs (5 ms), PostgreSQL 10,000 behind the
        // same backlog (10 ms, p50 half of p99 throughout).
        let runs = [
            single_run(System::Leasehold, 0, 8, 20_000, 4_000),
            single_run(System::Leasehold, 100_000, 8, 19_000, 5_000),
            single_run(System::Postgres, 100_000, 8, 10_000, 10_000),
        ];
        let text = render(&runs, &[], &[], &[], &targets());
        assert!(text.contains("### Claims behind 100,000 unclaimable jobs"), "{text}");
        assert!(text.contains("| 8 | leasehold | 0 | 2000 |"), "{text}");
        assert!(text.contains("| 8 | leasehold | 100,000 | 1900 |"), "{text}");
        assert!(text.contains("| 8 | postgres | 100,000 | 1000 |"), "{text}");
        let row = "| 8 | 0.95× | 1.25× | 1.25× | 1.90× | 0.50× | 0.50× |";
        assert!(text.contains(row), "{text}");
        // The one-node table and its ratios see only the clear queue: no
        // PostgreSQL run without a backlog, so no ratio against it.
        let one_node = text.split("### Claims behind").next().unwrap_or_default();
        assert!(!one_node.contains("| 8 | postgres |"), "{text}");
        assert!(one_node.contains("| 8 | – | – | – |"), "{text}");
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn repeated_rows_show_their_median_run_and_list_every_run() {
        let repeat = |cycles, p99_us| RunSummary {
            invocation: "i1".to_string(),
            ..run(false, 32, cycles, p99_us, 1.0)
        };
        let runs = [repeat(50_000, 9_000), repeat(30_000, 7_000), repeat(40_000, 8_000)];
        let text = render(&runs, &[], &[], &[], &targets());
        assert!(text.contains("Each row ran 3 times"), "{text}");
        let cluster = text.split("### Repeats").next().unwrap_or_default();
        assert!(cluster.contains("| 32 | leasehold ×3 | 4000 |"), "{text}");
        assert!(cluster.contains("| 8.00 |"), "the median run's own p99: {text}");
        assert!(!cluster.contains("| 5000 |"), "{text}");
        assert!(
            text.contains("| 3 | 32 | leasehold ×3 | 3 | 5000, 3000, 4000 | 4000 | 1.67× |"),
            "{text}"
        );
        let single = render(&runs[..1], &[], &[], &[], &targets());
        assert!(!single.contains("### Repeats"), "{single}");
        let mut uneven = runs.to_vec();
        uneven.push(run(false, 1, 100, 9_000, 1.0));
        let text = render(&uneven, &[], &[], &[], &targets());
        assert!(text.contains("Each row ran 1 to 3 times"), "{text}");
    }

    #[test]
    fn a_plaintext_invocation_has_no_tls_table() {
        let text = render(&[run(false, 1, 100, 9_000, 1.0)], &[], &[], &[], &targets());
        assert!(!text.contains("Cost of TLS"), "{text}");
        assert!(!text.contains("TLS ÷ plaintext"), "{text}");
    }
}
