//! Goal: the cutover gate of issue 5 with real node processes (SPEC §4) —
//! one node with its `journal_lease` flag off keeps the whole pool on the
//! broadcast (bus) path; turning it on moves the pool to the journal within
//! a few heartbeats, and off again moves it back, while an every-second
//! schedule runs each of its ticks exactly once throughout, while one that
//! enqueues a queue job fires on time on either path; a schedule turned
//! from `any` to `each` on the bus runs no tick twice on a node, and one
//! member down past `advert_stale_after_ms` stops no queue-job schedule;
//! and an advert
//! that is not signed with the cluster secret changes nothing and is
//! counted (one without the node proof never reaches the service, and a
//! node cannot speak for another); and dry-run stays on the bus while logging the journal claims it
//! would have made.
//!
//! Method: three nodes from the shared harness (adverts every 500 ms, so a
//! flag change settles in 1.5 s). The schedule's command appends
//! `$LEASEHOLD_BUCKET`, the claim path and the node to a file in the
//! sandbox; that file, not the nodes' own account, is the judge of
//! "exactly once". `leasehold cluster status --output json` is read at
//! every step and must show each node's path and the reason naming the
//! deciding peer. The forged advert is sent straight to a node's Peer
//! service; a correctly signed advert from an unknown node is the control
//! showing that the node does act on adverts that verify.
//!
//! Mutation checks (each run once against a deliberately broken build):
//! the live gate leaving node 3 out of its input fails the flip story (the
//! pool never shows "all 2 peers"); every bus claimant believing it won
//! fails it with buckets run two and three times; the journal not recording
//! the ticks the bus ran fails it with buckets run on both paths; asking
//! the gate for a queue-job schedule's ticks (they were skipped on the bus)
//! fails it with no queue job while the pool is on the bus; the
//! registry not checking the MAC fails the forged-advert story (the forgery
//! is answered OK).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::peer_client::PeerClient;
use leasehold_security::secret::NODE_PROOF_HEADER;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Endpoint;

use super::support::{
    CLUSTER_SECRET, Check, Cluster, ClusterOptions, Node, RPC_TIMEOUT, Sandbox, deadline_in, phase,
    run_cli, wait_until,
};

/// Adverts every 500 ms: a flag change counts 1.5 s after it is made.
const GATE_CONFIG: &str = "advert_interval_ms = 500\n";
/// Settle time of a flag change under [`GATE_CONFIG`].
const SETTLE_MS: u64 = 1_500;
/// How long the pool may take to show a new path in status after a flip:
/// the settle time plus a few heartbeats.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(6);
/// Ticks each phase runs on its path before the next flip.
const TICKS_PER_PHASE: usize = 5;
/// How long the ticks of one phase may take to appear in the runs file.
const PHASE_TIMEOUT: Duration = Duration::from_secs(30);
/// The schedule of the flip story.
const SCHEDULE: &str = "gate-every-second";
/// The stories' schedule that enqueues a queue job (no command).
const QUEUE_SCHEDULE: &str = "gate-queue-job";
/// The queue its jobs go to; nothing claims from it.
const REPORTS: &str = "reports";

fn unix_ms() -> Result<u64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).context("clock before 1970")?;
    Ok(u64::try_from(since.as_millis())?)
}

/// One line of the runs file: the bucket, the claim path, the node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RunLine {
    bucket: u64,
    path: String,
    node: String,
}

/// A schedule's command that appends its bucket, claim path and node to
/// `file` as one [`RunLine`].
fn runs_command(file: &Path) -> String {
    format!(
        "echo \"$LEASEHOLD_BUCKET ${{LEASEHOLD_CLAIM_PATH:-journal}} ${{LEASEHOLD_NODE_ID:-executor}}\" >> {}",
        file.display()
    )
}

/// Three nodes from the shared harness with adverts every 500 ms.
async fn start_three(sandbox: &Sandbox) -> Result<Cluster> {
    let options = ClusterOptions { config: GATE_CONFIG.to_string(), ..Default::default() };
    Cluster::start_with(sandbox, 3, options).await
}

fn read_runs(file: &Path) -> Result<Vec<RunLine>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).context("reading the runs file"),
    };
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            ensure!(parts.len() == 3, "malformed run line {line:?}");
            Ok(RunLine {
                bucket: parts[0].parse().with_context(|| format!("bucket of {line:?}"))?,
                path: parts[1].to_string(),
                node: parts[2].to_string(),
            })
        })
        .collect()
}

/// Each node's gate as `cluster status --output json` (asked of node 1)
/// shows it: id → (path, reason, intended).
async fn gate_views(
    sandbox: &Sandbox,
    cluster: &Cluster,
) -> Result<BTreeMap<u64, (String, String, String)>> {
    gate_views_of(sandbox, &cluster.node(1)?.addr()).await
}

