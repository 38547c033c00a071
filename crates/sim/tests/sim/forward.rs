//! Goal: a follower's real `Journal` forwards writes and read-index
//! requests to the leader over the node's real `Raft.Forward` gRPC call,
//! carried on turmoil's simulated TCP, and the leader, not the follower,
//! stamps what it writes; a seed gives the same history twice.
//!
//! Method: the three turmoil hosts of `journal_hosts` with
//! `Peers::Grpc`: each serves the real `leasehold.v1.Raft` service behind
//! the node's auth layer, and its journal's peer network dials over
//! turmoil with the host's node proof. Odd hosts' clocks run 100–200 ms
//! ahead of real time and even hosts' as far behind, so a leader has a
//! follower whose clock is 200–400 ms from its own (within the 500 ms
//! bound). The driver forms the group, waits for a stamping leader and
//! picks such a follower; it hands every write to the follower's journal
//! on the follower's runtime, as the node's gRPC server would: eight
//! concurrent enqueues, a claim of two and an ack of one. Then a
//! linearizable read on the follower (its read index comes from the
//! leader by `Raft.Forward`) must see them all. The history is every
//! answer, every entry the leader wrote with its stamp, and every
//! replica's digest. Each of 16 seeds runs twice.
//!
//! What fails if the feature goes: a journal on a peer network that dials
//! the operating system (`NetworkFactory::new()`) or a connector that
//! cannot connect answers the follower's writes `Unavailable::Peer`, and
//! channels without the node proof are refused by the auth layer; a
//! leader that kept the follower's stamp would stamp outside its own clock.

use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::QueueStats;
use leasehold_replica::metrics::WireLabels;
use leasehold_sim::clock::{Clocks, HostClock};
use tokio::time::Instant;

use crate::journal_hosts::{
    Host, Hosts, Peers, Skews, WAIT, claim_two_ack_one, enqueue_at_once, form_group,
    last_log_index, real_ms, stamping_leader, stamps_and_digests, start,
};

/// How many enqueues the driver sends the follower at once.
const ENQUEUES: u64 = 8;
/// The seeds the story runs on (a run takes a few hundredths of a second).
const SEEDS: std::ops::Range<u64> = 0..16;

/// What one run recorded.
#[derive(Debug, Default, PartialEq)]
struct Run {
    /// One line per answer, entry and digest, simulated milliseconds first.
    history: Vec<String>,
    /// The leader's and the follower's host clocks.
    leader_clock: HostClock,
    follower_clock: HostClock,
    /// The simulated real time the writes were made in.
    writes_real_ms: (u64, u64),
    /// The stamps of the leader's entries from the writes.
    stamps: Vec<u64>,
    /// What the follower's linearizable read saw of queue `q`.
    read: Option<QueueStats>,
    /// The calls the leader's gRPC Raft service had taken before the
    /// follower's read, and after it.
    served_calls: (u64, u64),
}

/// How many calls `host`'s gRPC Raft service has taken. openraft's own
/// messages travel on the simulated Raft network, not through it, so
/// every one is a forwarded write or read-index request.
fn served_calls(host: &Host) -> u64 {
    let envelopes = &host.journal.metrics().raft_envelopes;
    ["binary", "json"]
        .into_iter()
        .map(|wire| envelopes.get_or_create(&WireLabels { wire, call: "unary" }).get())
        .sum()
}

