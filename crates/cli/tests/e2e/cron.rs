//! Goal: cron schedules keep the promise of issue 4 with real node
//! processes — every tick of a schedule fires exactly once fleet-wide
//! through leader kills (SPEC §7 guarantee 4), missed ticks follow the
//! catch-up policy instead of flooding the fleet, `overlap = skip` never
//! runs two instances at once, and bad expressions and zones are refused
//! by name (SPEC §2 Schedule, §3 Fire/Skip and the leader's tickers).
//!
//! Method: every story judges by two independent records — what the
//! commands themselves wrote (the built-in executor runs them under `sh -c`
//! and each appends `$LEASEHOLD_BUCKET` and friends to a file in the
//! sandbox) and what the journal says (`leasehold cron history --output
//! json`). Long outages are simulated by restarting a node with its clock
//! skewed ahead (`clock_offset_ms` under `fault_injection`), so no test
//! waits for minutes.
//!
//! The nodes are the shared harness's (`support.rs`): a [`Cluster`] whose
//! nodes run with long election timeouts, or one [`Node`] restarted with its
//! clock skewed by a new configuration file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use leasehold_client::{Client, RetryPolicy};
use leasehold_core::schedule::{HISTORY_LEN, LATE_AFTER_MS};
use leasehold_node::driver::TICK_TOLERANCE_MS;
use leasehold_proto::v1;
use serde_json::Value;
use tokio::time::Instant;

use super::support::{
    Check, CliRun, Cluster, ClusterOptions, Node, RPC_TIMEOUT, Sandbox, deadline_in, phase,
    run_cli, wait_until,
};

/// The built-in executor's queue: command jobs of schedules land here.
const EXEC_QUEUE: &str = "exec";
/// How long a node started by these tests may take to serve.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a drained node may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the fired jobs of a story may take to be run and acked once the
/// schedule is paused.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Story 1: an every-second schedule on three nodes, leader SIGKILLed twice.
// ---------------------------------------------------------------------------

/// Election timeouts of the three-node cluster. Longer than the default
/// (0.5–1 s) on purpose: a failover then leaves a gap of several ticks, so
/// the catch-up of the new leader is visible in history as late fires
/// rather than hidden inside one tick. The kill lands at least 400 ms into
/// a second and no follower stands for election before 3 s of silence
/// (less one 150 ms heartbeat), so the first tick after a kill fires at
/// least 2.25 s late: `late` by construction.
const FAILOVER_CONFIG: &str = "election_timeout_min_ms = 3000\nelection_timeout_max_ms = 4000\n";
/// Ticks fired before the first kill, and after each restart before the
/// next kill.
const TICKS_BETWEEN_KILLS: u64 = 6;
/// Leader kills in the story.
const KILLS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_second_schedule_survives_leader_kills() -> Result<()> {
    let sandbox = Sandbox::new("cron-leader-kills")?;
    sandbox.run(Duration::from_secs(150), leader_kills_story(&sandbox)).await
}

/// What one leader kill did, for the failover report.
struct Kill {
    node: u64,
    /// The bucket the killed leader had just fired.
    bucket: u64,
    /// Wall clock of the kill, Unix ms.
    at_ms: u64,
    /// The leader that took over.
    successor: u64,
    /// Seconds from the kill until the successor was seen serving.
    failover_s: f64,
}

/// Three nodes, every one running the built-in executor, and one
/// every-second schedule whose command appends its bucket to one shared
/// file. The leader is SIGKILLed between two ticks and restarted on its
/// data, twice; the new leader must pick up from the journal's
/// `last_fired_bucket` and fire the ticks of the failover gap late (catch-up
/// `all`). Paused after about 25 s, the file must hold every bucket from the
/// first fired to the last exactly once, each as the job history names.
async fn leader_kills_story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster (election timeouts 3-4 s)");
    let mut cluster = start_three_nodes(sandbox).await?;
    let runs_file = sandbox.path().join("runs.txt");
    const NAME: &str = "every-second";

    phase("put an every-second schedule: overlap allow, catch-up all (max 100)");
    let put_ms = unix_ms()?;
    let command = append_run_command(&runs_file);
    cli(
        sandbox,
        &cluster.node(1)?.addr(),
        &[
            "cron",
            "put",
            NAME,
            "--cron",
            "* * * * * *",
            "--command",
            &command,
            "--overlap",
            "allow",
            "--catchup",
            "all",
            "--catchup-max",
            "100",
            // Short leases, so a lease stranded by a kill (a grant committed
            // but never delivered) is swept and redelivered in seconds.
            "--lease-ttl-ms",
            "5000",
        ],
    )
    .await?
    .success()?;
    let client = quiet_client(&cluster.node(1)?.addr())?;
    let created_at_ms = wait_until("the schedule to read back", deadline_in(RPC_TIMEOUT), || {
        let client = client.clone();
        async move {
            Ok(match schedule_of(&client, NAME, false).await {
                Ok(schedule) => Check::Done(schedule.created_at_ms),
                Err(error) => Check::NotYet(format!("{error:#}")),
            })
        }
    })
    .await?;
    ensure!(created_at_ms >= put_ms, "created_at_ms {created_at_ms} before the put at {put_ms}");

    let first = wait_fired_up_to(cluster.nodes_mut(), NAME, 0, "the first tick").await?;
    let before_kills = first + TICKS_BETWEEN_KILLS;
    wait_fired_up_to(cluster.nodes_mut(), NAME, before_kills, "ticks before the first kill")
        .await?;

    let mut kills = Vec::new();
    for round in 1..=KILLS {
        phase(&format!("kill {round}: SIGKILL the leader between two ticks"));
        let agreed = "a leader all running nodes agree on";
        let leader = wait_for_leader(cluster.nodes_mut(), agreed).await?;
        let (bucket, at_ms) = kill_between_ticks(cluster.node_mut(leader)?, NAME).await?;
        let after_ms = at_ms.saturating_sub(bucket * 1_000);
        eprintln!("killed leader node {leader} {after_ms} ms after the instant of bucket {bucket}");

        phase(&format!("kill {round}: wait for a new leader among the survivors"));
        let killed_at = Instant::now();
        let successor = wait_for_leader(cluster.nodes_mut(), "a new leader after the kill").await?;
        ensure!(successor != leader, "the killed node {leader} is still named leader");
        let failover_s = killed_at.elapsed().as_secs_f64();
        eprintln!("node {successor} leads {failover_s:.1} s after the kill");

        phase(&format!("kill {round}: restart node {leader} on its data dir and ports"));
        let node = cluster.node_mut(leader)?;
        node.launch(sandbox)?;
        wait_serving(node, "the restarted node to rejoin and serve", |l| l != 0).await?;
        kills.push(Kill { node: leader, bucket, at_ms, successor, failover_s });

        let after_restart = bucket + TICKS_BETWEEN_KILLS;
        wait_fired_up_to(cluster.nodes_mut(), NAME, after_restart, "ticks after the restart")
            .await?;
    }

    phase("pause the schedule and wait until every fired job is acked");
    let addr = cluster.node(1)?.addr();
    cli(sandbox, &addr, &["cron", "pause", NAME]).await?.success()?;
    wait_for_paused_record(&quiet_client(&addr)?, NAME).await?;
    let jobs = wait_all_acked(&quiet_client(&addr)?).await?;

    phase("check: every bucket from the first fired to the last ran exactly once");
    let history = history(sandbox, &addr, NAME).await?;
    let fired: Vec<&Tick> = history.iter().filter(|t| t.is_fired()).collect();
    let (Some(first_fired), Some(last_fired)) = (fired.first(), fired.last()) else {
        bail!("no fired tick in history: {history:?}");
    };
    let (first, last) = (first_fired.bucket, last_fired.bucket);
    ensure!(
        history.len() < HISTORY_LEN,
        "history holds {} records, its bound: the oldest may have been dropped",
        history.len()
    );
    ensure!(
        first == created_at_ms / 1_000 + 1,
        "the first fired bucket {first} is not the first tick after the put (created at \
         {created_at_ms} ms)"
    );
    let window: Vec<&Tick> =
        history.iter().filter(|t| (first..=last).contains(&t.bucket)).collect();
    let buckets: Vec<u64> = window.iter().map(|t| t.bucket).collect();
    let expected: Vec<u64> = (first..=last).collect();
    ensure!(
        buckets == expected,
        "history between {first} and {last} is not one record per bucket: {}",
        describe_buckets(&buckets)
    );
    let not_fired: Vec<&&Tick> = window.iter().filter(|t| !t.is_fired()).collect();
    ensure!(not_fired.is_empty(), "catch-up all must fire every missed tick: {not_fired:?}");

    let runs = read_runs(&runs_file)?;
    let by_bucket = runs_by_bucket(&runs);
    check_each_bucket_ran_once(&by_bucket, &expected)?;
    for tick in &window {
        let ran = by_bucket.get(&tick.bucket).and_then(|runs| runs.first()).map(|r| r.job_id);
        ensure!(
            tick.job_ids.len() == 1 && ran == tick.job_ids.first().copied(),
            "bucket {}: history fired jobs {:?}, the command ran as job {ran:?}",
            tick.bucket,
            tick.job_ids
        );
    }
    ensure!(
        jobs == expected.len() as u64,
        "{jobs} jobs exist for {} buckets: a tick enqueued more than one",
        expected.len()
    );

    phase("check: the failover gaps fired late, by the catch-up policy");
    for (round, kill) in kills.iter().enumerate() {
        // The window is one record per bucket (checked above): the gap is
        // the run of ticks after the kill that fired a second or more late.
        let gap: Vec<&&Tick> = window
            .iter()
            .skip_while(|t| t.bucket <= kill.bucket)
            .take_while(|t| t.lag_ms >= 1_000)
            .collect();
        eprintln!(
            "failover {}: node {} killed at {} (+{} ms after firing {}), node {} led after \
             {:.1} s; gap buckets:",
            round + 1,
            kill.node,
            kill.at_ms,
            kill.at_ms.saturating_sub(kill.bucket * 1_000),
            kill.bucket,
            kill.successor,
            kill.failover_s
        );
        for tick in &gap {
            eprintln!(
                "  bucket {} fired lag_ms={} late={} job {:?}",
                tick.bucket, tick.lag_ms, tick.late, tick.job_ids
            );
        }
        let after = window.iter().find(|t| t.bucket == kill.bucket + 1);
        let Some(after) = after else { bail!("no record of bucket {}", kill.bucket + 1) };
        ensure!(
            after.is_fired() && after.late && after.lag_ms >= LATE_AFTER_MS,
            "the first tick after kill {} waited for a new leader and must be fired late: \
             {after:?}",
            round + 1
        );
    }
    Ok(())
}

