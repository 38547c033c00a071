//! The journal handle: proposes commands to the Raft log (forwarding to the
//! leader when this node is a follower) and serves reads from the local state
//! machine, linearizable by default.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use leasehold_core::{Command, Limits, Proposal, Response, State, batch};
use leasehold_proto::v1::RaftEnvelope;
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_raft::{NetworkFactory, NodeId, Raft, envelope};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::clock_watch::{self, ClockWatch};
use crate::error::{JournalError as Error, Unavailable};
use crate::forward::{ForwardRequest, ForwardResponse};
use crate::metrics::{MAX_QUEUE_SERIES, Metrics, PeerLabels, Stage, StageLabels};
use crate::stores::{ReplicaLogStore, ReplicaStateMachine};

/// Settings of the journal handle.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// This node's id.
    pub node_id: NodeId,
    /// Limits applied to input before proposing.
    pub limits: Limits,
    /// How long a write or a linearizable read may wait for a quorum before
    /// failing with UNAVAILABLE.
    pub quorum_timeout: Duration,
    /// Most batched entries in flight at once (at least one; see
    /// [`DEFAULT_BATCHES_IN_FLIGHT`]).
    pub batches_in_flight: usize,
    /// The enforced clock bound (`max_clock_offset_ms`): how far this
    /// node's clock may be from a majority of the voters for it to lead
    /// and stamp time.
    pub max_clock_offset_ms: u64,
    /// How long a measured offset to a peer counts.
    pub clock_fresh_for: Duration,
}

struct Inner {
    config: JournalConfig,
    raft: Raft,
    log: Arc<dyn ReplicaLogStore>,
    state: Arc<dyn ReplicaStateMachine>,
    clock: Clock,
    peers: NetworkFactory,
    draining: AtomicBool,
    probe_fault: AtomicBool,
    /// The highest commit index a leader's append has named to this node
    /// (readiness: a follower is caught up only once it applied that).
    leader_commit_seen: std::sync::atomic::AtomicU64,
    /// The newest log format every member decodes (see
    /// [`Journal::set_log_format`]).
    log_format: AtomicU32,
    /// The same, counting a member not heard as decoding format 1 (see
    /// [`Journal::heard_log_format`]).
    heard_log_format: AtomicU32,
    metrics: Metrics,
    clock_watch: ClockWatch,
    drain_request: tokio::sync::watch::Sender<bool>,
    batches: tokio::sync::mpsc::Sender<Pending>,
    batcher: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When the metrics last walked the queues, and how long it took.
    queue_walk: tokio::sync::Mutex<Option<(std::time::Instant, Duration)>>,
    /// What this node's stamps of its current term may not run ahead of.
    pace: std::sync::Mutex<Option<TermPace>>,
}

/// A leader's stamps within one term run no faster than its monotonic
/// clock from the lowest agreed reading of the term: a step of the wall
/// clock forward (NTP, an operator), small enough to stay within the
/// bound of its peers, would otherwise move cluster time at once and cut
/// that term's leases short by the step, up to twice the bound (from one
/// side of the peers to the other). Steps back, and slowness, still show
/// (cluster time never goes back; it waits). Across terms the bounded
/// sweep covers the leaders' difference (docs/safety.md).
#[derive(Clone, Copy, Debug)]
struct TermPace {
    term: u64,
    /// The wall reading (ms) the pace runs from, and when it was read.
    wall_ms: u64,
    at: Instant,
}

impl TermPace {
    /// The stamp for a wall reading `wall_ms` taken at `at` in `term`, and
    /// the pace after it: the reading, capped by the pace when one of this
    /// term runs; a lower reading becomes the pace.
    fn stamp(pace: Option<TermPace>, term: u64, wall_ms: u64, at: Instant) -> (u64, TermPace) {
        match pace {
            Some(pace) if pace.term == term => {
                let elapsed = u64::try_from(at.saturating_duration_since(pace.at).as_millis())
                    .unwrap_or(u64::MAX);
                let cap = pace.wall_ms.saturating_add(elapsed);
                if wall_ms < cap { (wall_ms, TermPace { term, wall_ms, at }) } else { (cap, pace) }
            }
            _ => (wall_ms, TermPace { term, wall_ms, at }),
        }
    }
}

impl Inner {
    /// The most bytes one lease of a claim's answer can take: by this
    /// node's limits or the defaults, whichever allow more (jobs were
    /// checked by the limits of the leader that took them).
    fn grant_bytes_bound(&self) -> usize {
        self.config.limits.grant_bytes_bound().max(Limits::default().grant_bytes_bound())
    }
}

/// A metrics scrape walks the queues again only after twenty times the
/// last walk's time ([`Journal::refresh_gauges`]).
const QUEUE_WALK_SHARE: u32 = 20;

/// Whether a scrape at `now` walks the queues, given when the last walk
/// started and how long it took.
fn queue_walk_due(last: Option<(std::time::Instant, Duration)>, now: std::time::Instant) -> bool {
    last.is_none_or(|(at, took)| now.saturating_duration_since(at) >= took * QUEUE_WALK_SHARE)
}

/// A proposal waiting for the batcher, and where its answer goes.
struct Pending {
    proposal: Proposal,
    /// The node that forwarded it here, or `None` for this node's own: a
    /// follower forwards only its own to the leader, so no write bounces
    /// between nodes, and a leader takes a forwarded one only from a
    /// member.
    forwarded_by: Option<NodeId>,
    reply: tokio::sync::oneshot::Sender<Result<Response, Error>>,
    /// When it reached the journal (the queue stage starts).
    queued: std::time::Instant,
}

/// The default of [`JournalConfig::batches_in_flight`]. openraft 0.9
/// appends and fsyncs one entry at a time in its core. A second batch in
/// flight lets the leader sync one entry while the one before it
/// replicates, but splits the same proposals over more entries, each with
/// its own sync and Raft round; on the benchmark host (2 cores, CPU-bound)
/// one was as fast or faster at 1, 32 and 128 clients. More may pay where
/// syncs are slow and CPU is spare.
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 1;

