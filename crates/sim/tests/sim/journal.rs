//! Goal: the replica's real `Journal` — its clock rule, its batcher, its
//! read barrier — drives leasehold commands through openraft on the
//! simulated disks, and what it reads back is what the replicas applied.
//! Method: three openraft nodes on simulated disks over the in-process
//! network of `raft.rs`; a `Journal` on the leader over its Raft handle
//! and its simulated stores, and one on a follower. Both journals hold a
//! peer network that is never dialled: there is no gRPC in this test, and
//! the members have no addresses, so the follower's forward to the leader
//! fails before any channel is made, and the test says so.
//!
//! What shows the journal drove every write (a test that wrote to Raft
//! directly fails each): it refuses to stamp until a majority of the voters
//! agree with its clock; the entries carry the leader's rules
//! (`Command::Ruled`) and the leader's clock; concurrent proposals share
//! one `Batch` entry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Command, JobSpec, JobState, Limits, Proposal, Refusal, Response};
use leasehold_raft::{NetworkFactory, NodeId, Raft, TypeConfig};
use leasehold_replica::forward::{ForwardRequest, ForwardResponse};
use leasehold_replica::journal::DEFAULT_BATCHES_IN_FLIGHT;
use leasehold_replica::{Clock, Journal, JournalConfig, JournalError, Unavailable};
use leasehold_sim::{SimDisk, SimLogStore, SimStateMachine};
use openraft::{BasicNode, Entry, EntryPayload, RaftLogReader, ServerState};
use tokio::time::Instant;

use crate::raft::Router;

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

/// One running node: its Raft handle and the two stores openraft drives.
struct Node {
    raft: Raft,
    log_store: SimLogStore,
    state_machine: SimStateMachine,
}

async fn start(id: NodeId, disk: &SimDisk, router: &Router) -> anyhow::Result<Node> {
    // One-millisecond election windows, as in `raft.rs`: node 1 leads.
    let min = 300 + 100 * id;
    let config = leasehold_sim::raft_config(min).validate()?;
    let (log_store, state_machine) = disk.open();
    let raft =
        Raft::new(id, Arc::new(config), router.clone(), log_store.clone(), state_machine.clone())
            .await?;
    router.set(id, Some(raft.clone()));
    Ok(Node { raft, log_store, state_machine })
}

/// A journal on `node`, as the node builds one, over the simulated stores.
fn journal(id: NodeId, node: &Node, clock: Clock) -> Journal {
    journal_with(id, node, clock, DEFAULT_BATCHES_IN_FLIGHT)
}

/// A journal on `node` that keeps `batches_in_flight` batches in flight.
fn journal_with(id: NodeId, node: &Node, clock: Clock, batches_in_flight: usize) -> Journal {
    journal_timed(id, node, clock, batches_in_flight, Duration::from_secs(5))
}

/// A journal on `node` whose writes wait up to `quorum_timeout`.
fn journal_timed(
    id: NodeId,
    node: &Node,
    clock: Clock,
    batches_in_flight: usize,
    quorum_timeout: Duration,
) -> Journal {
    let config = JournalConfig {
        node_id: id,
        limits: Limits::default(),
        quorum_timeout,
        batches_in_flight,
        max_clock_offset_ms: 500,
        clock_fresh_for: Duration::from_secs(60),
    };
    Journal::new(
        config,
        node.raft.clone(),
        Arc::new(node.log_store.clone()),
        Arc::new(node.state_machine.clone()),
        clock,
        // Lazy channels: nothing connects unless this journal forwards.
        NetworkFactory::new(),
    )
}

fn enqueue(n: u64) -> Command {
    let spec = JobSpec {
        queue: "q".into(),
        payload: format!("job {n}").into_bytes(),
        ..Default::default()
    };
    Command::Enqueue { jobs: vec![spec] }
}

