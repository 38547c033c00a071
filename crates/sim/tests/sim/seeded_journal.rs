//! Goal: the replica's real `Journal` runs on the seeded simulation — its
//! stamps follow the leader host's simulated wall clock (skew and drift
//! included), its clock measurements age with simulated time, and one
//! seed gives the same history twice.
//!
//! Method: three turmoil hosts, each running openraft on its simulated
//! disk over the simulated network (as `leasehold_sim::cluster` runs
//! them) and a `Journal` over its Raft handle and stores, whose `Clock`
//! is the host's simulated clock (`Clocks::replica_clock`). Every host's
//! clock is off real time by 100–200 ms either way, from the seed. No
//! gate runs: each host records its peers' clocks once a second on its
//! own runtime, as the gate's adverts would measure them, with a zero
//! round trip. A driver (a turmoil client) forms the group, waits for a
//! leader whose clock a majority agrees with, and hands each write to
//! the leader's journal on the leader's own runtime, as the node's gRPC
//! server would: eight concurrent enqueues, a claim, an ack, a stale ack
//! and a linearizable read. The history is every answer, every entry
//! the leader wrote with its stamp, and every replica's digest.
//!
//! What fails if the feature goes: a journal on the system clock, or on
//! real time without the host's skew, stamps outside the leader host's
//! clock; a watch aging by the process's monotonic clock keeps a
//! measurement fresh after its simulated lifetime.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{Command, JobSpec, Limits, Proposal, Refusal, Response};
use leasehold_raft::{NetworkFactory, NodeId, Raft, TypeConfig};
use leasehold_replica::journal::DEFAULT_BATCHES_IN_FLIGHT;
use leasehold_replica::{Clock, Journal, JournalConfig, JournalError};
use leasehold_sim::clock::{Clocks, EPOCH_MS, HostClock};
use leasehold_sim::net::{OneWayCuts, SimNetwork, host_name, serve};
use leasehold_sim::{SimDisk, SimLogStore};
use openraft::{BasicNode, Config, Entry, EntryPayload, RaftLogReader, ServerState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Handle;
use tokio::time::Instant;

const NODES: u64 = 3;
/// How many enqueues the driver proposes at once.
const ENQUEUES: u64 = 8;
/// How often a host measures its peers' clocks (the gate's advert interval).
const MEASURE_EVERY: Duration = Duration::from_secs(1);
/// How long a measurement counts, in the runtime's (simulated) time.
const FRESH_FOR: Duration = Duration::from_secs(5);
/// The bound of every wait of the driver, in simulated time.
const WAIT: Duration = Duration::from_secs(20);

/// One running host: its journal, its log store and the runtime it runs on.
#[derive(Clone)]
struct Host {
    journal: Journal,
    log_store: SimLogStore,
    runtime: Handle,
}

/// The running hosts, as the driver sees them.
#[derive(Clone, Default)]
struct Hosts(Arc<Mutex<BTreeMap<NodeId, Host>>>);

impl Hosts {
    fn insert(&self, id: NodeId, host: Host) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id, host);
    }

    fn all(&self) -> BTreeMap<NodeId, Host> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// What one run recorded.
#[derive(Debug, Default, PartialEq)]
struct Run {
    /// One line per answer, entry and digest, simulated milliseconds first.
    history: Vec<String>,
    /// The leader's host clock, and the simulated real time the writes
    /// were made in.
    leader_clock: HostClock,
    writes_real_ms: (u64, u64),
    /// The stamps of the leader's entries from the writes.
    stamps: Vec<u64>,
}

fn real_ms() -> u64 {
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
        for peer in (1..=NODES).filter(|peer| *peer != id) {
            let sent_at = Instant::now();
            let sent_wall_ms = journal.clock().now_ms();
            let peer_now_ms = clocks.replica_clock(peer).now_ms();
            journal.clock_watch().record(peer, sent_wall_ms, sent_at, Instant::now(), peer_now_ms);
        }
    }
}

fn enqueue(n: u64) -> Command {
    let spec = JobSpec {
        queue: "q".into(),
        payload: format!("job {n}").into_bytes(),
        ..Default::default()
    };
    Command::Enqueue { jobs: vec![spec] }
}

/// Runs `command` through `host`'s journal on the host's runtime, as the
/// node's server handles a client's request there.
async fn propose(host: &Host, command: Command) -> anyhow::Result<Result<Response, JournalError>> {
    let journal = host.journal.clone();
    Ok(host.runtime.spawn(async move { journal.propose(command).await }).await?)
}

