//! Goal: the node's real cutover gate runs on the seeded simulation. Its
//! adverts, sent over the node's real `leasehold.v1.Peer` gRPC service on
//! turmoil, are what measures the hosts' clocks (so what lets a leader
//! stamp), and when one node turns its journal-lease flag off, every node
//! decides every instant the same way: the journal before the change has
//! settled, the bus from then on — never both paths for one tick. A seed
//! gives the same history twice.
//!
//! Method: the three turmoil hosts of `journal_hosts` with `Peers::Gate`:
//! each serves the Raft and Peer services behind the node's auth layer,
//! runs a `Gate` on in-memory bus and advert tables with the node's
//! defaults (adverts every second, the journal-lease flag on) and sends its
//! adverts; no host records clock offsets itself. Clocks are 100–200 ms
//! off real time either way, from the seed. The driver forms the group,
//! waits for a leader that may stamp and writes through it; waits until
//! every gate decides the journal; then turns node 3's flag off (at `T` on
//! node 3's clock), waits for the adverts to carry it, and asks every gate,
//! on its own runtime, to decide the instants just before and at `T` plus
//! the settle time (three advert intervals). Then all three claim one bus
//! key at once over the Peer service (one must win and every node name
//! it), the winner releases it, and a loser's later claim must not win a
//! released key. Eight seeds, each twice.
//!
//! What fails if the feature goes: without the adverts no clock is
//! measured and no leader may stamp; a gate that judged a flag change from
//! when it heard of it, not from when it was made, would decide the
//! instants around the settle point differently on node 3 and its peers;
//! claims that never reach the peers leave every node winning its own.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::Response;
use leasehold_core::claim_path::{ClaimPath, Decision};
use leasehold_raft::NodeId;
use leasehold_replica::bus::Outcome;

use crate::journal_hosts::{
    ADVERT_INTERVAL, Hosts, NODES, Peers, Skews, enqueue, every_gate_decides, form_group, propose,
    real_ms, stamping_leader, start, with_gate,
};

/// The seeds the story runs on.
const SEEDS: std::ops::Range<u64> = 0..8;
/// The node whose flag the driver turns off.
const FLIPPED: NodeId = 3;

/// What one run recorded.
#[derive(Debug, Default, PartialEq)]
struct Run {
    /// One line per event, simulated milliseconds first.
    history: Vec<String>,
    /// Every node's decision for each instant asked, by instant.
    decisions: Vec<(u64, Vec<(NodeId, Decision)>)>,
    /// When the flag changed (node 3's clock) and the settle time.
    flipped_at_ms: u64,
    settle_ms: u64,
    /// Every node's outcome of one bus claim of the same key, made at
    /// once; then a later claim of it by a node that lost, after the
    /// winner released it.
    claims: Vec<(NodeId, Outcome)>,
    late_claim: Option<(NodeId, Outcome)>,
}

/// The bus key the nodes claim: a cron tick's, as the node driver names it.
const BUS_KEY: &str = "cron:tick:1000";

/// Every node's decision for a claim at `at_ms`.
async fn decisions_at(hosts: &Hosts, at_ms: u64) -> anyhow::Result<Vec<(NodeId, Decision)>> {
    let mut decisions = Vec::new();
    for (id, host) in hosts.all() {
        decisions.push((id, with_gate(&host, move |gate| gate.decide_at(at_ms)).await?));
    }
    Ok(decisions)
}

