//! Goal: one node whose wall clock runs two minutes ahead cannot move
//! cluster time, cannot shorten a lease, and cannot lead; the two correct
//! nodes keep serving and stay ready; once its clock is right again it
//! takes part in full, leadership included (issue acceptance, clocks;
//! docs/safety.md, the enforced clock bound).
//!
//! Method: three nodes; node 3 starts with the fault-injection clock
//! offset (+120 s) and fast elections (300–500 ms), nodes 1 and 2 with slow
//! ones (2–2.6 s), so whenever the leader goes quiet node 3's election
//! timer fires first by far (openraft adds the leader lease, the maximum
//! timeout, to a follower's wait: about 1 s against 5 s): if it stood for
//! election it would win. The bound is the default 500 ms. Throughout, a watcher looks four times a
//! second: nodes 1 and 2 answer `/readyz` 200 (except one the story has
//! paused, from its pause until it answers ready again), and, while skewed,
//! node 3 answers 503 naming its clock and is never leader.
//!
//! 1. Node 3 reports not ready with the clock reason and `clock_skewed`.
//! 2. A write through every node succeeds — node 3 forwards — and is
//!    stamped with real time (the job's `enqueued_at_ms` against the test's
//!    wall clock), and so is a 10 s lease claimed through node 3.
//! 3. The leader is paused (SIGSTOP): node 2 or 1, with its slow timer, is
//!    elected; node 3 stands aside. The paused node resumes.
//! 4. Writes through every node succeed again, stamped with real time.
//! 5. A second worker polls for the held job through all three nodes from
//!    before the pause on: no grant may come from a claim sent earlier
//!    than the lease's TTL minus the bound after the first claim was sent
//!    (real time, the test's monotonic clock), and one must come soon after
//!    the lease (and the new leader's grace) ran out.
//! 6. `Faults.SetClock` puts node 3's clock right: it becomes ready again.
//! 7. The leader is paused again; node 3's fast election now wins. The
//!    paused node resumes, and writes through every node succeed, stamped
//!    with real time by node 3.
//! 8. Node 3, leading, has its clock stepped two minutes ahead again: it
//!    hands leadership to a correct node, which must lead within
//!    [`HANDED_OVER_WITHIN`] of the step. Left to their own timers the
//!    correct nodes would wait out the leader lease (2.6 s) and an election
//!    timeout (at least 2 s) after node 3's last heartbeat; asked to
//!    campaign by node 3, one wins in a vote round. Node 3 then reports
//!    its clock skewed and does not lead, and writes through every node
//!    succeed, stamped with real time.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::queue_client::QueueClient;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::e2e::cluster::cluster_slot;
use crate::e2e::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, ClusterOptions, Sandbox, deadline_in, http_get, job,
    phase, wait_until,
};

/// The skewed node.
const SKEWED: u64 = 3;
/// The correct nodes.
const CORRECT: [u64; 2] = [1, 2];
/// How far ahead node 3's clock starts.
const SKEW_MS: i64 = 120_000;
/// The enforced bound (the default, stated so the story can count on it).
const BOUND_MS: u64 = 500;
const HELD_QUEUE: &str = "held";
const WRITE_QUEUE: &str = "writes";
const LAST_QUEUE: &str = "last";
const LEASE_TTL_MS: u64 = 10_000;
/// How far a stamp may be from the test's wall clock around the write
/// (the nodes share this machine's clock; this is scheduling slack).
const STAMP_SLACK_MS: u64 = 1_000;
/// How long a node may take to report its clock verdict, either way.
const VERDICT_WITHIN: Duration = Duration::from_secs(20);
/// How long an election after a pause may take.
const ELECTION_WITHIN: Duration = Duration::from_secs(20);
/// How long writes may fail after a change of leader.
const WRITES_WITHIN: Duration = Duration::from_secs(20);
/// When the second worker must have the held job, after the first claim:
/// the TTL, the bound, the new leader's grace, its sweep, and slack.
const HAND_OVER_WITHIN: Duration = Duration::from_millis(LEASE_TTL_MS + 20_000);
/// Long-poll wait of a claim that must be granted.
const CLAIM_WAIT_MS: u64 = 5_000;
/// How soon after a leading node's clock steps beyond the bound a correct
/// node must lead (step 8): well under the 4.6 s the correct nodes' own
/// timers take at the least, with room for a busy machine.
const HANDED_OVER_WITHIN: Duration = Duration::from_millis(3_000);
/// Deadline of one call made by the watcher or the second worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_node_neither_leads_nor_moves_time_and_rejoins_once_right() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("clocks-skewed-node")?;
    sandbox.run(Duration::from_secs(150), story(&sandbox)).await
}

