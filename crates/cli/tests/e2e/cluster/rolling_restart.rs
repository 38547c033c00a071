//! Goal: a rolling restart of the whole fleet under load loses nothing and
//! breaks no guarantee (issue 6 "fleet lifecycle"; SPEC §5 Drain, §7
//! guarantees 1-4 and 6). Each of the three nodes in turn is drained with
//! SIGTERM, exits 0, starts again on its data directory and ports, and is
//! waited for until `/readyz` answers 200 and it has applied what the leader
//! had committed; only then does the next one go. Meanwhile four clients
//! enqueue, claim and ack (`load.rs`), and an every-second schedule runs a
//! command on whichever node's executor claims the tick's job.
//!
//! Method: the clients record every operation and its answer, checked at
//! the end as in the failover story (`history.rs`): every acked enqueue
//! ends acked, no two leases of one job overlap, tokens increase, no stale
//! ack is accepted. The schedule's command sleeps 3 s, then appends its
//! `$LEASEHOLD_BUCKET` (with job, token and attempt) to a file. The nodes
//! run with a 1 s drain grace, and each is drained just after its executor
//! started a command, so the drain must stop it and give its lease back
//! (SPEC §5: in-flight executions get the grace, then `Release`): the
//! drained node's log must say it released that lease, and right after
//! the exit no job may still be claimed by its executor. After the last
//! restart the schedule is paused; every command job must end acked, one
//! job per bucket, and the file must hold every bucket from the first tick
//! after the put to the last one fired exactly once.
//!
//! The nodes go leader first: at each step the node drained is the current
//! leader if it has not been restarted yet, otherwise the lowest id left,
//! so most steps hand leadership over. Whether the handover took (the
//! drained leader's log says "handed over") is reported, not required:
//! openraft 0.9 has no leadership transfer, and the successor's campaign
//! can lose to the other follower's (see docs/operations.md); what is
//! required is a new leader among the other two within seconds. A bucket
//! run twice by one job ("run again after a lost ack") is a failure to
//! report, not noise: the executor's ack retries outlast a handover.

use std::fmt;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_client::Client;
use leasehold_proto::v1;
use tokio::time::Instant;

use super::super::cron::{
    append_run_command, check_each_bucket_ran_once, cli, read_runs, runs_by_bucket, schedule_of,
    wait_for_paused_record,
};
use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, ClusterOptions, Sandbox, deadline_in, http_get,
    phase, wait_until,
};
use super::cluster_slot;
use super::load::{self, Load};