/// The normal entries of `log_store` from `first` on.
async fn proposals(log_store: &SimLogStore, first: u64) -> anyhow::Result<Vec<Proposal>> {
    let mut reader = log_store.clone();
    let entries: Vec<Entry<TypeConfig>> = reader.try_get_log_entries(first..).await?;
    Ok(entries
        .into_iter()
        .filter_map(|entry| match entry.payload {
            EntryPayload::Normal(proposal) => Some(proposal),
            _ => None,
        })
        .collect())
}

fn last_log_index(raft: &Raft) -> u64 {
    raft.metrics().borrow().last_log_index.unwrap_or(0)
}

/// Waits until every node applied the leader's last entry, then requires
/// that each holds the leader's digest.
async fn converged(leader: &Journal, nodes: &BTreeMap<NodeId, Node>) -> anyhow::Result<()> {
    let last = last_log_index(leader.raft());
    for (id, node) in nodes {
        node.raft
            .wait(WAIT)
            .applied_index_at_least(Some(last), &format!("node {id} applied"))
            .await?;
    }
    let leader_digest = leader.state_machine().digest();
    for (id, node) in nodes {
        let digest = leasehold_replica::ReplicaStateMachine::digest(&node.state_machine);
        assert_eq!(digest, leader_digest, "node {id} diverged");
    }
    Ok(())
}

/// Three nodes on simulated disks, node 1 leading with an entry of its own
/// term applied: what the journal calls leading (`Journal::is_leader`).
async fn three_nodes() -> anyhow::Result<BTreeMap<NodeId, Node>> {
    let router = Router::default();
    let disks: BTreeMap<NodeId, SimDisk> =
        (1..=3).map(|id| (id, SimDisk::with_sync_delay(Duration::from_millis(1)))).collect();
    let mut nodes = BTreeMap::new();
    for (id, disk) in &disks {
        nodes.insert(*id, start(*id, disk, &router).await?);
    }
    let members: BTreeMap<NodeId, BasicNode> =
        (1..=3).map(|id| (id, BasicNode::default())).collect();
    nodes[&1].raft.initialize(members).await?;
    nodes[&1]
        .raft
        .wait(WAIT)
        .metrics(
            |m| {
                m.state == ServerState::Leader
                    && m.last_applied
                        .is_some_and(|applied| applied.leader_id.term == m.current_term)
            },
            "node 1 leads",
        )
        .await?;
    Ok(nodes)
}

