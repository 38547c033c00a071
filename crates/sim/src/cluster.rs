//! A seeded cluster on turmoil: N simulated hosts, each running the real
//! openraft core with leasehold's type config on a [`SimDisk`], talking over
//! turmoil's simulated TCP ([`crate::net`]), with the real replica
//! [`Journal`] on top, stamping with its host's simulated clock once a
//! majority agrees with it; and a driver host that runs a workload of
//! enqueue, claim and ack through the leader's journal while the plan
//! partitions the leader and crashes (and restarts) a follower.
//!
//! One seed drives turmoil's network (latencies, host order), each node's
//! election timeout (a window one millisecond wide, its start drawn from
//! the seed: openraft 0.9 draws the timeout from an OS-seeded generator, and
//! a one-value range makes that draw irrelevant), the workload and the
//! fault times. The run's history is plain text lines; its digest is what
//! the determinism test compares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_cluster_tests::checkers::{
    self, Checker, FinalJob, RunRecord, Severity, StatusSample, Verdict,
};
use leasehold_cluster_tests::execlog::{ExecEvent, RunPhase};
use leasehold_cluster_tests::history::{
    LeaseRecord, Op, OpFunction, OpType, OpValue, TickRecord as ReadTick,
};
use leasehold_cluster_tests::plan::CronSchedulePlan;
use leasehold_cluster_tests::sink::{FencedSink, SinkWrite};
use leasehold_core::command::LOG_FORMAT;
use leasehold_core::cron::{self, CronSchedule};
use leasehold_core::schedule::{
    Catchup, DEFAULT_COMMAND_QUEUE, JobTemplate, Overlap, ScheduleSpec, TickOutcome, TickPlan,
    plan_ticks, planned_tick,
};
use leasehold_core::state::TERM_START_GRACE_MS;
use leasehold_core::{Command, JobFilter, JobSpec, Limits, Proposal, Response, State};
use leasehold_raft::{NetworkFactory, NodeId, Raft};
use leasehold_replica::clock_watch::guard_elections;
use leasehold_replica::forward::{ForwardRequest, ForwardResponse};
use leasehold_replica::journal::DEFAULT_BATCHES_IN_FLIGHT;
use leasehold_replica::{Journal, JournalConfig};
use openraft::{BasicNode, Config};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Handle;

use crate::clock::{Clocks, HostClock};
use crate::net::{Lost, OneWayCuts, SimNetwork, host_name, serve};
use crate::{Bug, Crash, SimDisk, SimStateMachine};

/// How long the driver waits for one write before recording its outcome
/// as unknown.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);

/// What one simulated run does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Drives everything random in the run.
    pub seed: u64,
    /// Voters (at least 3 for the faults to leave a quorum).
    pub nodes: u64,
    /// Workload operations the driver issues.
    pub operations: u32,
    /// Cut the leader off from every other node for a while mid-run.
    pub partition_leader: bool,
    /// Crash the last node (losing its unsynced writes, or tearing them) and
    /// restart it later.
    pub crash_follower: bool,
    /// Late in the run, right after a write is acknowledged, every node
    /// loses power at once (unsynced writes lost), then all restart.
    pub power_cut: bool,
    /// Node 2's clock is set this far ahead, twice during the run: beyond
    /// the clock bound, so its clock guard (the node's own) stands it
    /// aside from elections and leadership and its journal stamps nothing,
    /// but it keeps taking clients' commands.
    pub clock_jump_ms: Option<u64>,
    /// A clock hand-over: node 1, which leads first, runs its clock 450 ms
    /// behind real time, node 2 as far ahead and any other node on real
    /// time (so every clock is agreed by a majority); just before the
    /// leader partition node 1 grants a long lease, and after the
    /// operations the driver keeps sweeping and claiming for longer than
    /// that lease, so the new leader, node 2 (the only other node that
    /// stands for election, its clock the bound and more ahead of the one
    /// that stamped the lease), is the one to take it back. Implies
    /// `partition_leader`.
    pub handover: bool,
    /// Links that fail now and then for a few steps (each link, each
    /// step, with this chance in a million), breaking the connections on
    /// them: lost messages, as turmoil's TCP does not resend.
    pub link_failures_per_million: u32,
    /// A link cut in one direction early in the run, between the leader
    /// and a follower, and repaired before the leader partition.
    pub one_way: Option<OneWay>,
    /// A follower drains mid-run: its executor's leases are read, it is
    /// marked draining, releases them (or, on an unclean drain, some of
    /// them) and stops; its leases are read again at the stop and a lease
    /// TTL later, for the `drained_leases` checker; it restarts after.
    pub drain: bool,
    /// Bug classes planted for this run (none in a normal run).
    pub bugs: BTreeSet<Bug>,
}

/// The workload's worker, as its claims name it.
const WORKER: &str = "w";

/// The queue a drained node's executor holds its leases in.
const DRAIN_QUEUE: &str = "drain";

/// The TTL of a drained node's leases.
const DRAIN_TTL_MS: u64 = 2_000;

/// How long a one-way cut lasts at least, in simulated milliseconds: a few
/// election timeouts.
const ONE_WAY_HOLD_MS: u64 = 1_500;

/// Which way a one-way cut loses messages (see [`crate::net::OneWayCuts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneWay {
    /// The leader's requests and answers to a follower are lost; the
    /// follower's reach it (so its elections disturb the leader).
    LeaderToFollower,
    /// A follower's requests and answers to the leader are lost; the
    /// leader's reach it and take effect, but it hears no acknowledgement.
    FollowerToLeader,
}

impl Plan {
    /// A short plan whose faults the seed picks: each of a leader
    /// partition, a follower crash, a power cut and a clock jump happens
    /// on some seeds and not others, so a sweep covers them alone and
    /// together.
    pub fn short(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_91a2_c0ff_ee00);
        let plan = Plan {
            seed,
            nodes: 3,
            operations: 40,
            partition_leader: rng.gen_bool(0.5),
            crash_follower: rng.gen_bool(0.5),
            power_cut: rng.gen_bool(0.4),
            clock_jump_ms: rng.gen_bool(0.5).then(|| rng.gen_range(10_000..=60_000)),
            handover: false,
            link_failures_per_million: 0,
            one_way: None,
            drain: false,
            bugs: BTreeSet::new(),
        };
        // A quarter of the seeds are a clock hand-over alone: its long
        // lease must outlive the other faults' restarts to be judged.
        let handover = rng.gen_bool(0.25);
        // Drawn after the rest, so the other faults of a seed stay as they
        // were before links could fail.
        let link_failures_per_million =
            if rng.gen_bool(0.3) { rng.gen_range(200..=2_000) } else { 0 };
        // Drawn last, for the same reason.
        let one_way = rng.gen_bool(0.3).then(|| {
            if rng.gen_bool(0.5) { OneWay::LeaderToFollower } else { OneWay::FollowerToLeader }
        });
        // Drawn last, for the same reason.
        let drain = rng.gen_bool(0.3);
        let plan = Plan { link_failures_per_million, one_way, drain, ..plan };
        if handover {
            return Plan {
                partition_leader: true,
                crash_follower: false,
                power_cut: false,
                clock_jump_ms: None,
                handover: true,
                one_way: None,
                drain: false,
                ..plan
            };
        }
        plan
    }

    /// A short plan with every fault.
    pub fn every_fault(seed: u64) -> Plan {
        Plan {
            partition_leader: true,
            crash_follower: true,
            power_cut: true,
            clock_jump_ms: Some(30_000),
            handover: false,
            link_failures_per_million: 1_000,
            one_way: Some(OneWay::LeaderToFollower),
            drain: true,
            ..Plan::short(seed)
        }
    }

    /// This plan with `bug` planted.
    pub fn with_bug(mut self, bug: Bug) -> Plan {
        self.bugs.insert(bug);
        self
    }
}

/// The clock bound the checkers judge lease timing by: a real node's
/// default `max_clock_offset_ms`, which the leader's sweep honours too.
const CLOCK_BOUND_MS: u64 = 500;

/// The simulation's step: every host runs once per tick of simulated time.
/// Two milliseconds halves the steps of one (the default) and is still
/// finer than every latency, sync and timer in a plan.
const TICK_MS: u64 = 2;