/// The schedule of the story.
const SCHEDULE: &str = "every-second";
/// The built-in executor's queue: the schedule's jobs land here.
const EXEC_QUEUE: &str = "exec";
/// Load clients: half the failover story's, since each step here also
/// restarts a node and replays its log on the same two cores.
const CLIENTS: usize = 4;
/// The nodes' drain grace: shorter than a command, so a drain stops the
/// commands it runs and must release their leases.
const DRAIN_GRACE_MS: u64 = 1_000;
/// Commands each node's executor runs at once. The leader applies a fired
/// tick first, so its executor claims the tick's job whenever it has a free
/// slot (docs/operations.md, "Where commands run"); with the default 4 it
/// always has one (a 3 s command each second holds 3) and a follower may
/// never start a command. With 2 the leader runs about two ticks in three
/// and the followers share the rest, which the follower step needs; two
/// nodes (one is always down mid-step) still run 4 per 3 s, above the rate.
const EXECUTOR_CONCURRENCY: usize = 2;
/// How long the schedule's command runs.
const COMMAND_SECONDS: u64 = 3;
/// A node is drained while its executor runs a command granted less than
/// this ago: with 2 s of the command left, the 1 s grace cannot see it
/// finish.
const FRESH_GRANT_MS: u64 = 1_000;
/// How long a node may take to start a command: each second's job goes to
/// one of three executors, so a node waits a few seconds for one.
const FRESH_COMMAND_WITHIN: Duration = Duration::from_secs(30);
/// The lease of a command job: long enough to ride out a handover while
/// it is renewed, short enough that a grant whose answer a handover lost
/// lapses and its job runs well within [`FINISH_WITHIN`].
const COMMAND_LEASE_TTL_MS: u64 = 10_000;
/// Acks before the first drain, so the load is steady when it comes.
const ACKS_BEFORE: u64 = 100;
/// Acks after each restart before the next drain: the cluster serves again.
const ACKS_BETWEEN: u64 = 50;
/// Ticks fired after each restart before the next drain.
const TICKS_BETWEEN: u64 = 3;
/// A drained node is gone by then: the grace, two seconds for the executor
/// to stop, the releases, up to 3 s of handover and 5 s of closing.
const EXIT_WITHIN: Duration = Duration::from_secs(30);
/// How long a restarted node may take to answer `/readyz` with 200.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a ready node may take to apply what the leader had committed.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(30);
/// How long the load and the schedule may take to show progress.
const PROGRESS_WITHIN: Duration = Duration::from_secs(60);
/// How long the command jobs may take to be acked once the schedule is
/// paused: a command, or a lapsed lease and its rerun.
const FINISH_WITHIN: Duration = Duration::from_secs(40);
/// The story's whole budget: it must end, pass or fail, within this.
const BUDGET: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_under_load_loses_nothing() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-rolling-restart")?;
    sandbox.run(BUDGET, story(&sandbox)).await
}