/// The driver: forms the group, writes, waits for the pool to agree on the
/// journal, flips node 3's flag and asks every gate around the settle point.
async fn drive(hosts: Hosts, run: Arc<Mutex<Run>>) -> anyhow::Result<()> {
    let mut history = Vec::new();
    form_group(&hosts, Peers::Gate).await?;
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    history.push(format!("{} node {leader_id} leads and may stamp", real_ms()));
    let answer = propose(&leader, enqueue(1)).await??;
    history.push(format!("{} enqueue -> {answer:?}", real_ms()));
    anyhow::ensure!(matches!(answer, Response::Enqueued(_)), "enqueue: {answer:?}");

    tracing::info!("--- every gate decides the journal once every peer has advertised");
    every_gate_decides(&hosts, ClaimPath::Journal, &mut history).await?;

    tracing::info!("--- node {FLIPPED} turns its flag off; the adverts carry it");
    let flipped = hosts.get(FLIPPED).ok_or_else(|| anyhow::anyhow!("node {FLIPPED} is down"))?;
    let (flipped_at_ms, settle_ms) = with_gate(&flipped, |gate| {
        let at_ms = gate.now_ms();
        gate.set_flags(Some(false), None);
        (at_ms, gate.config().settle_ms())
    })
    .await?;
    history.push(format!("{} node {FLIPPED} flag off at {flipped_at_ms}", real_ms()));
    // Past the settle point on every clock (they are within 400 ms of each
    // other), and two more adverts.
    tokio::time::sleep(Duration::from_millis(settle_ms) + 2 * ADVERT_INTERVAL).await;

    let settled_ms = flipped_at_ms + settle_ms;
    let mut asked = Vec::new();
    for at_ms in [settled_ms - 1, settled_ms] {
        let decisions = decisions_at(&hosts, at_ms).await?;
        history.push(format!("{} decisions at {at_ms}: {decisions:?}", real_ms()));
        asked.push((at_ms, decisions));
    }

    tracing::info!("--- on the bus, every node claims one key at once: one wins");
    let claiming: Vec<_> = hosts
        .all()
        .into_iter()
        .map(|(id, host)| {
            let gate = host.gate.clone();
            let claimed = host.runtime.spawn(async move {
                match gate {
                    Some(gate) => gate.bus_claim(BUS_KEY).await.map_err(|e| e.to_string()),
                    None => Err("a host without a gate".to_string()),
                }
            });
            (id, claimed)
        })
        .collect();
    let mut claims = Vec::new();
    for (id, claimed) in claiming {
        let outcome = claimed.await?.map_err(|e| anyhow::anyhow!("node {id}: {e}"))?;
        history.push(format!("{} node {id} claim -> {outcome:?}", real_ms()));
        claims.push((id, outcome));
    }
    let winner = claims.iter().find(|(_, outcome)| *outcome == Outcome::Won).map(|(id, _)| *id);
    let late_claim = match winner {
        Some(winner) => {
            let host = hosts.get(winner).ok_or_else(|| anyhow::anyhow!("the winner is down"))?;
            let gate = host.gate.clone().ok_or_else(|| anyhow::anyhow!("no gate"))?;
            let released = host.runtime.spawn(async move { gate.bus_release(BUS_KEY).await });
            let released = released.await?.map_err(|e| anyhow::anyhow!("release: {e}"))?;
            history.push(format!("{} node {winner} released: {released}", real_ms()));
            let late = (1..=NODES).find(|id| *id != winner).unwrap_or(1);
            let host = hosts.get(late).ok_or_else(|| anyhow::anyhow!("node {late} is down"))?;
            let gate = host.gate.clone().ok_or_else(|| anyhow::anyhow!("no gate"))?;
            let claimed = host.runtime.spawn(async move { gate.bus_claim(BUS_KEY).await });
            let outcome = claimed.await?.map_err(|e| anyhow::anyhow!("late claim: {e}"))?;
            history.push(format!("{} node {late} claims again -> {outcome:?}", real_ms()));
            Some((late, outcome))
        }
        None => None,
    };
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    *run = Run { history, decisions: asked, flipped_at_ms, settle_ms, claims, late_claim };
    Ok(())
}

fn run(seed: u64) -> anyhow::Result<Run> {
    let mut simulation = start(seed, Peers::Gate, Skews::Either)?;
    let recorded = Arc::new(Mutex::new(Run::default()));
    let (hosts, run) = (simulation.hosts.clone(), recorded.clone());
    simulation
        .sim
        .client("driver", async move { drive(hosts, run).await.map_err(|error| error.into()) });
    simulation.sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(run)
}

#[test]
fn the_gate_measures_clocks_by_its_adverts_and_every_node_switches_paths_at_one_instant()
-> anyhow::Result<()> {
    for seed in SEEDS {
        let first = run(seed)?;
        let text = first.history.join("\n");
        anyhow::ensure!(first.settle_ms == 3 * 1_000, "seed {seed}: settle {}", first.settle_ms);
        let [(before_ms, before), (at_ms, at)] = first.decisions.as_slice() else {
            anyhow::bail!("seed {seed}: decisions {:?}\n{text}", first.decisions);
        };
        anyhow::ensure!(before.len() == NODES as usize && at.len() == NODES as usize);
        // Before the settle point every node still decides the journal,
        // the flipped one included; from it, every node the bus.
        for (id, decision) in before {
            anyhow::ensure!(
                decision.path == ClaimPath::Journal,
                "seed {seed}: node {id} at {before_ms} decided {decision:?}\n{text}"
            );
        }
        for (id, decision) in at {
            anyhow::ensure!(
                decision.path == ClaimPath::Bus,
                "seed {seed}: node {id} at {at_ms} decided {decision:?}\n{text}"
            );
        }
        // One winner, and every node names it; a released key is not won
        // again.
        let winners: Vec<NodeId> = first
            .claims
            .iter()
            .filter(|(_, outcome)| *outcome == Outcome::Won)
            .map(|(id, _)| *id)
            .collect();
        let [winner] = winners.as_slice() else {
            anyhow::bail!("seed {seed}: winners {winners:?}\n{text}");
        };
        for (id, outcome) in &first.claims {
            anyhow::ensure!(
                id == winner || *outcome == (Outcome::Lost { winner: Some(*winner) }),
                "seed {seed}: node {id} saw {outcome:?}, not node {winner} winning\n{text}"
            );
        }
        anyhow::ensure!(
            matches!(first.late_claim, Some((_, Outcome::Lost { .. }))),
            "seed {seed}: a released key was claimed again: {:?}\n{text}",
            first.late_claim
        );
        let again = run(seed)?;
        anyhow::ensure!(first == again, "seed {seed} is not deterministic:\n{text}");
    }
    Ok(())
}