fn slow_elections() -> String {
    "election_timeout_min_ms = 2000\nelection_timeout_max_ms = 2600".to_string()
}

fn now_wall_ms() -> Result<u64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).context("the clock is before 1970")?;
    u64::try_from(since.as_millis()).context("wall clock in ms")
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start three nodes: node 3 two minutes ahead with fast elections, 1 and 2 slow");
    let options = ClusterOptions {
        config: format!("fault_injection = true\nmax_clock_offset_ms = {BOUND_MS}"),
        node_config: vec![
            (1, slow_elections()),
            (2, slow_elections()),
            (
                SKEWED,
                format!(
                    "election_timeout_min_ms = 300\nelection_timeout_max_ms = 500\n\
                     clock_offset_ms = {SKEW_MS}"
                ),
            ),
        ],
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start_with(sandbox, 3, options).await?;

    phase("node 3 reports not ready for its clock; nodes 1 and 2 are ready");
    let skewed = wait_verdict(&cluster, SKEWED, true).await?;
    eprintln!("node 3: {}", skewed.clock);
    for id in CORRECT {
        let me = wait_verdict(&cluster, id, false).await?;
        let three = me.clock_offsets.iter().find(|o| o.node_id == SKEWED);
        ensure!(
            three.is_some_and(|o| o.offset_ms.abs_diff(SKEW_MS) < 5_000),
            "node {id} measures node 3 at {three:?}, not about +{SKEW_MS} ms"
        );
    }
    let watcher = Watcher::start(&cluster)?;

    phase("a write through every node succeeds, stamped with real time");
    writes_through_every_node(&cluster, "skewed").await?;
    let claim_sent = Instant::now();
    let held = claim_stamped(&cluster, SKEWED, HELD_QUEUE, "worker-first").await?;

    phase("a second worker polls for the held job through every node from now on");
    let second = SecondWorker::start(&cluster)?;

    phase("pause the leader: a slow correct node is elected, node 3 stands aside");
    let paused = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?.leader;
    ensure!(CORRECT.contains(&paused), "node {paused} leads, not one of {CORRECT:?}");
    let successor = CORRECT.iter().copied().find(|id| *id != paused).context("a successor")?;
    pause_leader_until(&mut cluster, &watcher, paused, successor).await?;

    phase("writes through every node succeed again under the new leader");
    writes_through_every_node(&cluster, "after-election").await?;

    phase("the held lease stays with its worker for TTL - bound in real time");
    let (granting_sent, second_lease) = second.wait().await?;
    let waited = granting_sent.saturating_duration_since(claim_sent);
    eprintln!(
        "the held job went to the second worker by a claim sent {} ms after the first \
         (TTL {LEASE_TTL_MS} ms, bound {BOUND_MS} ms)",
        waited.as_millis()
    );
    ensure!(
        waited >= Duration::from_millis(LEASE_TTL_MS - BOUND_MS),
        "the held job was handed over by a claim sent {} ms after the first claim, before TTL - \
         bound ({} ms)",
        waited.as_millis(),
        LEASE_TTL_MS - BOUND_MS
    );
    ensure!(
        second_lease.job_id == held.job_id && second_lease.token > held.token,
        "the second lease {second_lease:?} does not supersede {held:?}"
    );

    phase("set node 3's clock right: it becomes ready again");
    watcher.set_skew_expected(false)?;
    let answer = cluster
        .node(SKEWED)?
        .faults_stub()?
        .set_clock(v1::SetClockRequest { offset_ms: 0, rate: 1.0 })
        .await
        .context("Faults.SetClock on node 3")?
        .into_inner();
    let wall = now_wall_ms()?;
    ensure!(answer.now_ms.abs_diff(wall) < STAMP_SLACK_MS, "node 3's clock reads {answer:?}");
    let right = wait_verdict(&cluster, SKEWED, false).await?;
    eprintln!("node 3: {}", right.clock);

    phase("pause the leader again: node 3's fast election wins now");
    pause_leader_until(&mut cluster, &watcher, successor, SKEWED).await?;

    phase("writes through every node succeed, stamped with real time by node 3");
    writes_through_every_node(&cluster, "right-again").await?;
    claim_stamped(&cluster, 1, LAST_QUEUE, "worker-last").await?;
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    ensure!(converged.leader == SKEWED, "node {} leads at the end, not node 3", converged.leader);

    phase("the watcher saw no correct node unready and no skewed node lead");
    let (looks, violations) = watcher.stop().await?;
    eprintln!("the watcher looked {looks} times");
    ensure!(violations.is_empty(), "the watcher saw: {violations:#?}");
    ensure!(looks >= 20, "the watcher looked only {looks} times");

    phase("node 3's clock steps ahead while it leads: it hands over to a correct node");
    cluster
        .node(SKEWED)?
        .faults_stub()?
        .set_clock(v1::SetClockRequest { offset_ms: SKEW_MS, rate: 1.0 })
        .await
        .context("Faults.SetClock on node 3, leading")?;
    let stepped = Instant::now();
    let successor = cluster.wait_leader_among(&CORRECT, ELECTION_WITHIN).await?;
    let took = stepped.elapsed();
    eprintln!("node {successor} leads {} ms after node 3's clock stepped", took.as_millis());
    ensure!(
        took < HANDED_OVER_WITHIN,
        "node {successor} led {} ms after node 3's clock stepped, not within {} ms: node 3 did \
         not hand over, and the others waited out their own timers",
        took.as_millis(),
        HANDED_OVER_WITHIN.as_millis()
    );
    let aside = wait_verdict(&cluster, SKEWED, true).await?;
    ensure!(aside.role != "leader", "node 3 still leads while skewed: {aside:?}");
    writes_through_every_node(&cluster, "handed-over").await?;
    Ok(())
}