/// What one step of the rolling restart did, for the report.
struct Step {
    node: u64,
    /// If the node led: the node that led after it, and whether the
    /// drained node saw leadership move before it exited (its handover).
    successor: Option<(u64, bool)>,
    /// Leases the drained node released, by its log.
    released: usize,
    drained: Duration,
    ready: Duration,
    caught_up: Duration,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.successor {
            Some((successor, true)) => {
                write!(f, "node {} (leader, handed over to {successor})", self.node)?
            }
            Some((successor, false)) => write!(
                f,
                "node {} (leader, handover did not take; node {successor} elected)",
                self.node
            )?,
            None => write!(f, "node {} (follower)", self.node)?,
        }
        write!(
            f,
            ": drained and exited in {:.1} s releasing {} leases; ready {:.1} s after its \
             start, caught up after {:.1} s",
            self.drained.as_secs_f64(),
            self.released,
            self.ready.as_secs_f64(),
            self.caught_up.as_secs_f64()
        )
    }
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    let started = Instant::now();
    phase("start a three-node cluster with a 1 s drain grace and 2 commands per executor");
    let options = ClusterOptions {
        config: format!(
            "drain_grace_ms = {DRAIN_GRACE_MS}\nexecutor_concurrency = {EXECUTOR_CONCURRENCY}\n"
        ),
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start_with(sandbox, 3, options).await?;
    let client = cluster.client()?;
    let addrs = cluster.addrs();
    let runs_file = sandbox.path().join("runs.txt");

    phase("put an every-second schedule whose command takes 3 s; start 4 load clients");
    let command = format!("sleep {COMMAND_SECONDS}; {}", append_run_command(&runs_file));
    let lease_ttl_ms = COMMAND_LEASE_TTL_MS.to_string();
    let put = [
        "cron",
        "put",
        SCHEDULE,
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
        "--lease-ttl-ms",
        &lease_ttl_ms,
    ];
    cli(sandbox, &addrs, &put).await?.success()?;
    let load = Load::start(&cluster, CLIENTS)?;
    load.wait_acks(ACKS_BEFORE, PROGRESS_WITHIN).await?;
    wait_more_ticks(&client, TICKS_BETWEEN).await?;

    let mut left = cluster.ids();
    let mut steps = Vec::new();
    while !left.is_empty() {
        let leader = cluster.wait_leader_among(&cluster.ids(), Duration::from_secs(10)).await?;
        let id = if left.contains(&leader) { leader } else { left[0] };
        left.retain(|other| *other != id);
        let step = restart(sandbox, &mut cluster, id, id == leader).await?;
        eprintln!("STEP: {step}");
        steps.push(step);

        phase(&format!("after node {id}'s restart the load and the schedule go on"));
        load.wait_acks(load.acked() + ACKS_BETWEEN, PROGRESS_WITHIN).await?;
        wait_more_ticks(&client, TICKS_BETWEEN).await?;
    }
    eprintln!(
        "ROLLING RESTART of {} nodes done {:.1} s into the story:",
        steps.len(),
        started.elapsed().as_secs_f64()
    );
    for step in &steps {
        eprintln!("  {step}");
    }

    phase("some lease has lapsed and been granted again, so the lease checks compare pairs");
    load.wait_redelivered(1, PROGRESS_WITHIN).await?;

    phase("stop the load, pause the schedule, wait until every command job is acked");
    let mut history = load.stop().await?;
    cli(sandbox, &addrs, &["cron", "pause", SCHEDULE]).await?.success()?;
    wait_for_paused_record(&client, SCHEDULE).await?;
    let command_jobs = wait_commands_finished(&client).await?;

    phase("work the load queue off");
    load::work_off(&cluster, CLIENTS, &mut history).await?;

    phase("all three nodes converge: equal digests at equal applied index");
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    eprintln!("converged after the rolling restart: {converged:?}");

    phase("check the load's records against every job of its queue");
    load::check(&cluster, &history).await?;

    phase("check: every bucket from the first tick after the put to the last fired ran once");
    let schedule = schedule_of(&client, SCHEDULE, false).await?;
    // Ticks after the pause are recorded as skipped; every other tick from
    // the first after the put must have fired, in one unbroken run.
    let first = schedule.created_at_ms / 1_000 + 1;
    let last = first + schedule.fired_count.saturating_sub(1);
    let expected: Vec<u64> = (first..=last).collect();
    eprintln!(
        "SCHEDULE: buckets {first}..={last} ({}) fired, {} skipped after the pause",
        expected.len(),
        schedule.skipped_count
    );
    ensure!(
        expected.len() as u64 >= TICKS_BETWEEN * (steps.len() as u64 + 1),
        "only {} ticks fired; the schedule hardly ran",
        schedule.fired_count
    );
    let skips: Vec<&v1::TickRecord> =
        schedule.history.iter().filter(|tick| tick.outcome != "fired").collect();
    ensure!(
        skips.iter().all(|tick| tick.skip_reason == "paused" && tick.bucket > last)
            && skips.iter().map(|tick| tick.ticks).sum::<u64>() == schedule.skipped_count
            && schedule.last_fired_bucket == last + schedule.skipped_count,
        "catch-up all must fire every tick until the pause, each once: {schedule:?}"
    );
    check_each_bucket_ran_once(&runs_by_bucket(&read_runs(&runs_file)?), &expected)?;

    phase("check: one job per bucket");
    ensure!(
        command_jobs.len() == expected.len(),
        "{} command jobs for {} fired ticks",
        command_jobs.len(),
        expected.len()
    );
    // A lease may still lapse without a drained node holding it: a claim
    // that commits while its leader loses office (a handover) never
    // answers, and its lease lapses unrun. That costs the job an attempt
    // and a delay, not a run (the runs file shows each bucket ran once), so
    // it is reported rather than failed.
    for job in command_jobs.iter().filter(|job| job.attempts != 0) {
        eprintln!(
            "NOTE: command job {} ({:?}) was charged {} attempt(s): {:?}; final lease {:?}",
            job.id, job.idempotency_key, job.attempts, job.last_error, job.lease
        );
    }
    Ok(())
}