/// Like [`gate_views`], asking the node at `addr`.
async fn gate_views_of(
    sandbox: &Sandbox,
    addr: &str,
) -> Result<BTreeMap<u64, (String, String, String)>> {
    let run =
        run_cli(sandbox, &["cluster", "status", "--output", "json"], &[("LEASEHOLD_ADDR", addr)])
            .await?
            .success()?;
    let status = run.json()?;
    let nodes = status["nodes"].as_array().context("status has no nodes")?;
    let mut views = BTreeMap::new();
    for node in nodes {
        let id = node["id"].as_u64().context("node without id")?;
        match gate_of(node) {
            Some(view) => views.insert(id, view),
            None => bail!("node {id} shows no gate decision: {node}"),
        };
    }
    Ok(views)
}

/// One node's gate in `cluster status --output json`: (path, reason,
/// intended), or `None` when it shows none.
fn gate_of(node: &serde_json::Value) -> Option<(String, String, String)> {
    let gate = &node["gate"];
    let text = |field: &str| gate[field].as_str().map(str::to_string);
    Some((text("path")?, text("reason")?, text("intended")?))
}

/// Waits until every node's gate shows `path` with a reason `reason_ok`
/// accepts, and prints what status showed.
async fn wait_gate(
    sandbox: &Sandbox,
    cluster: &Cluster,
    what: &str,
    path: &str,
    reason_ok: impl Fn(u64, &str) -> bool,
) -> Result<BTreeMap<u64, (String, String, String)>> {
    let views = wait_until(what, deadline_in(SWITCH_TIMEOUT), || {
        let look = gate_views(sandbox, cluster);
        let reason_ok = &reason_ok;
        async move {
            let views = match look.await {
                Ok(views) => views,
                Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
            };
            let done = views.len() == 3
                && views.iter().all(|(id, (p, reason, _))| p == path && reason_ok(*id, reason));
            Ok(if done { Check::Done(views) } else { Check::NotYet(format!("{views:?}")) })
        }
    })
    .await?;
    for (id, (path, reason, intended)) in &views {
        eprintln!("status: node {id} gate path={path} intended={intended} reason={reason:?}");
    }
    Ok(views)
}

/// Waits until the runs file holds `count` more runs than `before`, and
/// answers them all.
async fn wait_runs(file: &Path, before: usize, count: usize) -> Result<Vec<RunLine>> {
    let what = format!("{count} more runs in the runs file");
    wait_until(&what, deadline_in(PHASE_TIMEOUT), || async move {
        let runs = read_runs(file)?;
        Ok(if runs.len() >= before + count {
            Check::Done(runs)
        } else {
            Check::NotYet(format!("{} runs", runs.len()))
        })
    })
    .await
}

/// `cron put NAME` of an every-second schedule with `what` it runs, whose
/// catch-up runs every missed tick (up to 100).
fn every_second_catching_up_all<'a>(name: &'a str, what: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["cron", "put", name, "--cron", "* * * * * *"];
    args.extend_from_slice(what);
    args.extend(["--catchup", "all", "--catchup-max", "100"]);
    args
}

/// The buckets of the jobs [`QUEUE_SCHEDULE`] has enqueued (their keys
/// are `cron:NAME:BUCKET`), each with its job's enqueue instant.
async fn queue_job_buckets(sandbox: &Sandbox, addr: &str) -> Result<BTreeMap<u64, u64>> {
    let run = run_cli(
        sandbox,
        &["job", "list", "--queue", REPORTS, "--limit", "1000", "--output", "json"],
        &[("LEASEHOLD_ADDR", addr)],
    )
    .await?
    .success()?;
    let listed = run.json()?;
    let jobs = listed["jobs"].as_array().context("job list has no jobs")?;
    let prefix = format!("cron:{QUEUE_SCHEDULE}:");
    let mut buckets = BTreeMap::new();
    for job in jobs {
        let key = job["idempotency_key"].as_str().context("a cron job without a key")?;
        let bucket = key
            .strip_prefix(&prefix)
            .and_then(|b| b.parse::<u64>().ok())
            .with_context(|| format!("unexpected key {key:?}"))?;
        let enqueued = job["enqueued_at_ms"].as_u64().context("no enqueued_at_ms")?;
        ensure!(buckets.insert(bucket, enqueued).is_none(), "bucket {bucket} enqueued twice");
    }
    Ok(buckets)
}

/// Puts [`QUEUE_SCHEDULE`], every second, enqueueing into [`REPORTS`].
async fn put_queue_schedule(sandbox: &Sandbox, addr: &str) -> Result<()> {
    let args = every_second_catching_up_all(
        QUEUE_SCHEDULE,
        &["--queue", REPORTS, "--payload", "report", "--overlap", "allow"],
    );
    run_cli(sandbox, &args, &[("LEASEHOLD_ADDR", addr)]).await?.success()?;
    Ok(())
}

