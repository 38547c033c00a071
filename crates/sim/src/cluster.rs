//! A seeded cluster on turmoil: N simulated hosts, each running the real
//! openraft core with leasehold's type config on a [`SimDisk`], talking over
//! turmoil's simulated TCP ([`crate::net`]), and a driver host that runs a
//! workload of enqueue, claim and ack against the leader while the plan
//! partitions the leader and crashes (and restarts) a follower.
//!
//! One seed drives turmoil's network (latencies, host order), each node's
//! election timeout (a window one millisecond wide, its start drawn from
//! the seed: openraft 0.9 draws the timeout from an OS-seeded generator, and
//! a one-value range makes that draw irrelevant), the workload and the
//! fault times. The run's history is plain text lines; its digest is what
//! the determinism test compares.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_cluster_tests::checkers::{
    self, Checker, FinalJob, RunRecord, Severity, StatusSample, Verdict,
};
use leasehold_cluster_tests::history::{LeaseRecord, Op, OpFunction, OpType, OpValue};
use leasehold_core::{Command, JobFilter, JobSpec, Proposal, Response, State};
use leasehold_raft::{NodeId, Raft};
use openraft::{BasicNode, Config};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::net::{SimNetwork, host_name, serve};
use crate::{Crash, SimDisk, SimStateMachine};

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
}

impl Plan {
    /// A short plan with both faults.
    pub fn short(seed: u64) -> Plan {
        Plan { seed, nodes: 3, operations: 40, partition_leader: true, crash_follower: true }
    }
}

/// The clock bound the checkers judge lease timing by (every simulated
/// host shares turmoil's one clock, so any bound holds).
const CLOCK_BOUND_MS: u64 = 500;

/// The queue the workload uses.
const QUEUE: &str = "q";

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
    /// Per node at the end: (applied index, state digest).
    pub finals: BTreeMap<NodeId, (u64, u64)>,
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
            samples,
            nodes: self.finals.len() as u64,
            clock_bound_ms: CLOCK_BOUND_MS,
            ..RunRecord::default()
        }
    }

    /// The verdicts of the checkers that apply to a queue workload: lease
    /// exclusivity (in simulated real time too), fencing, no redelivery
    /// after ack, none lost, convergence.
    pub fn check(&self) -> Vec<Verdict> {
        let record = self.record();
        let applicable: [&dyn Checker; 5] = [
            &checkers::lease_exclusivity::LeaseExclusivity,
            &checkers::fencing::Fencing,
            &checkers::no_redelivery::NoRedelivery,
            &checkers::none_lost::NoneLost,
            &checkers::convergence::Convergence,
        ];
        applicable.iter().map(|checker| checker.check(&record)).collect()
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

/// The running nodes' handles, as the driver and the fault loop see them.
#[derive(Clone, Default)]
struct Registry(Arc<Mutex<BTreeMap<NodeId, (Raft, SimStateMachine)>>>);

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, (Raft, SimStateMachine)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn raft(&self, id: NodeId) -> Option<Raft> {
        self.lock().get(&id).map(|(raft, _)| raft.clone())
    }
}

/// Where the crash fault stands, shared by the driver and the step loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    None,
    CrashAsked,
    Crashed,
    RestartAsked,
    Restarted,
}

#[derive(Clone)]
struct Faults(Arc<Mutex<Stage>>);

impl Default for Faults {
    fn default() -> Faults {
        Faults(Arc::new(Mutex::new(Stage::None)))
    }
}

impl Faults {
    fn stage(&self) -> Stage {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, stage: Stage) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = stage;
    }
}

/// The history, shared by the driver and the fault loop.
#[derive(Clone, Default)]
struct History(Arc<Mutex<Vec<String>>>);

impl History {
    fn record(&self, line: String) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(line);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The workload's operations, shared by the driver and the run.
#[derive(Clone, Default)]
struct Ops(Arc<Mutex<Vec<Op>>>);

impl Ops {
    fn record(&self, kind: OpType, f: OpFunction, value: OpValue) {
        let mut ops = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let index = ops.len() as u64;
        let time_ns = u64::try_from(turmoil::elapsed().as_nanos()).unwrap_or(u64::MAX);
        ops.push(Op { index, time_ns, process: "driver".to_string(), kind, f, value });
    }

