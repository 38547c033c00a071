//! Goal: a leader's followers receive and store a batch while the leader's
//! own log sync is still running, not after it (replication ahead,
//! `leasehold_raft::ahead`), and the write still commits only once synced.
//!
//! Method: three nodes in this process. The leader's log store is made to
//! report every append synced 600 ms late (a slow disk, as openraft sees
//! it). One write is proposed on the leader; the followers' last log index
//! is watched. Left to openraft 0.9 alone, the leader's core waits out its
//! sync before it replicates, so the followers would see the entry only
//! after 600 ms; with replication ahead a follower holds it within a
//! fraction of that, while the write has not yet returned. The write must still wait
//! for the leader's (delayed) sync before it answers.
//!
//! And the entry travels to each follower once: when openraft's
//! replication stream asks for the message already sent ahead, the
//! leader takes the answer of the one sent ahead instead of sending the
//! entries again. Each follower counts the AppendEntries carrying entries
//! it serves (its `follower_append` stage); over the write that count
//! may not exceed the entries it received.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use leasehold_core::{Command, Proposal};
use leasehold_node::config::{Config, SecretText};
use leasehold_node::{Node, NodeHandle, Transport};
use support::{last_index, phase, wait_for};
use tokio::net::TcpListener;

mod support;

/// How late the leader's appends are reported synced.
const SYNC_DELAY: Duration = Duration::from_millis(600);
/// The followers must hold the entry well before the leader's sync ends.
const AHEAD_WITHIN: Duration = Duration::from_millis(300);

/// How many AppendEntries carrying entries `node` has served (its
/// `follower_append` stage's count).
fn appends_served(node: &NodeHandle) -> u64 {
    let text = node.journal().metrics().encode().unwrap_or_default();
    text.lines()
        .find_map(|line| {
            line.strip_prefix("leasehold_commit_stage_seconds_count{stage=\"follower_append\"} ")
        })
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

async fn start(id: u64, dir: &std::path::Path, join: Option<String>) -> Result<NodeHandle> {
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let http = TcpListener::bind("127.0.0.1:0").await?;
    let config = Config {
        id,
        grpc: grpc.local_addr()?.to_string(),
        http: http.local_addr()?.to_string(),
        data: dir.join(format!("node-{id}")),
        join,
        // The leader's core stalls for the delayed sync; no follower may
        // take that for a dead leader.
        heartbeat_ms: 100,
        election_timeout_min_ms: 3_000,
        election_timeout_max_ms: 4_000,
        executor: false,
        // No sweeps from the leader's driver: the story's write is the
        // only one in flight.
        sweep_interval_ms: 3_600_000,
        cluster_secret: Some(SecretText("replicate-ahead-test-secret-0123456789".into())),
        // This story is about the feature on, whatever the default.
        replicate_ahead: true,
        ..Config::default()
    };
    Node::start(config, Transport { grpc, http }).await.map_err(|e| anyhow!("node {id}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_store_a_batch_while_the_leader_still_syncs_it() -> Result<()> {
    let dir = tempfile::tempdir()?;

    phase("start node 1, then nodes 2 and 3 joining it");
    let first = start(1, dir.path(), None).await?;
    let member = first.grpc_addr().to_string();
    let nodes = BTreeMap::from([
        (1, first),
        (2, start(2, dir.path(), Some(member.clone())).await?),
        (3, start(3, dir.path(), Some(member)).await?),
    ]);
    let leader = &nodes[&1];
    wait_for("three voters, both followers caught up", Duration::from_secs(30), || {
        let metrics = leader.raft().metrics().borrow().clone();
        let voters = metrics.membership_config.membership().voter_ids().count();
        let last = metrics.last_log_index;
        voters == 3
            && metrics.replication.as_ref().is_some_and(|replication| {
                replication.len() == 3
                    && replication.values().all(|matched| matched.map(|m| m.index) == last)
            })
    })
    .await?;

    phase("the leader's syncs now report 600 ms late; propose one write on it");
    let target = last_index(leader) + 1;
    let before: Vec<(u64, u64)> =
        [&nodes[&2], &nodes[&3]].map(|node| (last_index(node), appends_served(node))).to_vec();
    let taken_before = leader.journal().peers().ahead_answers().taken();
    leader.log_store().set_sync_delay(SYNC_DELAY);
    let raft = leader.raft().clone();
    let started = Instant::now();
    let write = tokio::spawn(async move {
        let proposal = Proposal { now_ms: 0, command: Command::Sweep };
        let written = raft.client_write(proposal).await;
        (written.map(|w| w.log_id.index), started.elapsed())
    });

    // A follower still answering an earlier message sent ahead is skipped
    // by design (one in flight per follower), so on a loaded machine one
    // of the two may get the entry only from openraft's stream. One is
    // what a commit needs (with the leader, a majority of three); without
    // replication ahead neither has it before the leader's sync ends.
    phase("a follower holds the entry before the leader's sync is reported");
    wait_for("a follower holds the new entry", AHEAD_WITHIN, || {
        last_index(&nodes[&2]) >= target || last_index(&nodes[&3]) >= target
    })
    .await
    .with_context(|| {
        format!(
            "leader's sync is delayed {SYNC_DELAY:?}; target {target}, leader at {}, followers at {} and {}, {:?} since the proposal",
            last_index(leader),
            last_index(&nodes[&2]),
            last_index(&nodes[&3]),
            started.elapsed()
        )
    })?;
    let followers_had_it = started.elapsed();
    assert!(!write.is_finished(), "the write answered before the leader's sync was reported");

    phase("the write commits, and only after the leader's own sync");
    let (written, write_took) = write.await?;
    let written = written.map_err(|e| anyhow!("write: {e}"))?;
    assert!(written >= target, "the write landed at {written}, before {target}");
    assert!(
        write_took >= SYNC_DELAY,
        "the write answered in {write_took:?}, before the leader's {SYNC_DELAY:?} sync"
    );
    eprintln!("followers held it after {followers_had_it:?}; the write took {write_took:?}");

    phase("each follower was sent the entries once");
    wait_for("both followers hold the write", Duration::from_secs(5), || {
        last_index(&nodes[&2]) >= written && last_index(&nodes[&3]) >= written
    })
    .await?;
    // A second copy, were one sent, would come within openraft's
    // heartbeat deadline (100 ms here) of the leader's sync.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (node, (index_before, served_before)) in [&nodes[&2], &nodes[&3]].into_iter().zip(before) {
        let received = last_index(node) - index_before;
        let served = appends_served(node) - served_before;
        assert!(
            served <= received,
            "a follower served {served} AppendEntries carrying entries for {received} new entries"
        );
    }
    let taken = leader.journal().peers().ahead_answers().taken() - taken_before;
    assert!(taken >= 1, "openraft's stream never took an answer of a message sent ahead");

    leader.log_store().set_sync_delay(Duration::ZERO);
    for (_, node) in nodes {
        node.shutdown(Duration::from_secs(5)).await.map_err(|e| anyhow!("shutdown: {e}"))?;
    }
    Ok(())
}
