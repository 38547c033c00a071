//! Three turmoil hosts, each running openraft on its simulated disk over
//! the simulated Raft network and the replica's real `Journal` on its
//! host's simulated clock: the setup `seeded_journal`, `forward`, `gate`
//! and `duties` share.
//!
//! Without the gate ([`Peers::Unused`], [`Peers::Grpc`]) each host records
//! its peers' clocks once a second on its own runtime, as the gate's
//! adverts would measure them, with a zero round trip. With
//! [`Peers::Grpc`] every host also serves the node's real
//! `leasehold.v1.Raft` gRPC service over turmoil and builds its journal on
//! a peer network dialled over turmoil, so a follower's journal forwards
//! to the leader as a node's does; [`Peers::Gate`] adds the node's gate.
//! [`start_with_duties`] adds the node's driver and executor
//! (`node_duties`), and [`Simulation::run`] crashes and restarts hosts as
//! the driver asks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::claim_path::{ClaimPath, GateFlags};
use leasehold_core::{Command, Grant, JobSpec, Limits, Proposal, Response};
use leasehold_raft::{NetworkFactory, NodeId, Raft, TypeConfig};
use leasehold_replica::bus::Bus;
use leasehold_replica::clock_watch::guard_elections;
use leasehold_replica::gate::run_adverts;
use leasehold_replica::journal::DEFAULT_BATCHES_IN_FLIGHT;
use leasehold_replica::stores::BusStore;
use leasehold_replica::{Gate, GateConfig, Journal, JournalConfig, JournalError};
use leasehold_security::ClusterSecret;
use leasehold_sim::clock::{Clocks, HostClock};
use leasehold_sim::grpc::{self, grpc_address};
use leasehold_sim::local::{ReleaseBothPaths, SimBusTable, SimPeerStore};
use leasehold_sim::net::{OneWayCuts, SimNetwork, host_name, serve};
use leasehold_sim::{Crash, SimDisk, SimLogStore};
use openraft::{BasicNode, Entry, EntryPayload, RaftLogReader, ServerState};
use rand::rngs::StdRng;

use crate::node_duties::Duties;
use rand::{Rng, SeedableRng};
use tokio::runtime::Handle;
use tokio::time::Instant;

pub const NODES: u64 = 3;
/// How often a host measures its peers' clocks (the gate's advert interval).
const MEASURE_EVERY: Duration = Duration::from_secs(1);
/// How long a measurement counts, in the runtime's (simulated) time.
pub const FRESH_FOR: Duration = Duration::from_secs(5);
/// The bound of every wait of the driver, in simulated time.
pub const WAIT: Duration = Duration::from_secs(20);

/// How the hosts' journals reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peers {
    /// They never do: every write goes to the leader's journal, and the
    /// journals get a peer network that is never dialled.
    Unused,
    /// Over the node's gRPC on turmoil: every host serves the Raft service
    /// on `grpc::GRPC_PORT`, its member entry names that address, and its
    /// journal forwards through `grpc::peers`.
    Grpc,
    /// As [`Peers::Grpc`], and every host runs the node's real gate: it
    /// serves the Peer service too and sends its adverts every
    /// [`ADVERT_INTERVAL`], and their round trips are the only clock
    /// measurements its journal gets (no host records them itself).
    Gate,
}

/// The gate's advert interval (the node's default).
pub const ADVERT_INTERVAL: Duration = Duration::from_secs(1);

/// How the hosts' clocks are set, each 100–200 ms off real time (from
/// the seed): any two within the 500 ms bound, and each far enough off
/// real time that a stamp from real time shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skews {
    /// Ahead or behind, from the seed.
    Either,
    /// Odd hosts ahead, even hosts behind: every host has a host 200–400 ms
    /// away from it, so a stamp shows whose clock it came from.
    Alternating,
    /// Node 1 behind, the others ahead: they reach a tick 200–400 ms
    /// before node 1 does.
    FirstBehind,
}

/// One running host: its journal, its gate (with [`Peers::Gate`]), its log
/// store and the runtime it runs on.
#[derive(Clone)]
pub struct Host {
    pub journal: Journal,
    pub gate: Option<Gate>,
    pub log_store: SimLogStore,
    pub runtime: Handle,
}

/// The running hosts, as the driver sees them.
#[derive(Clone, Default)]
pub struct Hosts(Arc<Mutex<BTreeMap<NodeId, Host>>>);