/// Waits until [`QUEUE_SCHEDULE`] has enqueued the jobs of
/// [`TICKS_PER_PHASE`] ticks at or after `since_ms`, and answers those,
/// each checked to have been enqueued within 5 s of its tick (on time, not
/// caught up later).
async fn wait_queue_jobs(
    sandbox: &Sandbox,
    addr: &str,
    what: &str,
    since_ms: u64,
) -> Result<BTreeMap<u64, u64>> {
    let what = format!("queue jobs enqueued {what}");
    let jobs = wait_until(&what, deadline_in(PHASE_TIMEOUT), || async {
        Ok(match queue_job_buckets(sandbox, addr).await {
            Ok(buckets) => {
                let since: BTreeMap<u64, u64> =
                    buckets.into_iter().filter(|(b, _)| b * 1_000 >= since_ms).collect();
                if since.len() >= TICKS_PER_PHASE {
                    Check::Done(since)
                } else {
                    Check::NotYet(format!("{} jobs", since.len()))
                }
            }
            Err(error) => Check::NotYet(format!("{error:#}")),
        })
    })
    .await?;
    for (bucket, enqueued_ms) in &jobs {
        let late_ms = enqueued_ms.saturating_sub(bucket * 1_000);
        ensure!(late_ms < 5_000, "bucket {bucket} was enqueued {late_ms} ms after its tick");
    }
    Ok(jobs)
}