/// Waits until node `id` reports the clock verdict asked for — skewed (not
/// ready with the clock reason, `clock_skewed`) or not (ready, not
/// `clock_skewed`) — and answers its status.
async fn wait_verdict(cluster: &Cluster, id: u64, skewed: bool) -> Result<v1::NodeStatus> {
    let node = cluster.node(id)?;
    let what = format!("node {id} to report its clock {}", if skewed { "skewed" } else { "right" });
    wait_until(&what, deadline_in(VERDICT_WITHIN), || async move {
        let ready = http_get(node.http, "/readyz").await?;
        let me = node.local_status().await?;
        let says_clock = ready.body.contains("clock: failed");
        let done = if skewed {
            ready.status == 503 && says_clock && me.clock_skewed
        } else {
            ready.status == 200 && !me.clock_skewed
        };
        Ok(if done {
            Check::Done(me)
        } else {
            Check::NotYet(format!("readyz {} {:?}; clock {:?}", ready.status, ready.body, me.clock))
        })
    })
    .await
}

/// Enqueues one job through each node in turn (retrying while leadership
/// settles) and checks that the job was stamped with real time.
async fn writes_through_every_node(cluster: &Cluster, label: &str) -> Result<()> {
    for id in cluster.ids() {
        let stub = cluster.node(id)?.stub()?;
        let payload = format!("{label} through node {id}");
        let what = format!("a write through node {id}");
        let (before, job_id, after) = wait_until(&what, deadline_in(WRITES_WITHIN), || {
            let mut stub = stub.clone();
            let request = v1::EnqueueRequest { jobs: vec![job(WRITE_QUEUE, payload.as_bytes())] };
            async move {
                let before = now_wall_ms()?;
                let answer = tokio::time::timeout(CALL_TIMEOUT, stub.enqueue(request)).await;
                let after = now_wall_ms()?;
                Ok(match answer {
                    Ok(Ok(answer)) => match answer.into_inner().results.as_slice() {
                        [result] => Check::Done((before, result.job_id, after)),
                        other => bail!("enqueue answered {other:?}"),
                    },
                    Ok(Err(status)) => Check::NotYet(format!("{status}")),
                    Err(_) => Check::NotYet("no answer in time".to_string()),
                })
            }
        })
        .await?;
        let written = cluster
            .node(id)?
            .stub()?
            .get_job(v1::GetJobRequest { job_id, stale: false })
            .await
            .context("reading the job back")?
            .into_inner()
            .job
            .context("the job is missing")?;
        check_stamp(
            &format!("job {job_id} written through node {id}"),
            written.enqueued_at_ms,
            before,
            after,
        )?;
    }
    Ok(())
}

/// Fails unless `stamp_ms` lies within the test's wall clock around the
/// write, give or take [`STAMP_SLACK_MS`].
fn check_stamp(what: &str, stamp_ms: u64, before_ms: u64, after_ms: u64) -> Result<()> {
    ensure!(
        stamp_ms + STAMP_SLACK_MS >= before_ms && stamp_ms <= after_ms + STAMP_SLACK_MS,
        "{what} was stamped {stamp_ms}, {:+} ms off the real time around the write ({before_ms} \
         ..= {after_ms})",
        i128::from(stamp_ms) - i128::from(after_ms)
    );
    Ok(())
}