impl Hosts {
    fn insert(&self, id: NodeId, host: Host) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id, host);
    }

    fn remove(&self, id: NodeId) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    pub fn all(&self) -> BTreeMap<NodeId, Host> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn get(&self, id: NodeId) -> Option<Host> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(&id).cloned()
    }
}

/// A simulation with the hosts added and no driver yet.
pub struct Simulation {
    pub sim: turmoil::Sim<'static>,
    pub hosts: Hosts,
    pub clocks: Clocks,
    /// Each host's disk.
    pub disks: BTreeMap<NodeId, SimDisk>,
    /// The crashes and restarts the driver asks for.
    pub faults: FaultQueue,
    seed: u64,
}

/// A crash or a restart of a host, which a driver running inside the
/// simulation cannot do itself: it asks, and [`Simulation::run`] does it
/// between two steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFault {
    /// The host loses power: its runtime and every task on it are gone,
    /// and its disk loses what it had not synced (or tears it, from the
    /// seed).
    Crash(NodeId),
    /// The host starts a new life on what its disk kept.
    Restart(NodeId),
}

/// The faults asked for and not yet done.
#[derive(Clone, Debug, Default)]
pub struct FaultQueue(Arc<Mutex<Vec<HostFault>>>);

impl FaultQueue {
    /// Asks for `fault`, done before the next step.
    pub fn ask(&self, fault: HostFault) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(fault);
    }

    fn take(&self) -> Vec<HostFault> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Simulation {
    /// Runs the simulation to its end, doing the faults asked for between
    /// steps. Answers when each crash happened (simulated ns since the
    /// start) and which host it took.
    pub fn run(mut self) -> anyhow::Result<Vec<(NodeId, u64)>> {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0xc4a5);
        let mut crashes = Vec::new();
        loop {
            let finished = self.sim.step().map_err(|error| anyhow::anyhow!("{error}"))?;
            if finished {
                return Ok(crashes);
            }
            for fault in self.faults.take() {
                match fault {
                    HostFault::Crash(id) => {
                        // Cut off first, as a host that loses power sends
                        // nothing more: the crash drops the host's sockets
                        // in the runtime's task order, which is not the
                        // seed's (tokio numbers tasks process-wide), and
                        // the messages those drops would send must not
                        // reach the network.
                        for other in (1..=NODES).filter(|other| *other != id) {
                            self.sim.partition(host_name(id), host_name(other));
                        }
                        self.sim.crash(host_name(id));
                        self.hosts.remove(id);
                        let crash = if rng.gen_bool(0.5) {
                            Crash::Torn { whole_writes: 0, torn_entries: 1 }
                        } else {
                            Crash::LoseUnsynced
                        };
                        if let Some(disk) = self.disks.get(&id) {
                            disk.crash(crash);
                        }
                        let at_ns = u64::try_from(self.sim.elapsed().as_nanos()).unwrap_or(0);
                        crashes.push((id, at_ns));
                    }
                    HostFault::Restart(id) => {
                        for other in (1..=NODES).filter(|other| *other != id) {
                            self.sim.repair(host_name(id), host_name(other));
                        }
                        self.sim.bounce(host_name(id));
                    }
                }
            }
        }
    }
}