/// The time a batch is stamped with, and whether this node stamped it as
/// the leader with a clock a majority agrees with (otherwise it is a
/// follower's placeholder: the leader stamps again).
#[derive(Clone, Copy, Debug)]
struct Stamp {
    now_ms: u64,
    agreed: bool,
}

/// How often a leader waiting for its clock to be measured looks again
/// without a new measurement (leadership or membership may have changed).
const STAMP_RECHECK: Duration = Duration::from_millis(100);

/// Most proposals waiting for the batcher before proposers wait for room.
const BATCH_QUEUE: usize = 4_096;

/// Cheap to clone; shared by every service and the node's driver.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

impl Journal {
    /// A journal over a started Raft instance and its stores (the node's
    /// are `leasehold_storage`'s; see [`crate::stores`]). `peers` carries
    /// the writes and read barriers a follower forwards to the leader; a
    /// journal that never forwards never connects through it.
    pub fn new(
        config: JournalConfig,
        raft: Raft,
        log: Arc<dyn ReplicaLogStore>,
        state: Arc<dyn ReplicaStateMachine>,
        clock: Clock,
        peers: NetworkFactory,
    ) -> Self {
        let (batches, queue) = tokio::sync::mpsc::channel(BATCH_QUEUE);
        let metrics = Metrics::new();
        let timer = |stage: Stage| {
            let stages = metrics.commit_stage_seconds.clone();
            let stage = StageLabels { stage: stage.name() };
            Arc::new(move |elapsed: Duration| {
                stages.get_or_create(&stage).observe(elapsed.as_secs_f64());
            })
        };
        peers.observe_replication(timer(Stage::Replicate));
        log.observe_syncs(timer(Stage::LogSync));
        let clock_watch = ClockWatch::new(config.max_clock_offset_ms, config.clock_fresh_for);
        let journal = Journal {
            inner: Arc::new(Inner {
                config,
                raft,
                log,
                state,
                clock,
                peers,
                draining: AtomicBool::new(false),
                probe_fault: AtomicBool::new(false),
                leader_commit_seen: std::sync::atomic::AtomicU64::new(0),
                log_format: AtomicU32::new(leasehold_core::command::LOG_FORMAT),
                heard_log_format: AtomicU32::new(1),
                drain_request: tokio::sync::watch::channel(false).0,
                batches,
                batcher: std::sync::Mutex::new(None),
                queue_walk: tokio::sync::Mutex::new(None),
                pace: std::sync::Mutex::new(None),
                metrics,
                clock_watch,
            }),
        };
        // The batcher holds only a weak handle, so dropping every Journal
        // closes the queue and ends it; the journal owns the task, and
        // `shutdown` ends it at once.
        let in_flight = journal.inner.config.batches_in_flight.max(1);
        let batcher =
            tokio::spawn(batch_proposals(Arc::downgrade(&journal.inner), queue, in_flight));
        if let Ok(mut slot) = journal.inner.batcher.lock() {
            *slot = Some(batcher);
        }
        journal
    }

    /// Stops the batcher and every write it has in flight; proposals after
    /// this fail UNAVAILABLE (shutting down). Called when the node stops,
    /// before Raft does.
    pub async fn shutdown(&self) {
        let batcher = self.inner.batcher.lock().ok().and_then(|mut slot| slot.take());
        if let Some(batcher) = batcher {
            batcher.abort();
            let _ = batcher.await;
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.inner.config.node_id
    }

    /// The most leases a claim this node forwards may be answered with
    /// ([`batch::max_forwarded_leases`]).
    pub fn forwarded_lease_cap(&self) -> u32 {
        batch::max_forwarded_leases(self.inner.grant_bytes_bound())
    }

    /// The input limits in force on this node.
    pub fn limits(&self) -> &Limits {
        &self.inner.config.limits
    }

    /// The Raft handle.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// The log store, as the replica runtime uses it (readiness probes it).
    pub fn log_store(&self) -> &dyn ReplicaLogStore {
        &*self.inner.log
    }

    /// The state machine, as the replica runtime reads it.
    pub fn state_machine(&self) -> &dyn ReplicaStateMachine {
        &*self.inner.state
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Brings the state-describing gauges up to date (called at each scrape).
    pub async fn refresh_gauges(&self) {
        let metrics = &self.inner.metrics;
        let raft = self.inner.raft.metrics().borrow().clone();
        metrics.raft_term.set(raft.current_term as i64);
        metrics.raft_leader.set(i64::from(raft.current_leader == Some(self.inner.config.node_id)));
        metrics.raft_last_log_index.set(raft.last_log_index.unwrap_or(0) as i64);
        metrics.raft_applied_index.set(raft.last_applied.map(|l| l.index).unwrap_or(0) as i64);
        metrics.raft_commit_index.set(self.committed_index().await as i64);
        metrics.draining.set(i64::from(self.is_draining()));
        for offset in self.inner.clock_watch.offsets(&self.inner.clock) {
            let labels = PeerLabels { peer: offset.node.to_string() };
            metrics.clock_offset_ms.get_or_create(&labels).set(offset.offset_ms);
        }
        metrics.clock_skewed.set(i64::from(self.clock_verdict().is_skewed()));
        if let Some(longest) = self.inner.state.snapshot_lock_hold_longest() {
            metrics.snapshot_lock_hold_longest_seconds.set(longest.as_secs_f64());
        }
        if let Some(longest) = self.inner.state.snapshot_lock_hold_longest_cpu() {
            metrics.snapshot_lock_hold_longest_cpu_seconds.set(longest.as_secs_f64());
        }
        let now_ms = self.inner.clock.now_ms();
        metrics.last_token.set(self.read_stale(|state| state.last_token()) as i64);
        // The queue counts walk every queue under the state lock, and
        // producers name queues: on a large state they are taken again only
        // once the time since the last walk is twenty times what it took,
        // so scrapes, however many, keep the lock at most a twentieth of
        // the time. A small state's walk takes microseconds, so every
        // scrape sees it fresh.
        let mut last = self.inner.queue_walk.lock().await;
        if !queue_walk_due(*last, std::time::Instant::now()) {
            return;
        }
        let started = std::time::Instant::now();
        let (stats, queues) =
            self.read_stale(|state| state.largest_queue_stats(now_ms, MAX_QUEUE_SERIES));
        *last = Some((started, started.elapsed()));
        metrics.queues.set(i64::try_from(queues).unwrap_or(i64::MAX));
        metrics.set_queue_counts(&stats);
    }

    /// Channels to peers, one per address.
    pub fn peers(&self) -> &NetworkFactory {
        &self.inner.peers
    }

    /// The last committed log index this node has recorded.
    pub async fn committed_index(&self) -> u64 {
        match self.inner.log.read_committed().await {
            Ok(committed) => committed.map(|id| id.index).unwrap_or(0),
            Err(error) => {
                tracing::warn!(%error, "reading the committed index failed");
                0
            }
        }
    }

    /// The node's clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The measured offsets to peers.
    pub fn clock_watch(&self) -> &ClockWatch {
        &self.inner.clock_watch
    }

    /// The current voters, by the Raft membership this node knows.
    pub fn voters(&self) -> Vec<u64> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        metrics.membership_config.membership().voter_ids().collect()
    }

    /// The verdict on this node's clock against the voters, now.
    pub fn clock_verdict(&self) -> leasehold_core::clock_bound::ClockVerdict {
        self.inner.clock_watch.verdict(self.node_id(), &self.voters(), &self.inner.clock)
    }

    /// Cluster time as the next entry this node stamps would make it: the
    /// later of the state's cluster time and this node's clock. What a
    /// leader's duties (sweeps, purges, cron planning) judge by, so they
    /// agree with what the state machine will see when their proposal
    /// applies.
    pub fn cluster_now_ms(&self) -> u64 {
        let cluster_ms = self.read_stale(|state| state.cluster_time_ms());
        cluster_ms.max(self.paced_now_ms(false))
    }

    /// This node's clock as it would stamp now: as leader, no faster than
    /// the term's pace ([`TermPace`]), which `advance` moves on.
    fn paced_now_ms(&self, advance: bool) -> u64 {
        let wall_ms = self.inner.clock.now_ms();
        let (leads, term) = {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.state == openraft::ServerState::Leader, metrics.current_term)
        };
        if !leads {
            return wall_ms;
        }
        let mut pace = self.inner.pace.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (stamp, next) = TermPace::stamp(*pace, term, wall_ms, Instant::now());
        if advance {
            *pace = Some(next);
        }
        stamp
    }