    fn take(&self) -> Vec<Op> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The workload queue's jobs as the final read reports them.
fn final_jobs(state: &State) -> Vec<FinalJob> {
    let filter = JobFilter { queue: Some(QUEUE.to_string()), ..JobFilter::default() };
    state
        .jobs(&filter, 0, usize::MAX)
        .into_iter()
        .map(|job| FinalJob {
            id: job.id,
            value: String::from_utf8_lossy(&job.payload).into_owned(),
            state: job.state.as_str().to_string(),
            attempts: job.attempts,
            lease_token: job.lease.as_ref().map(|lease| lease.token),
            key: job.idempotency_key.clone(),
        })
        .collect()
}

fn now_ms() -> u64 {
    u64::try_from(turmoil::elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The leader the highest-term running node names, among `nodes`.
fn leader_of(nodes: &BTreeMap<NodeId, (Raft, SimStateMachine)>) -> Option<NodeId> {
    nodes
        .values()
        .filter_map(|(raft, _)| {
            let metrics = raft.metrics().borrow().clone();
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

/// Runs `plan` to the end and returns its record.
pub fn run(plan: &Plan) -> Result<Run, ClusterError> {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut sim = turmoil::Builder::new()
        .rng_seed(plan.seed)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(rng.gen_range(2..=20)))
        .simulation_duration(Duration::from_secs(300))
        .build();
    let registry = Registry::default();
    let history = History::default();
    let disks: BTreeMap<NodeId, SimDisk> = (1..=plan.nodes)
        .map(|id| (id, SimDisk::with_sync_delay(Duration::from_millis(rng.gen_range(1..=5)))))
        .collect();

    for (id, disk) in &disks {
        let id = *id;
        // Distinct starts break election ties; one-value windows make them
        // independent of openraft's own generator.
        let election_min = 150 + rng.gen_range(0..150) + id;
        let config = Config {
            heartbeat_interval: 50,
            election_timeout_min: election_min,
            election_timeout_max: election_min + 1,
            install_snapshot_timeout: 2_000,
            ..Config::default()
        }
        .validate()
        .map_err(|e| ClusterError::Simulation(e.to_string()))?;
        let config = Arc::new(config);
        let (disk, registry, history) = (disk.clone(), registry.clone(), history.clone());
        sim.host(host_name(id), move || {
            let (disk, registry, history, config) =
                (disk.clone(), registry.clone(), history.clone(), config.clone());
            async move {
                let (log_store, state_machine) = disk.open();
                let raft =
                    Raft::new(id, config, SimNetwork, log_store, state_machine.clone()).await?;
                history.record(format!("{} node {id} started", now_ms()));
                registry.lock().insert(id, (raft.clone(), state_machine));
                serve(raft).await?;
                Ok(())
            }
        });
    }

    let faults = Faults::default();
    let ops = Ops::default();
    let driver = drive(
        plan.clone(),
        StdRng::seed_from_u64(rng.r#gen()),
        registry.clone(),
        history.clone(),
        faults.clone(),
        ops.clone(),
    );
    sim.client("driver", driver);

    // Faults the driver cannot inject from inside (a crash and a restart):
    // it asks, the step loop does them between steps.
    let torn = rng.gen_bool(0.5);
    let victim = plan.nodes;
    loop {
        let finished = sim.step().map_err(|e| ClusterError::Simulation(e.to_string()))?;
        if finished {
            break;
        }
        let elapsed = sim.elapsed().as_millis();
        match faults.stage() {
            Stage::CrashAsked => {
                sim.crash(host_name(victim));
                registry.lock().remove(&victim);
                let crash = if torn {
                    Crash::Torn { whole_writes: 0, torn_entries: 1 }
                } else {
                    Crash::LoseUnsynced
                };
                disks[&victim].crash(crash);
                history.record(format!("{elapsed} node {victim} crashed ({crash:?})"));
                faults.set(Stage::Crashed);
            }
            Stage::RestartAsked => {
                sim.bounce(host_name(victim));
                history.record(format!("{elapsed} node {victim} restarted"));
                faults.set(Stage::Restarted);
            }
            _ => {}
        }
    }
    let finals = registry
        .lock()
        .iter()
        .map(|(id, (_, sm))| (*id, (sm.last_applied_index(), sm.read(state_digest))))
        .collect();
    let final_jobs = {
        let nodes = registry.lock();
        let leader = leader_of(&nodes);
        leader.and_then(|id| nodes.get(&id)).map(|(_, sm)| sm.read(final_jobs))
    };
    Ok(Run { history: history.take(), ops: ops.take(), final_jobs, finals })
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

/// The driver: forms the group, runs the workload, heals, and waits for
/// every node to apply the leader's log.
async fn drive(
    plan: Plan,
    mut rng: StdRng,
    registry: Registry,
    history: History,
    faults: Faults,
    ops: Ops,
) -> turmoil::Result {
    // --- every node up, node 1 forms the group
    while registry.lock().len() < plan.nodes as usize {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let members: BTreeMap<NodeId, BasicNode> =
        (1..=plan.nodes).map(|id| (id, BasicNode::new(host_name(id)))).collect();
    if let Some(raft) = registry.raft(1) {
        raft.initialize(members).await?;
    }

    let mut held: Vec<(u64, u64)> = Vec::new();
    let mut next_value = 0u64;
    let mut partitioned: Option<NodeId> = None;
    for op in 0..plan.operations {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..60))).await;
        if plan.partition_leader
            && op == plan.operations / 3
            && let Some(cut) = leader(&registry, plan.nodes)
        {
            for other in (1..=plan.nodes).filter(|id| *id != cut) {
                turmoil::partition(host_name(cut), host_name(other));
            }
            history.record(format!("{} partition leader {cut}", now_ms()));
            partitioned = Some(cut);
        }
        if let Some(cut) = partitioned
            && op == 2 * plan.operations / 3
        {
            for other in (1..=plan.nodes).filter(|id| *id != cut) {
                turmoil::repair(host_name(cut), host_name(other));
            }
            history.record(format!("{} repair leader {cut}", now_ms()));
            partitioned = None;
        }

        if plan.crash_follower && op == plan.operations / 2 {
            faults.set(Stage::CrashAsked);
        }
        if plan.crash_follower && op == 3 * plan.operations / 4 {
            faults.set(Stage::RestartAsked);
        }

        let roll = rng.gen_range(0..10);
        let (name, command) = if roll < 4 {
            next_value += 1;
            let spec = JobSpec {
                queue: QUEUE.into(),
                payload: format!("v{next_value}").into_bytes(),
                ..Default::default()
            };
            ("enqueue", Command::Enqueue { jobs: vec![spec] })
        } else if roll < 7 || held.is_empty() {
            let claim = Command::Claim {
                worker: "w".into(),
                queue: QUEUE.into(),
                max: 2,
                lease_ttl_ms: Some(30_000),
                selector: Vec::new(),
            };
            ("claim", claim)
        } else {
            let Some((job_id, token)) = held.pop() else { continue };
            ("ack", Command::Ack { job_id, token, result: None })
        };
        let Some(target) =
            leader(&registry, plan.nodes).and_then(|id| registry.raft(id).map(|r| (id, r)))
        else {
            history.record(format!("{} {name} fail no-leader", now_ms()));
            continue;
        };
        let (f, invoke) = match &command {
            Command::Enqueue { jobs } => {
                let value = jobs.first().map(|j| String::from_utf8_lossy(&j.payload).into_owned());
                (OpFunction::Enqueue, OpValue { value, poison: Some(false), ..OpValue::default() })
            }
            Command::Ack { job_id, token, .. } => (
                OpFunction::Ack,
                OpValue { job_id: Some(*job_id), token: Some(*token), ..OpValue::default() },
            ),
            _ => (OpFunction::Claim, OpValue::default()),
        };
        ops.record(OpType::Invoke, f, invoke.clone());
        let proposal = Proposal { now_ms: 1_000_000 + now_ms(), command };
        let answer = tokio::time::timeout(CLIENT_TIMEOUT, target.1.client_write(proposal)).await;
        let outcome = match answer {
            Ok(Ok(written)) => {
                let detail = match &written.data {
                    Response::Enqueued(outcomes) => outcomes
                        .iter()
                        .map(|o| format!("job={}", o.job_id))
                        .collect::<Vec<_>>()
                        .join(","),
                    Response::Claimed(grants) if grants.is_empty() => "none".to_string(),
                    Response::Claimed(grants) => {
                        for grant in grants {
                            held.push((grant.lease.job_id, grant.lease.token));
                        }
                        grants
                            .iter()
                            .map(|g| format!("job={}:token={}", g.lease.job_id, g.lease.token))
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                    other => format!("{other:?}"),
                };
                let (kind, value) = completion(&written.data, invoke);
                ops.record(kind, f, value);
                format!("ok node={} index={} {detail}", target.0, written.log_id.index)
            }
            // Refused before it was proposed: certainly not written.
            Ok(Err(error)) if error.forward_to_leader().is_some() => {
                ops.record(OpType::Fail, f, invoke);
                format!("fail node={} not the leader", target.0)
            }
            // Unknown outcome: it may still commit.
            Ok(Err(error)) => {
                ops.record(OpType::Info, f, invoke);
                format!("info node={} {}", target.0, error.to_string().replace('\n', " "))
            }
            Err(_) => {
                ops.record(OpType::Info, f, invoke);
                format!("info node={} timeout", target.0)
            }
        };
        history.record(format!("{} {name} {outcome}", now_ms()));
    }
    if let Some(cut) = partitioned {
        for other in (1..=plan.nodes).filter(|id| *id != cut) {
            turmoil::repair(host_name(cut), host_name(other));
        }
    }

    // --- heal: every node reaches the leader's last log index
    for _ in 0..3_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Some(raft) = leader(&registry, plan.nodes).and_then(|id| registry.raft(id)) else {
            continue;
        };
        let Some(last) = raft.metrics().borrow().last_log_index else { continue };
        let nodes = registry.lock();
        if nodes.len() == plan.nodes as usize
            && nodes.values().all(|(_, sm)| sm.last_applied_index() >= last)
        {
            break;
        }
    }
    history.record(format!("{} healed", now_ms()));
    let nodes: Vec<(NodeId, u64, u64)> = registry
        .lock()
        .iter()
        .map(|(id, (_, sm))| (*id, sm.last_applied_index(), sm.read(state_digest)))
        .collect();
    for (id, applied, digest) in nodes {
        history.record(format!("final node={id} applied={applied} digest={digest:#x}"));
    }
    Ok(())
}