#[tokio::test]
async fn the_journal_proposes_and_reads_through_openraft_on_simulated_disks() -> anyhow::Result<()>
{
    let nodes = three_nodes().await?;
    let clock = Clock::system();
    let leader = journal(1, &nodes[&1], clock.clone());
    assert!(leader.is_leader());

    tracing::info!("--- node 2's clock agrees (as an advert would measure): a majority");
    let sent_at = Instant::now();
    leader.clock_watch().record(2, clock.now_ms(), sent_at, Instant::now(), clock.now_ms());
    assert!(leader.clock_verdict().may_stamp(), "{:?}", leader.clock_verdict());

    tracing::info!("--- eight concurrent enqueues through the batcher");
    let first = last_log_index(leader.raft()) + 1;
    let stamped_from_ms = clock.now_ms();
    let answers = futures::future::join_all((1..=8).map(|n| leader.propose(enqueue(n)))).await;
    let stamped_to_ms = clock.now_ms();
    let mut job_ids = Vec::new();
    for answer in answers {
        match answer? {
            Response::Enqueued(outcomes) => {
                assert_eq!(outcomes.len(), 1);
                assert!(!outcomes[0].duplicate);
                job_ids.push(outcomes[0].job_id);
            }
            other => anyhow::bail!("an enqueue was answered {other:?}"),
        }
    }
    assert_eq!(job_ids, (1..=8).collect::<Vec<_>>(), "each proposer gets its own job id");
    let written = proposals(&nodes[&1].log_store, first).await?;
    assert!(
        written.len() < 8,
        "eight concurrent proposals took {} entries: not batched",
        written.len()
    );
    let mut batched = 0;
    for proposal in &written {
        let Command::Ruled { command, .. } = &proposal.command else {
            anyhow::bail!("an entry without the leader's rules: {:?}", proposal.command);
        };
        match &**command {
            Command::Batch { commands } => batched += commands.len(),
            Command::Enqueue { .. } => batched += 1,
            other => anyhow::bail!("an unexpected entry: {other:?}"),
        }
        assert!(
            (stamped_from_ms..=stamped_to_ms).contains(&proposal.now_ms),
            "stamped {} ms, not the leader's clock ({stamped_from_ms}..={stamped_to_ms})",
            proposal.now_ms
        );
    }
    assert_eq!(batched, 8, "the entries carry every enqueue once");

    tracing::info!("--- claim two, ack one, and a stale ack is refused");
    let grants = match leader.propose(crate::journal_hosts::claim_two()).await? {
        Response::Claimed(grants) => grants,
        other => anyhow::bail!("the claim was answered {other:?}"),
    };
    assert_eq!(grants.iter().map(|g| g.job.id).collect::<Vec<_>>(), vec![1, 2]);
    let (acked, held) = (&grants[0].lease, &grants[1].lease);
    let ack = Command::Ack { job_id: acked.job_id, token: acked.token, result: None };
    assert_eq!(leader.propose(ack).await?, Response::Acked);
    let stale = Command::Ack { job_id: held.job_id, token: held.token + 100, result: None };
    assert_eq!(
        leader.propose(stale).await?,
        Response::Refused(Refusal::StaleToken { job_id: held.job_id, presented: held.token + 100 })
    );

    tracing::info!("--- the journal's linearizable read shows what was applied");
    let (first_state, second, third, stats) = leader
        .read(false, |state| {
            let state_of =
                |id: u64| state.job(id).map(|job| (job.state, job.lease.map(|l| l.token)));
            (state_of(1), state_of(2), state_of(3), state.stats(0).get("q").cloned())
        })
        .await?;
    assert_eq!(first_state.map(|(state, _)| state), Some(JobState::Acked));
    assert_eq!(second, Some((JobState::Claimed, Some(held.token))));
    assert_eq!(third, Some((JobState::Ready, None)));
    let stats = stats.ok_or_else(|| anyhow::anyhow!("no stats for queue q"))?;
    assert_eq!((stats.ready, stats.claimed, stats.acked), (6, 1, 1));

    tracing::info!("--- every replica applied the same: digests through the journal's store view");
    converged(&leader, &nodes).await?;
    assert!(leader.committed_index().await >= first, "the committed index is not recorded");
    leader.log_store().probe().await?;

    tracing::info!(
        "--- at format 3 the ack was written lean; at format 2 an ack keeps the payload"
    );
    let entries = proposals(&nodes[&1].log_store, first).await?;
    let written_acks: Vec<&Command> = entries
        .iter()
        .filter_map(|proposal| match &proposal.command {
            Command::Ruled { command, .. } => Some(&**command),
            _ => None,
        })
        .flat_map(|command| match command {
            Command::Batch { commands } => commands.iter().collect::<Vec<_>>(),
            other => vec![other],
        })
        .filter(|command| matches!(command, Command::Ack { .. } | Command::AckLean { .. }))
        .collect();
    assert!(
        !written_acks.is_empty()
            && written_acks.iter().all(|command| matches!(command, Command::AckLean { .. })),
        "the journal proposed a plain Ack and wrote {written_acks:?}"
    );
    leader.set_log_format(2);
    let ack_kept = Command::Ack { job_id: held.job_id, token: held.token, result: None };
    let from = last_log_index(leader.raft()) + 1;
    assert_eq!(leader.propose(ack_kept).await?, Response::Acked);
    let at_format_2 = proposals(&nodes[&1].log_store, from).await?;
    assert!(
        at_format_2.iter().any(|proposal| matches!(&proposal.command,
            Command::Ruled { command, .. } if matches!(&**command, Command::Ack { .. }))),
        "at format 2 the ack was not written plain: {at_format_2:?}"
    );
    leader.set_log_format(leasehold_core::command::LOG_FORMAT);
    converged(&leader, &nodes).await?;
    for (id, node) in &nodes {
        let payloads = node.state_machine.read(|state| {
            [acked.job_id, held.job_id].map(|id| state.job(id).map(|job| (job.state, job.payload)))
        });
        assert_eq!(
            payloads,
            [Some((JobState::Acked, Vec::new())), Some((JobState::Acked, b"job 2".to_vec()))],
            "node {id}: the lean ack's tombstone has no payload, the plain one's has"
        );
    }

    tracing::info!("--- a follower's journal reads locally, and cannot forward without gRPC");
    let follower = journal(2, &nodes[&2], clock.clone());
    assert_eq!(follower.read_stale(|state| state.last_job_id()), 8);
    let forwarded = follower.propose(enqueue(9)).await;
    assert!(
        matches!(forwarded, Err(JournalError::Unavailable(Unavailable::Peer(_)))),
        "a follower's write without a peer network: {forwarded:?}"
    );

    tracing::info!("--- the leader takes forwarded writes from members only");
    let forwarded_by = |node: NodeId| {
        let leader = leader.clone();
        async move {
            let write = Proposal { now_ms: 0, command: enqueue(20 + node) };
            leader.serve_forwarded(ForwardRequest::Write(Box::new(write)), node).await
        }
    };
    match forwarded_by(9).await {
        ForwardResponse::Failed { retryable: true, message }
            if message.starts_with("caller: node 9 is not a member") => {}
        other => anyhow::bail!("a write forwarded by node 9, not a member: {other:?}"),
    }
    match forwarded_by(2).await {
        ForwardResponse::Written(Response::Enqueued(outcomes)) if outcomes.len() == 1 => {}
        other => anyhow::bail!("a write forwarded by node 2, a member: {other:?}"),
    }
    let last = leader.read(false, |state| state.last_job_id()).await?;
    assert_eq!(last, 9, "only the member's forwarded enqueue was written");

    follower.shutdown().await;
    leader.shutdown().await;
    for (_, node) in nodes {
        node.raft.shutdown().await?;
    }
    Ok(())
}