/// Where in its second a leader may be killed: after the second's tick
/// fired and its command finished, and well before the next tick.
const QUIET_PHASE_MS: std::ops::Range<u64> = 400..850;

/// SIGKILLs `node`, the leader, between two ticks: once this second's tick
/// has fired and every job is acked, in [`QUIET_PHASE_MS`] of the second.
/// Answers the bucket last fired and the kill's wall clock (Unix ms).
///
/// Why between ticks: a node killed after its executor ran a command but
/// before the ack committed loses that ack, and the spec answers a lost
/// ack by redelivering the job once its lease lapses — the command runs a
/// second time (at-least-once execution; the fencing token lets a
/// downstream store refuse the stale writer). That is not a double fire,
/// and this story is about fires, so the kill lands when no command runs.
/// (An earlier version aimed the kill just after a fire and saw exactly
/// that redelivery; the runs check names it apart from a double fire.)
async fn kill_between_ticks(node: &mut Node, name: &str) -> Result<(u64, u64)> {
    let client = quiet_client(&node.addr())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let observed = async {
            let schedule = schedule_of(&client, name, false).await?;
            let stats = client.stats(Some(EXEC_QUEUE.to_string()), false).await?;
            let exec = stats.queues.iter().find(|q| q.queue == EXEC_QUEUE).cloned();
            anyhow::Ok((schedule.last_fired_bucket, exec.unwrap_or_default()))
        }
        .await;
        let now_ms = unix_ms()?;
        // A busy machine may fail a read now and then; only the deadline
        // ends the wait.
        let seen = match observed {
            Ok((bucket, exec)) => {
                let fired_this_second = bucket == now_ms / 1_000;
                let idle = exec.ready + exec.claimed + exec.delayed == 0;
                if fired_this_second && idle && QUIET_PHASE_MS.contains(&(now_ms % 1_000)) {
                    node.kill()?;
                    return Ok((bucket, now_ms));
                }
                format!("last fired bucket {bucket} at {now_ms} ms, exec queue {exec:?}")
            }
            Err(error) => format!("{error:#}"),
        };
        ensure!(
            Instant::now() < deadline,
            "timed out waiting for a quiet moment on leader node {}; last seen: {seen}",
            node.id
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until some running node reports `last_fired_bucket >= bucket`
/// (any fired tick at all when `bucket` is 0), and answers it.
async fn wait_fired_up_to(nodes: &mut [Node], name: &str, bucket: u64, what: &str) -> Result<u64> {
    let what = format!("{what} (last fired bucket >= {bucket})");
    wait_until(&what, deadline_in(Duration::from_secs(40)), || {
        let clients = running_clients(nodes);
        async move {
            let mut seen = Vec::new();
            for client in clients? {
                match schedule_of(&client, name, false).await {
                    Ok(schedule) if schedule.last_fired_bucket > 0 => {
                        if schedule.last_fired_bucket >= bucket {
                            return Ok(Check::Done(schedule.last_fired_bucket));
                        }
                        seen.push(schedule.last_fired_bucket.to_string());
                    }
                    Ok(_) => seen.push("nothing fired".to_string()),
                    Err(error) => seen.push(error.to_string()),
                }
            }
            Ok(Check::NotYet(seen.join("; ")))
        }
    })
    .await
}

/// A command that finishes on a follower while the leader is down runs
/// once. Its ack waits in the executor's retry loop while no leader lives,
/// and its 3 s lease lapses during the 3-4 s election: the new term's lease
/// grace (`TERM_START_GRACE_MS` in core) is what keeps the new leader's
/// first sweep from taking the job back before the ack lands. Without the
/// grace this story fails every time (the job runs again under a new
/// token). The schedule's jobs are tagged for one follower (`node:ID`),
/// whose command takes a second; the leader is killed while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_finishing_during_a_failover_runs_once() -> Result<()> {
    let sandbox = Sandbox::new("cron-ack-during-failover")?;
    sandbox.run(Duration::from_secs(120), ack_during_failover_story(&sandbox)).await
}

async fn ack_during_failover_story(sandbox: &Sandbox) -> Result<()> {
    const NAME: &str = "on-one-follower";
    phase("start a three-node cluster (election timeouts 3-4 s)");
    let mut cluster = start_three_nodes(sandbox).await?;
    let leader = wait_for_leader(cluster.nodes_mut(), "a leader").await?;
    let runner = cluster.ids().into_iter().find(|&id| id != leader).context("no follower")?;
    let started_file = sandbox.path().join("started.txt");
    let runs_file = sandbox.path().join("runs.txt");

    phase(&format!("put an every-second schedule whose 1 s command runs on node {runner} only"));
    let command = format!(
        "echo \"$LEASEHOLD_JOB_ID\" >> '{}'; sleep 1; {}",
        started_file.display(),
        append_run_command(&runs_file)
    );
    let tag = format!("node:{runner}");
    let put = [
        "cron",
        "put",
        NAME,
        "--cron",
        "* * * * * *",
        "--command",
        &command,
        "--tag",
        &tag,
        "--overlap",
        "allow",
        "--catchup",
        "all",
        "--catchup-max",
        "100",
        "--lease-ttl-ms",
        "3000",
    ];
    cli(sandbox, &cluster.node(1)?.addr(), &put).await?.success()?;

    phase(&format!("SIGKILL leader node {leader} while node {runner} runs a command"));
    let running = wait_until("a command in progress", deadline_in(Duration::from_secs(20)), || {
        let started = std::fs::read_to_string(&started_file).unwrap_or_default();
        let runs = read_runs(&runs_file);
        async move {
            let finished: BTreeSet<u64> = runs?.iter().map(|r| r.job_id).collect();
            let running: Vec<u64> = started
                .lines()
                .filter_map(|line| line.trim().parse().ok())
                .filter(|id| !finished.contains(id))
                .collect();
            Ok(match running.last() {
                Some(&job) if finished.len() >= 2 => Check::Done(job),
                _ => Check::NotYet(format!("finished {}, running {running:?}", finished.len())),
            })
        }
    })
    .await?;
    cluster.node_mut(leader)?.kill()?;
    eprintln!("killed node {leader} while job {running} ran on node {runner}");
    wait_for_leader(cluster.nodes_mut(), "a new leader after the kill").await?;
    let node = cluster.node_mut(leader)?;
    node.launch(sandbox)?;
    wait_serving(node, "the restarted node to rejoin and serve", |l| l != 0).await?;
    let addr = node.addr();

    phase("let the lease of the job lapse (3 s), pause, wait for every job to be acked");
    let client = quiet_client(&addr)?;
    wait_until("ten more ticks", deadline_in(Duration::from_secs(30)), || {
        let client = client.clone();
        async move {
            Ok(match schedule_of(&client, NAME, false).await {
                Ok(schedule) if schedule.fired_count >= 15 => Check::Done(()),
                Ok(schedule) => Check::NotYet(format!("fired {}", schedule.fired_count)),
                Err(error) => Check::NotYet(format!("{error:#}")),
            })
        }
    })
    .await?;
    cli(sandbox, &addr, &["cron", "pause", NAME]).await?.success()?;
    wait_for_paused_record(&client, NAME).await?;
    wait_all_acked(&client).await?;

    phase("check: every fired tick ran exactly once");
    let history = history(sandbox, &addr, NAME).await?;
    let fired: Vec<u64> = history.iter().filter(|t| t.is_fired()).map(|t| t.bucket).collect();
    check_each_bucket_ran_once(&runs_by_bucket(&read_runs(&runs_file)?), &fired)
}

// ---------------------------------------------------------------------------
// Story 2: catch-up policies after a long outage.
// ---------------------------------------------------------------------------

/// The schedule the issue names: every second. At a restart its newest due
/// tick is always *current* (less than a second old), so it fires on its
/// own right and every older tick is missed. Under `coalesce` the current
/// run stands for the missed ones, which makes `coalesce` and `skip` plan
/// alike for it: one skip record, then the current tick.
const EVERY_SECOND: &str = "every-second";
/// Every second of the first half of each minute. The tick-less half is
/// what lets a restart see *only* missed ticks, so `coalesce` (run the
/// newest missed tick once) and `skip` (run none) differ, and a test can
/// tell them apart.
const HALF_MINUTE: &str = "half-minute";
/// [`HALF_MINUTE`]'s expression.
const HALF_MINUTE_CRON: &str = "0-29 * * * * *";
/// Ticks per minute of [`HALF_MINUTE_CRON`].
const TICKS_PER_MINUTE: u64 = 30;
/// How far the node's clock jumps while it is down (plus up to a minute
/// to align it, below): five minutes, 300 missed every-second ticks —
/// three times Kubernetes' 100-missed-run cliff.
const OUTAGE_MS: i64 = 300_000;
/// Where in its minute the restarted node's clock starts: 8 s past the
/// last tick of the half-minute (second 29), so that tick is already
/// missed, with 22 s to spare before the next minute's first tick.
const RESTART_SECOND_MS: i64 = 37_000;
/// `--catchup-max` of the `all` story.
const CATCHUP_MAX: u64 = 20;

/// The catch-up policy under test.
#[derive(Clone, Copy, Debug)]
enum Policy {
    Coalesce,
    Skip,
    All,
}

impl Policy {
    fn flag(self) -> &'static str {
        match self {
            Policy::Coalesce => "coalesce",
            Policy::Skip => "skip",
            Policy::All => "all",
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_coalesce_runs_the_newest_missed_tick_once() -> Result<()> {
    let sandbox = Sandbox::new("cron-catchup-coalesce")?;
    sandbox.run(Duration::from_secs(120), catchup_story(&sandbox, Policy::Coalesce)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_skip_runs_none_of_the_missed_ticks() -> Result<()> {
    let sandbox = Sandbox::new("cron-catchup-skip")?;
    sandbox.run(Duration::from_secs(120), catchup_story(&sandbox, Policy::Skip)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_all_runs_at_most_catchup_max_missed_ticks() -> Result<()> {
    let sandbox = Sandbox::new("cron-catchup-all")?;
    sandbox.run(Duration::from_secs(120), catchup_story(&sandbox, Policy::All)).await
}

/// One node and two schedules under `policy` ([`EVERY_SECOND`] and
/// [`HALF_MINUTE`]); a couple of ticks fire, the node drains and stops,
/// and comes back with its clock five minutes (and up to one more, to land
/// in the tick-less half of a minute) ahead. The restarted leader plans
/// every missed tick at once; the story checks each plan record by record
/// against what the policy promises, in history and in the commands' own
/// output: a bounded number of runs, never hundreds.
async fn catchup_story(sandbox: &Sandbox, policy: Policy) -> Result<()> {
    let runs_file = |name: &str| sandbox.path().join(format!("runs-{name}.txt"));

    phase("start node 1 with its clock at second 1 of a minute");
    let first_offset_ms = {
        let now_ms = unix_ms_signed()?;
        (61_000 - now_ms.rem_euclid(60_000)).rem_euclid(60_000)
    };
    let config = write_config(sandbox, "clock-1.toml", &clock_config(first_offset_ms))?;
    let mut node = Node::new(sandbox, 1, Some(config), None)?;
    node.launch(sandbox)?;
    wait_serving(&mut node, "node 1 to lead and serve reads", |l| l == 1).await?;

    phase(&format!("put both schedules with catch-up {}", policy.flag()));
    let catchup_max = CATCHUP_MAX.to_string();
    for (name, cron) in [(EVERY_SECOND, "* * * * * *"), (HALF_MINUTE, HALF_MINUTE_CRON)] {
        let command = append_run_command(&runs_file(name));
        let mut args = vec!["cron", "put", name, "--cron", cron, "--command", &command];
        args.extend(["--overlap", "allow", "--catchup", policy.flag()]);
        if let Policy::All = policy {
            args.extend(["--catchup-max", &catchup_max]);
        }
        cli(sandbox, &node.addr(), &args).await?.success()?;
    }

    phase("let two half-minute ticks fire, then stop the node (SIGTERM: drain, exit)");
    let client = quiet_client(&node.addr())?;
    wait_until("two fired half-minute ticks", deadline_in(Duration::from_secs(70)), || {
        let client = client.clone();
        async move {
            let schedule = match schedule_of(&client, HALF_MINUTE, false).await {
                Ok(schedule) => schedule,
                Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
            };
            Ok(if schedule.fired_count >= 2 {
                Check::Done(())
            } else {
                Check::NotYet(format!("fired {}", schedule.fired_count))
            })
        }
    })
    .await?;
    node.stop(deadline_in(STOP_TIMEOUT)).await?;
    let stopped_ms = unix_ms_signed()?;
    // Every bucket fired before the stop lies at or below this one; every
    // bucket of the restarted node lies five minutes beyond it.
    let stopped_bucket = u64::try_from((stopped_ms + first_offset_ms) / 1_000)?;

    phase("restart node 1 with its clock 5-6 minutes ahead, in a tick-less half-minute");
    let (second_offset_ms, newest_missed) = {
        let now_ms = unix_ms_signed()?;
        let jumped_ms = now_ms + first_offset_ms + OUTAGE_MS;
        let align_ms = (RESTART_SECOND_MS - jumped_ms.rem_euclid(60_000)).rem_euclid(60_000);
        let offset_ms = first_offset_ms + OUTAGE_MS + align_ms;
        let node_now_ms = now_ms + offset_ms;
        let minute_s = u64::try_from(node_now_ms.div_euclid(60_000) * 60)?;
        (offset_ms, minute_s + TICKS_PER_MINUTE - 1)
    };
    let config = write_config(sandbox, "clock-2.toml", &clock_config(second_offset_ms))?;
    node.config = Some(config);
    let restarted_ms = unix_ms_signed()?;
    node.launch(sandbox)?;
    wait_serving(&mut node, "node 1 to lead again", |l| l == 1).await?;
    eprintln!(
        "node clock offset {first_offset_ms} ms before the stop, {second_offset_ms} ms after"
    );

    phase("wait for the restarted leader to plan the missed ticks, then pause both");
    let client = quiet_client(&node.addr())?;
    for name in [EVERY_SECOND, HALF_MINUTE] {
        wait_until(
            &format!("{name}: the ticks up to bucket {newest_missed} to be planned"),
            deadline_in(Duration::from_secs(20)),
            || {
                let client = client.clone();
                async move {
                    let schedule = match schedule_of(&client, name, false).await {
                        Ok(schedule) => schedule,
                        Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
                    };
                    Ok(if schedule.last_fired_bucket >= newest_missed {
                        Check::Done(())
                    } else {
                        Check::NotYet(format!("last fired bucket {}", schedule.last_fired_bucket))
                    })
                }
            },
        )
        .await?;
    }
    // The restarted leader's first plan ran between these two instants of
    // its clock: its current tick lies between them.
    let planned_between = u64::try_from((restarted_ms + second_offset_ms) / 1_000)?
        ..=u64::try_from((unix_ms_signed()? + second_offset_ms) / 1_000)?;
    for name in [EVERY_SECOND, HALF_MINUTE] {
        cli(sandbox, &node.addr(), &["cron", "pause", name]).await?.success()?;
    }
    wait_for_paused_record(&client, EVERY_SECOND).await?;
    let jobs = wait_all_acked(&client).await?;

    let mut fired_jobs = 0;
    for name in [EVERY_SECOND, HALF_MINUTE] {
        phase(&format!("{name}: check the plan of the missed ticks, record by record"));
        let history = history(sandbox, &node.addr(), name).await?;
        let catchup = if name == HALF_MINUTE {
            half_minute_plan(policy, &history, stopped_bucket, newest_missed)?
        } else {
            every_second_plan(policy, &history, stopped_bucket, &planned_between)?
        };
        for tick in &catchup.records {
            eprintln!("  {tick:?}");
        }
        catchup.check(policy)?;

        phase(&format!("{name}: check the commands' own output: each fired tick ran once"));
        let runs = read_runs(&runs_file(name))?;
        let by_bucket = runs_by_bucket(&runs);
        let fired: Vec<u64> = history.iter().filter(|t| t.is_fired()).map(|t| t.bucket).collect();
        check_each_bucket_ran_once(&by_bucket, &fired)?;
        let ran_missed: Vec<u64> =
            by_bucket.keys().copied().filter(|b| catchup.missed.contains(b)).collect();
        let expected_runs: Vec<u64> = catchup
            .expected
            .iter()
            .filter_map(|e| match e {
                Expected::Fired { bucket, .. } => Some(*bucket),
                Expected::Skipped { .. } => None,
            })
            .collect();
        ensure!(
            ran_missed == expected_runs,
            "{name}, catch-up {}: of {} missed ticks, {} ran ({}); expected {}",
            policy.flag(),
            catchup.missed.len(),
            ran_missed.len(),
            describe_buckets(&ran_missed),
            describe_buckets(&expected_runs)
        );
        fired_jobs += fired.len() as u64;
    }
    ensure!(jobs == fired_jobs, "{jobs} jobs exist for {fired_jobs} fired ticks");
    Ok(())
}

/// What a restarted leader planned for one schedule: the ticks missed, the
/// records history holds for them, and the records the policy promises.
struct CatchupPlan {
    name: &'static str,
    missed: Vec<u64>,
    records: Vec<Tick>,
    expected: Vec<Expected>,
}

impl CatchupPlan {
    fn check(&self, policy: Policy) -> Result<()> {
        let count = self.missed.len() as u64;
        ensure!(
            self.records.len() == self.expected.len(),
            "{}, catch-up {} of {count} missed ticks: expected {} records {:?}, history has {:?}",
            self.name,
            policy.flag(),
            self.expected.len(),
            self.expected,
            self.records
        );
        for (tick, expected) in self.records.iter().zip(&self.expected) {
            expected.check(tick)?;
        }
        let accounted: u64 =
            self.records.iter().map(|t| if t.is_fired() { 1 } else { t.ticks }).sum();
        ensure!(accounted == count, "{}: history accounts for {accounted} of {count}", self.name);
        Ok(())
    }
}

/// The half-minute schedule restarts in its tick-less half: every due tick
/// up to `newest_missed` is missed, none is current.
fn half_minute_plan(
    policy: Policy,
    history: &[Tick],
    stopped_bucket: u64,
    newest_missed: u64,
) -> Result<CatchupPlan> {
    let last_before_stop = last_bucket_before(history, stopped_bucket)?;
    let missed: Vec<u64> =
        (last_before_stop + 1..=newest_missed).filter(|b| b % 60 < TICKS_PER_MINUTE).collect();
    let count = missed.len() as u64;
    eprintln!("{HALF_MINUTE}: {count} ticks missed after bucket {last_before_stop}, none current");
    ensure!(count > 100, "only {count} ticks were missed; the outage proves too little");
    let late = |bucket| Expected::Fired { bucket, min_lag_ms: TICK_TOLERANCE_MS };
    let skip = |bucket, ticks| Expected::Skipped { bucket, ticks };
    let expected = match policy {
        // One run, for the newest missed tick; the rest is one skip record.
        Policy::Coalesce => vec![skip(newest_missed - 1, count - 1), late(newest_missed)],
        // No run at all; one skip record for every missed tick.
        Policy::Skip => vec![skip(newest_missed, count)],
        // The newest `catchup_max` run, each once; the older ones are one
        // skip record.
        Policy::All => {
            let kept = &missed[missed.len() - CATCHUP_MAX as usize..];
            let mut plan = vec![skip(kept[0] - 1, count - CATCHUP_MAX)];
            plan.extend(kept.iter().map(|&bucket| late(bucket)));
            plan
        }
    };
    let records = history
        .iter()
        .filter(|t| t.bucket > last_before_stop && t.bucket <= newest_missed)
        .cloned()
        .collect();
    Ok(CatchupPlan { name: HALF_MINUTE, missed, records, expected })
}

/// The every-second schedule restarts with a current tick, the newest tick
/// of the restarted leader's first plan: it fires on its own right, and the
/// plan's records for the missed ticks come before it — one catch-up skip
/// record first, then (under `all`) the fired ones.
fn every_second_plan(
    policy: Policy,
    history: &[Tick],
    stopped_bucket: u64,
    planned_between: &std::ops::RangeInclusive<u64>,
) -> Result<CatchupPlan> {
    let last_before_stop = last_bucket_before(history, stopped_bucket)?;
    let after: Vec<&Tick> = history.iter().filter(|t| t.bucket > last_before_stop).collect();
    let skip_record = after.first().with_context(|| "no record after the restart")?;
    ensure!(
        skip_record.is_skipped("catchup"),
        "{EVERY_SECOND}: the first record after the outage is not a catch-up skip: {after:?}"
    );
    let fired_missed = match policy {
        Policy::Coalesce | Policy::Skip => 0,
        Policy::All => CATCHUP_MAX,
    };
    let current = skip_record.bucket + fired_missed + 1;
    ensure!(
        planned_between.contains(&current),
        "{EVERY_SECOND}: by its skip record the first plan's current tick is {current}, but \
         the plan ran between buckets {planned_between:?} of the node's clock: {after:?}"
    );
    let missed: Vec<u64> = (last_before_stop + 1..current).collect();
    let count = missed.len() as u64;
    eprintln!(
        "{EVERY_SECOND}: {count} ticks missed after bucket {last_before_stop}; {current} current"
    );
    ensure!(count >= 300, "only {count} ticks were missed; the outage proves too little");
    // A missed tick fires at least as late as it is older than the current one.
    let late = |bucket: u64| Expected::Fired { bucket, min_lag_ms: (current - bucket) * 1_000 };
    let skip = |bucket, ticks| Expected::Skipped { bucket, ticks };
    let expected = match policy {
        // The current run stands for the missed ones (coalesce), or they
        // are not run at all (skip): one skip record either way.
        Policy::Coalesce | Policy::Skip => vec![skip(current - 1, count)],
        // The newest `catchup_max` missed ticks run, each once; the older
        // ones are one skip record.
        Policy::All => {
            let first_kept = current - CATCHUP_MAX;
            let mut plan = vec![skip(first_kept - 1, count - CATCHUP_MAX)];
            plan.extend((first_kept..current).map(late));
            plan
        }
    };
    let on_time = after.iter().find(|t| t.bucket == current);
    ensure!(
        on_time.is_some_and(|t| t.is_fired() && t.lag_ms < TICK_TOLERANCE_MS),
        "{EVERY_SECOND}: the current tick {current} did not fire on time: {on_time:?}"
    );
    let records = after.iter().filter(|t| t.bucket < current).map(|t| (*t).clone()).collect();
    Ok(CatchupPlan { name: EVERY_SECOND, missed, records, expected })
}

/// The newest bucket recorded at or before `stopped_bucket`.
fn last_bucket_before(history: &[Tick], stopped_bucket: u64) -> Result<u64> {
    history
        .iter()
        .map(|t| t.bucket)
        .filter(|&b| b <= stopped_bucket)
        .max()
        .context("no tick recorded before the stop")
}

/// One record a catch-up plan must have produced.
#[derive(Debug)]
enum Expected {
    /// A missed tick fired, at least `min_lag_ms` after its instant.
    Fired { bucket: u64, min_lag_ms: u64 },
    /// A skip record standing for `ticks` missed ticks up to `bucket`.
    Skipped { bucket: u64, ticks: u64 },
}

impl Expected {
    fn check(&self, tick: &Tick) -> Result<()> {
        match *self {
            Expected::Fired { bucket, min_lag_ms } => ensure!(
                tick.bucket == bucket
                    && tick.is_fired()
                    && tick.job_ids.len() == 1
                    && tick.lag_ms >= min_lag_ms
                    && tick.late == (tick.lag_ms >= LATE_AFTER_MS),
                "expected bucket {bucket} fired once with lag >= {min_lag_ms} ms (late from \
                 {LATE_AFTER_MS} ms), got {tick:?}"
            ),
            Expected::Skipped { bucket, ticks } => ensure!(
                tick.bucket == bucket && tick.is_skipped("catchup") && tick.ticks == ticks,
                "expected one catch-up skip of {ticks} ticks up to bucket {bucket}, got {tick:?}"
            ),
        }
        Ok(())
    }
}

fn clock_config(offset_ms: i64) -> String {
    format!("fault_injection = true\nclock_offset_ms = {offset_ms}\n")
}

// ---------------------------------------------------------------------------
// Story 3: overlap = skip with a command longer than the tick interval.
// ---------------------------------------------------------------------------

/// How long the command sleeps, in ticks of an every-second schedule.
const LONG_COMMAND_TICKS: u64 = 3;

/// A command that marks its start and end (Unix ns) in `file` around a
/// sleep of [`LONG_COMMAND_TICKS`] seconds.
fn long_command(file: &Path) -> String {
    let file = file.display();
    format!(
        "echo \"start $(date +%s%N) $LEASEHOLD_BUCKET $LEASEHOLD_JOB_ID\" >> '{file}'; \
         sleep {LONG_COMMAND_TICKS}; \
         echo \"end $(date +%s%N) $LEASEHOLD_BUCKET $LEASEHOLD_JOB_ID\" >> '{file}'"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_with_a_long_command() -> Result<()> {
    let sandbox = Sandbox::new("cron-overlap-skip")?;
    sandbox.run(Duration::from_secs(90), overlap_story(&sandbox)).await
}

/// One run of the long command, from its start and end lines.
#[derive(Debug, Default)]
struct Span {
    bucket: u64,
    start_ns: u128,
    end_ns: Option<u128>,
}

fn read_spans(file: &Path) -> Result<BTreeMap<u64, Span>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", file.display())),
    };
    let mut spans: BTreeMap<u64, Span> = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [mark, at_ns, bucket, job_id] = fields[..] else { bail!("bad span line {line:?}") };
        let at_ns: u128 = at_ns.parse().with_context(|| format!("time in {line:?}"))?;
        let bucket: u64 = bucket.parse().with_context(|| format!("bucket in {line:?}"))?;
        let job_id: u64 = job_id.parse().with_context(|| format!("job id in {line:?}"))?;
        match mark {
            "start" => {
                let span = Span { bucket, start_ns: at_ns, end_ns: None };
                ensure!(spans.insert(job_id, span).is_none(), "job {job_id} started twice");
            }
            "end" => {
                let span = spans.get_mut(&job_id).with_context(|| format!("{line:?} unstarted"))?;
                ensure!(span.end_ns.replace(at_ns).is_none(), "job {job_id} ended twice");
            }
            _ => bail!("bad span line {line:?}"),
        }
    }
    Ok(spans)
}

/// One node, an every-second schedule with `overlap = skip` whose command
/// sleeps 3 s between a start and an end mark. Tick runs must never
/// overlap, and the ticks that fall inside a run are recorded as overlap
/// skips. A manual trigger during a run is refused as an overlap (exit
/// code 3, nothing enqueued); `--force` runs it anyway, alongside.
async fn overlap_story(sandbox: &Sandbox) -> Result<()> {
    const NAME: &str = "long-runner";
    phase("start node 1");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let spans_file = sandbox.path().join("spans.txt");

    phase("put an every-second schedule, overlap skip, whose command takes 3 s");
    let command = long_command(&spans_file);
    cli(
        sandbox,
        &addr,
        &["cron", "put", NAME, "--cron", "* * * * * *", "--command", &command, "--overlap", "skip"],
    )
    .await?
    .success()?;

    phase("wait for two finished runs and a third in progress");
    let in_progress = wait_until(
        "two finished runs and one running",
        deadline_in(Duration::from_secs(30)),
        || {
            let spans = read_spans(&spans_file);
            async move {
                let spans = spans?;
                let finished = spans.values().filter(|s| s.end_ns.is_some()).count();
                let running: Vec<u64> =
                    spans.iter().filter(|(_, s)| s.end_ns.is_none()).map(|(id, _)| *id).collect();
                Ok(match running[..] {
                    [job] if finished >= 2 => Check::Done(job),
                    _ => Check::NotYet(format!("finished {finished}, running {running:?}")),
                })
            }
        },
    )
    .await?;

    phase("trigger while it runs: refused as an overlap (exit 3); --force runs it");
    let refused = cli(sandbox, &addr, &["cron", "trigger", NAME]).await?;
    ensure!(
        refused.status.code() == Some(3) && refused.stdout.contains("not run: overlap"),
        "unforced trigger during run of job {in_progress}: {} stdout {:?} stderr {:?}",
        refused.status,
        refused.stdout,
        refused.stderr
    );
    let forced = cli(sandbox, &addr, &["cron", "trigger", NAME, "--force"]).await?.success()?;
    let forced_job = forced
        .stdout
        .split_once("jobs [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(id, _)| id.trim().parse::<u64>().ok())
        .with_context(|| format!("no job id in {:?}", forced.stdout))?;
    let still_running =
        read_spans(&spans_file)?.get(&in_progress).is_some_and(|span| span.end_ns.is_none());
    ensure!(still_running, "job {in_progress} finished before the triggers; they proved nothing");

    phase("wait for the forced run to finish, pause, and wait for every job to be acked");
    wait_until("the forced run to finish", deadline_in(Duration::from_secs(20)), || {
        let spans = read_spans(&spans_file);
        async move {
            let spans = spans?;
            Ok(match spans.get(&forced_job) {
                Some(Span { end_ns: Some(_), .. }) => Check::Done(()),
                other => Check::NotYet(format!("forced job {forced_job}: {other:?}")),
            })
        }
    })
    .await?;
    cli(sandbox, &addr, &["cron", "pause", NAME]).await?.success()?;
    let client = quiet_client(&addr)?;
    wait_for_paused_record(&client, NAME).await?;
    let jobs = wait_all_acked(&client).await?;

    phase("check: no two tick runs overlapped; the ticks between them were overlap skips");
    let history = history(sandbox, &addr, NAME).await?;
    let spans = read_spans(&spans_file)?;
    let fired: Vec<&Tick> = history.iter().filter(|t| t.is_fired()).collect();
    ensure!(fired.len() >= 3, "only {} fired ticks: {history:?}", fired.len());
    ensure!(
        jobs == fired.len() as u64 + 1,
        "{jobs} jobs for {} fired ticks and one forced trigger: the refused trigger enqueued",
        fired.len()
    );
    let mut tick_spans = Vec::new();
    for tick in &fired {
        let job = *tick.job_ids.first().with_context(|| format!("no job in {tick:?}"))?;
        let span = spans.get(&job).with_context(|| format!("tick {tick:?} never ran"))?;
        let end_ns = span.end_ns.with_context(|| format!("job {job} never finished"))?;
        ensure!(
            span.bucket == tick.bucket,
            "job {job} ran as bucket {}, fired {tick:?}",
            span.bucket
        );
        tick_spans.push((tick.bucket, job, span.start_ns, end_ns));
    }
    for pair in tick_spans.windows(2) {
        let ((bucket_a, job_a, _, end_a), (bucket_b, job_b, start_b, _)) = (pair[0], pair[1]);
        ensure!(
            end_a < start_b,
            "tick {bucket_b} (job {job_b}) started before tick {bucket_a} (job {job_a}) ended"
        );
        ensure!(
            bucket_b >= bucket_a + LONG_COMMAND_TICKS,
            "tick {bucket_b} fired only {} s after tick {bucket_a}, whose run takes {} s",
            bucket_b - bucket_a,
            LONG_COMMAND_TICKS
        );
    }
    let (first, last) = (fired[0].bucket, fired[fired.len() - 1].bucket);
    let window: Vec<&Tick> =
        history.iter().filter(|t| (first..=last).contains(&t.bucket)).collect();
    let buckets: Vec<u64> = window.iter().map(|t| t.bucket).collect();
    ensure!(
        buckets == (first..=last).collect::<Vec<_>>(),
        "history between {first} and {last} is not one record per bucket: {}",
        describe_buckets(&buckets)
    );
    let odd: Vec<&&Tick> =
        window.iter().filter(|t| !t.is_fired() && !t.is_skipped("overlap")).collect();
    ensure!(odd.is_empty(), "ticks neither fired nor skipped as overlaps: {odd:?}");
    let overlaps = window.iter().filter(|t| t.is_skipped("overlap") && t.ticks == 1).count();
    ensure!(
        overlaps as u64 >= (LONG_COMMAND_TICKS - 1) * (fired.len() as u64 - 1),
        "only {overlaps} overlap skips between {} runs of 3 s",
        fired.len()
    );

    phase("check: the forced run overlapped the one in progress, as forced");
    let forced_span = spans.get(&forced_job).context("the forced job never ran")?;
    let running_span = spans.get(&in_progress).context("the running job vanished")?;
    let running_end = running_span.end_ns.context("the running job never finished")?;
    ensure!(
        forced_span.start_ns < running_end,
        "the forced run started after the run in progress ended"
    );
    ensure!(
        !fired.iter().any(|t| t.job_ids.contains(&forced_job)),
        "the forced run was recorded as a tick"
    );
    Ok(())
}

/// Known bug, kept as a story until it is fixed: `Trigger` replaces the
/// schedule's `last_job_ids` with the manual run's job, forgetting the tick
/// run still in progress, so a *short* forced run lets the next tick fire
/// beside that tick run — `overlap = skip` broken (core `State::trigger` in
/// `state/schedules.rs`). Same schedule as the overlap story, except that
/// the forced run is quick: it takes a flag file the test lays down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_holds_after_a_short_forced_run() -> Result<()> {
    let sandbox = Sandbox::new("cron-overlap-after-force")?;
    sandbox.run(Duration::from_secs(90), short_forced_run_story(&sandbox)).await
}

async fn short_forced_run_story(sandbox: &Sandbox) -> Result<()> {
    const NAME: &str = "long-runner";
    phase("start node 1");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let spans_file = sandbox.path().join("spans.txt");
    let flag = sandbox.path().join("quick-once");

    phase("put an every-second schedule, overlap skip; a run is quick only if it takes the flag");
    let (spans, flag_text) = (spans_file.display(), flag.display());
    let command = format!(
        "if mv '{flag_text}' '{flag_text}.taken' 2>/dev/null; then pause=0; \
         else pause={LONG_COMMAND_TICKS}; fi; \
         echo \"start $(date +%s%N) $LEASEHOLD_BUCKET $LEASEHOLD_JOB_ID\" >> '{spans}'; \
         sleep $pause; \
         echo \"end $(date +%s%N) $LEASEHOLD_BUCKET $LEASEHOLD_JOB_ID\" >> '{spans}'"
    );
    let put = ["cron", "put", NAME, "--cron", "* * * * * *", "--command", &command];
    cli(sandbox, &addr, &put).await?.success()?;

    phase("wait for a tick run in progress, lay the flag, trigger --force");
    let running =
        wait_until("a tick run in progress", deadline_in(Duration::from_secs(20)), || {
            let spans = read_spans(&spans_file);
            async move {
                let spans = spans?;
                let running: Vec<u64> =
                    spans.iter().filter(|(_, s)| s.end_ns.is_none()).map(|(id, _)| *id).collect();
                Ok(match running[..] {
                    [job] => Check::Done(job),
                    _ => Check::NotYet(format!("running {running:?}")),
                })
            }
        })
        .await?;
    std::fs::write(&flag, b"").with_context(|| format!("writing {}", flag.display()))?;
    cli(sandbox, &addr, &["cron", "trigger", NAME, "--force"]).await?.success()?;

    phase("let the tick run finish and two more ticks run, then pause");
    wait_until("two tick runs after it", deadline_in(Duration::from_secs(30)), || {
        let spans = read_spans(&spans_file);
        async move {
            let spans = spans?;
            let later = spans.iter().filter(|(id, s)| **id > running && s.end_ns.is_some()).count();
            Ok(if later >= 3 { Check::Done(()) } else { Check::NotYet(format!("{later} later")) })
        }
    })
    .await?;
    cli(sandbox, &addr, &["cron", "pause", NAME]).await?.success()?;
    let client = quiet_client(&addr)?;
    wait_for_paused_record(&client, NAME).await?;
    wait_all_acked(&client).await?;

    phase("check: no two tick runs overlapped");
    let history = history(sandbox, &addr, NAME).await?;
    let spans = read_spans(&spans_file)?;
    let mut tick_spans = Vec::new();
    for tick in history.iter().filter(|t| t.is_fired()) {
        let job = *tick.job_ids.first().with_context(|| format!("no job in {tick:?}"))?;
        let span = spans.get(&job).with_context(|| format!("tick {tick:?} never ran"))?;
        let end_ns = span.end_ns.with_context(|| format!("job {job} never finished"))?;
        tick_spans.push((tick.bucket, job, span.start_ns, end_ns));
    }
    for pair in tick_spans.windows(2) {
        let ((bucket_a, job_a, _, end_a), (bucket_b, job_b, start_b, _)) = (pair[0], pair[1]);
        ensure!(
            end_a < start_b,
            "tick {bucket_b} (job {job_b}) started before tick {bucket_a} (job {job_a}) ended: \
             the forced run replaced the running tick job in the overlap check"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Story 4: invalid expressions and zones.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_cron_and_timezone_are_refused_by_name() -> Result<()> {
    let sandbox = Sandbox::new("cron-validation")?;
    sandbox.run(Duration::from_secs(60), validation_story(&sandbox)).await
}

/// One node with one valid schedule. Putting an out-of-range minute or an
/// unknown zone — as a new schedule or over the valid one — fails with
/// INVALID_ARGUMENT naming the field, through the CLI and over raw gRPC,
/// and leaves `cron list` as it was.
async fn validation_story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1 and put one valid schedule");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let valid = [
        "cron",
        "put",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--command",
        "true",
    ];
    cli(sandbox, &addr, &valid).await?.success()?;
    let before = schedule_specs(sandbox, &addr).await?;

    let cases: [(&str, &str, &str, &[&str]); 4] = [
        ("new", "61 * * * *", "", &["cron", "61"]),
        ("nightly", "61 * * * *", "", &["cron", "61"]),
        ("new", "0 3 * * *", "Mars/Base", &["timezone", "Mars/Base"]),
        ("nightly", "0 3 * * *", "Mars/Base", &["timezone", "Mars/Base"]),
    ];
    for (name, cron, zone, named) in cases {
        phase(&format!("put {name} --cron {cron:?} --timezone {zone:?}: refused by name"));
        let mut args = vec!["cron", "put", name, "--cron", cron, "--command", "true"];
        if !zone.is_empty() {
            args.extend(["--timezone", zone]);
        }
        let refused = cli(sandbox, &addr, &args).await?;
        let stderr = refused.stderr.to_lowercase();
        ensure!(
            !refused.status.success()
                && stderr.contains("(invalidargument)")
                && named.iter().all(|word| stderr.contains(&word.to_lowercase())),
            "cron put {args:?}: {}; stderr {:?} should name INVALID_ARGUMENT and {named:?}",
            refused.status,
            refused.stderr
        );

        let spec = v1::ScheduleSpec {
            name: name.to_string(),
            cron: cron.to_string(),
            timezone: zone.to_string(),
            template: Some(v1::JobTemplate {
                command: Some("true".to_string()),
                ..Default::default()
            }),
            catchup_window_ms: 3_600_000,
            catchup_max: 10,
            ..Default::default()
        };
        let mut request = tonic::Request::new(v1::PutScheduleRequest { spec: Some(spec) });
        request.set_timeout(RPC_TIMEOUT);
        let status = match node.client()?.schedules_stub().put(request).await {
            Ok(_) => bail!("gRPC Put of {name} with {cron:?} / {zone:?} was accepted"),
            Err(status) => status,
        };
        ensure!(
            status.code() == tonic::Code::InvalidArgument && status.message().starts_with(named[0]),
            "gRPC Put of {name} with {cron:?} / {zone:?}: {status:?}, expected INVALID_ARGUMENT \
             naming {}",
            named[0]
        );
    }

    phase("cron list is unchanged");
    let after = schedule_specs(sandbox, &addr).await?;
    ensure!(after == before, "schedules changed: before {before:?}, after {after:?}");
    Ok(())
}

/// `cron list --output json` without what the ticker moves on its own.
async fn schedule_specs(sandbox: &Sandbox, addr: &str) -> Result<Vec<Value>> {
    let list =
        cli(sandbox, addr, &["cron", "list", "--output", "json"]).await?.success()?.json()?;
    let schedules = list.as_array().context("cron list is not a JSON array")?;
    Ok(schedules
        .iter()
        .map(|schedule| {
            let mut spec = schedule.clone();
            if let Some(object) = spec.as_object_mut() {
                for volatile in
                    ["history", "last_fired_bucket", "next_tick_ms", "fired_count", "skipped_count"]
                {
                    object.remove(volatile);
                }
            }
            spec
        })
        .collect())
}

// ---------------------------------------------------------------------------
// What the stories share: history records, the runs file, waits.
// ---------------------------------------------------------------------------

/// One record of `cron history --output json`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tick {
    bucket: u64,
    outcome: String,
    job_ids: Vec<u64>,
    lag_ms: u64,
    skip_reason: String,
    ticks: u64,
    late: bool,
}

impl Tick {
    fn from_json(value: &Value) -> Result<Tick> {
        let field = |name: &str| value.get(name).with_context(|| format!("no {name} in {value}"));
        let number = |name: &str| -> Result<u64> {
            field(name)?.as_u64().with_context(|| format!("{name} is not a number in {value}"))
        };
        let text = |name: &str| -> Result<String> {
            Ok(field(name)?.as_str().with_context(|| format!("{name} not a string"))?.to_string())
        };
        let job_ids = field("job_ids")?
            .as_array()
            .context("job_ids is not an array")?
            .iter()
            .map(|id| id.as_u64().context("job id is not a number"))
            .collect::<Result<Vec<u64>>>()?;
        Ok(Tick {
            bucket: number("bucket")?,
            outcome: text("outcome")?,
            job_ids,
            lag_ms: number("lag_ms")?,
            skip_reason: text("skip_reason")?,
            ticks: number("ticks")?,
            late: field("late")?.as_bool().context("late is not a bool")?,
        })
    }

    fn is_fired(&self) -> bool {
        self.outcome == "fired"
    }

    fn is_skipped(&self, reason: &str) -> bool {
        self.outcome == "skipped" && self.skip_reason == reason
    }
}

/// A schedule's history through the CLI.
async fn history(sandbox: &Sandbox, addr: &str, name: &str) -> Result<Vec<Tick>> {
    let run =
        cli(sandbox, addr, &["cron", "history", name, "--output", "json"]).await?.success()?;
    let value = run.json()?;
    value.as_array().context("history is not a JSON array")?.iter().map(Tick::from_json).collect()
}

/// One line of a runs file: one run of a tick's command.
#[derive(Clone, Debug)]
pub(super) struct Run {
    bucket: u64,
    job_id: u64,
    token: u64,
    attempt: u64,
}

/// The command of a tick: append "BUCKET JOB TOKEN ATTEMPT" to `file`. One
/// short `>>` write per run, so concurrent runs on the three nodes (all on
/// this machine) never interleave within a line.
pub(super) fn append_run_command(file: &Path) -> String {
    format!(
        r#"echo "$LEASEHOLD_BUCKET $LEASEHOLD_JOB_ID $LEASEHOLD_FENCING_TOKEN $LEASEHOLD_ATTEMPT" >> '{}'"#,
        file.display()
    )
}

pub(super) fn read_runs(file: &Path) -> Result<Vec<Run>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", file.display())),
    };
    text.lines()
        .map(|line| {
            let numbers = line
                .split(' ')
                .map(|field| field.parse::<u64>())
                .collect::<Result<Vec<u64>, _>>()
                .with_context(|| format!("bad run line {line:?}"))?;
            let [bucket, job_id, token, attempt] = numbers[..] else {
                bail!("bad run line {line:?}")
            };
            Ok(Run { bucket, job_id, token, attempt })
        })
        .collect()
}

pub(super) fn runs_by_bucket(runs: &[Run]) -> BTreeMap<u64, Vec<Run>> {
    let mut by_bucket: BTreeMap<u64, Vec<Run>> = BTreeMap::new();
    for run in runs {
        by_bucket.entry(run.bucket).or_default().push(run.clone());
    }
    by_bucket
}

/// Fails unless the runs are exactly the `expected` buckets, one run each.
/// A second run of one job (same id, higher token and attempt) is a
/// redelivery after a lost ack; a second job for one bucket is a double
/// fire. The message says which.
pub(super) fn check_each_bucket_ran_once(
    by_bucket: &BTreeMap<u64, Vec<Run>>,
    expected: &[u64],
) -> Result<()> {
    let expected: BTreeSet<u64> = expected.iter().copied().collect();
    let ran: BTreeSet<u64> = by_bucket.keys().copied().collect();
    let missing: Vec<u64> = expected.difference(&ran).copied().collect();
    let unexpected: Vec<u64> = ran.difference(&expected).copied().collect();
    let twice: Vec<String> = by_bucket
        .iter()
        .filter(|(_, runs)| runs.len() > 1)
        .map(|(bucket, runs)| {
            let jobs: BTreeSet<u64> = runs.iter().map(|r| r.job_id).collect();
            let redelivered = jobs.len() == 1
                && runs.windows(2).all(|w| w[1].token > w[0].token && w[1].attempt > w[0].attempt);
            let kind =
                if redelivered { "one job run again after a lost ack" } else { "DOUBLE FIRE" };
            format!("{bucket} ({kind}: {runs:?})")
        })
        .collect();
    ensure!(
        missing.is_empty() && unexpected.is_empty() && twice.is_empty(),
        "runs differ from the fired buckets {}: missing {missing:?}; unexpected {unexpected:?}; \
         more than once {twice:?}",
        describe_buckets(&expected.iter().copied().collect::<Vec<_>>())
    );
    Ok(())
}

/// "first..=last (n)", or the list itself when it is not contiguous.
fn describe_buckets(buckets: &[u64]) -> String {
    match (buckets.first(), buckets.last()) {
        (Some(&first), Some(&last)) if last - first + 1 == buckets.len() as u64 => {
            format!("{first}..={last} ({})", buckets.len())
        }
        _ => format!("{buckets:?}"),
    }
}

/// A schedule read over gRPC: `stale` reads the answering node's own state.
pub(super) async fn schedule_of(client: &Client, name: &str, stale: bool) -> Result<v1::Schedule> {
    let mut request = tonic::Request::new(v1::GetScheduleRequest { name: name.to_string(), stale });
    request.set_timeout(RPC_TIMEOUT);
    let schedule = client
        .schedules_stub()
        .get(request)
        .await
        .with_context(|| format!("get schedule {name}"))?
        .into_inner();
    Ok(schedule)
}

/// Waits until the ticker has seen the pause: a tick recorded as skipped
/// for it. From then on nothing of the schedule fires.
pub(super) async fn wait_for_paused_record(client: &Client, name: &str) -> Result<()> {
    wait_until("a tick skipped as paused", deadline_in(Duration::from_secs(20)), || {
        let client = client.clone();
        async move {
            let schedule = match schedule_of(&client, name, false).await {
                Ok(schedule) => schedule,
                Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
            };
            let last = schedule.history.last();
            Ok(match last {
                Some(record) if record.skip_reason == "paused" => Check::Done(()),
                other => Check::NotYet(format!("newest record {other:?}")),
            })
        }
    })
    .await
}

/// Waits until every job of the cluster (they are all ticks of the story's
/// schedule) is acked, none ready, claimed, delayed or dead; answers how
/// many jobs there are.
async fn wait_all_acked(client: &Client) -> Result<u64> {
    wait_until("every fired job acked", deadline_in(ACK_TIMEOUT), || {
        let client = client.clone();
        async move {
            let stats = match client.stats(Some(EXEC_QUEUE.to_string()), false).await {
                Ok(stats) => stats,
                Err(error) => return Ok(Check::NotYet(format!("stats: {error}"))),
            };
            let exec = stats.queues.iter().find(|q| q.queue == EXEC_QUEUE).cloned();
            let exec = exec.unwrap_or_default();
            let others: Vec<&v1::QueueStats> =
                stats.queues.iter().filter(|q| q.queue != EXEC_QUEUE).collect();
            ensure!(others.is_empty(), "jobs outside the exec queue: {others:?}");
            ensure!(exec.dead == 0, "a tick's command died: {exec:?}");
            Ok(
                if exec.acked == stats.last_job_id && exec.ready + exec.claimed + exec.delayed == 0
                {
                    Check::Done(stats.last_job_id)
                } else {
                    Check::NotYet(format!("{exec:?}, last job id {}", stats.last_job_id))
                },
            )
        }
    })
    .await
}

/// Runs `leasehold ARGS…` against the node at `addr`.
pub(super) async fn cli(sandbox: &Sandbox, addr: &str, args: &[&str]) -> Result<CliRun> {
    run_cli(sandbox, args, &[("LEASEHOLD_ADDR", addr)]).await
}

/// A client that answers what one node said, without retries: polls
/// re-ask on their own, and a retry would blur which node answered.
fn quiet_client(addr: &str) -> Result<Client> {
    let client =
        Client::connect(addr).map_err(|error| anyhow::anyhow!("client of {addr}: {error}"))?;
    Ok(client.with_retry(RetryPolicy {
        attempts: 1,
        first_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(100),
    }))
}

fn write_config(sandbox: &Sandbox, name: &str, text: &str) -> Result<PathBuf> {
    let path = sandbox.path().join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn unix_ms() -> Result<u64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).context("clock before 1970")?;
    Ok(u64::try_from(since.as_millis())?)
}

fn unix_ms_signed() -> Result<i64> {
    Ok(i64::try_from(unix_ms()?)?)
}

// ---------------------------------------------------------------------------
// Nodes: polls over the shared harness's nodes, and the three-node cluster.
// ---------------------------------------------------------------------------

/// Clients of the nodes that run, after checking none died unexpectedly.
fn running_clients(nodes: &mut [Node]) -> Result<Vec<Client>> {
    let mut clients = Vec::new();
    for node in nodes.iter_mut().filter(|n| n.is_running()) {
        node.ensure_running()?;
        clients.push(quiet_client(&node.addr())?);
    }
    Ok(clients)
}

/// Waits until `node` names a leader `accept` takes and answers a
/// linearizable read (through that leader); answers the leader.
async fn wait_serving(node: &mut Node, what: &str, accept: impl Fn(u64) -> bool) -> Result<u64> {
    let what = format!("node {} at {}: {what}", node.id, node.grpc);
    let accept = &accept;
    wait_until(&what, deadline_in(NODE_READY_TIMEOUT), || {
        let running = node.ensure_running();
        let client = quiet_client(&node.addr());
        async move {
            running?;
            let client = client?;
            let status = match client.status().await {
                Ok(status) => status,
                Err(error) => return Ok(Check::NotYet(format!("status: {error}"))),
            };
            if !accept(status.leader) {
                return Ok(Check::NotYet(format!("leader is {}", status.leader)));
            }
            match client.stats(None, false).await {
                Ok(_) => Ok(Check::Done(status.leader)),
                Err(error) => Ok(Check::NotYet(format!("stats: {error}"))),
            }
        }
    })
    .await
}

/// Waits until every running node names the same leader, itself running,
/// and that leader answers a linearizable read; answers its id.
async fn wait_for_leader(nodes: &mut [Node], what: &str) -> Result<u64> {
    let running: BTreeSet<u64> = nodes.iter().filter(|n| n.is_running()).map(|n| n.id).collect();
    let running = &running;
    wait_until(what, deadline_in(NODE_READY_TIMEOUT), || {
        let clients = running_clients(nodes);
        async move {
            let clients = clients?;
            let mut named = BTreeSet::new();
            for client in &clients {
                match client.status().await {
                    Ok(status) => named.insert(status.leader),
                    Err(error) => return Ok(Check::NotYet(format!("status: {error}"))),
                };
            }
            let leader = match named.iter().collect::<Vec<_>>()[..] {
                [&leader] if running.contains(&leader) => leader,
                _ => return Ok(Check::NotYet(format!("leaders named: {named:?}"))),
            };
            for client in &clients {
                if let Err(error) = client.stats(None, false).await {
                    return Ok(Check::NotYet(format!("leader {leader}; stats: {error}")));
                }
            }
            Ok(Check::Done(leader))
        }
    })
    .await
}

/// The three-node cluster of the failover stories: every node with
/// [`FAILOVER_CONFIG`]'s long election timeouts; node 1 bootstraps, nodes 2
/// and 3 join it, and the three have converged (see [`Cluster::start_with`]).
async fn start_three_nodes(sandbox: &Sandbox) -> Result<Cluster> {
    let options =
        ClusterOptions { config: FAILOVER_CONFIG.to_string(), ..ClusterOptions::default() };
    Cluster::start_with(sandbox, 3, options).await
}