async fn set_flag(sandbox: &Sandbox, cluster: &Cluster, node: u64, on: bool) -> Result<u64> {
    // Asked of node 1, which passes the change on to the named node.
    let addr = cluster.node(1)?.addr();
    let at_ms = unix_ms()?;
    let node_text = node.to_string();
    run_cli(
        sandbox,
        &[
            "cluster",
            "flags",
            "--node",
            &node_text,
            "--journal-lease",
            if on { "on" } else { "off" },
        ],
        &[("LEASEHOLD_ADDR", addr.as_str())],
    )
    .await?
    .success()?;
    Ok(at_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_flag_moves_the_pool_between_bus_and_journal_and_every_tick_runs_once() -> Result<()> {
    let sandbox = Sandbox::new("gate-flip")?;
    sandbox.run(Duration::from_secs(240), flip_story(&sandbox)).await
}

async fn flip_story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes (adverts every 500 ms)");
    let cluster = start_three(sandbox).await?;
    wait_gate(sandbox, &cluster, "every node on the journal", "journal", |_, reason| {
        reason.contains("all 2 peers advertise journal_lease=true")
    })
    .await?;

    phase("turn node 3's journal_lease off: the whole pool goes to the bus");
    set_flag(sandbox, &cluster, 3, false).await?;
    wait_gate(sandbox, &cluster, "every node on the bus because of node 3", "bus", |id, reason| {
        if id == 3 {
            reason.contains("journal_lease is off on this node")
        } else {
            reason.contains("peer 3 advertises journal_lease=false")
        }
    })
    .await?;

    phase("put an every-second schedule that appends its bucket, path and node");
    let runs_file = sandbox.path().join("runs.txt");
    let command = runs_command(&runs_file);
    let addr = cluster.node(1)?.addr();
    let env = [("LEASEHOLD_ADDR", addr.as_str())];
    run_cli(
        sandbox,
        // Catch-up `all`: were the journal to forget the ticks the bus ran,
        // it would run every one of them again when the pool comes back.
        &every_second_catching_up_all(SCHEDULE, &["--command", &command]),
        &env,
    )
    .await?
    .success()?;
    let bus_runs = wait_runs(&runs_file, 0, TICKS_PER_PHASE).await?;
    ensure!(
        bus_runs.iter().all(|run| run.path == "bus"),
        "a tick ran off the bus while node 3's flag was off: {bus_runs:?}"
    );

    phase("a schedule that enqueues a queue job fires on time while the pool is on the bus");
    // The bus runs commands only; a queue job is written through the
    // journal alone, so such a schedule keeps firing there whatever the
    // pool's path (before, its ticks were skipped until the pool was back).
    let put_ms = unix_ms()?;
    put_queue_schedule(sandbox, &addr).await?;
    let on_bus = wait_queue_jobs(sandbox, &addr, "while the pool is on the bus", 0).await?;
    for bucket in on_bus.keys() {
        ensure!(
            bucket * 1_000 >= put_ms.saturating_sub(1_000),
            "bucket {bucket} is from before the schedule was put (at {put_ms})"
        );
    }
    let views = gate_views(sandbox, &cluster).await?;
    ensure!(
        views.values().all(|(path, _, _)| path == "bus"),
        "the pool left the bus while the queue jobs were checked: {views:?}"
    );

    phase("turn node 3's flag on: the pool moves to the journal within a few heartbeats");
    let on_ms = set_flag(sandbox, &cluster, 3, true).await?;
    let switching = tokio::time::Instant::now();
    wait_gate(sandbox, &cluster, "every node on the journal", "journal", |_, reason| {
        reason.contains("all 2 peers advertise journal_lease=true")
    })
    .await?;
    eprintln!("the pool moved to the journal in {} ms", switching.elapsed().as_millis());
    let before = read_runs(&runs_file)?.len();
    wait_runs(&runs_file, before, TICKS_PER_PHASE).await?;

    phase("turn node 3's flag off again: back to the bus");
    let off_ms = set_flag(sandbox, &cluster, 3, false).await?;
    wait_gate(sandbox, &cluster, "every node on the bus again", "bus", |id, reason| {
        if id == 3 {
            reason.contains("journal_lease is off on this node")
        } else {
            reason.contains("peer 3 advertises journal_lease=false")
        }
    })
    .await?;
    let before = read_runs(&runs_file)?.len();
    wait_runs(&runs_file, before, TICKS_PER_PHASE).await?;

    phase("pause the schedule and let the last runs land");
    run_cli(sandbox, &["cron", "pause", SCHEDULE], &env).await?.success()?;
    run_cli(sandbox, &["cron", "pause", QUEUE_SCHEDULE], &env).await?.success()?;
    let mut last = (usize::MAX, tokio::time::Instant::now());
    let quiet = deadline_in(PHASE_TIMEOUT);
    let runs = wait_until("the runs file to stay unchanged for 3 s", quiet, || {
        let look = read_runs(&runs_file).map(|runs| {
            if runs.len() != last.0 {
                last = (runs.len(), tokio::time::Instant::now());
                Check::NotYet(format!("{} runs", runs.len()))
            } else if last.1.elapsed() >= Duration::from_secs(3) {
                Check::Done(runs)
            } else {
                let quiet_ms = last.1.elapsed().as_millis();
                Check::NotYet(format!("{} runs, quiet for {quiet_ms} ms", runs.len()))
            }
        });
        async move { look }
    })
    .await?;

    phase("judge: every bucket from the first to the last ran exactly once, on the right path");
    let mut by_bucket: BTreeMap<u64, Vec<&RunLine>> = BTreeMap::new();
    for run in &runs {
        by_bucket.entry(run.bucket).or_default().push(run);
    }
    let twice: Vec<_> = by_bucket.iter().filter(|(_, runs)| runs.len() > 1).collect();
    ensure!(twice.is_empty(), "buckets that ran more than once: {twice:?}");
    let (first, last) = match (by_bucket.keys().next(), by_bucket.keys().next_back()) {
        (Some(first), Some(last)) => (*first, *last),
        _ => bail!("no runs at all"),
    };
    let missing: Vec<u64> = (first..=last).filter(|b| !by_bucket.contains_key(b)).collect();
    ensure!(missing.is_empty(), "buckets that never ran between {first} and {last}: {missing:?}");
    // Ticks well before a flip ran on the old path, ticks well after it
    // (settle time plus a second) on the new one; a tick in between may run
    // on either, but only once (checked above).
    let expected = |bucket: u64| {
        let tick_ms = bucket * 1_000;
        if tick_ms < on_ms {
            Some("bus")
        } else if tick_ms >= on_ms + SETTLE_MS + 1_000 && tick_ms < off_ms {
            Some("journal")
        } else if tick_ms >= off_ms + SETTLE_MS + 1_000 {
            Some("bus")
        } else {
            None
        }
    };
    for run in &runs {
        if let Some(path) = expected(run.bucket) {
            ensure!(
                run.path == path,
                "bucket {} ran on {} (node {}), expected {path}",
                run.bucket,
                run.path,
                run.node
            );
        }
    }
    let journal_runs = runs.iter().filter(|r| r.path == "journal").count();
    ensure!(journal_runs >= TICKS_PER_PHASE, "only {journal_runs} journal runs: {runs:?}");
    eprintln!(
        "{} buckets {first}..={last}, each exactly once ({journal_runs} on the journal)",
        runs.len()
    );
    // The queue-job schedule fired every tick from its first to its last
    // across both flips, each once (a job per key; a second is refused).
    let queued = queue_job_buckets(sandbox, &addr).await?;
    let (first, last) = match (queued.keys().next(), queued.keys().next_back()) {
        (Some(first), Some(last)) => (*first, *last),
        _ => bail!("no queue jobs at all"),
    };
    let missing: Vec<u64> = (first..=last).filter(|b| !queued.contains_key(b)).collect();
    ensure!(
        missing.is_empty(),
        "queue-job ticks never fired between {first} and {last}: {missing:?}"
    );
    eprintln!("queue-job schedule: buckets {first}..={last}, {} jobs", queued.len());

    phase("metrics count decisions by path and reason");
    let metrics = http_get(cluster.node(1)?.http, "/metrics").await?;
    for labels in
        ["path=\"bus\",reason=\"peer_incapable\"", "path=\"journal\",reason=\"all_capable\""]
    {
        ensure!(
            metrics
                .lines()
                .any(|l| l.starts_with("leasehold_gate_decisions_total{") && l.contains(labels)),
            "no gate decision metric with {labels}"
        );
    }
    Ok(())
}

/// One member of three down longer than `advert_stale_after_ms` puts the
/// pool on the bus (SPEC §4: a stale advert is not trusted), yet a schedule
/// that enqueues a queue job goes on firing, on time, on the journal the
/// two others still form (SPEC §7.4: at least once while a quorum is up).
///
/// Mutation check: with the driver asking the gate for such a schedule's
/// ticks again (they are refused on the bus as `not_a_command`), this story
/// fails with no job enqueued after the member went stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_down_past_staleness_does_not_stop_a_queue_job_schedule() -> Result<()> {
    let sandbox = Sandbox::new("gate-stale-member")?;
    sandbox.run(Duration::from_secs(150), stale_member_story(&sandbox)).await
}

