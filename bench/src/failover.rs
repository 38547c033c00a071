//! One failover trial against a running leasehold cluster: find the leader,
//! put a light enqueue → claim → ack load on the survivors, SIGKILL the
//! leader, and time
//!
//! - **first write**: the first enqueue the survivors accept. A probe sends
//!   one enqueue every few milliseconds, alternating between the survivors,
//!   each on a connection opened before the kill, each with its own deadline
//!   and no client-side retry; the first to succeed stops the clock (at its
//!   answer). So the number is the cluster's write outage, not a client's
//!   retry back-off.
//! - **leader seen**: the first moment a survivor reports a leader other than
//!   the killed node (its own `Status`, polled every few milliseconds).
//! - **load client**: the first enqueue one of the light-load clients (the
//!   stock `leasehold-client` with its default retries, connected to the
//!   survivors) completes after the kill: what an application would see.
//!
//! The trial prints `killed=<id>` on stdout so the script can restart that
//! node; the process is the script's child, and the script reaps it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold_client::Client;
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::access::Access;
use crate::cluster;

/// Queue the probe's enqueues go to (never claimed).
const PROBE_QUEUE: &str = "failover-probe";
/// Queue of the light load.
const LOAD_QUEUE: &str = "failover-load";
/// Deadline of one probe enqueue.
const PROBE_DEADLINE: Duration = Duration::from_secs(5);
/// Probe enqueues in flight at most.
const PROBE_MAX_IN_FLIGHT: usize = 64;

/// The shape of one trial.
#[derive(Clone, Debug)]
pub struct FailoverConfig {
    /// gRPC addresses of nodes 1..=n.
    pub addrs: Vec<String>,
    /// Process ids of nodes 1..=n.
    pub pids: Vec<i32>,
    /// Trial number (for the report).
    pub trial: u32,
    /// Light-load clients.
    pub load_clients: usize,
    /// Pause between a load client's cycles.
    pub load_pause: Duration,
    /// How long the load runs before the kill.
    pub settle: Duration,
    /// How often the probe sends an enqueue, and the leader watch asks.
    pub probe_interval: Duration,
    /// Give up on a trial after this long without a write.
    pub give_up: Duration,
}

/// The result of one trial (one JSON line).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FailoverTrial {
    /// Trial number.
    pub trial: u32,
    /// The node killed (the leader before the kill).
    pub killed: u64,
    /// The leader the survivors reported after the kill; 0 if none was seen.
    pub new_leader: u64,
    /// Kill → a survivor reports a new leader, milliseconds.
    pub leader_seen_ms: Option<f64>,
    /// Kill → the first enqueue the survivors accept, milliseconds.
    pub first_write_ms: Option<f64>,
    /// Kill → a light-load client's first completed enqueue, milliseconds.
    pub load_client_ms: Option<f64>,
    /// Probe enqueues sent before the first success.
    pub probe_attempts: u64,
    /// Light-load calls that failed after the kill.
    pub load_errors: u64,
    /// Light-load cycles completed before the kill.
    pub load_cycles_before: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Addresses of every node but `id`.
fn survivors(addrs: &[String], id: u64) -> Vec<String> {
    addrs
        .iter()
        .enumerate()
        .filter(|(index, _)| u64::try_from(*index + 1).ok() != Some(id))
        .map(|(_, addr)| addr.clone())
        .collect()
}

fn spec(queue: &str) -> v1::JobSpec {
    v1::JobSpec {
        queue: queue.to_string(),
        payload: vec![0x5a; 64],
        lease_ttl_ms: Some(30_000),
        ..Default::default()
    }
}

