//! Goal: the replica's real `Journal` runs on the seeded simulation — its
//! stamps follow the leader host's simulated wall clock (skew and drift
//! included), its clock measurements age with simulated time, and one
//! seed gives the same history twice.
//!
//! Method: three turmoil hosts, each running openraft on its simulated
//! disk over the simulated network (as `leasehold_sim::cluster` runs
//! them) and a `Journal` over its Raft handle and stores, whose `Clock`
//! is the host's simulated clock (`Clocks::replica_clock`). Every host's
//! clock is off real time by 100–200 ms either way, from the seed. No
//! gate runs: each host records its peers' clocks once a second on its
//! own runtime, as the gate's adverts would measure them, with a zero
//! round trip. A driver (a turmoil client) forms the group, waits for a
//! leader whose clock a majority agrees with, and hands each write to
//! the leader's journal on the leader's own runtime, as the node's gRPC
//! server would: eight concurrent enqueues, a claim, an ack, a stale ack
//! and a linearizable read. The history is every answer, every entry
//! the leader wrote with its stamp, and every replica's digest.
//!
//! What fails if the feature goes: a journal on the system clock, or on
//! real time without the host's skew, stamps outside the leader host's
//! clock; a watch aging by the process's monotonic clock keeps a
//! measurement fresh after its simulated lifetime.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{Command, Refusal, Response};
use leasehold_replica::Clock;
use leasehold_sim::clock::{Clocks, EPOCH_MS, HostClock};
use tokio::time::Instant;

use crate::journal_hosts::{
    FRESH_FOR, Hosts, NODES, Peers, Skews, claim_two_ack_one, enqueue_at_once, form_group,
    last_log_index, propose, real_ms, stamping_leader, stamps_and_digests, start,
};

/// How many enqueues the driver proposes at once.
const ENQUEUES: u64 = 8;

/// What one run recorded.
#[derive(Debug, Default, PartialEq)]
struct Run {
    /// One line per answer, entry and digest, simulated milliseconds first.
    history: Vec<String>,
    /// The leader's host clock, and the simulated real time the writes
    /// were made in.
    leader_clock: HostClock,
    writes_real_ms: (u64, u64),
    /// The stamps of the leader's entries from the writes.
    stamps: Vec<u64>,
}

/// The driver: forms the group, writes through the leader's journal, and
/// records what it saw.
async fn drive(hosts: Hosts, clocks: Clocks, run: Arc<Mutex<Run>>) -> anyhow::Result<()> {
    let mut history = Vec::new();
    form_group(&hosts, Peers::Unused).await?;
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    history.push(format!("{} node {leader_id} leads and may stamp", real_ms()));
    let first_index = last_log_index(leader.journal.raft()) + 1;

    tracing::info!("--- eight concurrent enqueues through the leader's journal");
    let writes_from_ms = real_ms();
    enqueue_at_once(&leader, ENQUEUES, &mut history).await?;

    tracing::info!("--- claim two, ack one, and a stale ack is refused");
    let grants = claim_two_ack_one(&leader, &mut history).await?;
    let held = &grants[1].lease;
    let stale = Command::Ack { job_id: held.job_id, token: held.token + 100, result: None };
    let answer = propose(&leader, stale).await??;
    history.push(format!("{} stale ack -> {answer:?}", real_ms()));
    anyhow::ensure!(
        matches!(answer, Response::Refused(Refusal::StaleToken { .. })),
        "a stale ack was answered {answer:?}"
    );
    let writes_to_ms = real_ms();

    tracing::info!("--- a linearizable read through the leader's journal");
    let journal = leader.journal.clone();
    let read = leader
        .runtime
        .spawn(async move { journal.read(false, |state| state.stats(0).get("q").cloned()).await })
        .await??;
    history.push(format!("{} read -> {read:?}", real_ms()));

    tracing::info!("--- the leader's entries and their stamps; every replica's digest");
    let stamps = stamps_and_digests(&hosts, &leader, first_index, &mut history).await?;
    let leader_clock = clocks.host_clock(leader_id);
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    *run = Run { history, leader_clock, writes_real_ms: (writes_from_ms, writes_to_ms), stamps };
    Ok(())
}