async fn stale_member_story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes (adverts every 500 ms, stale after 3 s)");
    let config = format!("{GATE_CONFIG}advert_stale_after_ms = 3000\n");
    let options = ClusterOptions { config, ..Default::default() };
    let mut cluster = Cluster::start_with(sandbox, 3, options).await?;
    let leader = cluster.wait_leader_among(&[1, 2, 3], Duration::from_secs(15)).await?;
    let down = if leader == 3 { 2 } else { 3 };
    let addr = cluster.node(leader)?.addr();
    put_queue_schedule(sandbox, &addr).await?;

    phase("SIGKILL a follower and wait until the leader counts its advert as stale");
    cluster.node_mut(down)?.kill()?;
    let what = format!("node {leader} on the bus because node {down}'s advert is stale");
    wait_until(&what, deadline_in(Duration::from_secs(20)), || async {
        Ok(match own_gate(sandbox, &addr, leader).await {
            Ok(Some((path, reason, _))) if path == "bus" && reason.contains("too old to trust") => {
                eprintln!("status: node {leader} gate path={path} reason={reason:?}");
                Check::Done(())
            }
            Ok(other) => Check::NotYet(format!("{other:?}")),
            Err(error) => Check::NotYet(format!("{error:#}")),
        })
    })
    .await?;
    let stale_ms = unix_ms()?;

    phase("the queue-job schedule goes on firing on time");
    let fired =
        wait_queue_jobs(sandbox, &addr, "for ticks after the member went stale", stale_ms).await?;
    match own_gate(sandbox, &addr, leader).await? {
        Some((path, reason, _)) => {
            ensure!(path == "bus", "the pool left the bus meanwhile: {path} ({reason})")
        }
        None => bail!("node {leader} shows no gate"),
    }
    eprintln!("{} ticks fired with node {down} down and the pool on the bus", fired.len());
    Ok(())
}

/// A schedule turned from `any` to `each` while its ticks run on the bus
/// runs no tick twice on a node: the tick its `any` winner ran just before
/// the change is not taken again as every member's share. (The claimant's
/// own check of the target after its record, for a change that lands
/// between its claim and its record, is a core unit test's: this story's
/// changes come right after a run.)
///
/// Mutation check: with a node taking shares of the records it finds when
/// it first sees a schedule as `each` (`see_each` doing nothing), this
/// story fails with a bucket run twice on one node at every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_turned_each_on_the_bus_runs_no_tick_twice_on_a_node() -> Result<()> {
    let sandbox = Sandbox::new("gate-retarget")?;
    sandbox.run(Duration::from_secs(180), retarget_story(&sandbox)).await
}

