//! Replication ahead of the leader's own log sync.
//!
//! openraft 0.9's core waits for the log store's flush callback of an
//! append before it runs the next command (`RaftCore::append_to_log`
//! awaits it), and the next command of a leader's append is the one that
//! hands the same entries to the replication streams. So, left alone, a
//! leader syncs its log first and only then sends the entries to its
//! followers, which sync theirs: two syncs in series on every commit round
//! (docs/benchmarks.md measured them adding up to the whole write at one
//! client). openraft 0.10 submits log I/O without waiting; 0.9 does not.
//!
//! This module overlaps the two. When the leader's log store accepts a
//! batch (before its sync), [`AheadObserver`] checks with openraft's own
//! metrics that this node leads under the vote the entries were made in,
//! and picks the followers whose log openraft knows to end exactly where
//! the batch begins. [`run`] sends each of them the batch as an ordinary
//! AppendEntries of that vote, with no commit index. The follower appends
//! and syncs the entries while the leader syncs its own.
//!
//! When openraft's replication stream then asks for the same message
//! (same vote, same entry before, same entries' log ids: the usual case),
//! the network does not send it again: it waits for the answer of the one
//! sent ahead, half of openraft's deadline at most, and if that was
//! `Success` hands openraft that answer
//! ([`crate::network::AheadAnswers`]). Any other answer, an error, or no
//! answer in that time, and the request goes out as usual. That saves a
//! round trip of every commit, and the entries' second trip over the
//! wire. A commit index openraft's request carried and the follower was
//! not yet brought goes to it in a message without entries.
//!
//! Why this is safe: the message is one the leader could have sent itself
//! (its vote, its entries, the entry before them as `prev_log_id`); Raft
//! tolerates any message arriving late, twice or not at all, and a
//! follower with a newer vote refuses it. A follower answers `Success`
//! only after checking the vote and the entry before, and only once the
//! entries are synced (openraft 0.9's follower responds after its log
//! flush), so that answer is the very one openraft's own copy of the
//! message would get: that this follower holds these entries, accepted
//! under this leader's vote. Raft counts such an answer towards a commit
//! whenever it arrives, late or not: a follower accepts a leader's entries
//! only before it votes in a later term, so a later leader's election
//! still needs a voter holding them. The answer is handed out once, and
//! only for a request of the same vote and log ids; a log id names one
//! entry, since every entry sent ahead is of the leader's own vote and a
//! restarted node never leads a term it led before (below). The message
//! carries no commit index, so it can only add entries, never commit
//! them. The two properties of openraft 0.9 this rests on (a follower
//! answers only after its flush callback; a leader replicates only after
//! its own flush) must be checked again on an upgrade.
//! Sending entries before the leader's own sync is allowed by Raft (the
//! leader's copy counts towards the quorum only once durable, like any
//! other).
//!
//! One assumption of openraft's does not survive it: a node whose stored
//! vote is its own committed one starts as that term's leader again, with
//! its log as synced. A leader that sent an entry ahead and then lost it
//! (its sync failed, it restarted) would make a different entry under the
//! same log id, and followers holding the first would take the two for
//! one. The log store therefore reports the vote uncommitted at start
//! (`leasehold_storage`'s `read_vote`), so a restarted node never leads a
//! term it led before (docs/decisions.md, "Replication ahead").
//!
//! Everything is bounded: the queue of batches, and one message in flight
//! per follower (a follower still answering the last one is skipped, and
//! openraft's stream brings it the entries as before).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::AppendEntriesRequest;
use openraft::{BasicNode, Entry, LogId, RaftMetrics, ServerState, Vote};
use tokio::sync::mpsc;

use crate::network::{NetworkFactory, took_ahead};
use crate::types::{NodeId, Raft, TypeConfig};

/// Batches waiting to be sent ahead; past this, a batch is left to
/// openraft's replication stream alone.
pub const AHEAD_QUEUE: usize = 16;
/// Deadline of one message sent ahead: a follower slower than this is
/// skipped until it answers (openraft's own stream keeps it in step).
pub const AHEAD_TIMEOUT: Duration = Duration::from_secs(1);

/// A batch to send ahead: the request, and the followers to send it to.
#[derive(Debug)]
pub struct AheadBatch {
    /// The AppendEntries each follower gets.
    pub request: Arc<AppendEntriesRequest<TypeConfig>>,
    /// The followers, with their addresses.
    pub targets: Vec<(NodeId, String)>,
}

