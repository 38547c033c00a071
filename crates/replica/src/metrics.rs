//! Prometheus metrics of a node, served on `/metrics` in the OpenMetrics text
//! format (Prometheus scrapes it natively).
//!
//! Counters and histograms are updated where things happen (the services,
//! the driver); gauges that describe state (queue depth, Raft progress,
//! draining) are refreshed from the state machine and Raft metrics at each
//! scrape, so they can never drift from the truth.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use leasehold_core::QueueStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an RPC outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// The RPC, e.g. `claim`.
    pub method: &'static str,
    /// The gRPC code name, e.g. `ok`, `failed_precondition`.
    pub code: &'static str,
}

/// Labels naming one RPC.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// The RPC.
    pub method: &'static str,
}

/// Labels of a per-queue, per-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// Queue name.
    pub queue: String,
    /// ready, delayed, claimed, acked or dead.
    pub state: String,
}

/// Labels of a tick outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TickLabels {
    /// fired or skipped.
    pub outcome: String,
    /// Skip reason, or empty.
    pub reason: String,
}

/// Labels of a cutover-gate decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    /// journal or bus.
    pub path: String,
    /// The reason's label, e.g. `peer_incapable`.
    pub reason: String,
}

/// Labels of a Raft envelope a peer sent this node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireLabels {
    /// binary or json.
    pub wire: &'static str,
    /// How it came: `unary` (a call of its own) or `stream` (a message of
    /// a leader's append stream).
    pub call: &'static str,
}

/// Labels of a dropped peer message.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// advert or bus.
    pub kind: String,
    /// bad_mac, malformed, from_self or replay.
    pub reason: String,
}

/// Labels of a bus claim's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// won, lost or failed.
    pub outcome: String,
}

/// Labels of a refused call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabels {
    /// The gRPC service, e.g. `leasehold.v1.Raft`, or `http.status` for
    /// the status page's JSON.
    pub service: String,
    /// `no_token`, `unknown_token`, `role`, `not_a_node`, `node_proof` or
    /// `identity_mismatch`.
    pub reason: String,
}

/// Labels of one stage of a write's commit round (see [`Stage`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// The stage's name, [`Stage::name`].
    pub stage: &'static str,
}

/// The stages of a write's commit round that a node times, so the time of
/// one round can be split (docs/benchmarks.md, "Where a commit round's
/// time goes"). Each is a histogram in `leasehold_commit_stage_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A proposal waiting for the batcher: from its arrival at the journal
    /// until the write of the batch it joined starts.
    Queue,
    /// The leader's Raft write of one batch: append and sync, replication,
    /// commit and apply, until openraft hands back the applied response.
    Write,
    /// The leader's AppendEntries round trip to one follower for a message
    /// carrying entries (heartbeats are not counted): the follower's sync
    /// is inside it.
    Replicate,
    /// A follower serving an AppendEntries message carrying entries: decode,
    /// append, sync, answer.
    FollowerAppend,
    /// The log store's append, from its hand-over to the flush worker until
    /// the entries are synced (leader and followers alike).
    LogSync,
    /// A follower forwarding a write to the leader and hearing its answer.
    Forward,
}

impl Stage {
    /// Every stage, in the order of a round.
    pub const ALL: [Stage; 6] = [
        Stage::Queue,
        Stage::Forward,
        Stage::Write,
        Stage::LogSync,
        Stage::Replicate,
        Stage::FollowerAppend,
    ];

    /// The `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::Write => "write",
            Stage::Replicate => "replicate",
            Stage::FollowerAppend => "follower_append",
            Stage::LogSync => "log_sync",
            Stage::Forward => "forward",
        }
    }
}

/// Labels of a per-peer gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The peer's node id.
    pub peer: String,
}

/// Most queues with series of their own in `leasehold_queue_jobs`: the
/// ones holding the most jobs. Producers name queues, so their number has
/// no bound; a scrape's size and cost must have one.
pub const MAX_QUEUE_SERIES: usize = 1_000;