async fn retarget_story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes and put the pool on the bus (node 3's flag off)");
    let cluster = start_three(sandbox).await?;
    set_flag(sandbox, &cluster, 3, false).await?;
    wait_gate(sandbox, &cluster, "every node on the bus", "bus", |_, _| true).await?;

    phase("an every-second command, turned any → each → any … while it runs");
    let runs_file = sandbox.path().join("runs.txt");
    let command = runs_command(&runs_file);
    let addr = cluster.node(1)?.addr();
    let env = [("LEASEHOLD_ADDR", addr.as_str())];
    let name = "gate-retarget";
    for target in ["any", "each", "any", "each", "any", "each"] {
        let before = read_runs(&runs_file)?.len();
        let mut args = every_second_catching_up_all(name, &["--command", &command]);
        args.extend(["--target", target]);
        run_cli(sandbox, &args, &env).await?.success()?;
        // A few ticks under each target, the change at a tick's run.
        wait_runs(&runs_file, before, 3).await?;
    }
    run_cli(sandbox, &["cron", "pause", name], &env).await?.success()?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    phase("judge: no node ran a bucket twice");
    let runs = read_runs(&runs_file)?;
    let mut by_node: BTreeMap<(u64, String), usize> = BTreeMap::new();
    for run in &runs {
        *by_node.entry((run.bucket, run.node.clone())).or_default() += 1;
    }
    let twice: Vec<_> = by_node.iter().filter(|(_, count)| **count > 1).collect();
    ensure!(twice.is_empty(), "buckets a node ran more than once: {twice:?} of {runs:?}");
    let shared = runs.iter().map(|r| r.bucket).collect::<std::collections::BTreeSet<_>>();
    ensure!(runs.len() > shared.len(), "no tick ran as each member's share: {runs:?}");
    eprintln!("{} runs of {} buckets, none twice on a node", runs.len(), shared.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_advert_changes_nothing_and_is_counted() -> Result<()> {
    let sandbox = Sandbox::new("gate-forged-advert")?;
    sandbox.run(Duration::from_secs(150), forged_story(&sandbox)).await
}

/// Signs an advert as a peer would, with `secret`.
fn signed_advert(secret: &[u8], advert: &v1::Advert) -> Result<v1::Signed> {
    use hmac::Mac;
    let body = advert.encode_to_vec();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret)
        .map_err(|_| anyhow::anyhow!("HMAC key"))?;
    mac.update(b"leasehold.advert.v1");
    mac.update(&[0]);
    mac.update(&body);
    Ok(v1::Signed { body, mac: mac.finalize().into_bytes().to_vec() })
}

/// A Peer client of `node` whose calls carry the node proof of `as_node`
/// (computed from `secret`), or none.
fn peer_client(
    node: &Node,
    proof: Option<(u64, &str)>,
) -> Result<PeerClient<InterceptedService<tonic::transport::Channel, ProofHeader>>> {
    let channel = Endpoint::from_shared(node.addr())?.timeout(RPC_TIMEOUT).connect_lazy();
    let header = match proof {
        Some((id, secret)) => Some(
            leasehold_security::ClusterSecret::from_text(secret)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .node_proof(id)
                .parse()?,
        ),
        None => None,
    };
    Ok(PeerClient::with_interceptor(channel, ProofHeader(header)))
}

/// Adds a node proof to every call (as a node's own peer channel does).
#[derive(Clone)]
struct ProofHeader(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for ProofHeader {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(proof) = &self.0 {
            request.metadata_mut().insert(NODE_PROOF_HEADER, proof.clone());
        }
        Ok(request)
    }
}

async fn forged_story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes; all on the journal");
    let cluster = start_three(sandbox).await?;
    wait_gate(sandbox, &cluster, "every node on the journal", "journal", |_, reason| {
        reason.contains("all 2 peers advertise journal_lease=true")
    })
    .await?;
    let node = cluster.node(1)?;
    let rejected_before = rejected_count(node.http).await?;
    let refused_before = auth_refused_count(node.http).await?;
    let now_ms = unix_ms()?;
    let advert = |node_id: u64, sent_at_ms: u64| v1::Advert {
        node_id,
        version: "forger".into(),
        journal_lease: Some(false),
        sent_at_ms,
        ..Default::default()
    };

    phase("a caller without the node proof never reaches the Peer service");
    let mut stranger = peer_client(node, None)?;
    let signed = signed_advert(CLUSTER_SECRET.as_bytes(), &advert(2, now_ms))?;
    let answer = stranger.advertise(signed).await;
    ensure!(
        matches!(&answer, Err(status) if status.code() == tonic::Code::Unauthenticated
            && status.message().contains("leasehold-node-proof")),
        "an advert without a node proof was answered {answer:?}"
    );
    let wrong_proof = peer_client(node, Some((2, "not-the-cluster-secret-at-all")))?;
    let answer = wrong_proof.clone().advertise(signed_advert(b"x", &advert(2, now_ms))?).await;
    ensure!(
        matches!(&answer, Err(status) if status.code() == tonic::Code::Unauthenticated),
        "an advert with another cluster's node proof was answered {answer:?}"
    );

    phase("node 9's proof cannot speak for node 2, and a bad MAC is refused");
    let mut nine = peer_client(node, Some((9, CLUSTER_SECRET)))?;
    let as_two = signed_advert(CLUSTER_SECRET.as_bytes(), &advert(2, now_ms + 3_600_000))?;
    let answer = nine.advertise(as_two).await;
    ensure!(
        matches!(&answer, Err(status) if status.code() == tonic::Code::PermissionDenied),
        "node 9 speaking for node 2 was answered {answer:?}"
    );
    for mac_secret in ["not-the-cluster-secret-at-all", "another-wrong-secret!!"] {
        let forged = signed_advert(mac_secret.as_bytes(), &advert(9, now_ms + 3_600_000))?;
        let answer = nine.advertise(forged).await;
        ensure!(
            matches!(&answer, Err(status) if status.code() == tonic::Code::Unauthenticated),
            "a forged advert was answered {answer:?}"
        );
    }
    let unsigned = v1::Signed { body: advert(9, now_ms).encode_to_vec(), mac: Vec::new() };
    ensure!(nine.advertise(unsigned).await.is_err(), "an unsigned advert was taken");

    phase("node 1's registry and decision are unchanged, and the drops are counted");
    let views = gate_views(sandbox, &cluster).await?;
    ensure!(
        views.get(&1).is_some_and(|(path, reason, _)| path == "journal"
            && reason.contains("all 2 peers advertise journal_lease=true")),
        "node 1's decision changed: {views:?}"
    );
    let status = node.local_status().await?;
    ensure!(
        status.adverts.iter().all(|a| a.node_id != 9 && a.journal_lease == Some(true)),
        "node 1 holds a forged advert: {:?}",
        status.adverts
    );
    ensure!(
        status.adverts_rejected >= 4,
        "status counts {} rejected adverts",
        status.adverts_rejected
    );
    let rejected_after = rejected_count(node.http).await?;
    ensure!(
        rejected_after >= rejected_before + 4,
        "metrics count {rejected_after} dropped adverts, {rejected_before} before the forgeries"
    );
    let refused_after = auth_refused_count(node.http).await?;
    ensure!(
        refused_after >= refused_before + 2,
        "metrics count {refused_after} refused Peer calls, {refused_before} before"
    );

    phase("control: node 9's own advert, signed with the cluster secret, is acted on");
    nine.advertise(signed_advert(CLUSTER_SECRET.as_bytes(), &advert(9, unix_ms()?))?)
        .await
        .context("a correctly signed advert was refused")?;
    let views = gate_views(sandbox, &cluster).await?;
    ensure!(
        views.get(&1).is_some_and(|(path, reason, _)| path == "bus"
            && reason.contains("peer 9 advertises journal_lease=false")),
        "node 1 did not act on a valid advert: {views:?}"
    );
    Ok(())
}