/// Runs the journal on the simulation seeded with `seed`.
fn run(seed: u64) -> anyhow::Result<Run> {
    let simulation = start(seed, Peers::Unused, Skews::Either)?;
    let (mut sim, hosts, clocks) = (simulation.sim, simulation.hosts, simulation.clocks);
    let recorded = Arc::new(Mutex::new(Run::default()));
    let (driver_hosts, driver_clocks, driver_run) =
        (hosts.clone(), clocks.clone(), recorded.clone());
    sim.client("driver", async move {
        drive(driver_hosts, driver_clocks, driver_run).await.map_err(|error| error.into())
    });
    sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(run)
}

#[test]
fn the_journal_stamps_with_its_hosts_simulated_clock_and_replays_from_its_seed()
-> anyhow::Result<()> {
    let seed = 11;
    println!("seed {seed}");
    let first = run(seed)?;
    let text = first.history.join("\n");

    // Every write went through the journal and was applied.
    assert!(text.contains("Refused(StaleToken"), "seed {seed}: no stale ack refused in\n{text}");
    assert_eq!(
        text.matches(" digest ").count(),
        NODES as usize,
        "seed {seed}: a replica is missing in\n{text}"
    );
    let digests: Vec<&str> =
        first.history.iter().filter_map(|line| line.split(" digest ").nth(1)).collect();
    assert!(digests.windows(2).all(|pair| pair[0] == pair[1]), "replicas diverged:\n{text}");
    assert!(
        !first.stamps.is_empty() && first.stamps.len() < ENQUEUES as usize + 3,
        "seed {seed}: {} entries for {} writes: not batched",
        first.stamps.len(),
        ENQUEUES + 3
    );

    // Every stamp is the leader host's clock during the writes, and none
    // could have come from real time: the clock is further off real time
    // than the writes took.
    let (from_ms, to_ms) = first.writes_real_ms;
    let clock = first.leader_clock;
    let (earliest_ms, latest_ms) = (clock.now_ms(from_ms), clock.now_ms(to_ms));
    let (real_from_ms, real_to_ms) = (EPOCH_MS + from_ms, EPOCH_MS + to_ms);
    assert!(
        latest_ms < real_from_ms || real_to_ms < earliest_ms,
        "seed {seed}: the writes took longer than the leader's skew ({clock:?}, {from_ms}..{to_ms})"
    );
    for stamp in &first.stamps {
        assert!(
            (earliest_ms..=latest_ms).contains(stamp),
            "seed {seed}: stamped {stamp}, not the leader host's clock ({earliest_ms}..={latest_ms})\n{text}"
        );
    }

    // The same seed gives the same history; another seed another one.
    let second = run(seed)?;
    assert_eq!(first, second, "seed {seed} is not deterministic");
    let other = run(seed + 1)?;
    assert_ne!(first.history, other.history, "seeds {seed} and {} ran alike", seed + 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_clock_measurement_ages_with_the_runtimes_clock() {
    // The wall clock follows the runtime's clock, as a host's does in the
    // simulation; no real time passes in this test.
    let start = Instant::now();
    let clock = Clock::from_source(Arc::new(move || {
        let elapsed_ms = Instant::now().duration_since(start).as_millis();
        i64::try_from(elapsed_ms).unwrap_or(i64::MAX).saturating_add(1_000_000)
    }));
    let journal_watch = leasehold_replica::clock_watch::ClockWatch::new(500, FRESH_FOR);
    let now = Instant::now();
    journal_watch.record(2, clock.now_ms(), now, now, clock.now_ms());
    assert!(journal_watch.verdict(1, &[1, 2], &clock).may_stamp(), "node 2 agrees");
    tokio::time::advance(FRESH_FOR - Duration::from_millis(1)).await;
    assert_eq!(journal_watch.offsets(&clock).len(), 1, "fresh until its lifetime ends");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(journal_watch.offsets(&clock).is_empty(), "stale once simulated time has passed");
    assert!(!journal_watch.verdict(1, &[1, 2], &clock).may_stamp());
}
