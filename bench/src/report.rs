//! Markdown tables from the result lines: for one node, absolute numbers per
//! system and client count, leasehold's ratios against each peer measured in
//! the same invocation, peak memory and the throughput goal; for three nodes,
//! leasehold against a three-member etcd and the cluster goal, and the cost
//! of mutual TLS and tokens (the TLS cluster against the plaintext one);
//! for one node behind a backlog of jobs its claims cannot take, leasehold
//! against itself without the backlog and against PostgreSQL with the same
//! backlog; then the failover trials and the cron fire lag, each against its
//! goal.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::System;
use crate::failover::FailoverTrial;
use crate::firelag::FireLagSummary;
use crate::measure::RunSummary;

const PEERS: [System; 2] = [System::Etcd, System::Postgres];

/// The goals the report checks.
#[derive(Clone, Copy, Debug)]
pub struct Targets {
    /// Single node: cycles/s above this at `clients`.
    pub cycles_per_s: f64,
    /// The client count both throughput goals apply at.
    pub clients: usize,
    /// Three nodes: at least this many times the three-member etcd.
    pub cluster_ratio: f64,
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

/// Runs by (nodes, clients, system, TLS, backlog).
type Runs<'a> = BTreeMap<(usize, usize, u8, bool, u64), &'a RunSummary>;

/// Renders every section there are results for (later lines win for the
/// same system, size and client count).
pub fn render(
    runs: &[RunSummary],
    failovers: &[FailoverTrial],
    fire_lags: &[FireLagSummary],
    targets: &Targets,
) -> String {
    let mut by_key: Runs = BTreeMap::new();
    for run in runs {
        by_key.insert((run.nodes, run.clients, run.system as u8, run.tls, run.backlog), run);
    }
    let mut out = String::new();
    if let Some(run) = runs.first() {
        let _ = writeln!(
            out,
            "Each throughput run: {:.0} s warm-up, then {:.0} s measured; {}-byte payloads; \
             one connection per client. Latencies in milliseconds.\n",
            run.warmup_s, run.duration_s, run.payload_bytes
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
    if !failovers.is_empty() {
        out.push_str("\n### Failover\n\n");
        failover(&mut out, failovers, targets);
    }
    if let Some(lag) = fire_lags.last() {
        out.push_str("\n### Cron fire lag\n\n");
        fire_lag(&mut out, lag, targets);
    }
    out
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
        for system in [System::Leasehold, System::Etcd, System::Postgres] {
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

    out.push_str(
        "\nServer CPU: user + system time of the server process(es) inside the window, all \
         nodes summed, per counted cycle (PostgreSQL's work happens in its backends, which are \
         not measured).\n",
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
    for &clients in &client_counts {
        for (system, tls) in
            [(System::Leasehold, false), (System::Leasehold, true), (System::Etcd, false)]
        {
            if let Some(run) = get_tls(nodes, clients, system, tls) {
                let _ = writeln!(
                    out,
                    "| {clients} | {} ×{nodes}{} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    system.name(),
                    if tls { " TLS" } else { "" },
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
    let _ = writeln!(
        out,
        "\nRatios: leasehold ×{nodes} ÷ etcd ×{nodes}, and leasehold ×{nodes} ÷ leasehold ×1, \
         same invocation.\n"
    );
    out.push_str("| clients | cycles/s vs etcd | cycle p99 vs etcd | claim p99 vs etcd | cycles/s vs one node |\n");
    out.push_str("| ---: | ---: | ---: | ---: | ---: |\n");
    for &clients in &client_counts {
        let ours = get(nodes, clients, System::Leasehold);
        let etcd = get(nodes, clients, System::Etcd);
        let single = get(1, clients, System::Leasehold);
        let _ = writeln!(
            out,
            "| {clients} | {} | {} | {} | {} |",
            ratio(ours.map(|r| r.cycles_per_s), etcd.map(|r| r.cycles_per_s)),
            ratio(ours.map(|r| r.cycle.p99_us as f64), etcd.map(|r| r.cycle.p99_us as f64)),
            ratio(ours.map(|r| r.claim.p99_us as f64), etcd.map(|r| r.claim.p99_us as f64)),
            ratio(ours.map(|r| r.cycles_per_s), single.map(|r| r.cycles_per_s)),
        );
    }
    let (goal, at) = (targets.cluster_ratio, targets.clients);
    let verdict = match (get(nodes, at, System::Leasehold), get(nodes, at, System::Etcd)) {
        (Some(ours), Some(etcd)) if etcd.cycles_per_s > 0.0 => {
            let times = ours.cycles_per_s / etcd.cycles_per_s;
            format!(
                "**{}**: {:.0} against {:.0} cycles/s at {at} clients, {times:.2}×.",
                if times >= goal { "met" } else { "not met" },
                ours.cycles_per_s,
                etcd.cycles_per_s
            )
        }
        _ => format!("not measured (no {nodes}-node pair of runs with {at} clients)."),
    };
    let _ = writeln!(
        out,
        "\n{nodes}-node goal, at least {goal:.0}× the {nodes}-member etcd's cycles/s at {at} clients: {verdict}"
    );
    if client_counts.iter().any(|&c| get_tls(nodes, c, System::Leasehold, true).is_some()) {
        tls_cost(out, nodes, &client_counts, |clients, tls| {
            get_tls(nodes, clients, System::Leasehold, tls)
        });
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
        RunSummary {
            system: System::Leasehold,
            nodes: 3,
            clients,
            duration_s: 10.0,
            warmup_s: 1.0,
            payload_bytes: 64,
            cycles,
            cycles_per_s: cycles as f64 / 10.0,
            errors: 0,
            claim_retries: 0,
            enqueue: latency.clone(),
            claim: latency.clone(),
            ack: latency.clone(),
            cycle: latency,
            server_peak_rss_kib: None,
            server_cpu_s: Some(cpu_s),
            elections: Some(0),
            tls,
            backlog: 0,
        }
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
            cluster_ratio: 5.0,
            failover_ms: 1500.0,
            fire_lag_ms: 100.0,
        }
    }

    #[test]
    fn tls_runs_are_set_beside_the_plaintext_ones() {
        // 32 clients: 10,000 plaintext cycles on 10 s of CPU (1.00 ms a
        // cycle), 8,000 TLS cycles on 12 s (1.50 ms), p99 40 → 50 ms.
        let runs = [run(false, 32, 10_000, 40_000, 10.0), run(true, 32, 8_000, 50_000, 12.0)];
        let text = render(&runs, &[], &[], &targets());
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
        let text = render(&runs, &[], &[], &targets());
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
        assert!(one_node.contains("| 8 | – | – |"), "{text}");
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
    fn a_plaintext_invocation_has_no_tls_table() {
        let text = render(&[run(false, 1, 100, 9_000, 1.0)], &[], &[], &targets());
        assert!(!text.contains("Cost of TLS"), "{text}");
        assert!(!text.contains("TLS ÷ plaintext"), "{text}");
    }
}