/// The sum of a counter family's samples whose line contains every one of
/// `labels`, from a node's /metrics.
async fn counter_sum(http: SocketAddr, family: &str, labels: &[&str]) -> Result<u64> {
    let metrics = http_get(http, "/metrics").await?;
    let mut total = 0;
    for line in metrics.lines().filter(|l| {
        l.starts_with(&format!("{family}{{")) && labels.iter().all(|label| l.contains(label))
    }) {
        total += line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .with_context(|| format!("metric line {line:?}"))?;
    }
    Ok(total)
}

/// Adverts a node dropped, for any reason.
async fn rejected_count(http: SocketAddr) -> Result<u64> {
    counter_sum(http, "leasehold_peer_messages_rejected_total", &["kind=\"advert\""]).await
}

/// Peer calls a node refused before they reached the service.
async fn auth_refused_count(http: SocketAddr) -> Result<u64> {
    counter_sum(http, "leasehold_auth_refused_total", &["service=\"leasehold.v1.Peer\""]).await
}

/// A plain HTTP/1.0 GET, answering the body.
async fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await?;
        anyhow::Ok(reply)
    };
    let reply = tokio::time::timeout(RPC_TIMEOUT, exchange).await.context("HTTP timeout")??;
    let (_, body) = reply.split_once("\r\n\r\n").context("HTTP reply without a body")?;
    Ok(body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_stays_on_the_bus_and_logs_the_intended_journal_claims() -> Result<()> {
    let sandbox = Sandbox::new("gate-dry-run")?;
    sandbox.run(Duration::from_secs(120), dry_run_story(&sandbox)).await
}

/// Waits until node 1 alone shows `path` and `intended` with a reason
/// containing `reason`.
async fn wait_own_gate(
    sandbox: &Sandbox,
    addr: &str,
    path: &str,
    intended: &str,
    reason: &str,
) -> Result<()> {
    let what = format!("node 1 on {path} (intended {intended}, reason {reason:?})");
    // Adverts every second by default: a change settles in 3 s.
    wait_until(&what, deadline_in(Duration::from_secs(10)), || async move {
        let views = match gate_views_of(sandbox, addr).await {
            Ok(views) => views,
            Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
        };
        Ok(match views.get(&1) {
            Some((p, r, i)) if p == path && i == intended && r.contains(reason) => {
                eprintln!("status: node 1 gate path={p} intended={i} reason={r:?}");
                Check::Done(())
            }
            other => Check::NotYet(format!("{other:?}")),
        })
    })
    .await
}

async fn dry_run_story(sandbox: &Sandbox) -> Result<()> {
    phase("one node, dry-run on: bus, intending the journal");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let env = [("LEASEHOLD_ADDR", addr.as_str())];
    run_cli(sandbox, &["cluster", "flags", "--node", "1", "--dry-run", "on"], &env)
        .await?
        .success()?;
    wait_own_gate(sandbox, &addr, "bus", "journal", "dry-run (would decide: no peers)").await?;

    phase("an every-second schedule runs on the bus, and the journal claims are logged");
    let runs_file = sandbox.path().join("runs.txt");
    let command = runs_command(&runs_file);
    let name = "dry-run-every-second";
    run_cli(sandbox, &["cron", "put", name, "--cron", "* * * * * *", "--command", &command], &env)
        .await?
        .success()?;
    // A command for hosts tagged `rack:nowhere`: this node does not claim
    // with that tag, so the schedule's ticks are refused on the bus
    // (`no_target`) and leave no record.
    let untargeted = "dry-run-untargeted";
    run_cli(
        sandbox,
        &[
            "cron",
            "put",
            untargeted,
            "--cron",
            "* * * * * *",
            "--command",
            "true",
            "--tag",
            "rack:nowhere",
        ],
        &env,
    )
    .await?
    .success()?;
    let runs = wait_runs(&runs_file, 0, 3).await?;
    ensure!(runs.iter().all(|r| r.path == "bus"), "a dry-run tick left the bus: {runs:?}");
    let log = std::fs::read_to_string(node.log().context("node log")?)?;
    let intended = format!("intended_claim=\"cron:{name}:");
    ensure!(
        log.lines().any(|l| l.contains("gate.decide") && l.contains(&intended)),
        "the node log names no intended journal claim ({intended})"
    );

    phase("dry-run off: the node moves to the journal");
    // Switch away from a second's start, so the first journal round comes
    // before the next tick (the check on the untargeted schedule below
    // needs the newest due tick to be one the bus refused).
    let into_second = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_millis();
    let wait_ms = (1_200 - u64::from(into_second)) % 1_000;
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    run_cli(sandbox, &["cluster", "flags", "--node", "1", "--dry-run", "off"], &env)
        .await?
        .success()?;
    wait_own_gate(sandbox, &addr, "journal", "journal", "no peers").await?;
    let before = read_runs(&runs_file)?.len();
    let runs = wait_runs(&runs_file, before + 1, 2).await?;
    ensure!(
        runs[before + 1..].iter().all(|r| r.path == "journal"),
        "ticks after the switch did not run on the journal: {runs:?}"
    );
    run_cli(sandbox, &["cron", "pause", name], &env).await?.success()?;

    phase("back on the journal, the last tick the bus refused fires at once");
    // The untargeted schedule's ticks were refused on the bus and left no
    // record. On the journal the leader plans from the journal's records:
    // the newest of those ticks is still current (under 5 s old), so it
    // fires, and the older ones are skipped as one catch-up record. Planned
    // from the last tick decided on the bus instead, nothing would fire
    // until the next tick after the switch.
    let last_bus = read_runs(&runs_file)?
        .iter()
        .filter(|r| r.path == "bus")
        .map(|r| r.bucket)
        .max()
        .context("no tick ran on the bus")?;
    let schedules = node.schedules_stub()?;
    let history = wait_until(
        "the untargeted schedule to fire on the journal",
        deadline_in(Duration::from_secs(10)),
        || {
            let mut schedules = schedules.clone();
            async move {
                let schedule = schedules
                    .get(v1::GetScheduleRequest { name: untargeted.to_string(), stale: false })
                    .await
                    .context("get the untargeted schedule")?
                    .into_inner();
                Ok(if schedule.history.iter().any(|r| r.outcome == "fired") {
                    Check::Done(schedule.history)
                } else {
                    Check::NotYet(format!("{:?}", schedule.history))
                })
            }
        },
    )
    .await?;
    let first_fired = history.iter().find(|r| r.outcome == "fired").map(|r| r.bucket);
    ensure!(
        first_fired.is_some_and(|bucket| bucket <= last_bus),
        "the first fire was of bucket {first_fired:?}, after the last bus tick {last_bus}: \
         {history:?}"
    );
    run_cli(sandbox, &["cron", "pause", untargeted], &env).await?.success()?;
    Ok(())
}

/// A node restarted while another member is down judges that member by its
/// last advert, as the nodes that stayed up do: the pool stays on the
/// journal. Were the restarted node's registry empty, it alone would count
/// the dead member as "never heard from" and go to the bus — a split pool
/// (seen once in the cron leader-kill story, where the restarted node
/// became leader and recorded ticks nobody ran as run on the bus).
///
/// Mutation check: with the registry not read back from disk at start
/// (`PeerRegistry::new` in place of `with_store`), this story fails with
/// node 1 on the bus, "peer 3 was never heard from".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_judges_a_dead_member_by_its_last_advert() -> Result<()> {
    let sandbox = Sandbox::new("gate-restart")?;
    sandbox.run(Duration::from_secs(120), restart_story(&sandbox)).await
}