    /// The time this node stamps a batch with: its clock, when it leads
    /// with a clock agreed by a majority of the voters. A leader whose
    /// clock is skewed stamps nothing (UNAVAILABLE at once: it is handing
    /// leadership over). One whose clock is not measured against a
    /// majority (its measurements lapsed while its peers were out of reach,
    /// as for a leader cut off for a while, or one just elected after a
    /// restart) waits for the next measurements until `deadline` and stamps
    /// nothing if none agree by then, whatever the verdict at that moment:
    /// adverts measure every peer each advert interval (a second by
    /// default), so a leader that can reach a majority stamps within one
    /// instead of refusing. On a follower the stamp is a placeholder
    /// ([`Stamp::agreed`] false), good only for a write sent on to the
    /// leader, which stamps again.
    async fn stamp(&self, deadline: Instant) -> Result<Stamp, Error> {
        let mut held = false;
        loop {
            let leading = self.inner.raft.metrics().borrow().state == openraft::ServerState::Leader;
            if !leading {
                return Ok(Stamp { now_ms: self.inner.clock.now_ms(), agreed: false });
            }
            let verdict = self.clock_verdict();
            let bound_ms = self.inner.clock_watch.bound_ms();
            if verdict.is_skewed() {
                let why = clock_watch::describe(&verdict, bound_ms);
                return Err(Unavailable::ClockUnverified(why).into());
            }
            // A batch held to its deadline is refused even if the clock is
            // agreed that moment: the caller keeps the rest of the quorum
            // timeout for the write, and a write started later could
            // outlast it, its proposers told "no quorum" for an entry that
            // might still be written.
            if Instant::now() >= deadline {
                let why = format!(
                    "not agreed by a majority of the voters within the time a write may wait \
                     for it (now: {})",
                    clock_watch::describe(&verdict, bound_ms)
                );
                tracing::warn!(
                    event = "clock.unmeasured",
                    %why,
                    "no majority measured this leader's clock in time: the held batch is refused"
                );
                return Err(Unavailable::ClockUnverified(why).into());
            }
            if verdict.may_stamp() {
                if held {
                    tracing::debug!(
                        event = "clock.unmeasured",
                        "clock agreed: stamping the held batch"
                    );
                }
                return Ok(Stamp { now_ms: self.paced_now_ms(true), agreed: true });
            }
            // Registered, then the verdict read again, so a measurement
            // landing in between is not missed; leadership and membership
            // change without one, so look again now and then.
            let measured = self.inner.clock_watch.next_measurement();
            if self.clock_verdict().may_stamp() {
                continue;
            }
            if !held {
                held = true;
                tracing::debug!(
                    event = "clock.unmeasured",
                    "holding a batch until a majority has measured this leader's clock"
                );
            }
            let recheck = (Instant::now() + STAMP_RECHECK).min(deadline);
            tokio::select! {
                biased;
                () = measured => {}
                () = tokio::time::sleep_until(recheck) => {}
            }
        }
    }

    /// Why a batch this node stamped as a follower is not proposed here:
    /// it was to go to the leader, and there is none to send it to, or this
    /// node became leader after the stamp was taken.
    fn not_stamped_as_leader(&self) -> Error {
        match self.inner.raft.metrics().borrow().current_leader {
            None => Unavailable::NoLeader.into(),
            Some(_) => Unavailable::LeadershipChanging.into(),
        }
    }

    /// Whether this node is draining (refuses new claims).
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Marks this node draining.
    pub fn set_draining(&self, draining: bool) {
        self.inner.draining.store(draining, Ordering::SeqCst);
    }

    /// Asks the node to drain and exit (the Drain RPC).
    pub fn request_drain(&self) {
        self.inner.drain_request.send_replace(true);
    }

    /// Turns true once a drain has been asked for.
    pub fn drain_requested(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.drain_request.subscribe()
    }