/// The leader, once it leads with an entry of its term applied and a
/// majority agrees with its clock.
async fn stamping_leader(hosts: &Hosts) -> anyhow::Result<(NodeId, Host)> {
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

/// The driver: forms the group, writes through the leader's journal, and
/// records what it saw.
async fn drive(hosts: Hosts, clocks: Clocks, run: Arc<Mutex<Run>>) -> anyhow::Result<()> {
    let mut history = Vec::new();
    let deadline = Instant::now() + WAIT;
    while hosts.all().len() < NODES as usize {
        anyhow::ensure!(Instant::now() < deadline, "the hosts did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let members: BTreeMap<NodeId, BasicNode> =
        (1..=NODES).map(|id| (id, BasicNode::new(host_name(id)))).collect();
    let first = hosts.all().get(&1).map(|host| host.journal.raft().clone());
    if let Some(raft) = first {
        raft.initialize(members).await?;
    }
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    history.push(format!("{} node {leader_id} leads and may stamp", real_ms()));
    let first_index = last_log_index(leader.journal.raft()) + 1;

    tracing::info!("--- eight concurrent enqueues through the leader's journal");
    let writes_from_ms = real_ms();
    let answers = futures::future::join_all((1..=ENQUEUES).map(|n| propose(&leader, enqueue(n))));
    for (n, answer) in (1..=ENQUEUES).zip(answers.await) {
        let answer = answer?;
        history.push(format!("{} enqueue {n} -> {answer:?}", real_ms()));
        anyhow::ensure!(matches!(answer, Ok(Response::Enqueued(_))), "enqueue {n}: {answer:?}");
    }

    tracing::info!("--- claim two, ack one, and a stale ack is refused");
    let claim = Command::ClaimOnce {
        request_id: "claim-1".into(),
        worker: "w".into(),
        queue: "q".into(),
        max: 2,
        lease_ttl_ms: Some(30_000),
        selector: Vec::new(),
    };
    let grants = match propose(&leader, claim).await?? {
        Response::Claimed(grants) => grants,
        other => anyhow::bail!("the claim was answered {other:?}"),
    };
    history.push(format!("{} claim -> {grants:?}", real_ms()));
    anyhow::ensure!(grants.len() == 2, "claimed {grants:?}");
    let (acked, held) = (&grants[0].lease, &grants[1].lease);
    let ack = Command::Ack { job_id: acked.job_id, token: acked.token, result: None };
    let answer = propose(&leader, ack).await??;
    history.push(format!("{} ack -> {answer:?}", real_ms()));
    anyhow::ensure!(answer == Response::Acked, "the ack was answered {answer:?}");
    let stale = Command::Ack { job_id: held.job_id, token: held.token + 100, result: None };
    let answer = propose(&leader, stale).await??;
    history.push(format!("{} stale ack -> {answer:?}", real_ms()));
    anyhow::ensure!(
        matches!(answer, Response::Refused(Refusal::StaleToken { .. })),
        "a stale ack was answered {answer:?}"
    );
    let writes_to_ms = real_ms();

    tracing::info!("--- a linearizable read through the leader's journal");
    let journal = leader.journal.clone();
    let read = leader
        .runtime
        .spawn(async move { journal.read(false, |state| state.stats(0).get("q").cloned()).await })
        .await??;
    history.push(format!("{} read -> {read:?}", real_ms()));

    tracing::info!("--- the leader's entries and their stamps; every replica's digest");
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
    let leader_clock = clocks.host_clock(leader_id);
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    *run = Run { history, leader_clock, writes_real_ms: (writes_from_ms, writes_to_ms), stamps };
    Ok(())
}

fn last_log_index(raft: &Raft) -> u64 {
    raft.metrics().borrow().last_log_index.unwrap_or(0)
}

/// Runs the journal on the simulation seeded with `seed`.
fn run(seed: u64) -> anyhow::Result<Run> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(rng.gen_range(2..=10)))
        .simulation_duration(Duration::from_secs(60))
        .tick_duration(Duration::from_millis(2))
        .build();
    // Every clock 100–200 ms off real time, either way: any two within
    // the 500 ms bound, and every one far enough off real time that a
    // stamp from real time shows.
    let clocks = Clocks::new(
        (1..=NODES)
            .map(|id| {
                let skew_ms = rng.gen_range(100..=200) * if rng.gen_bool(0.5) { 1 } else { -1 };
                let drift_ppm = rng.gen_range(-500..=500);
                (id, HostClock { skew_ms, drift_ppm, jumped_ms: 0 })
            })
            .collect(),
    );
    let hosts = Hosts::default();
    let cuts = OneWayCuts::default();
    for id in 1..=NODES {
        let disk = SimDisk::with_sync_delay(Duration::from_millis(rng.gen_range(1..=12)));
        // One-value election windows: openraft's own draw plays no part.
        let election_min = 150 + rng.gen_range(0..150) + id;
        let config = Config {
            heartbeat_interval: 50,
            election_timeout_min: election_min,
            election_timeout_max: election_min + 1,
            ..Config::default()
        }
        .validate()?;
        let config = Arc::new(config);
        let (hosts, clocks, cuts) = (hosts.clone(), clocks.clone(), cuts.clone());
        sim.host(host_name(id), move || {
            let (disk, config) = (disk.clone(), config.clone());
            let (hosts, clocks, cuts) = (hosts.clone(), clocks.clone(), cuts.clone());
            async move {
                let (log_store, state_machine) = disk.open();
                let network = SimNetwork::new(id, cuts.clone());
                let raft = Raft::new(id, config, network, log_store.clone(), state_machine.clone())
                    .await?;
                let journal = Journal::new(
                    journal_config(id),
                    raft.clone(),
                    Arc::new(log_store.clone()),
                    Arc::new(state_machine),
                    clocks.replica_clock(id),
                    // Never dialled: every write goes to the leader's journal.
                    NetworkFactory::new(),
                );
                let host = Host { journal: journal.clone(), log_store, runtime: Handle::current() };
                hosts.insert(id, host);
                // Biased: the first branch is polled first, so tokio's
                // unseeded choice plays no part.
                tokio::select! {
                    biased;
                    served = serve(id, raft, cuts) => served?,
                    () = measure_peers(id, journal, clocks) => {}
                }
                Ok(())
            }
        });
    }
    let recorded = Arc::new(Mutex::new(Run::default()));
    let (driver_hosts, driver_clocks, driver_run) =
        (hosts.clone(), clocks.clone(), recorded.clone());
    sim.client("driver", async move {
        drive(driver_hosts, driver_clocks, driver_run).await.map_err(|error| error.into())
    });
    sim.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(run)
}

#[test]
fn the_journal_stamps_with_its_hosts_simulated_clock_and_replays_from_its_seed()
-> anyhow::Result<()> {
    let seed = 11;
    println!("seed {seed}");
    let first = run(seed)?;
    let text = first.history.join("\n");

    // Every write went through the journal and was applied.
    assert!(text.contains("Refused(StaleToken"), "seed {seed}: no stale ack refused in\n{text}");
    assert_eq!(
        text.matches(" digest ").count(),
        NODES as usize,
        "seed {seed}: a replica is missing in\n{text}"
    );
    let digests: Vec<&str> =
        first.history.iter().filter_map(|line| line.split(" digest ").nth(1)).collect();
    assert!(digests.windows(2).all(|pair| pair[0] == pair[1]), "replicas diverged:\n{text}");
    assert!(
        !first.stamps.is_empty() && first.stamps.len() < ENQUEUES as usize + 3,
        "seed {seed}: {} entries for {} writes: not batched",
        first.stamps.len(),
        ENQUEUES + 3
    );

    // Every stamp is the leader host's clock during the writes, and none
    // could have come from real time: the clock is further off real time
    // than the writes took.
    let (from_ms, to_ms) = first.writes_real_ms;
    let clock = first.leader_clock;
    let (earliest_ms, latest_ms) = (clock.now_ms(from_ms), clock.now_ms(to_ms));
    let (real_from_ms, real_to_ms) = (EPOCH_MS + from_ms, EPOCH_MS + to_ms);
    assert!(
        latest_ms < real_from_ms || real_to_ms < earliest_ms,
        "seed {seed}: the writes took longer than the leader's skew ({clock:?}, {from_ms}..{to_ms})"
    );
    for stamp in &first.stamps {
        assert!(
            (earliest_ms..=latest_ms).contains(stamp),
            "seed {seed}: stamped {stamp}, not the leader host's clock ({earliest_ms}..={latest_ms})\n{text}"
        );
    }

    // The same seed gives the same history; another seed another one.
    let second = run(seed)?;
    assert_eq!(first, second, "seed {seed} is not deterministic");
    let other = run(seed + 1)?;
    assert_ne!(first.history, other.history, "seeds {seed} and {} ran alike", seed + 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_clock_measurement_ages_with_the_runtimes_clock() {
    // The wall clock follows the runtime's clock, as a host's does in the
    // simulation; no real time passes in this test.
    let start = Instant::now();
    let clock = Clock::from_source(Arc::new(move || {
        let elapsed_ms = Instant::now().duration_since(start).as_millis();
        i64::try_from(elapsed_ms).unwrap_or(i64::MAX).saturating_add(1_000_000)
    }));
    let journal_watch = leasehold_replica::clock_watch::ClockWatch::new(500, FRESH_FOR);
    let now = Instant::now();
    journal_watch.record(2, clock.now_ms(), now, now, clock.now_ms());
    assert!(journal_watch.verdict(1, &[1, 2], &clock).may_stamp(), "node 2 agrees");
    tokio::time::advance(FRESH_FOR - Duration::from_millis(1)).await;
    assert_eq!(journal_watch.offsets(&clock).len(), 1, "fresh until its lifetime ends");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(journal_watch.offsets(&clock).is_empty(), "stale once simulated time has passed");
    assert!(!journal_watch.verdict(1, &[1, 2], &clock).may_stamp());
}
