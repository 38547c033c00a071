//! Goal: a leader that must stop leading (its clock is beyond the bound,
//! or it drains) hands leadership over with `Journal::hand_over`, and a
//! voter takes a hand-over only from the leader it follows, in its term
//! (Raft's "timeout now"), so a deposed leader that never heard of its
//! successor cannot have a healthy leader deposed in turn.
//!
//! Method: the three turmoil hosts of `journal_hosts` with `Peers::Grpc`
//! (the hand-over travels as the node's real `Raft.Forward` call). The
//! driver forms the group, waits for a stamping leader and for a follower
//! that knows it, then, on that follower's runtime, serves it two
//! hand-overs it must refuse: one naming the leader with a term ahead of
//! the follower's, one naming the other follower in the current term.
//! Both answer a retryable failure, and neither moves the follower's term
//! nor the leader. Then the leader stands aside as a skewed one does (no
//! elections, no heartbeats) and hands over: it names the most caught-up
//! follower, and within [`WAIT`] a node other than the old leader must
//! lead, in a higher term. (A leader elected less than its own lease ago
//! refuses the successor's first vote; the election then goes on by the
//! timers, and either follower may win it.) Each of 8 seeds runs twice and must give the
//! same history.
//!
//! What fails if the feature goes: a voter that campaigns whoever asks
//! (the leader and term checks removed) answers the stale hand-overs by
//! campaigning, so its term moves; a leader that cannot hand over leaves
//! the old leader in place.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_replica::forward::{ForwardRequest, ForwardResponse};
use leasehold_replica::journal::HAND_OVER_CATCH_UP;
use openraft::ServerState;
use tokio::time::Instant;

use crate::journal_hosts::{Host, Peers, Skews, WAIT, form_group, real_ms, stamping_leader, start};

/// The seeds the story runs on.
const SEEDS: std::ops::Range<u64> = 0..8;

/// `host`'s term and the leader it knows.
fn term_and_leader(host: &Host) -> (u64, Option<u64>) {
    let metrics = host.journal.raft().metrics().borrow().clone();
    (metrics.current_term, metrics.current_leader)
}

/// Serves `request` on `host`'s journal on its runtime, as its Raft
/// service would, and answers what it answered in words.
async fn serve(host: &Host, request: ForwardRequest) -> anyhow::Result<String> {
    let journal = host.journal.clone();
    let answer = host.runtime.spawn(async move { journal.serve_forwarded(request).await }).await?;
    Ok(match answer {
        ForwardResponse::Failed { retryable, .. } => format!("failed (retryable {retryable})"),
        ForwardResponse::Campaigning => "campaigning".to_string(),
        other => format!("{other:?}"),
    })
}

async fn drive(
    hosts: crate::journal_hosts::Hosts,
    history: Arc<Mutex<Vec<String>>>,
) -> anyhow::Result<()> {
    let mut seen = Vec::new();
    form_group(&hosts, Peers::Grpc).await?;
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    let deadline = Instant::now() + WAIT;
    let (follower_id, follower, other_id) = loop {
        let all = hosts.all();
        let following: Vec<u64> = all
            .iter()
            .filter(|(id, host)| **id != leader_id && term_and_leader(host).1 == Some(leader_id))
            .map(|(id, _)| *id)
            .collect();
        if following.len() == 2 {
            let follower = all.get(&following[0]).cloned();
            break (following[0], follower, following[1]);
        }
        anyhow::ensure!(Instant::now() < deadline, "the followers never learned their leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let follower = follower.ok_or_else(|| anyhow::anyhow!("node {follower_id} is gone"))?;
    let (term, _) = term_and_leader(&follower);
    seen.push(format!("node {leader_id} leads in term {term}; node {follower_id} follows"));

    tracing::info!("--- hand-overs the follower must refuse");
    let ahead =
        serve(&follower, ForwardRequest::HandOver { leader: leader_id, term: term + 1 }).await?;
    seen.push(format!("a hand-over from node {leader_id} of term {}: {ahead}", term + 1));
    let stranger = serve(&follower, ForwardRequest::HandOver { leader: other_id, term }).await?;
    seen.push(format!("a hand-over from node {other_id} of term {term}: {stranger}"));
    for answer in [&ahead, &stranger] {
        anyhow::ensure!(answer == "failed (retryable true)", "a stale hand-over answered {answer}");
    }
    let after = term_and_leader(&follower);
    anyhow::ensure!(
        after == (term, Some(leader_id)),
        "after stale hand-overs node {follower_id} is in term {} following {:?}",
        after.0,
        after.1
    );

    tracing::info!("--- the leader stands aside and hands over");
    let runtime = leader.journal.raft().runtime_config();
    runtime.elect(false);
    runtime.heartbeat(false);
    let journal = leader.journal.clone();
    let handed = leader
        .runtime
        .spawn(async move { journal.hand_over(HAND_OVER_CATCH_UP, None).await })
        .await?;
    let Some((successor, outcome)) = handed else {
        anyhow::bail!("node {leader_id} found no voter to hand over to");
    };
    outcome?;
    anyhow::ensure!(successor != leader_id, "node {leader_id} handed over to itself");
    seen.push(format!("node {leader_id} asked node {successor}"));
    let deadline = Instant::now() + WAIT;
    loop {
        let old = leader.journal.raft().metrics().borrow().state;
        let new = hosts.all().into_iter().find(|(id, host)| {
            *id != leader_id && host.journal.raft().metrics().borrow().state == ServerState::Leader
        });
        if let Some((new_id, new)) = new
            && old != ServerState::Leader
        {
            let new_term = term_and_leader(&new).0;
            anyhow::ensure!(new_term > term, "node {new_id} leads in term {term}");
            seen.push(format!(
                "{} node {new_id} leads in term {new_term}; node {leader_id} is {old:?}",
                real_ms()
            ));
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {leader_id} handed over to node {successor}, but no other node leads within \
             {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    *history.lock().unwrap_or_else(PoisonError::into_inner) = seen;
    Ok(())
}

fn run(seed: u64) -> anyhow::Result<Vec<String>> {
    let simulation = start(seed, Peers::Grpc, Skews::Either)?;
    let (mut sim, hosts) = (simulation.sim, simulation.hosts);
    let history = Arc::new(Mutex::new(Vec::new()));
    let recorded = history.clone();
    sim.client("driver", async move { drive(hosts, recorded).await.map_err(|error| error.into()) });
    sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(history)
}

#[test]
fn a_leader_hands_over_and_a_voter_takes_it_only_from_its_leader_in_its_term() -> anyhow::Result<()>
{
    for seed in SEEDS {
        let first = run(seed)?;
        anyhow::ensure!(first.len() == 5, "seed {seed}: {first:#?}");
        let again = run(seed)?;
        anyhow::ensure!(first == again, "seed {seed} ran differently twice: {first:#?} {again:#?}");
    }
    Ok(())
}