    /// If this node leads, asks the voter `State::successor` picks (the
    /// most caught-up one that is not draining; other than `avoid` when
    /// another qualifies) to start an election now, after giving it up to
    /// `catch_up_within` to hold this node's whole log, so the vote this
    /// node then receives is one it can grant. Answers the voter asked and
    /// how the request went, or `None` when this node does not lead or has
    /// no voter to ask. A leader that must stop leading (it drains, or its
    /// clock is beyond the bound) calls it: openraft 0.9 has no step-down, and otherwise the others
    /// wait out their leader lease and an election timeout before they
    /// elect. The request names this leader and its term, and is taken
    /// only by a voter that still follows it in that term.
    pub async fn hand_over(
        &self,
        catch_up_within: Duration,
        avoid: Option<NodeId>,
    ) -> Option<(NodeId, Result<(), Error>)> {
        let me = self.inner.config.node_id;
        let mut watch = self.inner.raft.metrics();
        let (matched, members, term, last_index) = {
            let metrics = watch.borrow();
            if metrics.state != openraft::ServerState::Leader {
                return None;
            }
            let membership = metrics.membership_config.membership();
            let matched: Vec<(NodeId, u64)> =
                membership.voter_ids().map(|id| (id, matched_index(&metrics, id))).collect();
            let members: Vec<(NodeId, String)> =
                membership.nodes().map(|(id, node)| (*id, node.addr.clone())).collect();
            (matched, members, metrics.current_term, metrics.last_log_index.unwrap_or(0))
        };
        let others: Vec<(NodeId, u64)> =
            matched.iter().copied().filter(|(id, _)| Some(*id) != avoid).collect();
        let successor = self.read_stale(|state| {
            state.successor(me, &others).or_else(|| state.successor(me, &matched))
        })?;
        let addr = members.into_iter().find(|(id, _)| *id == successor).map(|(_, a)| a)?;
        let caught_up = watch.wait_for(|m| matched_index(m, successor) >= last_index);
        // Asked regardless: a vote it cannot win costs a term, no more.
        let _ = tokio::time::timeout(catch_up_within, caught_up).await;
        let request = ForwardRequest::HandOver { leader: me, term };
        let outcome = match self.forward(Some(successor), Some(addr.clone()), request).await {
            // A peer of an earlier build knows only the bare request, which
            // names no leader or term (a rolling upgrade's window).
            Err(Error::PeerRefused(_)) => {
                self.forward(Some(successor), Some(addr), ForwardRequest::Campaign).await
            }
            answer => answer,
        };
        let outcome = match outcome {
            Ok(ForwardResponse::Campaigning) => Ok(()),
            Ok(other) => Err(Error::Internal(format!("unexpected hand-over answer {other:?}"))),
            Err(error) => Err(error),
        };
        Some((successor, outcome))
    }

    /// Notes the commit index a leader's append named (the Raft service
    /// calls this for every append it takes).
    pub fn note_leader_commit(&self, index: u64) {
        self.inner.leader_commit_seen.fetch_max(index, Ordering::Relaxed);
    }

    /// The highest commit index a leader's append has named to this node.
    pub fn leader_commit_seen(&self) -> u64 {
        self.inner.leader_commit_seen.load(Ordering::Relaxed)
    }

    /// Makes the readiness store probe fail (fault injection).
    pub fn set_probe_fault(&self, on: bool) {
        self.inner.probe_fault.store(on, Ordering::SeqCst);
    }

    /// Whether the readiness store probe is made to fail.
    pub fn probe_fault(&self) -> bool {
        self.inner.probe_fault.load(Ordering::SeqCst)
    }

    /// Whether this node leads and its state machine has caught up with
    /// everything committed before its term: when leader duties (sweeps,
    /// ticks, purges) may act on local state.
    pub fn is_leader(&self) -> bool {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        // A restarted ex-leader reads its own committed vote back as
        // `current_leader` before it learns of a newer term; only the
        // Leader role says it leads now. And a new leader acts on state only
        // once it has applied an entry of its own term (openraft commits a
        // blank one at once): until then its state may miss its
        // predecessor's last entries, and a catch-up plan made from it
        // would count ticks that were already fired as missed.
        metrics.current_leader == Some(self.inner.config.node_id)
            && metrics.state == openraft::ServerState::Leader
            && metrics
                .last_applied
                .is_some_and(|applied| applied.leader_id.term == metrics.current_term)
    }

    /// The leader's advertised address when another node leads, for the
    /// leader hint on answers; `None` on the leader or with none known.
    pub fn leader_hint(&self) -> Option<String> {
        self.other_leader().map(|(_, addr)| addr)
    }