/// Enqueues one job on `queue` and claims it through node `id` as
/// `worker` with a [`LEASE_TTL_MS`] lease; checks the lease's stamps.
async fn claim_stamped(cluster: &Cluster, id: u64, queue: &str, worker: &str) -> Result<v1::Lease> {
    let mut stub = cluster.node(id)?.stub()?;
    stub.enqueue(v1::EnqueueRequest { jobs: vec![job(queue, worker.as_bytes())] })
        .await
        .with_context(|| format!("enqueue on {queue} through node {id}"))?;
    let before = now_wall_ms()?;
    let answer = stub
        .claim(v1::ClaimRequest {
            worker: worker.to_string(),
            queue: queue.to_string(),
            max: 1,
            lease_ttl_ms: Some(LEASE_TTL_MS),
            // A follower proposes once it has applied the enqueue itself.
            wait_ms: CLAIM_WAIT_MS,
            request_id: format!("{worker}-claim"),
            ..Default::default()
        })
        .await
        .with_context(|| format!("{worker}'s claim through node {id}"))?
        .into_inner();
    let after = now_wall_ms()?;
    let Some(v1::Grant { lease: Some(lease), .. }) = answer.grants.into_iter().next() else {
        bail!("{worker}'s claim through node {id} was granted nothing");
    };
    check_stamp(&format!("{worker}'s lease"), lease.granted_at_ms, before, after)?;
    ensure!(
        lease.expires_at_ms.checked_sub(lease.granted_at_ms) == Some(LEASE_TTL_MS),
        "{worker}'s lease does not last {LEASE_TTL_MS} ms: {lease:?}"
    );
    Ok(lease)
}

/// Pauses node `paused` (the leader) until node `expected` leads, then
/// resumes it and waits until it is ready again; the watcher excuses it
/// meanwhile.
async fn pause_leader_until(
    cluster: &mut Cluster,
    watcher: &Watcher,
    paused: u64,
    expected: u64,
) -> Result<()> {
    watcher.excuse(paused, true)?;
    cluster.node(paused)?.signal(Signal::SIGSTOP)?;
    let paused_at = Instant::now();
    let elected = cluster.wait_leader_among(&[expected], ELECTION_WITHIN).await;
    cluster.node(paused)?.signal(Signal::SIGCONT)?;
    elected?;
    eprintln!(
        "node {expected} leads {} ms after node {paused} was paused",
        paused_at.elapsed().as_millis()
    );
    let node = cluster.node(paused)?;
    let what = format!("node {paused} to be ready again after its pause");
    wait_until(&what, deadline_in(VERDICT_WITHIN), || async move {
        let ready = http_get(node.http, "/readyz").await?;
        Ok(if ready.status == 200 {
            Check::Done(())
        } else {
            Check::NotYet(format!("{} {:?}", ready.status, ready.body))
        })
    })
    .await?;
    watcher.excuse(paused, false)
}

/// What the watcher keeps.
#[derive(Debug, Default)]
struct Watched {
    /// Correct nodes not looked at (paused by the story).
    excused: BTreeSet<u64>,
    /// Whether node 3 must look skewed (not ready, naming its clock, not leading).
    skew_expected: bool,
    looks: u64,
    violations: Vec<String>,
}

/// Looks at every node four times a second until stopped (see the module doc).
struct Watcher {
    watched: Arc<Mutex<Watched>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// How often the watcher looks.
const WATCH_EVERY: Duration = Duration::from_millis(250);

impl Watcher {
    fn start(cluster: &Cluster) -> Result<Watcher> {
        let mut correct = Vec::new();
        for id in CORRECT {
            correct.push((id, cluster.node(id)?.http));
        }
        let skewed = cluster.node(SKEWED)?;
        let skewed = (skewed.http, skewed.cluster_stub()?);
        let watched = Arc::new(Mutex::new(Watched { skew_expected: true, ..Watched::default() }));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(watch_loop(correct, skewed, watched.clone(), stopped));
        Ok(Watcher { watched, stop, task })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Watched) -> T) -> Result<T> {
        let mut watched = self.watched.lock().map_err(|_| anyhow!("the watcher is poisoned"))?;
        Ok(f(&mut watched))
    }

    fn excuse(&self, id: u64, excused: bool) -> Result<()> {
        self.with(|w| {
            if excused {
                w.excused.insert(id);
            } else {
                w.excused.remove(&id);
            }
        })
    }

    fn set_skew_expected(&self, expected: bool) -> Result<()> {
        self.with(|w| w.skew_expected = expected)
    }

