//! Goal: a node's readiness holds through a routine change of leader, and
//! fails once an election has run longer than one election timeout
//! (docs/operations.md, "Health").
//!
//! Method: the three turmoil hosts of `journal_hosts` (no gate), each with
//! the node's `Readiness` and its leader tracker (`track_leader`) running on
//! the host's runtime. The driver waits for a stamping leader and lets the
//! trackers look for half a second. Then it cuts the leader off from both
//! followers: their election timers fire and one of them is elected. Every
//! tick from the cut until a new leader has led for half a second, the
//! driver reads both followers' readiness as made at that moment
//! (`Readiness::report_now`, no cache) and their Raft metrics. Then it
//! cuts the two followers apart as well, so no election can succeed, and
//! reads them until both fail their `leader` check.
//!
//! Checks: through the change of leader every `leader` check of both
//! followers passed, while the metrics showed a follower naming no leader
//! at some tick (the election was seen, so the first check is not
//! vacuous); once cut apart, the follower that does not lead fails with
//! "no leader known for", not before and not much after its election grace
//! (one election timeout) has run out since it last named a leader; the
//! same seed gives the same history twice.
//!
//! What fails if the feature goes: readiness that fails the moment no
//! leader is known (no grace), or a tracker that never notes a leader,
//! fails the election's ticks; a grace without a bound leaves a node that
//! can elect no one ready for ever, and a longer grace fails the upper
//! bound.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_raft::NodeId;
use leasehold_replica::Readiness;
use leasehold_replica::readiness::{LEADER_LOOK_EVERY, track_leader};
use leasehold_sim::net::host_name;
use openraft::ServerState;
use tokio::time::Instant;

use crate::journal_hosts::{
    Host, Hosts, NODES, Peers, Skews, WAIT, form_group, real_ms, stamping_leader, start,
};

/// How long the new leader must have led before the first phase ends.
const SETTLED: Duration = Duration::from_millis(500);
/// How much later than its grace a node may be seen to fail: the driver's
/// looks are a tick apart, each waiting for a simulated disk sync (up to
/// 12 ms).
const LOOK_SLACK_MS: u64 = 50;

/// One follower's readiness and Raft view at one tick.
#[derive(Clone, Debug, PartialEq)]
struct Look {
    /// The `leader` check.
    leader_check: Result<(), String>,
    /// The leader its metrics name.
    names: Option<NodeId>,
    /// Whether it leads.
    leads: bool,
    /// Its election grace (one election timeout), in milliseconds.
    grace_ms: u64,
}

/// What one run recorded.
#[derive(Debug, Default, PartialEq)]
struct Run {
    history: Vec<String>,
    /// Ticks of the change of leader at which a follower named no leader.
    leaderless_looks: usize,
    /// `leader` checks that failed during the change of leader.
    failed_in_change: Vec<String>,
    /// Per follower: how long after its last known leader its check failed
    /// once cut apart, its grace, and the failure.
    failed_apart: Vec<(NodeId, u64, u64, String)>,
}

/// Reads `host`'s readiness now, on its own runtime (whose clock its
/// tracker noted time by).
async fn look(host: &Host, readiness: &Readiness) -> anyhow::Result<Look> {
    let readiness = readiness.clone();
    let journal = host.journal.clone();
    host.runtime
        .spawn(async move {
            let report = readiness.report_now().await;
            let leader_check = report
                .checks
                .iter()
                .find(|(name, _)| name == "leader")
                .map(|(_, outcome)| outcome.clone())
                .unwrap_or_else(|| Err("no leader check in the report".to_string()));
            let metrics = journal.raft().metrics().borrow().clone();
            Look {
                leader_check,
                names: metrics.current_leader,
                leads: metrics.state == ServerState::Leader,
                grace_ms: journal.raft().config().election_timeout_max,
            }
        })
        .await
        .map_err(anyhow::Error::from)
}