    /// Another node this node knows to lead, and its address, by
    /// openraft's metrics; `None` when this node leads or knows no leader.
    fn other_leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader.filter(|id| *id != self.inner.config.node_id)?;
        let node = metrics.membership_config.membership().get_node(&leader)?;
        Some((leader, node.addr.clone()))
    }

    /// Whether `node` is in the membership this node knows (a voter or a
    /// learner).
    pub fn is_member(&self, node: NodeId) -> bool {
        self.inner.raft.metrics().borrow().membership_config.membership().get_node(&node).is_some()
    }

    /// The members a `target = each` tick whose job carries `tags` goes to,
    /// judged by core from the Raft membership and the registered nodes.
    pub fn each_targets(&self, tags: &[String]) -> Vec<u64> {
        self.each_members(tags).0
    }

    /// [`Self::each_targets`], and the members a tick whose job carries
    /// `tags` would go to but for their draining, from one read of each.
    pub fn each_members(&self, tags: &[String]) -> (Vec<u64>, Vec<u64>) {
        let members: Vec<u64> = {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            metrics.membership_config.membership().nodes().map(|(id, _)| *id).collect()
        };
        self.read_stale(|state| {
            (state.each_targets(&members, tags), state.each_draining(&members, tags))
        })
    }

    /// Reads the local state machine as it is now (possibly behind the leader).
    pub fn read_stale<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.inner.state.state())
    }

    /// Reads the state machine after a read barrier: unless `stale`, the read
    /// sees every write committed before the call began.
    pub async fn read<T>(&self, stale: bool, f: impl FnOnce(&State) -> T) -> Result<T, Error> {
        if !stale {
            self.read_barrier().await?;
        }
        Ok(self.read_stale(f))
    }

    /// Waits until this node has applied everything committed before the call:
    /// the leader confirms its leadership with a quorum (read-index); a
    /// follower asks the leader for that index and waits to apply it.
    pub async fn read_barrier(&self) -> Result<(), Error> {
        let timeout = self.inner.config.quorum_timeout;
        let read_index = match tokio::time::timeout(timeout, self.leader_read_index()).await {
            Ok(result) => result?,
            Err(_) => return Err(no_quorum(timeout)),
        };
        self.wait_applied(read_index, timeout).await
    }

    async fn leader_read_index(&self) -> Result<u64, Error> {
        match self.inner.raft.ensure_linearizable().await {
            Ok(log_id) => Ok(log_id.map(|id| id.index).unwrap_or(0)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
                match self
                    .forward(
                        forward.leader_id,
                        forward.leader_node.map(|n| n.addr),
                        ForwardRequest::ReadIndex,
                    )
                    .await?
                {
                    ForwardResponse::ReadIndex(index) => Ok(index),
                    other => Err(Error::Internal(format!("unexpected forward answer {other:?}"))),
                }
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(Unavailable::QuorumLost(e.to_string()).into())
            }
            Err(RaftError::Fatal(fatal)) => Err(Unavailable::RaftStopped(fatal.to_string()).into()),
        }
    }

    async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), Error> {
        let mut applied = self.inner.state.subscribe();
        let wait = applied.wait_for(|applied| *applied >= index);
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Unavailable::ShuttingDown.into()),
            Err(_) => Err(Unavailable::NotApplied {
                index,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }
            .into()),
        }
    }

    /// The newest log format every member decodes, as the adverts last
    /// showed it (this build's own until then).
    pub fn log_format(&self) -> u32 {
        self.inner.log_format.load(Ordering::Relaxed)
    }

    /// Sets what [`Journal::log_format`] answers; the gate's advert loop
    /// keeps it current.
    pub fn set_log_format(&self, format: u32) {
        let format = format.clamp(1, leasehold_core::command::LOG_FORMAT);
        let before = self.inner.log_format.swap(format, Ordering::Relaxed);
        if before != format {
            tracing::info!(
                event = "gate.log_format",
                from = before,
                to = format,
                "the log format every member decodes changed"
            );
        }
    }

    /// The newest log format every member is known to decode: a member
    /// whose advert this node has not heard (it just joined, say) counts
    /// as format 1. What a command formed at the edge in a newer format
    /// must wait for: a follower forwards it as it is, and a leader of an
    /// older build could not decode it. [`Journal::log_format`], which a
    /// leader writes by, assumes such a member current instead (a joiner
    /// older than the cluster's format is refused at its join).
    pub fn heard_log_format(&self) -> u32 {
        self.inner.heard_log_format.load(Ordering::Relaxed)
    }

    /// Sets what [`Journal::heard_log_format`] answers; the gate's advert
    /// loop keeps it current.
    pub fn set_heard_log_format(&self, format: u32) {
        let format = format.clamp(1, leasehold_core::command::LOG_FORMAT);
        self.inner.heard_log_format.store(format, Ordering::Relaxed);
    }

    /// Proposes a command stamped with this node's clock and answers the
    /// applied response. Refusals come back as `Ok(Response::Refused(..))`.
    pub async fn propose(&self, command: Command) -> Result<Response, Error> {
        let proposal = Proposal { now_ms: self.inner.clock.now_ms(), command };
        self.propose_proposal(proposal).await
    }

    /// Proposes an already stamped proposal. Proposals made while another
    /// write is in flight are grouped into one `Batch` log entry, so
    /// concurrent clients share a Raft round and a log flush.
    pub async fn propose_proposal(&self, proposal: Proposal) -> Result<Response, Error> {
        self.enqueue_proposal(proposal, None).await
    }

    /// Queues `proposal` for the batcher and waits for its answer. A
    /// nack's error is cut here, at the first node that sees it, to what
    /// `apply` keeps, so no caller's text larger than that enters the log.
    async fn enqueue_proposal(
        &self,
        mut proposal: Proposal,
        forwarded_by: Option<NodeId>,
    ) -> Result<Response, Error> {
        proposal.command = proposal.command.with_texts_cut(self.limits());
        let timeout = self.inner.config.quorum_timeout;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let pending = Pending { proposal, forwarded_by, reply, queued: std::time::Instant::now() };
        let queued = tokio::time::timeout(timeout, self.inner.batches.send(pending));
        match queued.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Unavailable::ShuttingDown.into()),
            Err(_) => return Err(no_quorum(timeout)),
        }
        // The batcher bounds its own write by the quorum timeout; this bound
        // covers the wait in the queue.
        match tokio::time::timeout(timeout.saturating_mul(2), answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Unavailable::ShuttingDown.into()),
            Err(_) => Err(no_quorum(timeout)),
        }
    }

    /// One write, bounded by `deadline` (the quorum timeout from when its
    /// batch was formed); `agreed` says whether `proposal` was stamped by
    /// this node as leader with an agreed clock.
    async fn write_bounded(
        &self,
        proposal: Proposal,
        may_forward: bool,
        agreed: bool,
        deadline: Instant,
    ) -> Result<Response, Error> {
        let timeout = self.inner.config.quorum_timeout;
        match tokio::time::timeout_at(deadline, self.write(proposal, may_forward, agreed)).await {
            Ok(result) => result,
            Err(_) => Err(no_quorum(timeout)),
        }
    }

    async fn write(
        &self,
        proposal: Proposal,
        may_forward: bool,
        agreed: bool,
    ) -> Result<Response, Error> {
        // As leader, the entry is written in the newest format every member
        // decodes and carries this build's limits, so replicas of other
        // builds read it and judge it by the same numbers; a follower
        // forwards the bare proposal and the leader does this with its own.
        //
        // A follower that knows the leader (by openraft's metrics) sends the
        // bare proposal there. Asking its own core first would only bring
        // back ForwardToLeader naming the same leader: a hand-off to the
        // core and back, and a copy of the batch kept for the forward.
        if may_forward && let Some((leader_id, addr)) = self.other_leader() {
            let request = ForwardRequest::Write(Box::new(proposal));
            return match self.forward(Some(leader_id), Some(addr), request).await? {
                ForwardResponse::Written(response) => Ok(response),
                other => Err(Error::Internal(format!("unexpected forward answer {other:?}"))),
            };
        }
        // Otherwise openraft's core decides, and what it refuses is never
        // sent on from here. It usually refuses a write before appending
        // it, but it also answers ForwardToLeader for an entry it appended
        // as leader and then truncated when a newer leader's log replaced
        // it, and a node that received the entry may still get it
        // committed: proposing the same batch again elsewhere could apply
        // it twice. Its proposers hear UNAVAILABLE, with the outcome
        // unknown as after a quorum timeout (docs/api.md).
        //
        // Only a stamp this node took as leader with an agreed clock goes
        // to the core: a follower's placeholder whose leader vanished, or
        // that this node took before it was elected, would reach the log
        // unchecked.
        if !agreed {
            return Err(self.not_stamped_as_leader());
        }
        let format = self.log_format();
        let command = proposal.command.for_log_format(format);
        let command = if format >= 2 {
            Command::Ruled { limits: Limits::default(), command: Box::new(command) }
        } else {
            command
        };
        let entry = Proposal { now_ms: proposal.now_ms, command };
        let started = std::time::Instant::now();
        match self.inner.raft.client_write(entry).await {
            Ok(written) => {
                self.inner.metrics.observe_stage(Stage::Write, started.elapsed());
                Ok(written.data)
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(refused_by_the_core())
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(Error::Internal(e.to_string()))
            }
            Err(RaftError::Fatal(fatal)) => Err(Unavailable::RaftStopped(fatal.to_string()).into()),
        }
    }

    async fn forward(
        &self,
        leader_id: Option<NodeId>,
        leader_addr: Option<String>,
        request: ForwardRequest,
    ) -> Result<ForwardResponse, Error> {
        let (Some(leader_id), Some(addr)) = (leader_id, leader_addr) else {
            return Err(Unavailable::NoLeader.into());
        };
        if leader_id == self.inner.config.node_id {
            return Err(Unavailable::LeadershipChanging.into());
        }
        let channel = self
            .inner
            .peers
            .channel(&addr)
            .map_err(|e| Unavailable::Peer(format!("leader {leader_id} at {addr}: {e}")))?;
        let wire = self.inner.peers.wires().of(leader_id);
        // Asking for an election is answered at once; waiting the quorum
        // timeout on a peer that does not answer would only hold the next
        // try back.
        let deadline = match &request {
            ForwardRequest::HandOver { .. } | ForwardRequest::Campaign => HAND_OVER_DEADLINE,
            ForwardRequest::Write(_) | ForwardRequest::ReadIndex => {
                self.inner.config.quorum_timeout
            }
        };
        // The answer comes back as one message, with every lease in it
        // granted already: claims ask for no more than it can carry.
        let request = match request {
            ForwardRequest::Write(mut proposal) => {
                let grant_bytes = self.inner.grant_bytes_bound();
                let most = batch::max_forwarded_leases(grant_bytes);
                proposal.command = proposal.command.with_claims_capped(most);
                // A batch formed while this node led was not bounded by its
                // answers; if leadership moved before it was written, it is
                // not sent: nothing was written, and its proposers repeat.
                if proposal.command.answer_bound(grant_bytes) > batch::MAX_BATCH_ANSWER_BYTES {
                    return Err(Unavailable::LeadershipChanging.into());
                }
                ForwardRequest::Write(proposal)
            }
            other => other,
        };
        let started = std::time::Instant::now();
        let data =
            envelope::encode_as(wire, &request).map_err(|e| Error::Internal(e.to_string()))?;
        let mut grpc = tonic::Request::new(RaftEnvelope { data });
        grpc.set_timeout(deadline);
        let reply = RaftClient::new(channel)
            .max_decoding_message_size(envelope::MAX_ENVELOPE_BYTES)
            .max_encoding_message_size(envelope::MAX_ENVELOPE_BYTES)
            .forward(grpc)
            .await
            .map_err(|status| {
                let message = format!("forwarding to leader {leader_id}: {}", status.message());
                match status.code() {
                    // The leader is gone, slow or unreachable: retry.
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown => Error::Unavailable(Unavailable::Peer(message)),
                    // The leader refused what this node sent: a bug here,
                    // or a request an earlier build does not know.
                    tonic::Code::InvalidArgument => Error::PeerRefused(message),
                    code => Error::Internal(format!("{message} ({code:?})")),
                }
            })?;
        let answer: ForwardResponse = envelope::decode(&reply.into_inner().data)
            .map_err(|e| Error::Internal(e.to_string()))?;
        self.inner.metrics.observe_stage(Stage::Forward, started.elapsed());
        match answer {
            ForwardResponse::Failed { retryable: true, message } => {
                Err(Unavailable::Peer(message).into())
            }
            ForwardResponse::Failed { retryable: false, message } => Err(Error::Internal(message)),
            answer => Ok(answer),
        }
    }

    /// Starts an election at a leader's request: `from` (leader, term) must
    /// still be who this node follows, when named. Refused while this
    /// node's own clock is skewed or it drains: neither may take over.
    async fn campaign(&self, from: Option<(NodeId, u64)>) -> Result<ForwardResponse, Error> {
        if let Some((leader, term)) = from {
            let (current_leader, current_term) = {
                let metrics = self.inner.raft.metrics();
                let metrics = metrics.borrow();
                (metrics.current_leader, metrics.current_term)
            };
            if current_leader != Some(leader) || current_term != term {
                return Err(Unavailable::Peer(format!(
                    "not handing over for node {leader} of term {term}: this node follows {} in \
                     term {current_term}",
                    current_leader.map_or("no leader".to_string(), |id| format!("node {id}"))
                ))
                .into());
            }
        }
        if self.clock_verdict().is_skewed() {
            let verdict = self.clock_verdict();
            let why = clock_watch::describe(&verdict, self.inner.clock_watch.bound_ms());
            return Err(Unavailable::ClockUnverified(why).into());
        }
        // A draining node is on its way out: it must not take over.
        if self.is_draining() {
            return Err(Unavailable::Draining.into());
        }
        match self.inner.raft.trigger().elect().await {
            Ok(()) => Ok(ForwardResponse::Campaigning),
            Err(fatal) => Err(Unavailable::RaftStopped(fatal.to_string()).into()),
        }
    }

    /// Serves a request node `from` forwarded, on the leader. Never
    /// forwards again, so a request cannot bounce between nodes.
    pub async fn serve_forwarded(&self, request: ForwardRequest, from: NodeId) -> ForwardResponse {
        let result = match request {
            // Through the batcher, so the followers' forwarded batches and
            // the leader's own proposals share one entry and one fsync.
            // Only a leader takes one: merged into a batch of this node's
            // own proposals, a forwarded write may not be forwarded again,
            // so on a node that no longer leads it would fail them too.
            ForwardRequest::Write(_)
                if self.inner.raft.metrics().borrow().state != openraft::ServerState::Leader =>
            {
                let me = self.inner.config.node_id;
                Err(Unavailable::Peer(format!("node {me} does not lead now: ask the leader"))
                    .into())
            }
            ForwardRequest::Write(proposal) => {
                self.enqueue_proposal(*proposal, Some(from)).await.map(ForwardResponse::Written)
            }
            ForwardRequest::Campaign => self.campaign(None).await,
            ForwardRequest::HandOver { leader, term } => self.campaign(Some((leader, term))).await,
            ForwardRequest::ReadIndex => {
                let timeout = self.inner.config.quorum_timeout;
                match tokio::time::timeout(timeout, self.inner.raft.ensure_linearizable()).await {
                    Ok(Ok(log_id)) => {
                        Ok(ForwardResponse::ReadIndex(log_id.map(|id| id.index).unwrap_or(0)))
                    }
                    Ok(Err(e)) => Err(Unavailable::Peer(format!("read index: {e}")).into()),
                    Err(_) => Err(no_quorum(timeout)),
                }
            }
        };
        match result {
            Ok(answer) => answer,
            Err(error) => ForwardResponse::Failed {
                retryable: matches!(error, Error::Unavailable(_)),
                message: error.to_string(),
            },
        }
    }
}