/// The driver: forms the group, writes through a follower's journal, reads
/// linearizably on it, and records what it saw.
async fn drive(hosts: Hosts, clocks: Clocks, run: Arc<Mutex<Run>>) -> anyhow::Result<()> {
    let mut history = Vec::new();
    form_group(&hosts, Peers::Grpc).await?;
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    // A follower on the other side of real time from the leader: their
    // clocks are 200–400 ms apart.
    let leader_ahead = clocks.host_clock(leader_id).skew_ms > 0;
    let Some((follower_id, follower)) = hosts
        .all()
        .into_iter()
        .find(|(id, _)| (clocks.host_clock(*id).skew_ms > 0) != leader_ahead)
    else {
        anyhow::bail!("no follower with a clock on the other side of the leader's");
    };
    history.push(format!("{} node {leader_id} leads; node {follower_id} follows", real_ms()));

    tracing::info!("--- the follower learns its leader");
    let deadline = Instant::now() + WAIT;
    while follower.journal.raft().metrics().borrow().current_leader != Some(leader_id) {
        anyhow::ensure!(Instant::now() < deadline, "node {follower_id} never learned its leader");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let first_index = last_log_index(leader.journal.raft()) + 1;

    tracing::info!("--- eight concurrent enqueues through the follower's journal");
    let writes_from_ms = real_ms();
    enqueue_at_once(&follower, ENQUEUES, &mut history).await?;

    tracing::info!("--- claim two and ack one through the follower");
    claim_two_ack_one(&follower, &mut history).await?;
    let writes_to_ms = real_ms();

    tracing::info!("--- a linearizable read on the follower (read index from the leader)");
    let calls_before_read = served_calls(&leader);
    let journal = follower.journal.clone();
    let read = follower
        .runtime
        .spawn(async move { journal.read(false, |state| state.stats(0).get("q").cloned()).await })
        .await??;
    history.push(format!("{} follower read -> {read:?}", real_ms()));
    let calls = (calls_before_read, served_calls(&leader));
    history
        .push(format!("leader's Raft service: {} calls for the writes, then {}", calls.0, calls.1));

    tracing::info!("--- the leader's entries and their stamps; every replica's digest");
    let stamps = stamps_and_digests(&hosts, &leader, first_index, &mut history).await?;
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    *run = Run {
        history,
        leader_clock: clocks.host_clock(leader_id),
        follower_clock: clocks.host_clock(follower_id),
        writes_real_ms: (writes_from_ms, writes_to_ms),
        stamps,
        read,
        served_calls: calls,
    };
    Ok(())
}

/// Runs the forwarding story on the simulation seeded with `seed`.
fn run(seed: u64) -> anyhow::Result<Run> {
    let simulation = start(seed, Peers::Grpc, Skews::Alternating)?;
    let (mut sim, hosts, clocks) = (simulation.sim, simulation.hosts, simulation.clocks);
    let recorded = Arc::new(Mutex::new(Run::default()));
    let driver_run = recorded.clone();
    sim.client("driver", async move {
        drive(hosts, clocks, driver_run).await.map_err(|error| error.into())
    });
    sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(run)
}

/// The wall-clock span `clock` read while the writes ran.
fn span(clock: HostClock, (from_ms, to_ms): (u64, u64)) -> std::ops::RangeInclusive<u64> {
    clock.now_ms(from_ms)..=clock.now_ms(to_ms)
}

/// Checks the story of one run of `seed`.
fn check(seed: u64, first: &Run) {
    let text = first.history.join("\n");

    // Every write was answered through the follower, and the follower's
    // linearizable read saw all of them: eight enqueued, two claimed, one
    // of those acked.
    assert_eq!(
        text.matches("Ok(Enqueued(").count(),
        ENQUEUES as usize,
        "seed {seed}: not every enqueue was answered\n{text}"
    );
    let read = first.read.clone().unwrap_or_default();
    assert_eq!(
        (read.ready, read.claimed, read.acked),
        (ENQUEUES - 2, 1, 1),
        "seed {seed}: the follower's linearizable read missed a write\n{text}"
    );

    // The writes and the read went to the leader over its gRPC Raft
    // service: the read index took one call of its own.
    let (before_read, after_read) = first.served_calls;
    assert!(before_read >= 3, "seed {seed}: {before_read} forwarded calls for the writes\n{text}");
    assert_eq!(
        after_read,
        before_read + 1,
        "seed {seed}: the read index was not forwarded\n{text}"
    );

    // Every replica applied the same log.
    let digests: Vec<&str> =
        first.history.iter().filter_map(|line| line.split(" digest ").nth(1)).collect();
    assert_eq!(digests.len(), 3, "seed {seed}: a replica is missing in\n{text}");
    assert!(digests.windows(2).all(|pair| pair[0] == pair[1]), "replicas diverged:\n{text}");

    // Every stamp is the leader host's clock during the writes, and none
    // could be the follower's: the two clocks' spans do not meet.
    let leader_span = span(first.leader_clock, first.writes_real_ms);
    let follower_span = span(first.follower_clock, first.writes_real_ms);
    assert!(
        leader_span.end() < follower_span.start() || follower_span.end() < leader_span.start(),
        "seed {seed}: the writes took longer than the clocks' gap \
         ({leader_span:?} and {follower_span:?})"
    );
    assert!(!first.stamps.is_empty(), "seed {seed}: no entries from the writes\n{text}");
    for stamp in &first.stamps {
        assert!(
            leader_span.contains(stamp),
            "seed {seed}: stamped {stamp}, not the leader host's clock {leader_span:?} \
             (the follower's was {follower_span:?})\n{text}"
        );
    }
}

#[test]
fn a_followers_journal_forwards_over_grpc_on_simulated_tcp_and_the_leader_stamps()
-> anyhow::Result<()> {
    for seed in SEEDS {
        println!("seed {seed}");
        let first = run(seed)?;
        check(seed, &first);
        // The same seed gives the same history.
        let second = run(seed)?;
        assert_eq!(first, second, "seed {seed} is not deterministic");
    }
    Ok(())
}