/// A queue's counts by the `state` label of `leasehold_queue_jobs`.
fn by_state(counts: &QueueStats) -> [(&'static str, u64); 5] {
    [
        ("ready", counts.ready),
        ("delayed", counts.delayed),
        ("claimed", counts.claimed),
        ("acked", counts.acked),
        ("dead", counts.dead),
    ]
}

/// Every metric a node exports.
pub struct Metrics {
    registry: Registry,
    /// Finished RPCs by method and code.
    pub rpcs: Family<RpcLabels, Counter>,
    /// RPC latency in seconds by method.
    pub rpc_seconds: Family<MethodLabels, Histogram>,
    /// Leases granted by claims served here.
    pub leases_granted: Counter,
    /// Leases that lapsed and were swept (by this node while leader).
    pub lease_expiries: Counter,
    /// Sweeps committed by this node while leader.
    pub sweeps: Counter,
    /// Writes dropped unwritten from a batch this node formed: their
    /// caller gave up (cancelled, or told the outcome is unknown) while
    /// they waited for their turn.
    pub writes_abandoned: Counter,
    /// Ticks fired or skipped (by this node while leader), by reason.
    pub ticks: Family<TickLabels, Counter>,
    /// Lag from a tick's instant to its job being enqueued, seconds.
    pub fire_lag_seconds: Histogram,
    /// Jobs per queue and state (refreshed at scrape).
    pub queue_jobs: Family<QueueLabels, Gauge>,
    /// Raft term.
    pub raft_term: Gauge,
    /// 1 when this node leads.
    pub raft_leader: Gauge,
    /// Last log index.
    pub raft_last_log_index: Gauge,
    /// Committed index recorded by this node.
    pub raft_commit_index: Gauge,
    /// Last applied index.
    pub raft_applied_index: Gauge,
    /// 1 while draining.
    pub draining: Gauge,
    /// The last fencing token issued.
    pub last_token: Gauge,
    /// Queues holding a job (those past [`MAX_QUEUE_SERIES`] have no
    /// series of their own in `queue_jobs`).
    pub queues: Gauge,
    /// Cutover-gate decisions made for claims, by path and reason.
    pub gate_decisions: Family<GateLabels, Counter>,
    /// Valid adverts accepted from peers.
    pub adverts_accepted: Counter,
    /// Peer messages dropped, by kind and reason.
    pub peer_rejected: Family<RejectLabels, Counter>,
    /// Raft envelopes received from peers, by layout and by call.
    pub raft_envelopes: Family<WireLabels, Counter>,
    /// Bus claims made by this node, by outcome.
    pub bus_claims: Family<OutcomeLabels, Counter>,
    /// Calls refused for want of a credential or a role, by service and reason.
    pub auth_refused: Family<AuthLabels, Counter>,
    /// This node's measured clock offset to each peer (peer minus this), ms.
    pub clock_offset_ms: Family<PeerLabels, Gauge>,
    /// 1 while this node's clock is judged skewed against the voters.
    pub clock_skewed: Gauge,
    /// Time spent in each stage of a write's commit round, seconds.
    pub commit_stage_seconds: Family<StageLabels, Histogram>,
    /// The longest single hold of the state lock during this node's last
    /// snapshot build, seconds (0 before the first).
    pub snapshot_lock_hold_longest_seconds: Gauge<f64, AtomicU64>,
    /// The most CPU time the building thread spent inside one such hold,
    /// seconds: the build's own work, without descheduled time.
    pub snapshot_lock_hold_longest_cpu_seconds: Gauge<f64, AtomicU64>,
    encode_lock: Mutex<()>,
    /// The queues [`Metrics::set_queue_counts`] last published.
    published_queues: Mutex<std::collections::BTreeSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered under the `leasehold` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("leasehold");
        let rpcs = Family::<RpcLabels, Counter>::default();
        registry.register("rpc_requests", "Finished RPCs by method and gRPC code", rpcs.clone());
        let rpc_seconds = Family::<MethodLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.0005, 2.0, 16))) as fn() -> Histogram,
        );
        registry.register("rpc_duration_seconds", "RPC latency by method", rpc_seconds.clone());
        let leases_granted = Counter::default();
        registry.register("leases_granted", "Leases granted by claims", leases_granted.clone());
        let lease_expiries = Counter::default();
        registry.register(
            "lease_expiries",
            "Leases that lapsed and were swept",
            lease_expiries.clone(),
        );
        let sweeps = Counter::default();
        registry.register("sweeps", "Sweeps committed while leader", sweeps.clone());
        let writes_abandoned = Counter::default();
        registry.register(
            "writes_abandoned",
            "Writes dropped unwritten because their caller gave up while they waited in the queue",
            writes_abandoned.clone(),
        );
        let ticks = Family::<TickLabels, Counter>::default();
        registry.register("ticks", "Schedule ticks fired or skipped, by reason", ticks.clone());
        let fire_lag_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "fire_lag_seconds",
            "Tick instant to job enqueued",
            fire_lag_seconds.clone(),
        );
        let queue_jobs = Family::<QueueLabels, Gauge>::default();
        registry.register("queue_jobs", "Jobs per queue and state", queue_jobs.clone());
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let raft_term = gauge(&mut registry, "raft_term", "Raft term");
        let raft_leader = gauge(&mut registry, "raft_leader", "1 when this node leads");
        let raft_last_log_index = gauge(&mut registry, "raft_last_log_index", "Last log index");
        let raft_commit_index =
            gauge(&mut registry, "raft_commit_index", "Committed index recorded here");
        let raft_applied_index = gauge(&mut registry, "raft_applied_index", "Last applied index");
        let draining = gauge(&mut registry, "draining", "1 while the node drains");
        let last_token = gauge(&mut registry, "last_fencing_token", "Last fencing token issued");
        let queues = gauge(
            &mut registry,
            "queues",
            "Queues holding a job; queue_jobs has series for the 1,000 largest",
        );
        let gate_decisions = Family::<GateLabels, Counter>::default();
        registry.register(
            "gate_decisions",
            "Cutover-gate decisions made for claims, by path and reason",
            gate_decisions.clone(),
        );
        let adverts_accepted = Counter::default();
        registry.register(
            "adverts_accepted",
            "Valid peer adverts accepted",
            adverts_accepted.clone(),
        );
        let peer_rejected = Family::<RejectLabels, Counter>::default();
        registry.register(
            "peer_messages_rejected",
            "Peer adverts and bus messages dropped (bad MAC, malformed, replayed), by kind and reason",
            peer_rejected.clone(),
        );
        let raft_envelopes = Family::<WireLabels, Counter>::default();
        registry.register(
            "raft_envelopes_received",
            "Raft messages received from peers, by envelope layout (binary, or json from a peer of an earlier build or not yet heard from) and by how they came (unary call, or a message of an append stream)",
            raft_envelopes.clone(),
        );
        let bus_claims = Family::<OutcomeLabels, Counter>::default();
        registry.register("bus_claims", "Bus claims made here, by outcome", bus_claims.clone());
        let auth_refused = Family::<AuthLabels, Counter>::default();
        registry.register(
            "auth_refused",
            "Calls refused for a missing or wrong credential or role, by service and reason",
            auth_refused.clone(),
        );
        let clock_offset_ms = Family::<PeerLabels, Gauge>::default();
        registry.register(
            "clock_offset_ms",
            "Measured clock offset to each peer (peer minus this node), ms",
            clock_offset_ms.clone(),
        );
        let clock_skewed = gauge(
            &mut registry,
            "clock_skewed",
            "1 while this node's clock is more than the bound off a majority of the voters",
        );
        let commit_stage_seconds = Family::<StageLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 18))) as fn() -> Histogram,
        );
        registry.register(
            "commit_stage_seconds",
            "Time a write spends in each stage of its commit round, by stage",
            commit_stage_seconds.clone(),
        );
        let snapshot_lock_hold_longest_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "snapshot_lock_hold_longest_seconds",
            "Longest single hold of the state lock during the last snapshot build",
            snapshot_lock_hold_longest_seconds.clone(),
        );
        let snapshot_lock_hold_longest_cpu_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "snapshot_lock_hold_longest_cpu_seconds",
            "Most CPU time the building thread spent inside one state-lock hold during the last snapshot build",
            snapshot_lock_hold_longest_cpu_seconds.clone(),
        );
        Metrics {
            registry,
            rpcs,
            rpc_seconds,
            leases_granted,
            lease_expiries,
            sweeps,
            writes_abandoned,
            ticks,
            fire_lag_seconds,
            queue_jobs,
            raft_term,
            raft_leader,
            raft_last_log_index,
            raft_commit_index,
            raft_applied_index,
            draining,
            last_token,
            queues,
            gate_decisions,
            adverts_accepted,
            peer_rejected,
            raft_envelopes,
            bus_claims,
            auth_refused,
            clock_offset_ms,
            clock_skewed,
            commit_stage_seconds,
            snapshot_lock_hold_longest_seconds,
            snapshot_lock_hold_longest_cpu_seconds,
            encode_lock: Mutex::new(()),
            published_queues: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// Records one finished RPC.
    pub fn observe_rpc(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.rpcs.get_or_create(&RpcLabels { method, code: code_name(code) }).inc();
        self.rpc_seconds.get_or_create(&MethodLabels { method }).observe(elapsed.as_secs_f64());
    }

    /// Records time spent in one stage of a commit round.
    pub fn observe_stage(&self, stage: Stage, elapsed: Duration) {
        self.commit_stage_seconds
            .get_or_create(&StageLabels { stage: stage.name() })
            .observe(elapsed.as_secs_f64());
    }

    /// Publishes each queue's jobs by state, and removes the series of a
    /// queue no longer listed (purged): queue names come from producers,
    /// so stale ones must not pile up, nor show frozen counts.
    pub fn set_queue_counts(&self, queues: &std::collections::BTreeMap<String, QueueStats>) {
        let mut published =
            self.published_queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let listed: std::collections::BTreeSet<String> = queues.keys().cloned().collect();
        for gone in published.difference(&listed) {
            for (state, _) in by_state(&QueueStats::default()) {
                let labels = QueueLabels { queue: gone.clone(), state: state.to_string() };
                self.queue_jobs.remove(&labels);
            }
        }
        for (queue, counts) in queues {
            for (state, count) in by_state(counts) {
                let labels = QueueLabels { queue: queue.clone(), state: state.to_string() };
                self.queue_jobs
                    .get_or_create(&labels)
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
        *published = listed;
    }

    /// The registry in the text exposition format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let _guard = self.encode_lock.lock();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Lower-case snake name of a gRPC code (`failed_precondition`). A
/// label of every counted call, so it is a constant, not a string built
/// per call.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_no_longer_listed_loses_its_series() -> Result<(), std::fmt::Error> {
        let metrics = Metrics::new();
        let counts = |ready: u64| QueueStats { ready, ..QueueStats::default() };
        let both = [("emails".to_string(), counts(3)), ("gone".to_string(), counts(1))];
        metrics.set_queue_counts(&both.into_iter().collect());
        let text = metrics.encode()?;
        assert!(text.contains("queue=\"gone\""), "{text}");
        assert!(
            text.contains("leasehold_queue_jobs{queue=\"emails\",state=\"ready\"} 3"),
            "{text}"
        );
        metrics.set_queue_counts(&[("emails".to_string(), counts(4))].into_iter().collect());
        let text = metrics.encode()?;
        assert!(!text.contains("queue=\"gone\""), "a purged queue kept its series: {text}");
        assert!(
            text.contains("leasehold_queue_jobs{queue=\"emails\",state=\"ready\"} 4"),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn code_names_are_snake_case() {
        // Every code, by its number: the name is its Rust variant's name
        // in snake case.
        for number in 0..=16 {
            let code = tonic::Code::from_i32(number);
            let mut snake = String::new();
            for (i, c) in format!("{code:?}").chars().enumerate() {
                if c.is_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.extend(c.to_lowercase());
            }
            assert_eq!(code_name(code), snake, "code {number}");
        }
        assert_eq!(code_name(tonic::Code::FailedPrecondition), "failed_precondition");
    }

    #[test]
    fn every_stage_has_its_own_label() -> Result<(), std::fmt::Error> {
        let metrics = Metrics::new();
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            for _ in 0..=i {
                metrics.observe_stage(stage, Duration::from_micros(200));
            }
        }
        let text = metrics.encode()?;
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            let line = format!(
                "leasehold_commit_stage_seconds_count{{stage=\"{}\"}} {}",
                stage.name(),
                i + 1
            );
            assert!(text.contains(&line), "{line} missing from {text}");
        }
        Ok(())
    }

    #[test]
    fn observed_rpcs_show_up_in_the_text() -> Result<(), std::fmt::Error> {
        let metrics = Metrics::new();
        metrics.observe_rpc("claim", tonic::Code::Ok, Duration::from_millis(3));
        metrics.observe_rpc("claim", tonic::Code::Ok, Duration::from_millis(3));
        metrics.snapshot_lock_hold_longest_seconds.set(0.004);
        metrics.snapshot_lock_hold_longest_cpu_seconds.set(0.001);
        let text = metrics.encode()?;
        assert!(
            text.contains("leasehold_snapshot_lock_hold_longest_cpu_seconds 0.001"),
            "the benchmark reads this exact name: {text}"
        );
        assert!(
            text.contains("leasehold_snapshot_lock_hold_longest_seconds 0.004"),
            "the benchmark reads this exact name: {text}"
        );
        assert!(
            text.contains("leasehold_rpc_requests_total{method=\"claim\",code=\"ok\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("leasehold_rpc_duration_seconds_count{method=\"claim\"} 2"),
            "{text}"
        );
        Ok(())
    }
}