/// What a write's proposers hear when openraft's core answers
/// ForwardToLeader: always "leadership is changing", never "no leader is
/// known yet", whether or not the core names a leader. The core may have
/// appended the entry before it lost leadership, so the write may still
/// commit, and clients take "no leader is known yet" for a refusal given
/// before anything was proposed (the SDK repeats it, and reports it as
/// nothing written: docs/sdk.md).
fn refused_by_the_core() -> Error {
    Unavailable::LeadershipChanging.into()
}

/// Why a leader does not take a write node `node` forwarded: it is not a
/// member as this leader knows the cluster. Retryable: a leader's
/// published membership can trail by a moment the entry that added a
/// joining node.
pub fn not_a_member(node: NodeId) -> Unavailable {
    Unavailable::Peer(format!(
        "caller: node {node} is not a member of this cluster as its leader knows it; its \
         writes are not taken"
    ))
}

/// The deadline of a hand-over request.
const HAND_OVER_DEADLINE: Duration = Duration::from_secs(1);

/// How long a leader handing over waits for its successor to hold its
/// whole log before asking it to campaign ([`Journal::hand_over`]).
pub const HAND_OVER_CATCH_UP: Duration = Duration::from_millis(500);

/// The index of the last entry `node` holds, as this leader's replication
/// reports it (0 when unknown).
fn matched_index(
    metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    node: NodeId,
) -> u64 {
    metrics
        .replication
        .as_ref()
        .and_then(|replication| replication.get(&node).cloned().flatten())
        .map_or(0, |log_id| log_id.index)
}