    /// Stops the watcher; answers how often it looked and what it saw wrong.
    async fn stop(self) -> Result<(u64, Vec<String>)> {
        let Watcher { watched, stop, task } = self;
        stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .context("the watcher did not stop")?
            .context("the watcher failed")?;
        let mut watched = watched.lock().map_err(|_| anyhow!("the watcher is poisoned"))?;
        Ok((watched.looks, std::mem::take(&mut watched.violations)))
    }
}

async fn watch_loop(
    correct: Vec<(u64, SocketAddr)>,
    skewed: (SocketAddr, ClusterClient<Channel>),
    watched: Arc<Mutex<Watched>>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tick.tick() => {}
        }
        let (excused, skew_expected) = match watched.lock() {
            Ok(w) => (w.excused.clone(), w.skew_expected),
            Err(_) => return,
        };
        let mut seen = Vec::new();
        for (id, http) in &correct {
            if excused.contains(id) {
                continue;
            }
            match http_get(*http, "/readyz").await {
                Ok(ready) if ready.status == 200 => {}
                Ok(ready) => {
                    seen.push(format!("node {id} not ready: {} {:?}", ready.status, ready.body))
                }
                Err(error) => seen.push(format!("node {id} readyz: {error:#}")),
            }
        }
        if skew_expected {
            match http_get(skewed.0, "/readyz").await {
                Ok(ready) if ready.status == 503 && ready.body.contains("clock: failed") => {}
                Ok(ready) => seen.push(format!(
                    "node 3, skewed, answered readyz {} {:?}",
                    ready.status, ready.body
                )),
                Err(error) => seen.push(format!("node 3 readyz: {error:#}")),
            }
            let mut stub = skewed.1.clone();
            let status = tokio::time::timeout(
                CALL_TIMEOUT,
                stub.status(v1::StatusRequest { local_only: true }),
            )
            .await;
            match status {
                Ok(Ok(status)) => {
                    let status = status.into_inner();
                    let me = status.nodes.iter().find(|n| n.id == SKEWED);
                    if status.leader == SKEWED || me.is_some_and(|m| m.role == "leader") {
                        seen.push(format!("node 3 leads while skewed: {status:?}"));
                    }
                }
                Ok(Err(error)) => seen.push(format!("node 3 status: {error}")),
                Err(_) => seen.push("node 3 status: no answer in time".to_string()),
            }
        }
        let Ok(mut w) = watched.lock() else { return };
        // A look that began before a change of plan is judged by the old plan.
        if w.excused == excused && w.skew_expected == skew_expected {
            w.looks += 1;
            w.violations.extend(seen);
        }
    }
}

/// A second worker claiming the held job through every node in turn, five
/// times a second, until it gets it; answers when its granting claim was
/// sent and the lease.
struct SecondWorker {
    task: JoinHandle<Result<(Instant, v1::Lease)>>,
}

impl SecondWorker {
    fn start(cluster: &Cluster) -> Result<SecondWorker> {
        let stubs: Vec<(u64, QueueClient<Channel>)> = cluster
            .ids()
            .into_iter()
            .map(|id| Ok((id, cluster.node(id)?.stub()?)))
            .collect::<Result<_>>()?;
        let task = tokio::spawn(async move {
            let mut turn = 0_usize;
            wait_until(
                "the second worker to get the held job",
                deadline_in(HAND_OVER_WITHIN),
                || {
                    turn += 1;
                    let (id, mut stub) = stubs[turn % stubs.len()].clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        let sent = Instant::now();
                        let request = v1::ClaimRequest {
                            worker: "worker-second".to_string(),
                            queue: HELD_QUEUE.to_string(),
                            max: 1,
                            lease_ttl_ms: Some(LEASE_TTL_MS),
                            wait_ms: 0,
                            ..Default::default()
                        };
                        Ok(match tokio::time::timeout(CALL_TIMEOUT, stub.claim(request)).await {
                            Ok(Ok(answer)) => match answer.into_inner().grants.into_iter().next() {
                                Some(v1::Grant { lease: Some(lease), .. }) => {
                                    Check::Done((sent, lease))
                                }
                                Some(other) => bail!("a grant without a lease: {other:?}"),
                                None => Check::NotYet(format!("node {id}: nothing granted")),
                            },
                            Ok(Err(status)) => Check::NotYet(format!("node {id}: {status}")),
                            Err(_) => Check::NotYet(format!("node {id}: no answer in time")),
                        })
                    }
                },
            )
            .await
        });
        Ok(SecondWorker { task })
    }

    async fn wait(self) -> Result<(Instant, v1::Lease)> {
        self.task.await.context("the second worker failed")?
    }
}
