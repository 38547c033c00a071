//! Goal: a leader whose clock no majority measures any more (its
//! adverts' round trips fail: neither agreed nor skewed) may not stamp,
//! so it refuses every write; its clock guard hands leadership over once
//! that has lasted `UNMEASURED_HAND_OVER_AFTER`, and a voter that can
//! stamp leads and takes writes again.
//!
//! Method: the three turmoil hosts of `journal_hosts`, each running the
//! node's clock guard, their journals on `Peers::Grpc` (a hand-over
//! travels as the node's real `Raft.Forward` call). Once a leader stamps
//! and a write goes through, the leader stops measuring its peers. Its
//! writes must then be refused (nothing can be stamped), and within the
//! hand-over wait plus [`MOVED_WITHIN`] another host must lead and stamp
//! a write. Each of 4 seeds runs twice and must give the same history.
//!
//! What fails if the feature goes: the unmeasured leader keeps leading
//! (its heartbeats hold the others off) and no write is taken again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_replica::clock_watch::UNMEASURED_HAND_OVER_AFTER;
use leasehold_sim::clock::Clocks;
use openraft::ServerState;
use tokio::time::Instant;

use crate::journal_hosts::{
    Hosts, Peers, Skews, enqueue, form_group, propose, real_ms, stamping_leader, start_guarded,
};

/// The seeds the story runs on.
const SEEDS: std::ops::Range<u64> = 0..4;

/// How long after the hand-over wait another host must lead: the
/// measurements' freshness (5 s) and a hand-over's election.
const MOVED_WITHIN: Duration = Duration::from_secs(8);

async fn drive(
    hosts: Hosts,
    clocks: Clocks,
    history: Arc<Mutex<Vec<String>>>,
) -> anyhow::Result<()> {
    let mut seen = Vec::new();
    form_group(&hosts, Peers::Grpc).await?;
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    let written = propose(&leader, enqueue(1)).await?;
    anyhow::ensure!(written.is_ok(), "node {leader_id}'s first write: {written:?}");
    seen.push(format!("node {leader_id} leads and writes"));

    tracing::info!("--- the leader stops measuring its peers");
    clocks.set_unmeasured(leader_id, true);
    let started = Instant::now();
    // Once its measurements have aged out it stamps nothing.
    tokio::time::sleep(Duration::from_secs(6)).await;
    if leader.journal.raft().metrics().borrow().state == ServerState::Leader {
        let refused = propose(&leader, enqueue(2)).await?;
        anyhow::ensure!(refused.is_err(), "the unmeasured leader wrote: {refused:?}");
    }

    tracing::info!("--- another host leads and writes");
    let deadline = started + UNMEASURED_HAND_OVER_AFTER + MOVED_WITHIN;
    loop {
        let (new_id, new) = stamping_leader(&hosts).await?;
        if new_id != leader_id {
            let written = propose(&new, enqueue(3)).await?;
            anyhow::ensure!(written.is_ok(), "node {new_id}'s write: {written:?}");
            seen.push(format!("node {new_id} leads and writes; node {leader_id} handed over"));
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {leader_id}, unmeasured, still leads {} ms after it stopped measuring",
            started.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::info!("{} done", real_ms());
    *history.lock().unwrap_or_else(PoisonError::into_inner) = seen;
    Ok(())
}

fn run(seed: u64) -> anyhow::Result<Vec<String>> {
    let simulation = start_guarded(seed, Skews::Either)?;
    let (mut sim, hosts, clocks) = (simulation.sim, simulation.hosts, simulation.clocks);
    let history = Arc::new(Mutex::new(Vec::new()));
    let recorded = history.clone();
    sim.client("driver", async move {
        drive(hosts, clocks, recorded).await.map_err(|error| error.into())
    });
    sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(history)
}

#[test]
fn an_unmeasured_leader_hands_over_to_a_voter_that_can_stamp() -> anyhow::Result<()> {
    for seed in SEEDS {
        let first = run(seed)?;
        anyhow::ensure!(first.len() == 2, "seed {seed}: {first:#?}");
        let again = run(seed)?;
        anyhow::ensure!(first == again, "seed {seed} ran differently twice: {first:#?} {again:#?}");
    }
    Ok(())
}