/// Who the leader's log store tells about each batch it accepts, before
/// syncing it: `prev` is the log id of the entry before the batch.
pub trait AppendObserver: Send + Sync {
    /// Called with every batch the log store accepts, on the Raft core's
    /// task; it must not block.
    fn appended(&self, prev: Option<LogId<NodeId>>, entries: &[Arc<Entry<TypeConfig>>]);
}

/// Whom a batch goes ahead to, and under which vote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AheadPlan {
    /// The leader's vote, which made the entries.
    pub vote: Vote<NodeId>,
    /// The followers that hold everything before the batch, with their
    /// addresses.
    pub targets: Vec<(NodeId, String)>,
}

/// The [`AppendObserver`] that queues batches for [`run`].
pub struct AheadObserver {
    raft: Raft,
    queue: mpsc::Sender<AheadBatch>,
}

impl AheadObserver {
    /// An observer reading `raft`'s metrics, and the receiving end of its
    /// queue, for [`run`].
    pub fn new(raft: Raft) -> (Self, mpsc::Receiver<AheadBatch>) {
        let (queue, batches) = mpsc::channel(AHEAD_QUEUE);
        (AheadObserver { raft, queue }, batches)
    }
}

impl AppendObserver for AheadObserver {
    fn appended(&self, prev: Option<LogId<NodeId>>, entries: &[Arc<Entry<TypeConfig>>]) {
        let plan = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            plan(&metrics, prev, entries)
        };
        let Some(AheadPlan { vote, targets }) = plan else { return };
        let request = AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries: entries.iter().map(|entry| Entry::clone(entry)).collect(),
            // Never a commit index: a message sent ahead only adds entries.
            leader_commit: None,
        };
        let batch = AheadBatch { request: Arc::new(request), targets };
        if self.queue.try_send(batch).is_err() {
            // Full or stopped: openraft's stream carries the batch anyway.
            tracing::trace!("replication ahead skipped a batch: queue full or stopped");
        }
    }
}

/// Whom to send a batch ahead to, judged from openraft's metrics: `None`
/// unless this node leads under a committed vote that made the entries;
/// otherwise that vote and every follower whose matching log id is `prev`
/// (it holds everything before the batch, so the message fits its log).
pub fn plan(
    metrics: &RaftMetrics<NodeId, BasicNode>,
    prev: Option<LogId<NodeId>>,
    entries: &[Arc<Entry<TypeConfig>>],
) -> Option<AheadPlan> {
    let first = entries.first()?;
    let vote = metrics.vote;
    let leads = metrics.state == ServerState::Leader
        && vote.is_committed()
        && vote.leader_id().voted_for() == Some(metrics.id);
    // Every entry must be this vote's own: a leader appends only those,
    // and a message must not claim another leader's vote.
    if !leads || entries.iter().any(|entry| entry.log_id.leader_id != *vote.leader_id()) {
        return None;
    }
    // Contiguous and right after `prev`, as the follower will check.
    let first_index = prev.map_or(0, |prev| prev.index + 1);
    if first.log_id.index != first_index
        || (first_index..).zip(entries).any(|(index, entry)| entry.log_id.index != index)
    {
        return None;
    }
    let membership = metrics.membership_config.membership();
    let targets: Vec<(NodeId, String)> = metrics
        .replication
        .as_ref()?
        .iter()
        .filter(|(id, matched)| **id != metrics.id && **matched == prev)
        .filter_map(|(id, _)| membership.get_node(id).map(|node| (*id, node.addr.clone())))
        .collect();
    (!targets.is_empty()).then_some(AheadPlan { vote, targets })
}