/// One step: drains node `id` (SIGTERM, exit 0), checks it left no lease
/// held and, if it led, that another node leads; restarts it on its
/// data directory and waits until it is ready and caught up.
async fn restart(sandbox: &Sandbox, cluster: &mut Cluster, id: u64, leads: bool) -> Result<Step> {
    let role = if leads { "the leader" } else { "a follower" };
    phase(&format!("wait until node {id}, {role}, has just started a command"));
    let (running, token) = wait_fresh_command(cluster, id).await?;

    phase(&format!("drain node {id} while job {running} runs there: SIGTERM, and it exits 0"));
    let others: Vec<u64> = cluster.ids().into_iter().filter(|other| *other != id).collect();
    let signalled = Instant::now();
    cluster.node_mut(id)?.stop(deadline_in(EXIT_WITHIN)).await?;
    let drained = signalled.elapsed();
    let log_path = cluster.node(id)?.log().context("the drained node has no log")?.to_path_buf();
    let log = std::fs::read_to_string(&log_path)
        .with_context(|| format!("reading {}", log_path.display()))?;
    let released: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("released on drain") && line.contains("response=Released"))
        .collect();
    let (job_field, token_field) = (format!(" job={running} "), format!(" token={token} "));
    ensure!(
        released.iter().any(|line| line.contains(&job_field) && line.contains(&token_field)),
        "node {id} did not release job {running} (token {token}), whose command outlasts the \
         grace; released: {released:?} (log {})",
        log_path.display()
    );

    phase(&format!("node {id} left no lease held"));
    let survivors = Client::connect(&cluster.addrs_of(&others)?)?;
    let holder = format!("node-{id}");
    let held: Vec<String> = jobs_of(&survivors, None, v1::JobState::Claimed)
        .await?
        .into_iter()
        .filter_map(|job| {
            let lease = job.lease.filter(|lease| lease.holder == holder)?;
            Some(format!("job {} ({:?}) under {lease:?}", job.id, job.idempotency_key))
        })
        .collect();
    ensure!(
        held.is_empty(),
        "node {id} drained and exited, yet its executor still holds {held:?} (log {})",
        log_path.display()
    );

    let successor = if leads {
        phase(&format!("one of nodes {others:?} leads"));
        let handed_over = log.contains("event=\"drain.step\" step=\"handed over\"");
        let successor = cluster.wait_leader_among(&others, Duration::from_secs(10)).await?;
        eprintln!(
            "node {successor} leads {:.1} s after node {id}'s SIGTERM; handover {}",
            signalled.elapsed().as_secs_f64(),
            if handed_over { "took" } else { "did not take (see the drained node's log)" }
        );
        Some((successor, handed_over))
    } else {
        None
    };

    phase(&format!("restart node {id} on its data directory; wait for /readyz and catch-up"));
    let launched = Instant::now();
    cluster.node_mut(id)?.launch(sandbox)?;
    let http = cluster.node(id)?.http;
    wait_until(&format!("node {id}'s /readyz to answer 200"), deadline_in(READY_WITHIN), || {
        let running = cluster.node_mut(id).and_then(|node| node.ensure_running());
        async move {
            running?;
            Ok(match http_get(http, "/readyz").await {
                Ok(reply) if reply.status == 200 => Check::Done(()),
                Ok(reply) => Check::NotYet(format!("{} {:?}", reply.status, reply.body)),
                Err(error) => Check::NotYet(format!("{error:#}")),
            })
        }
    })
    .await?;
    let ready = launched.elapsed();
    cluster.wait_caught_up(id, CATCH_UP_WITHIN).await?;
    let released = released.len();
    Ok(Step { node: id, successor, released, drained, ready, caught_up: launched.elapsed() })
}