/// Runs one trial.
pub async fn trial(config: &FailoverConfig) -> anyhow::Result<FailoverTrial> {
    anyhow::ensure!(config.addrs.len() >= 3, "a failover needs at least three nodes");
    anyhow::ensure!(config.pids.len() == config.addrs.len(), "one pid per address");
    // The failover cluster is a plaintext one (the TLS cost is measured by
    // the throughput part).
    let access = Access::plaintext();
    let leader = cluster::agreed_leader(&config.addrs, &access).await?;
    let index = usize::try_from(leader)? - 1;
    let pid = config.pids[index];
    let survivors = survivors(&config.addrs, leader);

    // Light load on the survivors (they forward to the leader until it dies).
    let (kill_tx, kill_rx) = watch::channel::<Option<Instant>>(None);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (load_first_tx, mut load_first) = watch::channel::<Option<Instant>>(None);
    let load_first_tx = Arc::new(load_first_tx);
    let load_errors = Arc::new(AtomicU64::new(0));
    let cycles_before = Arc::new(AtomicU64::new(0));
    let mut load = tokio::task::JoinSet::new();
    for client_index in 0..config.load_clients {
        let mut addrs = survivors.clone();
        addrs.rotate_left(client_index % survivors.len());
        let client = Client::connect(&addrs.join(","))?;
        load.spawn(load_client(
            client,
            format!("failover-load-{client_index}"),
            config.load_pause,
            kill_rx.clone(),
            stop_rx.clone(),
            Arc::clone(&load_first_tx),
            Arc::clone(&load_errors),
            Arc::clone(&cycles_before),
        ));
    }

    // Probe connections, opened now so no connect is timed.
    let mut probes = Vec::new();
    for addr in &survivors {
        let client = Client::connect(addr)?.with_retry(cluster::no_retry());
        client.stats(Some(PROBE_QUEUE.to_string()), true).await?;
        probes.push(client);
    }
    let mut watchers = Vec::new();
    for addr in &survivors {
        let mut stub = ClusterClient::new(access.channel(addr)?);
        cluster::local_status(&mut stub, &access, Duration::from_secs(2)).await?;
        watchers.push(stub);
    }

    tokio::time::sleep(config.settle).await;

    // The kill.
    let killed_at = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)?;
    let _ = kill_tx.send(Some(killed_at));
    eprintln!("failover trial {}: SIGKILL to node {leader} (pid {pid})", config.trial);

    // Leader watch: one task per survivor.
    let (seen_tx, mut seen_rx) = watch::channel::<Option<(Instant, u64)>>(None);
    let mut watch_tasks = tokio::task::JoinSet::new();
    for mut stub in watchers {
        let seen_tx = seen_tx.clone();
        let interval = config.probe_interval;
        let plaintext = access.clone();
        watch_tasks.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            loop {
                ticker.tick().await;
                if let Ok(status) =
                    cluster::local_status(&mut stub, &plaintext, Duration::from_millis(500)).await
                    && status.leader != 0
                    && status.leader != leader
                {
                    let at = Instant::now();
                    seen_tx.send_if_modified(|seen| {
                        if seen.is_none() {
                            *seen = Some((at, status.leader));
                            true
                        } else {
                            false
                        }
                    });
                    return;
                }
            }
        });
    }

    // Probe: an enqueue every interval, alternating survivors.
    let mut attempts = 0_u64;
    let mut in_flight = tokio::task::JoinSet::new();
    let mut ticker = tokio::time::interval(config.probe_interval);
    let give_up = killed_at + config.give_up;
    let first_write = loop {
        tokio::select! {
            _ = ticker.tick() => {
                if Instant::now() >= give_up {
                    break None;
                }
                if in_flight.len() < PROBE_MAX_IN_FLIGHT {
                    let client = probes[usize::try_from(attempts)? % probes.len()].clone();
                    attempts += 1;
                    in_flight.spawn(async move {
                        let call = client.enqueue(vec![spec(PROBE_QUEUE)]);
                        match tokio::time::timeout(PROBE_DEADLINE, call).await {
                            Ok(Ok(_)) => Some(Instant::now()),
                            _ => None,
                        }
                    });
                }
            }
            Some(done) = in_flight.join_next() => {
                if let Ok(Some(at)) = done {
                    break Some(at);
                }
            }
        }
    };
    in_flight.abort_all();

    // Give the leader watch and the load clients a little longer to report.
    let wait_more = Instant::now() + Duration::from_secs(3);
    while seen_rx.borrow().is_none() && Instant::now() < wait_more {
        let _ = tokio::time::timeout_at(wait_more, seen_rx.changed()).await;
    }
    watch_tasks.abort_all();
    let load_deadline = Instant::now() + Duration::from_secs(10);
    while load_first.borrow().is_none() && Instant::now() < load_deadline {
        let _ = tokio::time::timeout_at(load_deadline, load_first.changed()).await;
    }
    let _ = stop_tx.send(true);
    while load.join_next().await.is_some() {}
    let load_first_at = *load_first.borrow();

    let seen = *seen_rx.borrow();
    Ok(FailoverTrial {
        trial: config.trial,
        killed: leader,
        new_leader: seen.map_or(0, |(_, id)| id),
        leader_seen_ms: seen.map(|(at, _)| ms(at - killed_at)),
        first_write_ms: first_write.map(|at| ms(at - killed_at)),
        load_client_ms: load_first_at.map(|at| ms(at - killed_at)),
        probe_attempts: attempts,
        load_errors: load_errors.load(Ordering::Relaxed),
        load_cycles_before: cycles_before.load(Ordering::Relaxed),
    })
}

/// A light-load client: enqueue → claim → ack, a pause, again. The first
/// enqueue that starts after the kill and completes is reported through
/// `first` (the earliest of all clients wins); the client then goes on.
#[allow(clippy::too_many_arguments)]
async fn load_client(
    client: Client,
    worker: String,
    pause: Duration,
    kill: watch::Receiver<Option<Instant>>,
    mut stop: watch::Receiver<bool>,
    first: Arc<watch::Sender<Option<Instant>>>,
    errors: Arc<AtomicU64>,
    cycles_before: Arc<AtomicU64>,
) {
    loop {
        let killed_at = *kill.borrow();
        let cycle = async {
            client.enqueue(vec![spec(LOAD_QUEUE)]).await?;
            if killed_at.is_some() {
                let at = Instant::now();
                first.send_if_modified(|first| {
                    if first.is_none_or(|earlier| at < earlier) {
                        *first = Some(at);
                        true
                    } else {
                        false
                    }
                });
            }
            let request = v1::ClaimRequest {
                worker: worker.clone(),
                queue: LOAD_QUEUE.to_string(),
                max: 1,
                lease_ttl_ms: Some(30_000),
                selector: Vec::new(),
                wait_ms: 1_000,
                ..Default::default()
            };
            let grants = client.claim(request).await?;
            if let Some(lease) = grants.first().and_then(|g| g.lease.as_ref()) {
                client.ack(lease.job_id, lease.token).await?;
            }
            Ok::<_, anyhow::Error>(())
        };
        tokio::select! {
            _ = stop.changed() => return,
            outcome = cycle => match outcome {
                Ok(()) => {
                    if kill.borrow().is_none() {
                        cycles_before.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(_) => {
                    if kill.borrow().is_some() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