/// Sends each queued batch to its followers until `shutdown` turns true or
/// the queue closes, at most one message in flight per follower; each
/// answer goes to [`crate::network::AheadAnswers`], where openraft's
/// request for the same entries takes it.
pub async fn run(
    peers: NetworkFactory,
    mut batches: mpsc::Receiver<AheadBatch>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut sends = tokio::task::JoinSet::new();
    let mut busy = BTreeSet::new();
    loop {
        tokio::select! {
            batch = batches.recv() => {
                let Some(batch) = batch else { break };
                for (target, addr) in batch.targets {
                    if !busy.insert(target) {
                        continue;
                    }
                    let mut client = peers.clone();
                    let request = batch.request.clone();
                    // Noted before it is sent: openraft's request for the
                    // same entries, if it comes later, finds it (one that
                    // comes first is simply sent).
                    let answered = peers.ahead_answers().sending(target, &request);
                    sends.spawn(async move {
                        let mut client = client.new_client(target, &BasicNode { addr }).await;
                        let option = RPCOption::new(AHEAD_TIMEOUT);
                        let answer = client.append_ahead(&request, &option).await;
                        if let Err(error) = &answer {
                            tracing::trace!(target, %error, "replication ahead failed");
                        }
                        let took = took_ahead(&answer);
                        // Nobody may be waiting (openraft moved on): fine.
                        let _ = answered.send(took);
                        target
                    });
                }
            }
            Some(done) = sends.join_next() => {
                if let Ok(target) = done {
                    busy.remove(&target);
                }
            }
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    sends.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::{CommittedLeaderId, EntryPayload, Membership, StoredMembership};

    use super::*;

    fn log_id(term: u64, node: NodeId, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn entry(term: u64, node: NodeId, index: u64) -> Arc<Entry<TypeConfig>> {
        Arc::new(Entry { log_id: log_id(term, node, index), payload: EntryPayload::Blank })
    }

    /// Node 1 leading in term 3 of {1, 2, 3}; followers matched as given.
    fn leader(matched: [(NodeId, Option<LogId<NodeId>>); 2]) -> RaftMetrics<NodeId, BasicNode> {
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=3)
            .map(|id| (id, BasicNode { addr: format!("127.0.0.1:{}", 7070 + id) }))
            .collect();
        let membership = Membership::new(vec![nodes.keys().copied().collect()], nodes);
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.state = ServerState::Leader;
        metrics.current_term = 3;
        metrics.vote = Vote::new_committed(3, 1);
        metrics.current_leader = Some(1);
        metrics.membership_config = Arc::new(StoredMembership::new(None, membership));
        let mut replication: BTreeMap<NodeId, Option<LogId<NodeId>>> = matched.into();
        replication.insert(1, Some(log_id(3, 1, 9)));
        metrics.replication = Some(replication);
        metrics
    }

    #[test]
    fn a_leader_sends_ahead_to_the_followers_that_hold_everything_before() {
        let prev = Some(log_id(3, 1, 9));
        let batch = [entry(3, 1, 10), entry(3, 1, 11)];
        let metrics = leader([(2, prev), (3, Some(log_id(3, 1, 8)))]);
        let planned = plan(&metrics, prev, &batch).expect("node 2 matches");
        assert_eq!(planned.vote, Vote::new_committed(3, 1));
        assert_eq!(planned.targets, vec![(2, "127.0.0.1:7072".to_string())]);

        // Both in step: both get it; neither: no message at all.
        let both = leader([(2, prev), (3, prev)]);
        assert_eq!(plan(&both, prev, &batch).map(|p| p.targets.len()), Some(2));
        let neither = leader([(2, None), (3, Some(log_id(2, 2, 9)))]);
        assert_eq!(plan(&neither, prev, &batch), None);
    }

    #[test]
    fn nothing_is_sent_ahead_unless_this_node_leads_under_the_entries_vote() {
        let prev = Some(log_id(3, 1, 9));
        let batch = [entry(3, 1, 10)];
        let mut follower = leader([(2, prev), (3, prev)]);
        follower.state = ServerState::Follower;
        assert_eq!(plan(&follower, prev, &batch), None);

        let mut uncommitted = leader([(2, prev), (3, prev)]);
        uncommitted.vote = Vote::new(3, 1);
        assert_eq!(plan(&uncommitted, prev, &batch), None);

        // Entries of an older term of this node, or of another leader.
        let metrics = leader([(2, prev), (3, prev)]);
        assert_eq!(plan(&metrics, prev, &[entry(2, 1, 10)]), None);
        assert_eq!(plan(&metrics, prev, &[entry(3, 2, 10)]), None);
        assert_eq!(plan(&metrics, prev, &[entry(3, 1, 10), entry(3, 2, 11)]), None);
    }

    #[test]
    fn a_batch_that_does_not_follow_prev_is_not_sent_ahead() {
        let prev = Some(log_id(3, 1, 9));
        let metrics = leader([(2, prev), (3, prev)]);
        assert_eq!(plan(&metrics, prev, &[entry(3, 1, 11)]), None);
        assert_eq!(plan(&metrics, prev, &[entry(3, 1, 10), entry(3, 1, 12)]), None);
        assert_eq!(plan(&metrics, prev, &[]), None);
    }
}