/// The role name `cluster status` prints and adverts carry.
pub fn role_name(state: openraft::ServerState) -> &'static str {
    match state {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    }
}

fn no_quorum(timeout: Duration) -> Error {
    Unavailable::NoQuorum { timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) }
        .into()
}

/// Takes every proposal waiting (up to the bounds), writes them as one log
/// entry, and hands each proposer its own response (group commit). Up to
/// `in_flight` writes are in flight; whatever arrives
/// meanwhile forms the next batch. A proposal that is itself a batch (a
/// follower's, forwarded here) merges into the larger one.
async fn batch_proposals(
    journal: std::sync::Weak<Inner>,
    mut queue: tokio::sync::mpsc::Receiver<Pending>,
    in_flight: usize,
) {
    let in_flight_limit = in_flight;
    let in_flight = Arc::new(tokio::sync::Semaphore::new(in_flight));
    // The writes in flight: owned here, so ending the batcher (shutdown)
    // ends them too, and their proposers hear that the journal stopped.
    let mut writes = tokio::task::JoinSet::new();
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(pending) => pending,
            None => match queue.recv().await {
                Some(pending) => pending,
                None => return,
            },
        };
        // Wait for room before collecting, so everything that arrives while
        // the pipeline is full joins this batch.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        // A batch a follower forms goes to the leader as one message, and
        // its answers come back as one: its claims count by what they could
        // hand out. A leader answers each proposer apart.
        let Some(inner) = journal.upgrade() else { return };
        let leads = inner.raft.metrics().borrow().state == openraft::ServerState::Leader;
        let grant_bytes = if leads { 0 } else { inner.grant_bytes_bound() };
        if let Some(mut fill) = batch::Fill::start(&batch[0].proposal.command, grant_bytes) {
            while !fill.is_full() {
                let Ok(next) = queue.try_recv() else { break };
                match fill.admit(&next.proposal.command) {
                    Some(more) => {
                        fill = more;
                        batch.push(next);
                    }
                    // Too many commands or bytes, or malformed: it starts
                    // the next batch.
                    None => {
                        carried = Some(next);
                        break;
                    }
                }
            }
        }
        if in_flight_limit == 1 {
            // One write at a time: the batcher writes it itself. Whatever
            // arrives meanwhile waits in the queue and forms the next batch,
            // as it would behind a spawned write, and the write starts
            // without a hand-over to another task (a wake-up on a loaded
            // host).
            write_batch(&Journal { inner }, batch).await;
            drop(permit);
            continue;
        }
        while writes.try_join_next().is_some() {}
        writes.spawn(async move {
            write_batch(&Journal { inner }, batch).await;
            drop(permit);
        });
    }
}