async fn drive(hosts: Hosts, run: Arc<Mutex<Run>>) -> anyhow::Result<()> {
    let mut history = Vec::new();
    form_group(&hosts, Peers::Unused).await?;
    let (leader_id, _) = stamping_leader(&hosts).await?;
    let followers: Vec<NodeId> = (1..=NODES).filter(|id| *id != leader_id).collect();
    // Kept until the driver ends: a dropped sender stops the trackers.
    let (_trackers_on, trackers_shutdown) = tokio::sync::watch::channel(false);
    let mut watched = Vec::new();
    for id in &followers {
        let host = hosts.get(*id).ok_or_else(|| anyhow::anyhow!("node {id} is down"))?;
        let readiness = Readiness::new(host.journal.clone());
        host.runtime.spawn(track_leader(readiness.clone(), trackers_shutdown.clone()));
        watched.push((*id, host, readiness));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (id, host, readiness) in &watched {
        let first = look(host, readiness).await?;
        anyhow::ensure!(first.leader_check.is_ok(), "node {id} before the cut: {first:?}");
    }

    tracing::info!("--- the leader is cut off from both followers");
    for id in &followers {
        turmoil::partition(host_name(leader_id), host_name(*id));
    }
    history.push(format!("{} node {leader_id} (the leader) cut off", real_ms()));
    let (mut leaderless_looks, mut failed_in_change) = (0, Vec::new());
    let deadline = Instant::now() + WAIT;
    let mut led_since: Option<(NodeId, Instant)> = None;
    loop {
        let mut leader_now = None;
        for (id, host, readiness) in &watched {
            let seen = look(host, readiness).await?;
            if seen.names.is_none() {
                leaderless_looks += 1;
            }
            if let Err(why) = &seen.leader_check {
                failed_in_change.push(format!("{} node {id}: {why}", real_ms()));
            }
            if seen.leads {
                leader_now = Some(*id);
            }
        }
        led_since = match (led_since, leader_now) {
            (Some((was, since)), Some(now)) if was == now => Some((was, since)),
            (_, Some(now)) => {
                history.push(format!("{} node {now} leads", real_ms()));
                Some((now, Instant::now()))
            }
            (_, None) => None,
        };
        if led_since.is_some_and(|(_, since)| since.elapsed() >= SETTLED) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no new leader within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    history.push(format!(
        "{} {leaderless_looks} leaderless looks, {} failed checks",
        real_ms(),
        failed_in_change.len()
    ));

    tracing::info!("--- the followers are cut apart too: no election can succeed");
    let [one, other] = followers.as_slice() else {
        anyhow::bail!("followers {followers:?}");
    };
    turmoil::partition(host_name(*one), host_name(*other));
    let cut_apart = Instant::now();
    history.push(format!("{} nodes {one} and {other} cut apart", real_ms()));
    let mut failed_apart: Vec<(NodeId, u64, u64, String)> = Vec::new();
    let mut last_known: Vec<(NodeId, Instant)> =
        followers.iter().map(|id| (*id, cut_apart)).collect();
    let deadline = Instant::now() + WAIT;
    while failed_apart.len() < watched.len() {
        for (id, host, readiness) in &watched {
            if failed_apart.iter().any(|(failed, ..)| failed == id) {
                continue;
            }
            let seen = look(host, readiness).await?;
            let known = last_known.iter_mut().find(|(known, _)| known == id);
            let Some((_, known_at)) = known else { continue };
            if seen.names.is_some() {
                *known_at = Instant::now();
            }
            if let Err(why) = seen.leader_check {
                let after_ms = u64::try_from(known_at.elapsed().as_millis()).unwrap_or(u64::MAX);
                history.push(format!("{} node {id} unready: {why}", real_ms()));
                failed_apart.push((*id, after_ms, seen.grace_ms, why));
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "still ready {WAIT:?} after the cut");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    *run = Run { history, leaderless_looks, failed_in_change, failed_apart };
    Ok(())
}

fn run(seed: u64) -> anyhow::Result<Run> {
    let simulation = start(seed, Peers::Unused, Skews::Either)?;
    let (mut sim, hosts) = (simulation.sim, simulation.hosts);
    let recorded = Arc::new(Mutex::new(Run::default()));
    let driver_run = recorded.clone();
    sim.client("driver", async move { drive(hosts, driver_run).await.map_err(|e| e.into()) });
    sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(run)
}

#[test]
fn readiness_holds_through_a_change_of_leader_and_fails_past_the_bound() -> anyhow::Result<()> {
    for seed in [3, 17] {
        let first = run(seed)?;
        let text = first.history.join("\n");
        println!("seed {seed}:\n{text}");
        assert!(
            first.leaderless_looks > 0,
            "seed {seed}: no follower was seen without a leader; the election was not looked at"
        );
        assert!(
            first.failed_in_change.is_empty(),
            "seed {seed}: readiness failed during a routine change of leader: {:#?}",
            first.failed_in_change
        );
        let electing: Vec<_> = first
            .failed_apart
            .iter()
            .filter(|(.., why)| why.contains("no leader known for"))
            .collect();
        assert!(
            !electing.is_empty(),
            "seed {seed}: no follower failed for want of a leader: {first:?}"
        );
        // The tracker looks every LEADER_LOOK_EVERY, so it may have last
        // noted the leader that much before the driver last saw it named;
        // and a look of the driver's waits for a simulated disk sync.
        let look_ms = u64::try_from(LEADER_LOOK_EVERY.as_millis()).unwrap_or(u64::MAX);
        for (id, after_ms, grace_ms, why) in electing {
            assert!(
                after_ms + look_ms > *grace_ms,
                "seed {seed}: node {id} failed {after_ms} ms after it last knew a leader, within \
                 its grace of {grace_ms} ms: {why}"
            );
            assert!(
                *after_ms <= grace_ms + LOOK_SLACK_MS,
                "seed {seed}: node {id} failed only {after_ms} ms after it last knew a leader, \
                 past its grace of {grace_ms} ms: {why}"
            );
        }
        assert_eq!(first, run(seed)?, "seed {seed} is not deterministic");
    }
    Ok(())
}