/// A leader stamps only with a clock a majority agrees with. Unmeasured,
/// it holds the write until a measurement agrees, for up to half the
/// quorum timeout, and refuses it then if none does; skewed, it refuses at
/// once. Nothing reaches the log while it waits or refuses.
#[tokio::test]
async fn an_unmeasured_leader_waits_for_its_clock_and_a_skewed_one_refuses_at_once()
-> anyhow::Result<()> {
    let nodes = three_nodes().await?;
    let clock = Clock::system();
    let quorum_timeout = Duration::from_secs(2);
    let leader =
        journal_timed(1, &nodes[&1], clock.clone(), DEFAULT_BATCHES_IN_FLIGHT, quorum_timeout);
    let before = last_log_index(leader.raft());

    tracing::info!("--- no voter measures the leader's clock: refused after half the timeout");
    let started = Instant::now();
    let refused = leader.propose(enqueue(0)).await;
    let waited = started.elapsed();
    assert!(
        matches!(&refused, Err(JournalError::Unavailable(Unavailable::ClockUnverified(why)))
            if why.contains("not measured against a majority")),
        "an unmeasured leader proposed: {refused:?}"
    );
    // The write keeps the other half of the quorum timeout.
    let hold = quorum_timeout / 2;
    assert!(
        waited >= hold - Duration::from_millis(50) && waited < quorum_timeout,
        "refused after {waited:?}, not after the {hold:?} a batch may wait for the clock"
    );
    assert_eq!(last_log_index(leader.raft()), before, "a refused proposal reached the log");

    tracing::info!("--- a write waits while unmeasured, and is stamped once node 2 agrees");
    let write = tokio::spawn({
        let leader = leader.clone();
        async move { leader.propose(enqueue(1)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!write.is_finished(), "the write was answered before any measurement");
    assert_eq!(last_log_index(leader.raft()), before, "an unstamped write reached the log");
    let measured_ms = clock.now_ms();
    leader.clock_watch().record(2, measured_ms, Instant::now(), Instant::now(), measured_ms);
    let answered = tokio::time::timeout(quorum_timeout, write).await??;
    match answered? {
        Response::Enqueued(outcomes) if outcomes.len() == 1 => {}
        other => anyhow::bail!("the held write was answered {other:?}"),
    }
    let written = proposals(&nodes[&1].log_store, before + 1).await?;
    assert_eq!(written.len(), 1, "one entry for the held write: {written:?}");
    assert!(
        written[0].now_ms >= measured_ms,
        "stamped {} ms, before the clock was agreed at {measured_ms} ms",
        written[0].now_ms
    );

    tracing::info!("--- both peers read two minutes behind: skewed, refused at once");
    let now_ms = clock.now_ms();
    for peer in [2, 3] {
        let behind_ms = now_ms - 120_000;
        leader.clock_watch().record(peer, now_ms, Instant::now(), Instant::now(), behind_ms);
    }
    assert!(leader.clock_verdict().is_skewed(), "{:?}", leader.clock_verdict());
    let before = last_log_index(leader.raft());
    let started = Instant::now();
    let refused = leader.propose(enqueue(2)).await;
    assert!(
        matches!(&refused, Err(JournalError::Unavailable(Unavailable::ClockUnverified(why)))
            if why.contains("more than 500 ms off")),
        "a skewed leader proposed: {refused:?}"
    );
    assert!(
        started.elapsed() < quorum_timeout / 2,
        "a skewed leader held the write {:?}",
        started.elapsed()
    );
    assert_eq!(last_log_index(leader.raft()), before, "a refused proposal reached the log");

    leader.shutdown().await;
    for (_, node) in nodes {
        node.raft.shutdown().await?;
    }
    Ok(())
}

/// With more than one batch in flight the batcher hands each batch to a
/// write of its own (one batch in flight is written by the batcher
/// itself): every proposal is still answered once, with its own job, and
/// written once.
#[tokio::test]
async fn with_several_batches_in_flight_every_proposal_is_written_and_answered_once()
-> anyhow::Result<()> {
    let nodes = three_nodes().await?;
    let clock = Clock::system();
    let leader = journal_with(1, &nodes[&1], clock.clone(), 4);
    leader.clock_watch().record(2, clock.now_ms(), Instant::now(), Instant::now(), clock.now_ms());
    let first = last_log_index(leader.raft()) + 1;
    let answers = tokio::time::timeout(
        Duration::from_secs(30),
        futures::future::join_all((1..=64).map(|n| leader.propose(enqueue(n)))),
    )
    .await?;
    let mut job_ids = Vec::new();
    for answer in answers {
        match answer? {
            Response::Enqueued(outcomes) if outcomes.len() == 1 => job_ids.push(outcomes[0].job_id),
            other => anyhow::bail!("an enqueue was answered {other:?}"),
        }
    }
    job_ids.sort_unstable();
    assert_eq!(job_ids, (1..=64).collect::<Vec<_>>(), "each proposer gets a job of its own");
    let written = proposals(&nodes[&1].log_store, first).await?;
    let mut payloads = Vec::new();
    for proposal in &written {
        let Command::Ruled { command, .. } = &proposal.command else {
            anyhow::bail!("an entry without the leader's rules: {:?}", proposal.command);
        };
        let commands = match &**command {
            Command::Batch { commands } => commands.iter().collect::<Vec<_>>(),
            other => vec![other],
        };
        for command in commands {
            let Command::Enqueue { jobs } = command else {
                anyhow::bail!("an unexpected entry: {command:?}");
            };
            payloads.extend(jobs.iter().map(|job| job.payload.clone()));
        }
    }
    payloads.sort();
    let mut expected: Vec<Vec<u8>> = (1..=64).map(|n| format!("job {n}").into_bytes()).collect();
    expected.sort();
    assert_eq!(payloads, expected, "the log carries every enqueue once");
    assert!(written.len() < 64, "64 concurrent proposals took {} entries", written.len());
    converged(&leader, &nodes).await?;
    leader.shutdown().await;
    for (_, node) in nodes {
        node.raft.shutdown().await?;
    }
    Ok(())
}