/// Writes `batch` (a lone proposal as it is, several as one `Batch`
/// entry) and answers every proposer.
async fn write_batch(journal: &Journal, mut batch: Vec<Pending>) {
    let metrics = journal.metrics();
    for pending in &batch {
        metrics.observe_stage(Stage::Queue, pending.queued.elapsed());
    }
    // The node that forms the batch stamps it; on a follower that stamp is
    // replaced when the leader forms its own batch, so only the leader's
    // clock ever enters the journal, never a time that came over the
    // network from a follower.
    let timeout = journal.inner.config.quorum_timeout;
    let formed = Instant::now();
    let deadline = formed + timeout;
    // A batch holds for the clock at most half the quorum timeout: the
    // write keeps the other half, and a batch a follower forwarded is
    // refused before the follower's own deadline (which started before it
    // forwarded) runs out, so its client hears that nothing was written
    // rather than "no quorum".
    let stamp_deadline = formed + timeout / 2;
    let Stamp { now_ms, agreed } = match journal.stamp(stamp_deadline).await {
        Ok(stamp) => stamp,
        Err(error) => {
            for pending in batch {
                let _ = pending.reply.send(Err(error.clone()));
            }
            return;
        }
    };
    // A proposer that gave up meanwhile (its call was cancelled, or it
    // waited out its bound in the queue and was told the outcome is
    // unknown) has its write dropped here: written later, a keyless
    // enqueue would be a second copy of one its client sent again, and a
    // claim would grant leases nobody holds.
    if batch.iter().any(|pending| pending.reply.is_closed()) {
        let before = batch.len();
        batch.retain(|pending| !pending.reply.is_closed());
        metrics.writes_abandoned.inc_by((before - batch.len()) as u64);
        if batch.is_empty() {
            return;
        }
    }
    // Stamped as leader: a write forwarded by a node that is not a member
    // (removed, its credentials not yet retired) is not taken. Judged here,
    // as leader, and not when it arrived: a node may have been a follower
    // then and won an election since. (Looked for first, so a batch of
    // members' writes is not split and copied.)
    let from_stranger =
        |pending: &Pending| pending.forwarded_by.is_some_and(|node| !journal.is_member(node));
    if agreed && batch.iter().any(from_stranger) {
        let (taken, refused): (Vec<_>, Vec<_>) =
            batch.into_iter().partition(|pending| !from_stranger(pending));
        for pending in refused {
            let node = pending.forwarded_by.unwrap_or_default();
            let _ = pending.reply.send(Err(not_a_member(node).into()));
        }
        batch = taken;
        if batch.is_empty() {
            return;
        }
    }
    // Forwarded writes must not be forwarded again; the batch carrying one
    // answers UNAVAILABLE if leadership moved, and its proposers repeat
    // only what a repeat cannot double (see `write`). Judged on what is
    // left of the batch: a forwarded write dropped above (its caller gone,
    // or a stranger's) does not keep the others from being forwarded.
    let may_forward = batch.iter().all(|p| p.forwarded_by.is_none());
    if batch.len() == 1
        && let Some(pending) = batch.pop()
    {
        let proposal = Proposal { now_ms, command: pending.proposal.command };
        let result = journal.write_bounded(proposal, may_forward, agreed, deadline).await;
        let _ = pending.reply.send(result);
        return;
    }
    let (replies, commands): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|pending| (pending.reply, pending.proposal.command)).unzip();
    let (command, shares) = batch::merge(commands);
    let answers = match journal
        .write_bounded(Proposal { now_ms, command }, may_forward, agreed, deadline)
        .await
    {
        Ok(response) => batch::split(response, &shares).map_err(|e| Error::Internal(e.to_string())),
        Err(error) => Err(error),
    };
    match answers {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_the_core_turned_away_is_not_reported_as_never_proposed() {
        // The SDK's prefixes of refusals given before proposing
        // (leasehold_client::refused_before_proposing).
        let message = refused_by_the_core().to_string();
        for before in ["draining:", "no leader is known yet", "clock:"] {
            assert!(!message.starts_with(before), "{message}");
        }
        assert_eq!(message, "leadership is changing");
    }

    #[test]
    fn a_terms_stamps_run_no_faster_than_the_monotonic_clock() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let (first, pace) = TermPace::stamp(None, 3, 10_000, t0);
        assert_eq!(first, 10_000, "the term's first stamp is the clock");
        // 100 ms on, the clock stepped forward by 900: the stamp moves 100.
        let (stamp, pace) = TermPace::stamp(Some(pace), 3, 11_000, ms(100));
        assert_eq!(stamp, 10_100);
        // Stepped back below the pace: the lower reading is the new pace.
        let (stamp, pace) = TermPace::stamp(Some(pace), 3, 9_800, ms(200));
        assert_eq!(stamp, 9_800);
        // And forward again: from the lower reading, at the monotonic rate.
        let (stamp, pace) = TermPace::stamp(Some(pace), 3, 10_500, ms(300));
        assert_eq!(stamp, 9_900);
        // A new term starts from its clock.
        let (stamp, _) = TermPace::stamp(Some(pace), 4, 10_600, ms(400));
        assert_eq!(stamp, 10_600);
    }

    #[test]
    fn a_slow_queue_walk_is_taken_again_only_after_twenty_times_its_time() {
        let at = std::time::Instant::now();
        assert!(queue_walk_due(None, at), "the first scrape walks");
        // A walk of a small state: the next scrape, a millisecond on, walks.
        let quick = Some((at, Duration::from_micros(20)));
        assert!(queue_walk_due(quick, at + Duration::from_millis(1)));
        // A walk of 100 ms: not again for two seconds.
        let slow = Some((at, Duration::from_millis(100)));
        assert!(!queue_walk_due(slow, at + Duration::from_millis(1_999)));
        assert!(queue_walk_due(slow, at + Duration::from_secs(2)));
    }
}