/// Node `id`'s own gate decision as node `id` reports it in status:
/// (path, reason, intended), or `None` while it shows none.
async fn own_gate(
    sandbox: &Sandbox,
    addr: &str,
    id: u64,
) -> Result<Option<(String, String, String)>> {
    let run =
        run_cli(sandbox, &["cluster", "status", "--output", "json"], &[("LEASEHOLD_ADDR", addr)])
            .await?
            .success()?;
    let status = run.json()?;
    let nodes = status["nodes"].as_array().context("status has no nodes")?;
    Ok(nodes.iter().find(|node| node["id"].as_u64() == Some(id)).and_then(gate_of))
}

async fn restart_story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes (adverts every 500 ms); all on the journal");
    let mut cluster = start_three(sandbox).await?;
    wait_gate(sandbox, &cluster, "every node on the journal", "journal", |_, reason| {
        reason.contains("all 2 peers advertise journal_lease=true")
    })
    .await?;

    phase("SIGKILL node 3, then restart node 1 while node 3 stays down");
    cluster.node_mut(3)?.kill()?;
    cluster.restart(sandbox, 1).await?;

    phase("node 1 decides the journal, counting node 3 by its last advert");
    // Past the restarted node's warm-up (three intervals) and a few more
    // adverts from node 2, node 1 must still be on the journal.
    tokio::time::sleep(Duration::from_millis(3 * 500 + 1_000)).await;
    let addr = cluster.node(1)?.addr();
    let seen = wait_until("node 1 to show its gate", deadline_in(Duration::from_secs(10)), || {
        let look = own_gate(sandbox, &addr, 1);
        async move {
            Ok(match look.await {
                Ok(Some(view)) => Check::Done(view),
                Ok(None) => Check::NotYet("no gate shown yet".to_string()),
                Err(error) => Check::NotYet(format!("{error:#}")),
            })
        }
    })
    .await?;
    let (path, reason, intended) = seen;
    eprintln!("status: node 1 gate path={path} intended={intended} reason={reason:?}");
    ensure!(
        path == "journal" && intended == "journal",
        "restarted node 1 split the pool: path {path}, intended {intended}, reason {reason:?}"
    );
    ensure!(!reason.contains("never heard"), "node 1 forgot node 3: {reason:?}");
    Ok(())
}