/// The chance, each step, that a failed link is repaired: a failure lasts
/// a few steps.
const LINK_REPAIR_RATE: f64 = 0.3;

/// How far any host's clock is set off real time, at most: two leaders then
/// disagree by at most twice this, under the bound.
const MAX_SKEW_MS: i64 = 200;

/// A hand-over plan's skews: node 1 this far behind real time, its
/// successor ([`HANDOVER_SUCCESSOR`]) this far ahead, the others on real
/// time. Every node is within the 500 ms bound of a majority (itself and
/// a node in the middle), so each journal stamps when it leads, yet the
/// two leaders are 900 ms apart, so a sweep that does not give an earlier
/// term's leases the bound cuts them short by more than the bound.
const HANDOVER_SKEW_MS: i64 = 450;

/// The node that succeeds node 1 in a hand-over: the only other node that
/// stands for election there (see [`bystander`]).
const HANDOVER_SUCCESSOR: NodeId = 2;

/// The hand-over's long lease, milliseconds: longer than the new term's
/// 5 s start grace, so the new leader's sweep is what ends it.
const HANDOVER_TTL_MS: u64 = 7_000;

/// How far any host's clock runs fast or slow, at most (parts per million).
const MAX_DRIFT_PPM: i64 = 500;

/// The queue the workload uses.
const QUEUE: &str = "q";

/// The cron schedule's name.
const SCHEDULE: &str = "tick";

/// The lease TTL of the cron schedule's jobs.
const CRON_LEASE_TTL_MS: u64 = 3_000;

/// How late a tick may still fire rather than be coalesced: the node
/// driver's `TICK_TOLERANCE_MS`.
const TICK_TOLERANCE_MS: u64 = 5_000;

/// The record of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// One line per event, in simulated time order.
    pub history: Vec<String>,
    /// The workload's operations in the chaos harness's history format, on
    /// simulated time, for its checkers.
    pub ops: Vec<Op>,
    /// The workload queue's jobs after heal, read from the leader.
    pub final_jobs: Option<Vec<FinalJob>>,
    /// The cron schedule's runs, as the execution log of the chaos
    /// harness records them.
    pub runs: Vec<ExecEvent>,
    /// The command queue's jobs after heal, read from the leader.
    pub final_exec_jobs: Option<Vec<FinalJob>>,
    /// Per node at the end: (applied index, state digest).
    pub finals: BTreeMap<NodeId, (u64, u64)>,
    /// The link between the leader and the follower of a one-way cut, as
    /// each side saw it when the cut was made and when it was repaired.
    pub one_way_views: Vec<LinkView>,
    /// The fenced sink's log: every workload worker writes its result
    /// there under its lease's token before it acks, zombies too.
    pub sink: Vec<SinkWrite>,
    /// Whether a node was drained (then `drained_leases` must have
    /// something to check); a plan's drain waits for a leader, and may
    /// find none before the operations end.
    pub drained: bool,
}

/// The two ends of a one-way cut, as Raft's metrics show them at one
/// instant (see [`Plan::one_way`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkView {
    /// Whether this is the cut (or the repair).
    pub cut: bool,
    /// The leader when the cut was made.
    pub leader: NodeId,
    /// The follower at the other end.
    pub follower: NodeId,
    /// The leader's term (`None`: that node is down).
    pub leader_term: Option<u64>,
    /// What the leader knows the follower holds, while it still leads.
    pub leader_matched: Option<u64>,
    /// The follower's term.
    pub follower_term: Option<u64>,
    /// The follower's last log index.
    pub follower_last_log: Option<u64>,
    /// What the cut lost so far from the leader to the follower.
    pub lost_to_follower: Lost,
    /// What the cut lost so far from the follower to the leader.
    pub lost_to_leader: Lost,
}

impl Run {
    /// FNV-1a 64 over the history's lines and the operations' JSON: equal
    /// for equal histories, byte for byte.
    pub fn digest(&self) -> u64 {
        let mut hash = Fnv::default();
        for line in &self.history {
            hash.write(line.as_bytes());
            hash.write(b"\n");
        }
        for op in &self.ops {
            hash.write(serde_json::to_string(op).unwrap_or_default().as_bytes());
            hash.write(b"\n");
        }
        hash.0
    }

    /// The run as the chaos harness's checkers read one: the history, the
    /// final jobs, and one sampling round (two reads per node) of the final
    /// applied index and digest.
    pub fn record(&self) -> RunRecord {
        let end_ns = self.ops.last().map_or(0, |op| op.time_ns);
        let samples = self
            .finals
            .iter()
            .flat_map(|(node, (applied_index, digest))| {
                (0..2).map(move |read| StatusSample {
                    round: 0,
                    read,
                    time_ns: end_ns,
                    node: *node,
                    applied_index: *applied_index,
                    digest: *digest,
                })
            })
            .collect();
        RunRecord {
            history: self.ops.clone(),
            final_jobs: self.final_jobs.clone(),
            runs: self.runs.clone(),
            final_exec_jobs: self.final_exec_jobs.clone(),
            cron: vec![cron_plan()],
            samples,
            nodes: self.finals.len() as u64,
            clock_bound_ms: CLOCK_BOUND_MS,
            sink: self.sink.clone(),
        }
    }

    /// The verdicts of the checkers that apply to a queue and cron
    /// workload on the journal path: lease exclusivity (in simulated real
    /// time too), fencing, no redelivery after ack, none lost, convergence,
    /// cron once per bucket, and no journal-path claim run twice.
    pub fn check(&self) -> Vec<Verdict> {
        let record = self.record();
        let applicable: [&dyn Checker; 8] = [
            &checkers::lease_exclusivity::LeaseExclusivity,
            &checkers::fencing::Fencing,
            &checkers::no_redelivery::NoRedelivery,
            &checkers::none_lost::NoneLost,
            &checkers::convergence::Convergence,
            &checkers::cron_once::CronOnce,
            &checkers::journal_once::JournalOnce,
            &checkers::drained_leases::DrainedLeases,
        ];
        applicable
            .iter()
            // Without a drain, the drained-leases checker has nothing to
            // judge, which is no finding.
            .filter(|checker| self.drained || checker.name() != "drained_leases")
            .map(|checker| checker.check(&record))
            .collect()
    }

    /// Why this run fails, empty when it passes: every safety anomaly of
    /// every checker (liveness is not enforced: a plan may leave jobs
    /// unfinished), a checker that checked nothing, and replicas that
    /// ended apart.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for verdict in self.check() {
            if verdict.checked == 0 {
                failures.push(format!("{}: checked nothing", verdict.checker));
            }
            for anomaly in &verdict.anomalies {
                if anomaly.severity == Severity::Safety {
                    failures.push(format!("{}: {}", verdict.checker, anomaly.message));
                }
            }
        }
        let ends: std::collections::BTreeSet<&(u64, u64)> = self.finals.values().collect();
        if ends.len() != 1 {
            failures.push(format!("replicas ended apart: {:?}", self.finals));
        }
        failures
    }
}

/// Why a run could not complete.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The simulation stopped with an error from a host or the driver.
    #[error("simulation failed: {0}")]
    Simulation(String),
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The digest of a state: FNV-1a over its bincode encoding, as the nodes'
/// convergence check computes it.
pub fn state_digest(state: &leasehold_core::State) -> u64 {
    let mut hash = Fnv::default();
    match bincode::serialize(state) {
        Ok(bytes) => hash.write(&bytes),
        Err(error) => hash.write(error.to_string().as_bytes()),
    }
    hash.0
}

/// One running node: its Raft handle, its applied state, its journal and
/// the runtime of its host (a journal is called on its own host's runtime,
/// as the node's server calls it, so its timers and clock measurements
/// are that host's).
#[derive(Clone)]
struct Member {
    raft: Raft,
    state_machine: SimStateMachine,
    journal: Journal,
    runtime: Handle,
}

