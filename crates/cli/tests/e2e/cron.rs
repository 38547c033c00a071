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
    Check, CliRun, Cluster, ClusterOptions, NODE_READY_TIMEOUT, Node, RPC_TIMEOUT, Sandbox,
    deadline_in, phase, run_cli, wait_until,
};

/// The built-in executor's queue: command jobs of schedules land here.
const EXEC_QUEUE: &str = "exec";
/// How long a drained node may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the fired jobs of a story may take to be run and acked once the
/// schedule is paused.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

mod catchup;
mod each;
mod failover;
mod overlap;
mod validation;

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