/// Simulated milliseconds since the start of the run (real time).
pub fn real_ms() -> u64 {
    u64::try_from(turmoil::elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn journal_config(id: NodeId) -> JournalConfig {
    JournalConfig {
        node_id: id,
        limits: Limits::default(),
        quorum_timeout: Duration::from_secs(5),
        batches_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
        max_clock_offset_ms: 500,
        clock_fresh_for: FRESH_FOR,
    }
}

/// Records every peer's clock against this host's once a second, as the
/// gate's adverts do, on this host's runtime (the one the watch ages by).
async fn measure_peers(id: NodeId, journal: Journal, clocks: Clocks) {
    let mut tick = tokio::time::interval(MEASURE_EVERY);
    loop {
        tick.tick().await;
        if clocks.host_clock(id).unmeasured {
            continue;
        }
        for peer in (1..=NODES).filter(|peer| *peer != id) {
            let sent_at = Instant::now();
            let sent_wall_ms = journal.clock().now_ms();
            let peer_now_ms = clocks.replica_clock(peer).now_ms();
            journal.clock_watch().record(peer, sent_wall_ms, sent_at, Instant::now(), peer_now_ms);
        }
    }
}

/// The node's gate over `journal`, on the bus table `bus_table` and an
/// in-memory advert table, with the node's default settings and its
/// journal-lease flag on.
fn gate_of(journal: &Journal, secret: &ClusterSecret, bus_table: Arc<dyn BusStore>) -> Gate {
    let config = GateConfig {
        advert_interval: ADVERT_INTERVAL,
        stale_after_ms: 30_000,
        bus_window: leasehold_replica::bus::DEFAULT_WINDOW,
        version: "sim".to_string(),
    };
    let flags = GateFlags { journal_lease: true, journal_lease_dry_run: false };
    let bus = Bus::new(journal.node_id(), bus_table);
    Gate::new(
        journal.clone(),
        config,
        flags,
        secret.clone(),
        bus,
        Arc::new(SimPeerStore::default()),
    )
}

/// An enqueue of one job, `job n`, on queue `q`.
pub fn enqueue(n: u64) -> Command {
    let spec = JobSpec {
        queue: "q".into(),
        payload: format!("job {n}").into_bytes(),
        ..Default::default()
    };
    Command::Enqueue { jobs: vec![spec] }
}

/// A claim of two leases on queue `q` by worker `w`, answered once
/// (request id `claim-1`).
pub fn claim_two() -> Command {
    Command::ClaimOnce {
        request_id: "claim-1".into(),
        worker: "w".into(),
        queue: "q".into(),
        max: 2,
        lease_ttl_ms: Some(30_000),
        selector: Vec::new(),
    }
}

/// `count` enqueues proposed at once through `host`'s journal, each of
/// which must be answered `Enqueued`; the answers go into `history`.
pub async fn enqueue_at_once(
    host: &Host,
    count: u64,
    history: &mut Vec<String>,
) -> anyhow::Result<()> {
    let answers = futures::future::join_all((1..=count).map(|n| propose(host, enqueue(n))));
    for (n, answer) in (1..=count).zip(answers.await) {
        let answer = answer?;
        history.push(format!("{} enqueue {n} -> {answer:?}", real_ms()));
        anyhow::ensure!(matches!(answer, Ok(Response::Enqueued(_))), "enqueue {n}: {answer:?}");
    }
    Ok(())
}

/// [`claim_two`] and an ack of the first lease through `host`'s journal,
/// each required to succeed; the answers go into `history`. Answers the
/// two grants.
pub async fn claim_two_ack_one(
    host: &Host,
    history: &mut Vec<String>,
) -> anyhow::Result<Vec<Grant>> {
    let grants = match propose(host, claim_two()).await?? {
        Response::Claimed(grants) => grants,
        other => anyhow::bail!("the claim was answered {other:?}"),
    };
    history.push(format!("{} claim -> {grants:?}", real_ms()));
    anyhow::ensure!(grants.len() == 2, "claimed {grants:?}");
    let acked = &grants[0].lease;
    let ack = Command::Ack { job_id: acked.job_id, token: acked.token, result: None };
    let answer = propose(host, ack).await??;
    history.push(format!("{} ack -> {answer:?}", real_ms()));
    anyhow::ensure!(answer == Response::Acked, "the ack was answered {answer:?}");
    Ok(grants)
}

/// The stamps of `leader`'s entries from `first_index` on, once every
/// replica has applied them; each entry and every replica's digest go into
/// `history`.
pub async fn stamps_and_digests(
    hosts: &Hosts,
    leader: &Host,
    first_index: u64,
    history: &mut Vec<String>,
) -> anyhow::Result<Vec<u64>> {
    let mut reader = leader.log_store.clone();
    let entries: Vec<Entry<TypeConfig>> = reader.try_get_log_entries(first_index..).await?;
    let mut stamps = Vec::new();
    for entry in entries {
        if let EntryPayload::Normal(Proposal { now_ms, command }) = entry.payload {
            history.push(format!("entry {} stamped {now_ms}: {command:?}", entry.log_id.index));
            stamps.push(now_ms);
        }
    }
    let last = last_log_index(leader.journal.raft());
    for (id, host) in hosts.all() {
        host.journal
            .raft()
            .wait(Some(WAIT))
            .applied_index_at_least(Some(last), &format!("node {id} applied"))
            .await?;
        history.push(format!("node {id} digest {:x}", host.journal.state_machine().digest()));
    }
    Ok(stamps)
}

/// Runs `command` through `host`'s journal on the host's runtime, as the
/// node's server handles a client's request there.
pub async fn propose(
    host: &Host,
    command: Command,
) -> anyhow::Result<Result<Response, JournalError>> {
    let journal = host.journal.clone();
    Ok(host.runtime.spawn(async move { journal.propose(command).await }).await?)
}

/// Waits for every host to start, then forms the group on node 1, each
/// member named by the address `peers` dial it at.
pub async fn form_group(hosts: &Hosts, peers: Peers) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    while hosts.all().len() < NODES as usize {
        anyhow::ensure!(Instant::now() < deadline, "the hosts did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let address = |id| match peers {
        Peers::Unused => host_name(id),
        Peers::Grpc | Peers::Gate => grpc_address(id),
    };
    let members: BTreeMap<NodeId, BasicNode> =
        (1..=NODES).map(|id| (id, BasicNode::new(address(id)))).collect();
    if let Some(first) = hosts.get(1) {
        first.journal.raft().initialize(members).await?;
    }
    Ok(())
}

/// The leader, once it leads with an entry of its term applied and a
/// majority agrees with its clock.
pub async fn stamping_leader(hosts: &Hosts) -> anyhow::Result<(NodeId, Host)> {
    let deadline = Instant::now() + WAIT;
    loop {
        for (id, host) in hosts.all() {
            let metrics = host.journal.raft().metrics().borrow().clone();
            let leads = metrics.state == ServerState::Leader
                && metrics
                    .last_applied
                    .is_some_and(|applied| applied.leader_id.term == metrics.current_term);
            // Asked on the host's runtime: each turmoil host's monotonic
            // clock has its own origin, and the watch's measurements were
            // taken on this one.
            let journal = host.journal.clone();
            let verdict = host.runtime.spawn(async move { journal.clock_verdict() }).await?;
            if leads && verdict.may_stamp() {
                return Ok((id, host));
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no stamping leader within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `f` with `host`'s gate on the host's runtime (its monotonic clock
/// is the one its adverts were aged by).
pub async fn with_gate<T: Send + 'static>(
    host: &Host,
    f: impl FnOnce(&Gate) -> T + Send + 'static,
) -> anyhow::Result<T> {
    let gate = host.gate.clone().ok_or_else(|| anyhow::anyhow!("a host without a gate"))?;
    Ok(host.runtime.spawn(async move { f(&gate) }).await?)
}

/// Waits until every host's gate decides `path` for a claim now (once
/// every peer has advertised); the decisions go into `history`.
pub async fn every_gate_decides(
    hosts: &Hosts,
    path: ClaimPath,
    history: &mut Vec<String>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut decisions = Vec::new();
        for (id, host) in hosts.all() {
            decisions.push((id, with_gate(&host, |gate| gate.decide_at(gate.now_ms())).await?));
        }
        if decisions.iter().all(|(_, decision)| decision.path == path) {
            history.push(format!("{} every gate decides {decisions:?}", real_ms()));
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "no agreement on {path:?}: {decisions:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The last log index `raft` holds.
pub fn last_log_index(raft: &Raft) -> u64 {
    raft.metrics().borrow().last_log_index.unwrap_or(0)
}

/// Builds the simulation seeded with `seed` and starts its three hosts.
pub fn start(seed: u64, peers: Peers, skews: Skews) -> anyhow::Result<Simulation> {
    start_hosts(seed, peers, skews, None, false)
}

/// [`start`] with [`Peers::Grpc`], every host also running the node's
/// clock guard (`guard_elections`): a host whose clock is skewed, or that
/// leads unmeasured, stands aside and hands over as a node does.
pub fn start_guarded(seed: u64, skews: Skews) -> anyhow::Result<Simulation> {
    start_hosts(seed, Peers::Grpc, skews, None, true)
}

/// [`start`] with [`Peers::Gate`], every host also running the node's
/// duties (`duties`).
pub fn start_with_duties(seed: u64, skews: Skews, duties: Duties) -> anyhow::Result<Simulation> {
    start_hosts(seed, Peers::Gate, skews, Some(duties), false)
}

fn start_hosts(
    seed: u64,
    peers: Peers,
    skews: Skews,
    duties: Option<Duties>,
    guarded: bool,
) -> anyhow::Result<Simulation> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(rng.gen_range(2..=10)))
        .simulation_duration(Duration::from_secs(60))
        .tick_duration(Duration::from_millis(2))
        .build();
    let clocks = Clocks::new(
        (1..=NODES)
            .map(|id| {
                let magnitude_ms = rng.gen_range(100..=200);
                let ahead = match skews {
                    Skews::Either => rng.gen_bool(0.5),
                    Skews::Alternating => id % 2 == 1,
                    Skews::FirstBehind => id != 1,
                };
                let skew_ms = if ahead { magnitude_ms } else { -magnitude_ms };
                let drift_ppm = rng.gen_range(-500..=500);
                (id, HostClock { skew_ms, drift_ppm, ..HostClock::default() })
            })
            .collect(),
    );
    let hosts = Hosts::default();
    let mut disks = BTreeMap::new();
    let cuts = OneWayCuts::default();
    let secret = grpc::cluster_secret()?;
    for id in 1..=NODES {
        let disk = SimDisk::with_sync_delay(Duration::from_millis(rng.gen_range(1..=12)));
        disks.insert(id, disk.clone());
        // One-value election windows: openraft's own draw plays no part.
        let election_min = 150 + rng.gen_range(0..150) + id;
        let config = leasehold_sim::raft_config(election_min).validate()?;
        let config = Arc::new(config);
        let (hosts, clocks, cuts, secret) =
            (hosts.clone(), clocks.clone(), cuts.clone(), secret.clone());
        let duties = duties.clone();
        sim.host(host_name(id), move || {
            let (disk, config) = (disk.clone(), config.clone());
            let (hosts, clocks, cuts, secret) =
                (hosts.clone(), clocks.clone(), cuts.clone(), secret.clone());
            let duties = duties.clone();
            async move {
                let (log_store, state_machine) = disk.open();
                let network = SimNetwork::new(id, cuts.clone());
                let raft = Raft::new(id, config, network, log_store.clone(), state_machine.clone())
                    .await?;
                let journal_peers = match peers {
                    Peers::Unused => NetworkFactory::new(),
                    Peers::Grpc | Peers::Gate => grpc::peers(id, &secret)?,
                };
                let journal = Journal::new(
                    journal_config(id),
                    raft.clone(),
                    Arc::new(log_store.clone()),
                    Arc::new(state_machine),
                    clocks.replica_clock(id),
                    journal_peers,
                );
                let bus_table: Arc<dyn BusStore> = match &duties {
                    Some(duties) if duties.release_both_paths => {
                        Arc::new(ReleaseBothPaths::new(id, journal.clone()))
                    }
                    _ => Arc::new(SimBusTable::default()),
                };
                let gate = (peers == Peers::Gate).then(|| gate_of(&journal, &secret, bus_table));
                let host = Host {
                    journal: journal.clone(),
                    gate: gate.clone(),
                    log_store,
                    runtime: Handle::current(),
                };
                hosts.insert(id, host);
                // Never told to stop: the host's life ends with its runtime.
                let (_running, shutdown) = tokio::sync::watch::channel(false);
                if let (Some(duties), Some(gate)) = (&duties, &gate) {
                    duties.start(id, &journal, gate, &secret, &shutdown)?;
                }
                let (served_journal, served_gate) = (journal.clone(), gate.clone());
                let services = async move {
                    match peers {
                        Peers::Unused => std::future::pending().await,
                        Peers::Grpc | Peers::Gate => {
                            grpc::serve(served_journal, served_gate, secret).await
                        }
                    }
                };

                let (guard_journal, guard_shutdown) = (journal.clone(), shutdown.clone());
                let guard = async move {
                    if guarded {
                        guard_elections(guard_journal, guard_shutdown).await;
                    }
                    std::future::pending::<()>().await;
                };
                let measured = async move {
                    match gate {
                        Some(gate) => run_adverts(gate, shutdown).await,
                        None => measure_peers(id, journal, clocks).await,
                    }
                };
                // Biased: the branches are polled in order, so tokio's
                // unseeded choice plays no part.
                tokio::select! {
                    biased;
                    served = serve(id, raft, cuts) => served?,
                    served = services => served?,
                    () = measured => {}
                    () = guard => {}
                }
                Ok(())
            }
        });
    }
    Ok(Simulation { sim, hosts, clocks, disks, faults: FaultQueue::default(), seed })
}