/// The running nodes' handles, as the driver, the hosts and the fault loop
/// see them.
#[derive(Clone, Default)]
struct Registry(Arc<Mutex<BTreeMap<NodeId, Member>>>);

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, Member>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn raft(&self, id: NodeId) -> Option<Raft> {
        self.lock().get(&id).map(|member| member.raft.clone())
    }

    fn state_machine(&self, id: NodeId) -> Option<SimStateMachine> {
        self.lock().get(&id).map(|member| member.state_machine.clone())
    }

    fn member(&self, id: NodeId) -> Option<Member> {
        self.lock().get(&id).cloned()
    }
}

/// A fault the driver asks for and the step loop carries out between
/// steps (a host can only be crashed or restarted from outside).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fault {
    /// These nodes' processes die, and their disks lose (or tear) what
    /// was not synced.
    Crash(Vec<NodeId>),
    /// These nodes start again on what their disks hold.
    Restart(Vec<NodeId>),
}

/// A list the driver, the hosts and the step loop append to, and the run
/// takes at the end. Cheap to clone; clones share the list.
struct Shared<T>(Arc<Mutex<Vec<T>>>);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Shared<T> {
        Shared(self.0.clone())
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Shared<T> {
        Shared(Arc::default())
    }
}

impl<T> Shared<T> {
    fn record(&self, item: T) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(item);
    }

    fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The faults asked for and not yet carried out.
type Faults = Shared<Fault>;

/// The history's text lines, shared by the driver, the hosts and the
/// fault loop.
type History = Shared<String>;

/// The cron schedule's runs, shared by the driver and the run.
type Runs = Shared<ExecEvent>;

/// The workload's operations, shared by the driver and the run.
type Ops = Shared<Op>;

/// The one-way cut's views, shared by the driver and the run.
type LinkViews = Shared<LinkView>;

impl Shared<Op> {
    /// Records one operation of the driver, numbered and timed.
    fn op(&self, kind: OpType, f: OpFunction, value: OpValue) {
        let mut ops = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let index = ops.len() as u64;
        ops.push(Op { index, time_ns: now_ns(), process: "driver".to_string(), kind, f, value });
    }
}

/// The cron schedule every plan runs: every second, catch-up coalesced,
/// overlap allowed, its command jobs on the node's command queue.
fn cron_plan() -> CronSchedulePlan {
    CronSchedulePlan {
        name: SCHEDULE.to_string(),
        period_s: 1,
        catchup: "coalesce".to_string(),
        overlap: "allow".to_string(),
        run_ms: 0,
        lease_ttl_ms: CRON_LEASE_TTL_MS,
    }
}

/// The spec of [`cron_plan`]'s schedule as a `PutSchedule` carries it.
fn cron_spec() -> ScheduleSpec {
    let plan = cron_plan();
    ScheduleSpec {
        name: plan.name.clone(),
        cron: plan.cron(),
        template: JobTemplate {
            lease_ttl_ms: Some(plan.lease_ttl_ms),
            max_attempts: Some(20),
            command: Some("true".to_string()),
            ..JobTemplate::default()
        },
        overlap: Overlap::Allow,
        catchup: Catchup::Coalesce,
        ..ScheduleSpec::default()
    }
}

/// The workload queue's jobs as the final read reports them.
fn final_jobs(state: &State) -> Vec<FinalJob> {
    final_jobs_of(state, QUEUE)
}

/// `queue`'s jobs as the final read reports them.
fn final_jobs_of(state: &State, queue: &str) -> Vec<FinalJob> {
    let filter = JobFilter { queue: Some(queue.to_string()), ..JobFilter::default() };
    state
        .jobs(&filter, 0, usize::MAX)
        .into_iter()
        .map(|job| FinalJob {
            id: job.id,
            value: FinalJob::value_of(
                &job.payload,
                job.state.as_str(),
                job.idempotency_key.as_deref(),
            ),
            state: job.state.as_str().to_string(),
            attempts: job.attempts,
            lease_token: job.lease.as_ref().map(|lease| lease.token),
            key: job.idempotency_key.clone(),
        })
        .collect()
}

/// The leases `holder` holds in the drain queue, as lease records.
fn leases_of(state: &State, holder: &str) -> Vec<LeaseRecord> {
    let filter = JobFilter { queue: Some(DRAIN_QUEUE.to_string()), ..JobFilter::default() };
    state
        .jobs(&filter, 0, usize::MAX)
        .into_iter()
        .filter(|job| job.state.as_str() == "claimed")
        .filter_map(|job| job.lease)
        .filter(|lease| lease.holder == holder)
        .map(|lease| LeaseRecord {
            job_id: lease.job_id,
            holder: lease.holder,
            token: lease.token,
            epoch: lease.epoch,
            granted_at_ms: lease.granted_at_ms,
            expires_at_ms: lease.expires_at_ms,
            value: None,
            attempts: None,
        })
        .collect()
}

/// A tick record as the Schedules service reports it.
fn read_tick(record: &leasehold_core::schedule::TickRecord) -> ReadTick {
    match &record.outcome {
        TickOutcome::Fired { job_ids, .. } => ReadTick {
            bucket: record.bucket,
            outcome: "fired".to_string(),
            job_ids: job_ids.clone(),
            reason: String::new(),
            ticks: 0,
        },
        TickOutcome::Skipped { reason, ticks } => ReadTick {
            bucket: record.bucket,
            outcome: "skipped".to_string(),
            job_ids: Vec::new(),
            reason: reason.as_str().to_string(),
            ticks: *ticks,
        },
    }
}