/// Waits until node `id`'s executor holds a command job granted less than
/// [`FRESH_GRANT_MS`] ago, and answers its id and token: its command has
/// more of its run left than the drain grace, so a drain now must stop it
/// and release its lease. Every node runs while this is asked.
async fn wait_fresh_command(cluster: &Cluster, id: u64) -> Result<(u64, u64)> {
    let client = cluster.client()?;
    let client = &client;
    let holder = format!("node-{id}");
    let holder = &holder;
    let what = format!("node {id}'s executor to start a command");
    wait_until(&what, deadline_in(FRESH_COMMAND_WITHIN), || async move {
        let now_ms = match client.stats(None, false).await {
            Ok(stats) => stats.cluster_time_ms,
            Err(error) => return Ok(Check::NotYet(format!("stats: {error}"))),
        };
        let claimed = match jobs_of(client, Some(EXEC_QUEUE), v1::JobState::Claimed).await {
            Ok(claimed) => claimed,
            Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
        };
        let leases: Vec<v1::Lease> = claimed.into_iter().filter_map(|job| job.lease).collect();
        let fresh = leases.iter().find(|lease| {
            lease.holder == *holder && now_ms.saturating_sub(lease.granted_at_ms) < FRESH_GRANT_MS
        });
        Ok(match fresh {
            Some(lease) => Check::Done((lease.job_id, lease.token)),
            None => Check::NotYet(format!("at {now_ms} ms the command leases are {leases:?}")),
        })
    })
    .await
}

/// Waits until the schedule has fired `ticks` more buckets than when asked.
/// Reads go to whichever node `client` is at; they are only made while
/// every node runs.
async fn wait_more_ticks(client: &Client, ticks: u64) -> Result<()> {
    let last_fired = || async move {
        Ok(match schedule_of(client, SCHEDULE, false).await {
            Ok(schedule) => Check::Done(schedule.last_fired_bucket),
            Err(error) => Check::NotYet(format!("{error:#}")),
        })
    };
    let from = wait_until("the schedule to read", deadline_in(PROGRESS_WITHIN), last_fired).await?;
    let what = format!("{ticks} ticks fired after bucket {from}");
    wait_until(&what, deadline_in(PROGRESS_WITHIN), || async move {
        Ok(match schedule_of(client, SCHEDULE, false).await {
            Ok(schedule) if schedule.last_fired_bucket >= from + ticks => Check::Done(()),
            Ok(schedule) => Check::NotYet(format!("last fired {}", schedule.last_fired_bucket)),
            Err(error) => Check::NotYet(format!("{error:#}")),
        })
    })
    .await
}

/// Waits until no command job is ready, delayed or claimed, none dead, and
/// answers every command job.
async fn wait_commands_finished(client: &Client) -> Result<Vec<v1::Job>> {
    wait_until("every command job finished", deadline_in(FINISH_WITHIN), || async move {
        let stats = match client.stats(Some(EXEC_QUEUE.to_string()), false).await {
            Ok(stats) => stats,
            Err(error) => return Ok(Check::NotYet(format!("stats: {error}"))),
        };
        let exec = stats.queues.into_iter().find(|q| q.queue == EXEC_QUEUE).unwrap_or_default();
        ensure!(exec.dead == 0, "a command job died: {exec:?}");
        Ok(if exec.ready + exec.delayed + exec.claimed == 0 {
            Check::Done(())
        } else {
            Check::NotYet(format!("{exec:?}"))
        })
    })
    .await?;
    let jobs = jobs_of(client, Some(EXEC_QUEUE), v1::JobState::Unspecified).await?;
    let unfinished: Vec<&v1::Job> =
        jobs.iter().filter(|job| job.state != v1::JobState::Acked as i32).collect();
    ensure!(unfinished.is_empty(), "command jobs not acked: {unfinished:?}");
    Ok(jobs)
}

/// Every job of `queue` (all queues: `None`) in `state` (any:
/// `Unspecified`), read linearizably.
async fn jobs_of(
    client: &Client,
    queue: Option<&str>,
    state: v1::JobState,
) -> Result<Vec<v1::Job>> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_jobs(v1::ListJobsRequest {
                queue: queue.map(str::to_string),
                state: state as i32,
                page_size: 1_000,
                page_token: page_token.clone(),
                stale: false,
            })
            .await
            .context("list jobs")?;
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(jobs);
        }
        page_token = page.next_page_token;
    }
}