fn now_ns() -> u64 {
    u64::try_from(turmoil::elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    u64::try_from(turmoil::elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The leader the highest-term running node names, among `nodes`.
fn leader_of(nodes: &BTreeMap<NodeId, Member>) -> Option<NodeId> {
    nodes
        .values()
        .filter_map(|member| {
            let metrics = member.raft.metrics().borrow().clone();
            Some((metrics.current_term, metrics.current_leader?))
        })
        .max()
        .map(|(_, leader)| leader)
}

/// The leader as the running node with the highest term sees it (a deposed
/// leader cut off by a partition still believes in itself, at a lower term).
fn leader(registry: &Registry, nodes: u64) -> Option<NodeId> {
    (1..=nodes)
        .filter_map(|id| {
            let raft = registry.raft(id)?;
            let metrics = raft.metrics().borrow().clone();
            Some((metrics.current_term, metrics.current_leader?))
        })
        .max()
        .map(|(_, leader)| leader)
}

/// Whether some running node leads in the highest term any running node
/// has seen (a deposed leader, or a follower that heard of one, is not
/// enough: a candidate may have moved the term on).
fn undisputed_leader(registry: &Registry, nodes: u64) -> bool {
    let metrics: Vec<_> =
        (1..=nodes).filter_map(|id| Some(registry.raft(id)?.metrics().borrow().clone())).collect();
    let Some(term) = metrics.iter().map(|metrics| metrics.current_term).max() else {
        return false;
    };
    metrics.iter().any(|metrics| {
        metrics.current_term == term && metrics.state == openraft::ServerState::Leader
    })
}

/// Whether node `id` is a hand-over's bystander in `plan` (neither node 1
/// nor [`HANDOVER_SUCCESSOR`]): it drains from the start, which keeps it
/// from standing for election, so the successor is the node whose clock is
/// furthest from the first leader's.
fn bystander(plan: &Plan, id: NodeId) -> bool {
    plan.handover && id != 1 && id != HANDOVER_SUCCESSOR
}

/// How often a host measures its running peers' clocks: five times the
/// gate's advert rate, so a leader's clock verdict forms within a fifth of
/// a second of a start or a restart (a real node waits for its first
/// adverts).
const MEASURE_EVERY: Duration = Duration::from_millis(200);

/// How long a clock measurement counts: the node's default (five advert
/// intervals).
const MEASUREMENT_FRESH_FOR: Duration = Duration::from_secs(5);

/// The journal's settings on a simulated node: the node's defaults, with
/// the clock bound the checkers judge by.
fn journal_config(id: NodeId) -> JournalConfig {
    JournalConfig {
        node_id: id,
        limits: Limits::default(),
        quorum_timeout: CLIENT_TIMEOUT,
        batches_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
        max_clock_offset_ms: CLOCK_BOUND_MS,
        clock_fresh_for: MEASUREMENT_FRESH_FOR,
    }
}

/// Measures every running peer's clock against this host's, as the gate's
/// adverts do, with a zero round trip, on this host's runtime (the one the
/// journal's clock watch ages measurements by). A peer that is down is not
/// measured, so its last measurement ages out as a silent peer's does.
async fn measure_peers(id: NodeId, journal: Journal, clocks: Clocks, registry: Registry) {
    let mut tick = tokio::time::interval(MEASURE_EVERY);
    loop {
        tick.tick().await;
        if clocks.host_clock(id).unmeasured {
            continue;
        }
        let peers: Vec<NodeId> =
            registry.lock().keys().copied().filter(|peer| *peer != id).collect();
        for peer in peers {
            let sent_at = tokio::time::Instant::now();
            let sent_wall_ms = journal.clock().now_ms();
            let peer_now_ms = clocks.replica_clock(peer).now_ms();
            journal.clock_watch().record(peer, sent_wall_ms, sent_at, sent_at, peer_now_ms);
        }
    }
}

/// The node whose clock a clock-jump plan sets ahead (never node 1, which
/// forms the group and leads first).
const JUMPED_NODE: NodeId = 2;

/// Runs `plan` to the end and returns its record.
pub fn run(plan: &Plan) -> Result<Run, ClusterError> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut sim = turmoil::Builder::new()
        .rng_seed(plan.seed)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(rng.gen_range(2..=10)))
        .simulation_duration(Duration::from_secs(300))
        .tick_duration(Duration::from_millis(TICK_MS))
        .fail_rate(f64::from(plan.link_failures_per_million) / 1_000_000.0)
        .repair_rate(LINK_REPAIR_RATE)
        .build();
    let registry = Registry::default();
    let history = History::default();
    let cuts = OneWayCuts::default();
    let disks: BTreeMap<NodeId, SimDisk> = (1..=plan.nodes)
        .map(|id| (id, SimDisk::with_sync_delay(Duration::from_millis(rng.gen_range(1..=12)))))
        .collect();
    for bug in &plan.bugs {
        for disk in disks.values() {
            disk.plant(*bug);
        }
    }
    // Every host's clock a little off real time and rate, within the
    // bound of any two leaders' disagreement the checkers allow.
    let clocks = Clocks::new(
        (1..=plan.nodes)
            .map(|id| {
                let mut skew_ms = rng.gen_range(-MAX_SKEW_MS..=MAX_SKEW_MS);
                if plan.handover {
                    // Each within the bound of the node in the middle (so
                    // every journal may stamp when it leads), but the first
                    // leader and its successor further apart than the
                    // bound.
                    skew_ms = match id {
                        1 => -HANDOVER_SKEW_MS,
                        HANDOVER_SUCCESSOR => HANDOVER_SKEW_MS,
                        _ => 0,
                    };
                }
                let mut drift_ppm = rng.gen_range(-MAX_DRIFT_PPM..=MAX_DRIFT_PPM);
                if plan.handover {
                    // Node 1 and the successor are each 450 ms from the
                    // node in the middle, 50 ms under the bound: drift
                    // would use that up in a long run.
                    drift_ppm = 0;
                }
                let clock = HostClock { skew_ms, drift_ppm, ..HostClock::default() };
                (id, clock)
            })
            .collect(),
    );

    for (id, disk) in &disks {
        let id = *id;
        // Distinct starts break election ties; one-value windows make them
        // independent of openraft's own generator.
        let election_min = 150 + rng.gen_range(0..150) + id;
        // Whether a node stands for election is the real clock guard's
        // call (`guard_elections`, on every host below): a node whose clock
        // a majority disputes stands aside, as the jumped node does, and so
        // does a draining one.
        let config = Config {
            install_snapshot_timeout: 2_000,
            enable_elect: !bystander(plan, id),
            ..crate::raft_config(election_min)
        }
        .validate()
        .map_err(|e| ClusterError::Simulation(e.to_string()))?;
        let config = Arc::new(config);
        let (disk, registry, history, cuts, clocks) =
            (disk.clone(), registry.clone(), history.clone(), cuts.clone(), clocks.clone());
        let drains = bystander(plan, id);
        sim.host(host_name(id), move || {
            let (disk, registry, history, config, cuts, clocks) = (
                disk.clone(),
                registry.clone(),
                history.clone(),
                config.clone(),
                cuts.clone(),
                clocks.clone(),
            );
            async move {
                let (log_store, state_machine) = disk.open();
                let network = SimNetwork::new(id, cuts.clone());
                let raft = Raft::new(id, config, network, log_store.clone(), state_machine.clone())
                    .await?;
                // The node's journal, stamping with this host's clock.
                let journal = Journal::new(
                    journal_config(id),
                    raft.clone(),
                    Arc::new(log_store),
                    Arc::new(state_machine.clone()),
                    clocks.replica_clock(id),
                    // Never dialled: the driver hands each write to the
                    // leader's journal (see `Driver::write`).
                    NetworkFactory::new(),
                );
                journal.set_draining(drains);
                history.record(format!("{} node {id} started", now_ms()));
                let member = Member {
                    raft: raft.clone(),
                    state_machine,
                    journal: journal.clone(),
                    runtime: Handle::current(),
                };
                registry.lock().insert(id, member);
                // Never told to stop: the host's life ends with its runtime.
                let (_running, shutdown) = tokio::sync::watch::channel(false);
                // Biased: the first branch is polled first, so tokio's
                // unseeded choice of branch plays no part.
                tokio::select! {
                    biased;
                    served = serve(id, raft, cuts) => served?,
                    () = measure_peers(id, journal.clone(), clocks, registry) => {}
                    () = guard_elections(journal, shutdown) => {}
                }
                Ok(())
            }
        });
    }

    let faults = Faults::default();
    let ops = Ops::default();
    let runs = Runs::default();
    let one_way_views = LinkViews::default();
    let sink = FencedSink::new();
    let driver = Driver {
        plan: plan.clone(),
        rng: StdRng::seed_from_u64(rng.r#gen()),
        registry: registry.clone(),
        history: history.clone(),
        faults: faults.clone(),
        ops: ops.clone(),
        runs: runs.clone(),
        cron: cron::parse(&cron_spec().cron, "").ok(),
        clocks,
        cuts,
        drained: false,
        sink: sink.clone(),
        one_way_views: one_way_views.clone(),
        held: Vec::new(),
        released: Vec::new(),
        next_value: 0,
    };
    sim.client("driver", driver.drive());

    // Faults the driver cannot inject from inside (crashes and restarts):
    // it asks, the step loop does them between steps.
    loop {
        let finished = sim.step().map_err(|e| ClusterError::Simulation(e.to_string()))?;
        if finished {
            break;
        }
        let elapsed = sim.elapsed().as_millis();
        for fault in faults.take() {
            match fault {
                Fault::Crash(nodes) => {
                    for node in nodes {
                        sim.crash(host_name(node));
                        registry.lock().remove(&node);
                        let crash = if rng.gen_bool(0.5) {
                            Crash::Torn { whole_writes: 0, torn_entries: 1 }
                        } else {
                            Crash::LoseUnsynced
                        };
                        disks[&node].crash(crash);
                        history.record(format!("{elapsed} node {node} crashed ({crash:?})"));
                    }
                }
                Fault::Restart(nodes) => {
                    for node in nodes {
                        sim.bounce(host_name(node));
                        history.record(format!("{elapsed} node {node} restarted"));
                    }
                }
            }
        }
    }
    let finals = registry
        .lock()
        .iter()
        .map(|(id, member)| {
            let sm = &member.state_machine;
            (*id, (sm.last_applied_index(), sm.read(state_digest)))
        })
        .collect();
    let (final_jobs, final_exec_jobs) = {
        let nodes = registry.lock();
        let leader = leader_of(&nodes).and_then(|id| nodes.get(&id));
        (
            leader.map(|member| member.state_machine.read(final_jobs)),
            leader.map(|member| {
                member.state_machine.read(|state| final_jobs_of(state, DEFAULT_COMMAND_QUEUE))
            }),
        )
    };
    let ops = ops.take();
    let drained = ops.iter().any(|op| op.f == OpFunction::LeaseRead);
    Ok(Run {
        history: history.take(),
        ops,
        final_jobs,
        runs: runs.take(),
        final_exec_jobs,
        finals,
        one_way_views: one_way_views.take(),
        sink: sink.log(),
        drained,
    })
}

/// The completion of an operation whose write was applied with `response`.
fn completion(response: &Response, invoke: OpValue) -> (OpType, OpValue) {
    match response {
        Response::Enqueued(outcomes) => {
            let first = outcomes.first();
            let value = OpValue {
                job_id: first.map(|o| o.job_id),
                duplicate: first.map(|o| o.duplicate),
                ..invoke
            };
            (OpType::Ok, value)
        }
        Response::Claimed(grants) => {
            let leases = grants
                .iter()
                .map(|grant| LeaseRecord {
                    job_id: grant.lease.job_id,
                    holder: grant.lease.holder.clone(),
                    token: grant.lease.token,
                    epoch: grant.lease.epoch,
                    granted_at_ms: grant.lease.granted_at_ms,
                    expires_at_ms: grant.lease.expires_at_ms,
                    value: Some(String::from_utf8_lossy(&grant.job.payload).into_owned()),
                    attempts: Some(grant.job.attempts),
                })
                .collect();
            (OpType::Ok, OpValue { leases, ..invoke })
        }
        Response::Refused(refusal) => {
            (OpType::Fail, OpValue { message: Some(format!("{refusal:?}")), ..invoke })
        }
        _ => (OpType::Ok, invoke),
    }
}

/// Hands `proposal` to `leader`'s journal on the leader's runtime, as the
/// leader serves a write a follower forwarded to it (it never forwards
/// again): the journal batches it, stamps the batch with the leader host's
/// clock (the time in `proposal` is not kept), wraps it in the leader's
/// rules and proposes it. Answers the applied response, or why the outcome
/// is unknown.
async fn write_through_journal(leader: &Member, proposal: Proposal) -> Result<Response, String> {
    let journal = leader.journal.clone();
    let request = ForwardRequest::Write(Box::new(proposal));
    // Forwarded as by a member (the leader itself), which the leader takes.
    let from = journal.node_id();
    let served = leader.runtime.spawn(async move { journal.serve_forwarded(request, from).await });
    match tokio::time::timeout(CLIENT_TIMEOUT, served).await {
        Ok(Ok(ForwardResponse::Written(response))) => Ok(response),
        Ok(Ok(ForwardResponse::Failed { message, .. })) => Err(message),
        Ok(Ok(other)) => Err(format!("unexpected answer {other:?}")),
        // The task's id is a process-wide counter, so not in the history.
        Ok(Err(_)) => Err("host stopped".to_string()),
        Err(_) => Err("timeout".to_string()),
    }
}

/// [`Bug::FollowerStampsTime`]: proposes `proposal` to `leader`'s Raft as it
/// came, keeping the stamp of the node that took it, as a leader that kept
/// a forwarded time would.
async fn write_keeping_stamp(leader: &Member, proposal: Proposal) -> Result<Response, String> {
    match tokio::time::timeout(CLIENT_TIMEOUT, leader.raft.client_write(proposal)).await {
        Ok(Ok(written)) => Ok(written.data),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("timeout".to_string()),
    }
}

/// A write the workload makes next: its name in the history, the command,
/// and how the checkers see it (`None`: not a checker operation).
struct Planned(&'static str, Command, Option<(OpFunction, OpValue)>);

/// The workload's client: forms the group, runs the plan's operations and
/// faults, heals, and waits for every node to apply the leader's log.
struct Driver {
    plan: Plan,
    rng: StdRng,
    registry: Registry,
    history: History,
    faults: Faults,
    ops: Ops,
    runs: Runs,
    /// The cron schedule's expression, parsed once (as the node's ticker
    /// caches it).
    cron: Option<CronSchedule>,
    clocks: Clocks,
    /// The one-way cuts the hosts' networks obey.
    cuts: OneWayCuts,
    /// Whether the plan's drain happened.
    drained: bool,
    /// The downstream store the workload's workers write to, fenced by
    /// their leases' tokens (the chaos harness's own).
    sink: FencedSink,
    /// The cut link as its ends saw it, at the cut and at the repair.
    one_way_views: LinkViews,
    /// Leases granted and not yet acked or released.
    held: Vec<(u64, u64)>,
    /// Leases released: a zombie worker may still ack with them.
    released: Vec<(u64, u64)>,
    next_value: u64,
}

impl Driver {
    async fn drive(mut self) -> turmoil::Result {
        // --- every node up, node 1 forms the group
        while self.registry.lock().len() < self.plan.nodes as usize {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let members: BTreeMap<NodeId, BasicNode> =
            (1..=self.plan.nodes).map(|id| (id, BasicNode::new(host_name(id)))).collect();
        if let Some(raft) = self.registry.raft(1) {
            raft.initialize(members).await?;
        }
        self.put_schedule().await;

        let operations = self.plan.operations;
        let mut partitioned: Option<NodeId> = None;
        let mut one_way_cut: Option<(NodeId, NodeId)> = None;
        let mut one_way_since_ms = 0;
        let mut power_cut_done = false;
        for op in 0..operations {
            tokio::time::sleep(Duration::from_millis(self.rng.gen_range(5..60))).await;
            self.tick().await;
            if op % 4 == 0 {
                self.read_schedule();
            }
            if self.plan.handover && op == operations / 3 {
                self.grant_handover_lease().await;
            }
            if let Some(way) = self.plan.one_way
                && op == operations / 6
            {
                one_way_cut = self.cut_one_way(way);
                one_way_since_ms = now_ms();
            }
            if let Some(cut) = one_way_cut
                && op == operations / 3
            {
                // Held long enough for a follower that hears nothing to
                // campaign, whatever the operations took.
                let held_ms = now_ms().saturating_sub(one_way_since_ms);
                let hold_ms = ONE_WAY_HOLD_MS.saturating_sub(held_ms);
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                self.repair_one_way(cut);
                one_way_cut = None;
            }
            if self.plan.partition_leader
                && op == operations / 3
                && let Some(cut) = leader(&self.registry, self.plan.nodes)
            {
                self.partition(cut, true);
                partitioned = Some(cut);
            }
            if let Some(cut) = partitioned
                && op == 2 * operations / 3
            {
                self.partition(cut, false);
                partitioned = None;
            }
            // From seven twelfths on, as soon as every node runs and every
            // link is up: the two others must keep a quorum to sweep with
            // while the drained node is down (the harness never stops two
            // nodes at once either).
            let whole = partitioned.is_none()
                && one_way_cut.is_none()
                && self.registry.lock().len() as u64 == self.plan.nodes;
            if self.plan.drain && !self.drained && whole && op >= 7 * operations / 12 {
                self.drained = self.drain().await;
            }
            if self.plan.crash_follower && op == operations / 2 {
                self.faults.record(Fault::Crash(vec![self.plan.nodes]));
            }
            if self.plan.crash_follower && op == 3 * operations / 4 {
                self.faults.record(Fault::Restart(vec![self.plan.nodes]));
            }
            if let Some(step_ms) = self.plan.clock_jump_ms
                && (op == operations / 8 || op == operations / 2)
            {
                self.clocks.jump(JUMPED_NODE, step_ms);
                self.history.record(format!(
                    "{} clock of node {JUMPED_NODE} jumps {step_ms} ms ahead",
                    now_ms()
                ));
            }

            let acknowledged = match self.next_step() {
                Some(Planned(name, command, op)) => self.write(name, command, op).await.is_some(),
                None => false,
            };
            // The power cut comes right after an acknowledged write, while
            // the write's own syncs may still be under way.
            if self.plan.power_cut && !power_cut_done && acknowledged && op >= 5 * operations / 6 {
                power_cut_done = true;
                self.power_cut().await;
            }
        }
        if let Some(cut) = partitioned {
            self.partition(cut, false);
        }
        if let Some(cut) = one_way_cut {
            self.repair_one_way(cut);
        }
        // No write was acknowledged late in the operations (the faults left
        // no leader that could stamp): the cut comes after the next one
        // that is (within 50 tries; a run whose writes never get through
        // again ends without it).
        for _ in 0..50 {
            if !self.plan.power_cut || power_cut_done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(self.rng.gen_range(20..60))).await;
            let Planned(name, enqueue, op) = self.next_enqueue();
            if self.write(name, enqueue, op).await.is_some() {
                power_cut_done = true;
                self.power_cut().await;
            }
        }
        if self.plan.handover {
            self.outlast_handover_lease().await;
        }
        self.settle().await;
        self.heal().await;
        Ok(())
    }

    /// Every node loses power at once (its unsynced writes lost or torn),
    /// and all restart 50–300 ms later.
    async fn power_cut(&mut self) {
        let all: Vec<NodeId> = (1..=self.plan.nodes).collect();
        self.history.record(format!("{} power cut", now_ms()));
        self.faults.record(Fault::Crash(all.clone()));
        let dark_ms = self.rng.gen_range(50..300);
        tokio::time::sleep(Duration::from_millis(dark_ms)).await;
        self.faults.record(Fault::Restart(all));
    }

    /// Puts the cron schedule, retrying while the group forms (bounded).
    async fn put_schedule(&mut self) {
        for _ in 0..50 {
            let put = Command::PutSchedule { spec: cron_spec() };
            if self.write("put-schedule", put, None).await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The leader's ticker, as the node's driver runs it: plans the
    /// schedule's due ticks (`plan_ticks`, the core's rule) from the
    /// leader's applied state and its cluster time, proposes each fire or
    /// skip in order, stops at the first that does not commit (the next
    /// round plans again from the journal), and runs what fired.
    async fn tick(&mut self) {
        let Some(cron) = self.cron.clone() else { return };
        let Some(id) = leader(&self.registry, self.plan.nodes) else { return };
        let Some(state_machine) = self.registry.state_machine(id) else { return };
        let clock_ms = self.clocks.now_ms(id, now_ms());
        let steps = state_machine.read(|state| {
            let now_ms = state.cluster_time_ms().max(clock_ms);
            let schedule = state.schedules().get(SCHEDULE)?;
            Some((schedule.clone(), plan_ticks(schedule, &cron, now_ms, TICK_TOLERANCE_MS)))
        });
        let Some((planned_from, steps)) = steps else { return };
        let mut fired = false;
        for step in steps {
            let schedule = SCHEDULE.to_string();
            let command = match step {
                TickPlan::Fire(bucket) => Command::Fire { schedule, bucket, targets: Vec::new() },
                TickPlan::Skip { bucket, reason, ticks } => {
                    Command::Skip { schedule, bucket, reason, ticks }
                }
            };
            // As the node's driver proposes it (the leader writes it in
            // the format its members agree on).
            let command = planned_tick(&planned_from, command, LOG_FORMAT);
            match self.write("tick", command, None).await {
                Some(Response::Tick(Some(TickOutcome::Fired { .. }))) => fired = true,
                Some(_) => {}
                None => break,
            }
        }
        if fired {
            self.run_cron_jobs().await;
        }
    }

    /// The built-in executor: claims the command queue's jobs, runs each
    /// (a start and an end line in the execution log, under the lease's
    /// token) and acks it.
    async fn run_cron_jobs(&mut self) {
        for _ in 0..3 {
            let node = leader(&self.registry, self.plan.nodes).unwrap_or(0);
            let claim = Command::Claim {
                worker: format!("executor-{node}"),
                queue: DEFAULT_COMMAND_QUEUE.into(),
                max: 4,
                lease_ttl_ms: None,
                selector: Vec::new(),
            };
            let Some(Response::Claimed(grants)) = self.write("exec-claim", claim, None).await
            else {
                return;
            };
            if grants.is_empty() {
                return;
            }
            for grant in grants {
                let bucket = grant
                    .job
                    .idempotency_key
                    .as_deref()
                    .and_then(|key| key.rsplit(':').next())
                    .and_then(|bucket| bucket.parse().ok())
                    .unwrap_or(0);
                let (job_id, token) = (grant.lease.job_id, grant.lease.token);
                let event = |phase| ExecEvent {
                    phase,
                    wall_ns: now_ns(),
                    schedule: SCHEDULE.to_string(),
                    bucket,
                    node,
                    token,
                    job_id,
                    attempt: grant.job.attempts.saturating_add(1),
                    path: "journal".to_string(),
                };
                self.runs.record(event(RunPhase::Start));
                self.runs.record(event(RunPhase::End));
                let ack = Command::Ack { job_id, token, result: None };
                self.write("exec-ack", ack, None).await;
            }
        }
    }

    /// Reads the schedule's tick records from the leader's applied state,
    /// as the chaos harness's poller reads them over gRPC.
    fn read_schedule(&self) {
        let base = OpValue { schedule: Some(SCHEDULE.to_string()), ..OpValue::default() };
        self.ops.op(OpType::Invoke, OpFunction::ScheduleRead, base.clone());
        let ticks = leader(&self.registry, self.plan.nodes)
            .and_then(|id| self.registry.state_machine(id))
            .and_then(|state_machine| {
                state_machine.read(|state| {
                    let schedule = state.schedules().get(SCHEDULE)?;
                    Some(schedule.history.iter().map(read_tick).collect::<Vec<_>>())
                })
            });
        match ticks {
            Some(ticks) => {
                self.ops.op(OpType::Ok, OpFunction::ScheduleRead, OpValue { ticks, ..base })
            }
            None => self.ops.op(OpType::Info, OpFunction::ScheduleRead, base),
        }
    }

    /// The hand-over's long lease, granted by the first leader to a worker
    /// that never acks: a job enqueued for it, claimed at once.
    async fn grant_handover_lease(&mut self) {
        let Planned(name, enqueue, op) = self.next_enqueue();
        self.write(name, enqueue, op).await;
        let claim = Command::Claim {
            worker: "handover".into(),
            queue: QUEUE.into(),
            max: 1,
            lease_ttl_ms: Some(HANDOVER_TTL_MS),
            selector: Vec::new(),
        };
        self.write("handover-claim", claim, Some((OpFunction::Claim, OpValue::default()))).await;
    }

    /// Sweeps and claims, a few times a second, for longer than the
    /// hand-over's lease, so the job is taken back by the new leader and
    /// granted again as soon as its sweep allows.
    async fn outlast_handover_lease(&mut self) {
        let until_ms = now_ms() + HANDOVER_TTL_MS + 2_000;
        while now_ms() < until_ms {
            tokio::time::sleep(Duration::from_millis(self.rng.gen_range(50..150))).await;
            self.tick().await;
            let sweep = self.sweep();
            self.write("sweep", sweep, None).await;
            let claim = Command::Claim {
                worker: WORKER.into(),
                queue: QUEUE.into(),
                max: 2,
                lease_ttl_ms: Some(3_000),
                selector: Vec::new(),
            };
            self.write("claim", claim, Some((OpFunction::Claim, OpValue::default()))).await;
        }
    }

    /// The leader's sweep: earlier terms' leases get the clock bound on top
    /// of their expiry ([`Bug::SweepIgnoresBound`] planted: they do not).
    fn sweep(&self) -> Command {
        let max_clock_offset_ms =
            if self.plan.bugs.contains(&Bug::SweepIgnoresBound) { 0 } else { CLOCK_BOUND_MS };
        Command::SweepBounded { max_clock_offset_ms }
    }

    /// After the faults: the workers finish what they hold and take a few
    /// more jobs to the end, so every run has acks for the checkers to
    /// judge, whatever its faults left undone.
    async fn settle(&mut self) {
        for _ in 0..1_000 {
            let running = self.registry.lock().len() as u64;
            if running == self.plan.nodes
                && undisputed_leader(&self.registry, self.plan.nodes)
                && self.leader_may_stamp().await
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.history.record(format!("{} settle", now_ms()));
        self.tick().await;
        self.run_cron_jobs().await;
        self.read_schedule();
        // A fresh job, so the claims below find one ready even when every
        // earlier job is held under a lease whose grant timed out here.
        let Planned(name, enqueue, op) = self.next_enqueue();
        self.write(name, enqueue, op).await;
        for _ in 0..3 {
            for (job_id, token) in std::mem::take(&mut self.held) {
                self.sink.write(now_ns(), job_id, token, WORKER);
                let ack = Command::Ack { job_id, token, result: None };
                let op = OpValue { job_id: Some(job_id), token: Some(token), ..OpValue::default() };
                self.write("ack", ack, Some((OpFunction::Ack, op))).await;
            }
            let claim = Command::Claim {
                worker: WORKER.into(),
                queue: QUEUE.into(),
                max: 2,
                lease_ttl_ms: Some(3_000),
                selector: Vec::new(),
            };
            self.write("claim", claim, Some((OpFunction::Claim, OpValue::default()))).await;
        }
    }

    /// Whether the leader's journal may stamp time now (a majority has
    /// measured its clock and agrees with it), asked on the leader's
    /// runtime, whose monotonic clock its measurements were taken on.
    async fn leader_may_stamp(&self) -> bool {
        let Some(member) =
            leader(&self.registry, self.plan.nodes).and_then(|id| self.registry.member(id))
        else {
            return false;
        };
        let journal = member.journal.clone();
        let verdict = member.runtime.spawn(async move { journal.clock_verdict().may_stamp() });
        verdict.await.unwrap_or(false)
    }

    /// Drains a follower as the node's drain does, in the driver's hands:
    /// its executor (`node-ID`) takes two leases, the leases it holds are
    /// read (`before`), it is marked draining and gives its leases back —
    /// all of them on a clean drain (exit 0), none on an unclean one (exit
    /// 1, as a drain cut short) — then stops; its leases are read at the
    /// stop (`exit`) and once a lease TTL and the clock bound have passed
    /// with the leader sweeping (`ttl`); then it restarts. The reads are
    /// the chaos harness's `lease_read`s, for `drained_leases`.
    /// Answers whether it drained (not without a leader to read from).
    async fn drain(&mut self) -> bool {
        let Some(leader) = leader(&self.registry, self.plan.nodes) else { return false };
        // Not the leader, and not the node the crash fault takes.
        let Some(node) = (1..self.plan.nodes).find(|id| *id != leader) else { return false };
        let holder = format!("node-{node}");
        for value in ["d1", "d2"] {
            let spec = JobSpec {
                queue: DRAIN_QUEUE.into(),
                payload: value.as_bytes().to_vec(),
                ..JobSpec::default()
            };
            self.write("drain-enqueue", Command::Enqueue { jobs: vec![spec] }, None).await;
        }
        let claim = Command::Claim {
            worker: holder.clone(),
            queue: DRAIN_QUEUE.into(),
            max: 2,
            lease_ttl_ms: Some(DRAIN_TTL_MS),
            selector: Vec::new(),
        };
        self.write("drain-claim", claim, None).await;
        let clean = self.rng.gen_bool(0.5);
        let exit_code = i32::from(!clean);
        self.history.record(format!("{} drain node {node} (clean {clean})", now_ms()));
        let before = self.read_leases(&holder, node, "before", None);
        let draining = Command::SetDraining { node, draining: true };
        self.write("set-draining", draining, None).await;
        // The node's own journal drains too, so its clock guard keeps it
        // out of elections until it stops, as a draining node's does.
        if let Some(member) = self.registry.member(node) {
            member.journal.set_draining(true);
        }
        if clean && !before.is_empty() {
            // As a node's drain does: every lease in one write.
            let commands = before
                .iter()
                .map(|lease| Command::Release { job_id: lease.job_id, token: lease.token })
                .collect();
            self.write("drain-release", Command::Batch { commands }, None).await;
        }
        self.faults.record(Fault::Crash(vec![node]));
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.read_leases(&holder, node, "exit", Some(exit_code));
        // Until its leases are back, with the leader sweeping: at least a
        // TTL and the clock bound, and a new term's grace after every
        // change of leader meanwhile (a leader sweeps nothing in its first
        // seconds, and failing links can make several), so bounded only
        // by a few of those.
        let until_ms = now_ms() + DRAIN_TTL_MS + CLOCK_BOUND_MS + 4 * TERM_START_GRACE_MS;
        while now_ms() < until_ms && !self.held_by(&holder).is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let sweep = self.sweep();
            self.write("sweep", sweep, None).await;
        }
        self.read_leases(&holder, node, "ttl", None);
        self.faults.record(Fault::Restart(vec![node]));
        true
    }

    /// The freshest applied state of any running node: a leader may be
    /// missing for a while (the drained node's stop can take one down with
    /// a partition), and a replica's applied state is committed.
    fn freshest(&self) -> Option<SimStateMachine> {
        self.registry
            .lock()
            .values()
            .map(|member| member.state_machine.clone())
            .max_by_key(SimStateMachine::last_applied_index)
    }

    /// The leases `holder` holds in the freshest state.
    fn held_by(&self, holder: &str) -> Vec<LeaseRecord> {
        self.freshest().map_or_else(Vec::new, |state_machine| {
            state_machine.read(|state| leases_of(state, holder))
        })
    }

    /// Records a `lease_read` of the leases `holder` holds, as the
    /// harness's drainer reads them.
    fn read_leases(
        &self,
        holder: &str,
        node: NodeId,
        phase: &str,
        exit_code: Option<i32>,
    ) -> Vec<LeaseRecord> {
        let base = OpValue {
            round: Some(0),
            nodes: vec![node],
            phase: Some(phase.to_string()),
            exit_code,
            ..OpValue::default()
        };
        self.ops.op(OpType::Invoke, OpFunction::LeaseRead, base.clone());
        let leases = self
            .freshest()
            .map(|state_machine| state_machine.read(|state| leases_of(state, holder)));
        match leases {
            Some(leases) => {
                let value = OpValue { leases: leases.clone(), ..base };
                self.ops.op(OpType::Ok, OpFunction::LeaseRead, value);
                leases
            }
            None => {
                self.ops.op(OpType::Fail, OpFunction::LeaseRead, base);
                Vec::new()
            }
        }
    }

    /// Cuts the link between the leader and a follower the seed picks in
    /// the direction `way` names; answers the cut (from, to), if there was
    /// a leader to cut.
    fn cut_one_way(&mut self, way: OneWay) -> Option<(NodeId, NodeId)> {
        let leader = leader(&self.registry, self.plan.nodes)?;
        let followers: Vec<NodeId> = (1..=self.plan.nodes).filter(|id| *id != leader).collect();
        let follower = *followers.get(self.rng.gen_range(0..followers.len()))?;
        let (from, to) = match way {
            OneWay::LeaderToFollower => (leader, follower),
            OneWay::FollowerToLeader => (follower, leader),
        };
        self.set_one_way(from, to, true);
        self.view_link(true, leader, follower);
        Some((from, to))
    }

    /// Repairs the one-way cut `from` → `to`, made when `leader` led.
    fn repair_one_way(&self, (from, to): (NodeId, NodeId)) {
        let (leader, follower) = match self.plan.one_way {
            Some(OneWay::FollowerToLeader) => (to, from),
            _ => (from, to),
        };
        self.view_link(false, leader, follower);
        self.set_one_way(from, to, false);
    }

    /// Cuts (`cut`) or repairs the direction `from` → `to`.
    fn set_one_way(&self, from: NodeId, to: NodeId, cut: bool) {
        self.cuts.set(from, to, cut);
        let what = if cut { "cut" } else { "repair" };
        self.history.record(format!("{} {what} one way {from} -> {to}", now_ms()));
    }

    /// Records how `leader` and `follower` see their link now.
    fn view_link(&self, cut: bool, leader: NodeId, follower: NodeId) {
        let leader_metrics = self.registry.raft(leader).map(|raft| raft.metrics().borrow().clone());
        let follower_metrics =
            self.registry.raft(follower).map(|raft| raft.metrics().borrow().clone());
        let leader_matched = leader_metrics.as_ref().and_then(|metrics| {
            let matched = metrics.replication.as_ref()?.get(&follower)?;
            Some(matched.map_or(0, |log_id| log_id.index))
        });
        self.one_way_views.record(LinkView {
            cut,
            leader,
            follower,
            leader_term: leader_metrics.as_ref().map(|metrics| metrics.current_term),
            leader_matched,
            follower_term: follower_metrics.as_ref().map(|metrics| metrics.current_term),
            follower_last_log: follower_metrics.and_then(|metrics| metrics.last_log_index),
            lost_to_follower: self.cuts.lost(leader, follower),
            lost_to_leader: self.cuts.lost(follower, leader),
        });
    }

    /// Cuts `node` off from every other node, or repairs that.
    fn partition(&self, node: NodeId, cut: bool) {
        for other in (1..=self.plan.nodes).filter(|id| *id != node) {
            if cut {
                turmoil::partition(host_name(node), host_name(other));
            } else {
                turmoil::repair(host_name(node), host_name(other));
            }
        }
        let what = if cut { "partition" } else { "repair" };
        self.history.record(format!("{} {what} leader {node}", now_ms()));
    }

    /// An enqueue of the workload's next unique value.
    fn next_enqueue(&mut self) -> Planned {
        self.next_value += 1;
        let value = format!("v{}", self.next_value);
        // The value is its key too, as in the chaos workload: a retried
        // enqueue dedups, and an acked job whose tombstone keeps no payload
        // is still found by value (`FinalJob::value_of`).
        let spec = JobSpec {
            queue: QUEUE.into(),
            payload: value.clone().into_bytes(),
            idempotency_key: Some(value.clone()),
            ..Default::default()
        };
        let op = OpValue { value: Some(value), poison: Some(false), ..OpValue::default() };
        Planned("enqueue", Command::Enqueue { jobs: vec![spec] }, Some((OpFunction::Enqueue, op)))
    }

    /// Picks the next operation: enqueue, claim, ack of a held lease,
    /// release of one, a zombie ack with a released lease's token, or the
    /// leader's sweep.
    fn next_step(&mut self) -> Option<Planned> {
        let roll = self.rng.gen_range(0..100);
        if roll < 30 {
            return Some(self.next_enqueue());
        }
        if roll >= 90 {
            return Some(Planned("sweep", self.sweep(), None));
        }
        let lease_op = |f: OpFunction, job_id: u64, token: u64| {
            let value = OpValue { job_id: Some(job_id), token: Some(token), ..OpValue::default() };
            Some((f, value))
        };
        if (55..72).contains(&roll) && !self.held.is_empty() {
            let (job_id, token) = self.held.swap_remove(self.rng.gen_range(0..self.held.len()));
            self.sink.write(now_ns(), job_id, token, WORKER);
            let ack = Command::Ack { job_id, token, result: None };
            return Some(Planned("ack", ack, lease_op(OpFunction::Ack, job_id, token)));
        }
        if (72..80).contains(&roll) && !self.held.is_empty() {
            let (job_id, token) = self.held.swap_remove(self.rng.gen_range(0..self.held.len()));
            self.released.push((job_id, token));
            let release = Command::Release { job_id, token };
            return Some(Planned("release", release, lease_op(OpFunction::Release, job_id, token)));
        }
        if (80..90).contains(&roll) && !self.released.is_empty() {
            // A worker that let its lease go and acks anyway: the token is
            // stale, and must be refused.
            let (job_id, token) = self.released[self.rng.gen_range(0..self.released.len())];
            // A zombie writes its stale result too; the sink must refuse it
            // once the job's next holder has written.
            self.sink.write(now_ns(), job_id, token, WORKER);
            let ack = Command::Ack { job_id, token, result: None };
            return Some(Planned("zombie-ack", ack, lease_op(OpFunction::Ack, job_id, token)));
        }
        if roll >= 55 && self.held.is_empty() && self.released.is_empty() {
            return None;
        }
        let claim = Command::Claim {
            worker: WORKER.into(),
            queue: QUEUE.into(),
            max: 2,
            lease_ttl_ms: Some(self.rng.gen_range(1_000..=3_000)),
            selector: Vec::new(),
        };
        Some(Planned("claim", claim, Some((OpFunction::Claim, OpValue::default()))))
    }

    /// Sends `command` as a client would: to a running node the seed picks,
    /// which hands it to the leader's journal; the leader's journal stamps
    /// the time with its host's clock (with [`Bug::FollowerStampsTime`]
    /// planted, the stamp of the node that took it is kept). Returns the
    /// response of an acknowledged write.
    async fn write(
        &mut self,
        name: &'static str,
        command: Command,
        op: Option<(OpFunction, OpValue)>,
    ) -> Option<Response> {
        // Only the workload worker's own claims give it leases to ack,
        // release or replay as a zombie: the executor's, a drained node's
        // and the hand-over's (which must outlast its TTL) are theirs.
        let workload = matches!(&command, Command::Claim { worker, .. } if worker == WORKER);
        let running: Vec<NodeId> = self.registry.lock().keys().copied().collect();
        let Some(entry) = running.get(self.rng.gen_range(0..running.len().max(1))).copied() else {
            self.history.record(format!("{} {name} fail no-node", now_ms()));
            return None;
        };
        let Some((leader_id, member)) = leader(&self.registry, self.plan.nodes)
            .and_then(|id| self.registry.member(id).map(|member| (id, member)))
        else {
            self.history.record(format!("{} {name} via={entry} fail no-leader", now_ms()));
            return None;
        };
        // What the node that took the command would send on: the command
        // with its own clock's time, which only the planted bug keeps.
        let proposal = Proposal { now_ms: self.clocks.now_ms(entry, now_ms()), command };
        if let Some((f, invoke)) = &op {
            self.ops.op(OpType::Invoke, *f, invoke.clone());
        }
        let answer = if self.plan.bugs.contains(&Bug::FollowerStampsTime) && entry != leader_id {
            write_keeping_stamp(&member, proposal).await
        } else {
            write_through_journal(&member, proposal).await
        };
        let mut acknowledged = None;
        let outcome = match answer {
            Ok(response) => {
                let detail = match &response {
                    Response::Enqueued(outcomes) => outcomes
                        .iter()
                        .map(|o| format!("job={}", o.job_id))
                        .collect::<Vec<_>>()
                        .join(","),
                    Response::Claimed(grants) if grants.is_empty() => "none".to_string(),
                    Response::Claimed(grants) => {
                        if workload {
                            self.held.extend(
                                grants.iter().map(|grant| (grant.lease.job_id, grant.lease.token)),
                            );
                        }
                        grants
                            .iter()
                            .map(|g| format!("job={}:token={}", g.lease.job_id, g.lease.token))
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                    other => format!("{other:?}"),
                };
                if let Some((f, invoke)) = op {
                    let (kind, value) = completion(&response, invoke);
                    self.ops.op(kind, f, value);
                }
                acknowledged = Some(response);
                format!("ok node={leader_id} {detail}")
            }
            // Unknown outcome: it may still commit (a journal's refusal to
            // stamp, or a leadership change before the proposal, are
            // certain failures, but told apart only by their text: judging
            // them unknown is the weaker, always true claim).
            Err(why) => {
                if let Some((f, invoke)) = op {
                    self.ops.op(OpType::Info, f, invoke);
                }
                format!("info node={leader_id} {}", why.replace('\n', " "))
            }
        };
        self.history.record(format!("{} {name} via={entry} {outcome}", now_ms()));
        acknowledged
    }

    /// Waits, bounded, until every node runs and has applied the leader's
    /// last log index; records each node's applied index and digest.
    async fn heal(&self) {
        for _ in 0..3_000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let Some(raft) =
                leader(&self.registry, self.plan.nodes).and_then(|id| self.registry.raft(id))
            else {
                continue;
            };
            let Some(last) = raft.metrics().borrow().last_log_index else { continue };
            let nodes = self.registry.lock();
            if nodes.len() == self.plan.nodes as usize
                && nodes.values().all(|member| member.state_machine.last_applied_index() >= last)
            {
                break;
            }
        }
        self.history.record(format!("{} healed", now_ms()));
        let nodes: Vec<(NodeId, u64, u64)> = self
            .registry
            .lock()
            .iter()
            .map(|(id, member)| {
                let sm = &member.state_machine;
                (*id, sm.last_applied_index(), sm.read(state_digest))
            })
            .collect();
        for (id, applied, digest) in nodes {
            self.history.record(format!("final node={id} applied={applied} digest={digest:#x}"));
        }
    }
}
