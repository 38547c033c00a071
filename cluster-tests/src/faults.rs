//! The nemesis: injects one planned fault and heals it. Process faults go
//! through the [`Supervisor`] (SIGKILL, SIGSTOP/SIGCONT, SIGTERM, restart);
//! network faults through the per-node [`Proxy`]s (see `proxy.rs` for how a
//! proxy tells links apart); clock and store faults through the node's
//! `leasehold.v1.Faults` service, which exists only with `--fault-injection`
//! and needs the `admin` role (so do gate flips, `Cluster.SetFlags`); the
//! drainer's lease reads use a `reader` token.
//!
//! Every injection and heal is recorded in the history as an operation of
//! the process `nemesis`, with the nodes it actually hit.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_proto::v1;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::disk::Disks;
use crate::history::{History, LeaseRecord, OpFunction, OpType, OpValue};
use crate::plan::{ClientLinkMode, Fault, Target};
use crate::proxy::{LinkRule, Mode, Proxy, Source};
use crate::security::{Role, Security};
use crate::supervisor::{ProcessState, Supervisor};

/// The proxies, one per node, and the link-level faults built from them.
pub struct Network {
    proxies: BTreeMap<u64, Proxy>,
}

impl Network {
    /// The network over `proxies` (node id → the proxy in front of it).
    pub fn new(proxies: BTreeMap<u64, Proxy>) -> Network {
        Network { proxies }
    }

    /// The client-facing addresses (every proxy), comma-separated order.
    pub fn client_addrs(&self) -> Vec<String> {
        self.proxies.values().map(|p| p.listen_addr().to_string()).collect()
    }

    fn proxy(&self, id: u64) -> anyhow::Result<&Proxy> {
        self.proxies.get(&id).ok_or_else(|| anyhow::anyhow!("no proxy for node {id}"))
    }

    /// Messages from `from` to `to` are lost both as requests `from` sends
    /// and as answers `from` gives to `to`'s requests.
    pub fn cut_one_way(&self, from: u64, to: u64) -> anyhow::Result<()> {
        self.proxy(to)?.set_direction(Source::Node(from), Some(Mode::Blackhole), None);
        self.proxy(from)?.set_direction(Source::Node(to), None, Some(Mode::Blackhole));
        Ok(())
    }

    /// No message passes between `a` and `b`.
    pub fn cut(&self, a: u64, b: u64) -> anyhow::Result<()> {
        self.proxy(a)?.set(Source::Node(b), LinkRule::both(Mode::Blackhole));
        self.proxy(b)?.set(Source::Node(a), LinkRule::both(Mode::Blackhole));
        Ok(())
    }

    /// Cuts every link between the groups (a partition).
    pub fn partition(&self, groups: &[Vec<u64>]) -> anyhow::Result<()> {
        for (i, left) in groups.iter().enumerate() {
            for right in groups.iter().skip(i + 1) {
                for a in left {
                    for b in right {
                        self.cut(*a, *b)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets `mode` on every node→node link, both directions.
    pub fn all_peer_links(&self, mode: Mode) {
        let ids: Vec<u64> = self.proxies.keys().copied().collect();
        for (id, proxy) in &self.proxies {
            for other in ids.iter().filter(|o| *o != id) {
                proxy.set(Source::Node(*other), LinkRule::both(mode));
            }
        }
    }

    /// Applies `mode` to the client links (the workload's connections) of
    /// node `id`'s proxy; node↔node links are untouched.
    pub fn client_links(&self, id: u64, mode: Mode) -> anyhow::Result<()> {
        self.proxy(id)?.set(Source::Client, LinkRule::both(mode));
        Ok(())
    }

    /// Holds everything the peers send to `target`: their requests (at the
    /// target's proxy) and their answers to its requests (at theirs).
    pub fn hold_into(&self, target: u64) -> anyhow::Result<()> {
        let proxy = self.proxy(target)?;
        for other in self.proxies.keys().filter(|o| **o != target) {
            proxy.set_direction(Source::Node(*other), Some(Mode::Hold), None);
            self.proxy(*other)?.set_direction(Source::Node(target), None, Some(Mode::Hold));
        }
        Ok(())
    }

    /// Every link passes again.
    pub fn heal(&self) {
        for proxy in self.proxies.values() {
            proxy.heal();
        }
    }

    /// Totals over every proxy: (connections, resets, dropped, held, delayed bytes).
    pub fn stats(&self) -> BTreeMap<&'static str, u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut totals = BTreeMap::new();
        for proxy in self.proxies.values() {
            let stats = proxy.stats();
            for (name, value) in [
                ("connections", stats.connections.load(Relaxed)),
                ("resets", stats.resets.load(Relaxed)),
                ("bytes_dropped", stats.bytes_dropped.load(Relaxed)),
                ("bytes_held", stats.bytes_held.load(Relaxed)),
                ("bytes_delayed", stats.bytes_delayed.load(Relaxed)),
            ] {
                *totals.entry(name).or_insert(0) += value;
            }
        }
        totals
    }
}

/// What must be undone at heal.
#[derive(Default)]
pub struct Active {
    round: usize,
    kind: &'static str,
    restart: Vec<u64>,
    resume: Vec<u64>,
    clocks: Vec<u64>,
    kill_then_restart: Vec<u64>,
    network: bool,
    strobe: Option<tokio::task::JoinHandle<()>>,
    /// A handover round's next claimer, stopped at heal.
    claimer: Option<tokio::task::JoinHandle<()>>,
    /// Disk-full targets.
    disks: Vec<u64>,
    /// Nodes whose journal_lease flag was turned off.
    gate: Vec<u64>,
    /// Nodes removed and wiped, to join afresh at heal.
    rejoin: Vec<u64>,
    /// What the injection found (recorded with the fault).
    note: Option<String>,
}

/// What the nemesis needs for the workload-facing faults (drains' lease
/// reads, disk-full data dirs).
pub struct Extras {
    /// Client addresses (the proxies).
    pub addrs: Vec<String>,
    /// The queue whose leases a drained node may hold (the command queue).
    pub command_queue: String,
    /// How long after a drained node's exit its leases are read again.
    pub ttl_read_after: Duration,
    /// The tmpfs data dirs (disk-full mode), if any.
    pub disks: Option<Disks>,
    /// The run's credentials (the lease reads call as `reader`).
    pub security: Security,
    /// The workload's queue (a late-replies round claims from it).
    pub queue: String,
}

/// The queue of a handover round's own jobs (apart from the workload's, so
/// no other checker counts them).
pub const HANDOVER_QUEUE: &str = "handover";
/// The process that holds a handover round's leases; the one that claims
/// them next is `handover-next`.
const HANDOVER: &str = "handover";
/// The process whose claims a late-replies round answers late.
const LATE: &str = "late-replies";
/// How many jobs a handover round puts under one lease holder.
const HANDOVER_JOBS: usize = 3;

/// Injects and heals faults.
pub struct Nemesis {
    /// The node processes.
    pub supervisor: Supervisor,
    /// The proxies.
    pub network: Network,
    history: History,
    rng: StdRng,
    extras: Option<Extras>,
    /// Lease reads a TTL after a drain, still running.
    later: tokio::task::JoinSet<()>,
    /// What the last heal did beyond the usual (recorded with it).
    heal_note: Option<String>,
    /// The clock bound the nodes enforce.
    clock_bound_ms: u64,
}

const PROCESS: &str = "nemesis";
/// The process name of a disk-full round's own writer.
const DISK_WRITER: &str = "disk-writer";

/// Enqueues a job every 200 ms until aborted at heal, each recorded as a
/// producer's enqueue (its value names the round and its number).
async fn disk_full_writer(
    history: History,
    client: leasehold_client::Client,
    queue: String,
    round: usize,
) {
    for n in 0_u64.. {
        let value = format!("job-disk{round}-{n}");
        let spec = v1::JobSpec {
            queue: queue.clone(),
            payload: value.as_bytes().to_vec(),
            idempotency_key: Some(value.clone()),
            ..v1::JobSpec::default()
        };
        let base = OpValue { value: Some(value), poison: Some(false), ..OpValue::default() };
        history.invoke(DISK_WRITER, OpFunction::Enqueue, base.clone());
        let answer = tokio::time::timeout(Duration::from_secs(5), client.enqueue(vec![spec])).await;
        let (kind, value) = match answer {
            Ok(Ok(results)) => {
                let first = results.first();
                let value = OpValue {
                    job_id: first.map(|r| r.job_id),
                    duplicate: first.map(|r| r.duplicate),
                    ..base
                };
                (OpType::Ok, value)
            }
            Ok(Err(error)) => (OpType::Info, OpValue { message: Some(error.to_string()), ..base }),
            Err(_) => (OpType::Info, OpValue { message: Some("timed out".into()), ..base }),
        };
        history.record(DISK_WRITER, kind, OpFunction::Enqueue, value);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
const DRAINER: &str = "drainer";
/// Gate flips are their own process: the nemesis's fault operation is
/// still open while it flips (one operation at a time per process).
const GATE: &str = "gate";
/// How long a restarted node may take to serve again in a rolling drain.
const RESTART_LIMIT: Duration = Duration::from_secs(30);

/// A claim as `process`, recorded in the history like a worker's (with the
/// leases granted and the node's hold); with `ack`, each lease granted is
/// settled at once as a worker would ([`settle`]: acked, or nacked when the
/// job is a poison one), that call recorded too. Answers how many were
/// granted.
async fn claim_recorded(
    history: &History,
    process: &str,
    client: &leasehold_client::Client,
    request: v1::ClaimRequest,
    ack: bool,
) -> anyhow::Result<usize> {
    history.invoke(process, OpFunction::Claim, OpValue::default());
    let ended =
        tokio::time::timeout(Duration::from_secs(12), client.claim_with_wait(request)).await;
    let reply = match ended {
        Ok(Ok(reply)) => reply,
        Ok(Err(error)) => {
            let value = OpValue { message: Some(error.to_string()), ..OpValue::default() };
            history.record(process, OpType::Info, OpFunction::Claim, value);
            return Err(error.into());
        }
        Err(_) => {
            let value = OpValue { message: Some("timed out".to_string()), ..OpValue::default() };
            history.record(process, OpType::Info, OpFunction::Claim, value);
            anyhow::bail!("claim timed out");
        }
    };
    let leases: Vec<LeaseRecord> = reply
        .grants
        .iter()
        .filter_map(|g| g.lease.as_ref().map(|l| crate::workload::lease_record(l, g.job.as_ref())))
        .collect();
    let granted = leases.len();
    let value = OpValue { leases, waited_ms: Some(reply.waited_ms), ..OpValue::default() };
    history.record(process, OpType::Ok, OpFunction::Claim, value);
    if ack {
        for grant in &reply.grants {
            let Some(lease) = &grant.lease else { continue };
            let base = OpValue {
                job_id: Some(lease.job_id),
                token: Some(lease.token),
                ..OpValue::default()
            };
            let limit = Duration::from_secs(12);
            let (f, ended) = match settle(grant.job.as_ref()) {
                OpFunction::Nack => {
                    history.invoke(process, OpFunction::Nack, base.clone());
                    let request = v1::NackRequest {
                        job_id: lease.job_id,
                        token: lease.token,
                        error: "chaos: a poison job".to_string(),
                        retry_after_ms: Some(100),
                    };
                    let nacked = tokio::time::timeout(limit, client.nack(request)).await;
                    (OpFunction::Nack, nacked.map(|r| r.map(|_| ())))
                }
                _ => {
                    history.invoke(process, OpFunction::Ack, base.clone());
                    let acked =
                        tokio::time::timeout(limit, client.ack(lease.job_id, lease.token)).await;
                    (OpFunction::Ack, acked)
                }
            };
            let (kind, message) = match ended {
                Ok(Ok(())) => (OpType::Ok, None),
                Ok(Err(error)) => (OpType::Info, Some(error.to_string())),
                Err(_) => (OpType::Info, Some("timed out".to_string())),
            };
            history.record(process, kind, f, OpValue { message, ..base });
        }
    }
    Ok(granted)
}

/// How a fault's own claimer settles a grant of `job`: as every worker
/// does, an ack, except that a poison job (the workload's
/// [`crate::workload::POISON_PREFIX`]) is never acked but nacked. Its ack
/// would often count: the claimer's answer may come after the lease lapsed,
/// and an ack under a lease a sweep took back still finishes the job until
/// it is granted again (SPEC §3), a dead one too.
fn settle(job: Option<&v1::Job>) -> OpFunction {
    let poison =
        job.is_some_and(|job| job.payload.starts_with(crate::workload::POISON_PREFIX.as_bytes()));
    if poison { OpFunction::Nack } else { OpFunction::Ack }
}

/// Reads the leases a drained node holds, as `reader`.
#[derive(Clone)]
struct LeaseReader {
    history: History,
    security: Security,
    /// The client addresses, comma-separated.
    addrs: String,
    /// The command queue.
    queue: String,
}

impl LeaseReader {
    /// The leases of the command queue held by node `id`'s executor, read
    /// linearizably, recorded as a `lease_read` of the drainer.
    async fn read(
        &self,
        round: usize,
        id: u64,
        phase: &'static str,
        exit_code: Option<i32>,
    ) -> usize {
        let history = &self.history;
        let base = OpValue {
            round: Some(round),
            nodes: vec![id],
            phase: Some(phase.to_string()),
            exit_code,
            ..OpValue::default()
        };
        history.invoke(DRAINER, OpFunction::LeaseRead, base.clone());
        let holder = format!("node-{id}");
        let read = async {
            let client = self.security.client(&self.addrs, Role::Reader)?;
            let request = v1::ListJobsRequest {
                queue: Some(self.queue.clone()),
                state: v1::JobState::Claimed as i32,
                page_size: 1_000,
                page_token: String::new(),
                stale: false,
            };
            let page = client.list_jobs(request).await?;
            let held: Vec<LeaseRecord> = page
                .jobs
                .iter()
                .filter_map(|job| job.lease.as_ref())
                .filter(|lease| lease.holder == holder)
                .map(|lease| LeaseRecord {
                    job_id: lease.job_id,
                    holder: lease.holder.clone(),
                    token: lease.token,
                    epoch: lease.epoch,
                    granted_at_ms: lease.granted_at_ms,
                    expires_at_ms: lease.expires_at_ms,
                    value: None,
                    attempts: None,
                })
                .collect();
            anyhow::Ok(held)
        };
        match tokio::time::timeout(Duration::from_secs(15), read).await {
            Ok(Ok(leases)) => {
                let held = leases.len();
                history.record(
                    DRAINER,
                    OpType::Ok,
                    OpFunction::LeaseRead,
                    OpValue { leases, ..base },
                );
                held
            }
            Ok(Err(error)) => {
                let message = Some(format!("{error:#}"));
                history.record(
                    DRAINER,
                    OpType::Info,
                    OpFunction::LeaseRead,
                    OpValue { message, ..base },
                );
                0
            }
            Err(_) => {
                let message = Some("timed out".to_string());
                history.record(
                    DRAINER,
                    OpType::Info,
                    OpFunction::LeaseRead,
                    OpValue { message, ..base },
                );
                0
            }
        }
    }
}

/// Empties a data dir (keeping the dir itself: it may be a mount point).
fn wipe(dir: &std::path::Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

impl Nemesis {
    /// A nemesis over a started cluster. `rng` makes the run-time choices
    /// (which follower) deterministic for a given cluster state.
    pub fn new(supervisor: Supervisor, network: Network, history: History, rng: StdRng) -> Nemesis {
        Nemesis {
            supervisor,
            network,
            history,
            rng,
            extras: None,
            later: tokio::task::JoinSet::new(),
            heal_note: None,
            clock_bound_ms: crate::plan::DEFAULT_CLOCK_BOUND_MS,
        }
    }

    /// The clock bound the nodes enforce (what a clock fault is judged by).
    pub fn with_clock_bound(mut self, bound_ms: u64) -> Nemesis {
        self.clock_bound_ms = bound_ms;
        self
    }

    /// Adds what drains and disk-full rounds need.
    pub fn with_extras(mut self, extras: Extras) -> Nemesis {
        self.extras = Some(extras);
        self
    }

    /// Waits (bounded) for the lease reads still pending after drains.
    pub async fn finish(&mut self) {
        let limit = self.extras.as_ref().map(|e| e.ttl_read_after).unwrap_or_default()
            + Duration::from_secs(30);
        if tokio::time::timeout(limit, async { while self.later.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            self.later.abort_all();
        }
    }

    /// Gives the tmpfs mounts back (after the nodes stopped).
    pub fn release_disks(&mut self) {
        if let Some(extras) = self.extras.as_mut() {
            extras.disks = None;
        }
    }

    /// What the drainer's lease reads need (a clone travels to the read a
    /// TTL after the exit).
    fn lease_reader(&self) -> anyhow::Result<LeaseReader> {
        let Some(extras) = self.extras.as_ref() else {
            anyhow::bail!("drain faults need the workload's addresses");
        };
        Ok(LeaseReader {
            history: self.history.clone(),
            security: extras.security.clone(),
            addrs: extras.addrs.join(","),
            queue: extras.command_queue.clone(),
        })
    }

    /// Drains node `id`: reads its leases, SIGTERMs it, waits for the exit,
    /// reads its leases again (and once more a TTL later, in the
    /// background), and restarts it; with `wait`, until it serves again.
    async fn drain_node(&mut self, round: usize, id: u64, wait: bool) -> anyhow::Result<()> {
        let reader = self.lease_reader()?;
        let after = self.extras.as_ref().map(|e| e.ttl_read_after).unwrap_or_default();
        if self.supervisor.state(id) == ProcessState::Down {
            self.supervisor.restart(id)?;
            return Ok(());
        }
        // Drain a node while it holds a lease when that comes soon (the
        // release step is what is under test): read up to ~4 s for one.
        for _ in 0..10 {
            if reader.read(round, id, "before", None).await > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        self.supervisor.terminate(id).await?;
        let code = self.supervisor.last_exit_code(id);
        tracing::info!(node = id, ?code, "drained node exited");
        let _ = reader.read(round, id, "exit", code).await;
        self.later.spawn(async move {
            tokio::time::sleep(after).await;
            let _ = reader.read(round, id, "ttl", None).await;
        });
        self.supervisor.restart(id)?;
        if wait {
            self.wait_serving(id, RESTART_LIMIT).await?;
        }
        Ok(())
    }

    /// Sets node `id`'s `journal_lease` flag (asked directly, not through
    /// its proxy), recorded as a `gate_flip` with the path asked for.
    async fn set_gate(&self, round: usize, id: u64, journal_lease: bool) -> anyhow::Result<()> {
        let base = OpValue {
            round: Some(round),
            nodes: vec![id],
            phase: Some(if journal_lease { "journal" } else { "bus" }.to_string()),
            ..OpValue::default()
        };
        self.history.invoke(GATE, OpFunction::GateFlip, base.clone());
        let mut client = self.supervisor.cluster(id, Role::Admin)?;
        let mut request = tonic::Request::new(v1::SetFlagsRequest {
            id,
            journal_lease: Some(journal_lease),
            dry_run: None,
        });
        request.set_timeout(Duration::from_secs(5));
        match client.set_flags(request).await {
            Ok(_) => {
                self.history.record(GATE, OpType::Ok, OpFunction::GateFlip, base);
                Ok(())
            }
            Err(status) => {
                let message = Some(status.message().to_string());
                let code = Some(format!("{:?}", status.code()));
                self.history.record(
                    GATE,
                    OpType::Info,
                    OpFunction::GateFlip,
                    OpValue { message, code, ..base },
                );
                Err(status.into())
            }
        }
    }

    /// Removes node `id` from the membership, asked of the leader (another
    /// member once `id` is down), retried a few times (a leader may be
    /// between elections).
    async fn remove_member(&self, id: u64) -> anyhow::Result<()> {
        let mut last_error = None;
        for _ in 0..10 {
            let Some(leader) = self.leader().await.filter(|l| *l != id) else {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            };
            let mut client = self.supervisor.cluster(leader, Role::Admin)?;
            let mut request = tonic::Request::new(v1::RemoveRequest { id });
            request.set_timeout(Duration::from_secs(5));
            match client.remove(request).await {
                Ok(_) => return Ok(()),
                Err(status) => last_error = Some(status.message().to_string()),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        anyhow::bail!("removing node {id}: {}", last_error.unwrap_or_else(|| "no leader".into()))
    }

    /// Starts node `id` (its data dir wiped) as a fresh node that joins the
    /// leader, and waits until it serves as a voter.
    async fn join_fresh(&mut self, id: u64) -> anyhow::Result<()> {
        if self.supervisor.state(id) != ProcessState::Down {
            return Ok(());
        }
        let leader = self
            .leader()
            .await
            .filter(|l| *l != id)
            .ok_or_else(|| anyhow::anyhow!("node {id} cannot join: no leader"))?;
        let member = self.supervisor.spec(leader)?.grpc;
        self.supervisor.start(id, Some(member))?;
        self.wait_serving(id, RESTART_LIMIT).await
    }

    /// Waits until node `id` answers its status as a voter with a leader
    /// known and its applied index within reach of the leader's.
    async fn wait_serving(&self, id: u64, limit: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let statuses = self.supervisor.statuses().await;
            let leader_applied =
                statuses.values().filter(|s| s.role == "leader").map(|s| s.applied_index).max();
            if let (Some(mine), Some(leader)) = (statuses.get(&id), leader_applied)
                && mine.applied_index + 50 >= leader
                && (mine.role == "follower" || mine.role == "leader")
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("node {id} did not serve again within {} ms", limit.as_millis());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn leader(&self) -> Option<u64> {
        // A leader may be between elections: wait a little for one.
        for _ in 0..25 {
            if let Some(leader) = self.supervisor.leader().await {
                return Some(leader);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// The nodes a target names now; `exclude` keeps a node out (the other
    /// end of a one-way cut).
    async fn resolve(&mut self, target: Target, exclude: Option<u64>) -> anyhow::Result<Vec<u64>> {
        let ids: Vec<u64> =
            self.supervisor.ids().into_iter().filter(|id| Some(*id) != exclude).collect();
        if ids.is_empty() {
            anyhow::bail!("no node to target");
        }
        let leader = self.leader().await;
        let pick = |rng: &mut StdRng, from: &[u64]| from.choose(rng).copied();
        let chosen = match target {
            Target::Node(id) if ids.contains(&id) => vec![id],
            Target::Node(_) => pick(&mut self.rng, &ids).into_iter().collect(),
            Target::Leader => match leader.filter(|l| ids.contains(l)) {
                Some(leader) => vec![leader],
                None => pick(&mut self.rng, &ids).into_iter().collect(),
            },
            Target::Follower => {
                let followers: Vec<u64> =
                    ids.iter().copied().filter(|id| Some(*id) != leader).collect();
                let from = if followers.is_empty() { &ids } else { &followers };
                pick(&mut self.rng, from).into_iter().collect()
            }
            Target::Majority => {
                let size = self.supervisor.ids().len() / 2 + 1;
                let mut chosen: Vec<u64> = leader.into_iter().collect();
                let mut rest: Vec<u64> =
                    ids.iter().copied().filter(|id| Some(*id) != leader).collect();
                rest.shuffle(&mut self.rng);
                chosen.extend(rest.into_iter().take(size.saturating_sub(chosen.len())));
                chosen
            }
        };
        Ok(chosen)
    }

    /// A leader change between clocks within the bound of each other node
    /// but not of each other: the leader's clock steps `offset_ms` behind,
    /// it grants [`HANDOVER_JOBS`] leases of `lease_ttl_ms` to the holder,
    /// it is killed, and whichever node leads next steps `offset_ms` ahead
    /// while the third drifts at `drift_rate`. A claimer then waits for the
    /// jobs under the new leader; `lease_exclusivity` judges in real time
    /// whether they came back before the holder's lease was due.
    async fn handover(
        &mut self,
        active: &mut Active,
        offset_ms: i64,
        lease_ttl_ms: u64,
        drift_rate: f64,
    ) -> anyhow::Result<Vec<u64>> {
        use crate::checkers::clock_bound::ADVERT_INTERVAL_MS;
        let Some(extras) = self.extras.as_ref() else {
            anyhow::bail!("a handover needs the workload's addresses");
        };
        let (security, addrs) = (extras.security.clone(), extras.addrs.join(","));
        let old = self.resolve(Target::Leader, None).await?;
        let old = old.first().copied().ok_or_else(|| anyhow::anyhow!("no leader"))?;
        active.clocks.push(old);
        self.set_clock(old, -offset_ms, 1.0).await?;
        // Two advert intervals: the peers measure the step before it grants.
        tokio::time::sleep(Duration::from_millis(2 * ADVERT_INTERVAL_MS)).await;
        let producer = security.client(&addrs, Role::Producer)?;
        let specs: Vec<v1::JobSpec> = (0..HANDOVER_JOBS)
            .map(|i| v1::JobSpec {
                queue: HANDOVER_QUEUE.to_string(),
                payload: format!("handover-{}-{i}", active.round).into_bytes(),
                idempotency_key: Some(format!("handover-{}-{i}", active.round)),
                ..v1::JobSpec::default()
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(10), producer.enqueue(specs))
            .await
            .map_err(|_| anyhow::anyhow!("handover: enqueue timed out"))??;
        let worker = security.client(&addrs, Role::Worker)?;
        let request = v1::ClaimRequest {
            worker: HANDOVER.to_string(),
            queue: HANDOVER_QUEUE.to_string(),
            max: HANDOVER_JOBS as u32,
            lease_ttl_ms: Some(lease_ttl_ms),
            wait_ms: 1_000,
            ..Default::default()
        };
        let held = claim_recorded(&self.history, HANDOVER, &worker, request, false).await?;
        if held == 0 {
            anyhow::bail!("handover: the holder was granted no lease");
        }
        // Killed while the holder's leases are fresh: they outlive the new
        // term's grace, so the clock bound decides when they come back.
        active.restart.push(old);
        self.supervisor.kill(old).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let new = loop {
            if let Some(leader) = self.supervisor.leader().await.filter(|l| *l != old) {
                break leader;
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("handover: no new leader within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        active.clocks.push(new);
        self.set_clock(new, offset_ms, 1.0).await?;
        let third: Vec<u64> =
            self.supervisor.ids().into_iter().filter(|id| *id != old && *id != new).collect();
        for id in &third {
            active.clocks.push(*id);
            self.set_clock(*id, 0, drift_rate).await?;
        }
        let history = self.history.clone();
        let limit = Duration::from_millis(lease_ttl_ms + 5_000);
        active.claimer = Some(tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut taken = 0;
            while taken < held && started.elapsed() < limit {
                let request = v1::ClaimRequest {
                    worker: format!("{HANDOVER}-next"),
                    queue: HANDOVER_QUEUE.to_string(),
                    max: HANDOVER_JOBS as u32,
                    lease_ttl_ms: Some(2_000),
                    wait_ms: 1_000,
                    ..Default::default()
                };
                let process = format!("{HANDOVER}-next");
                match claim_recorded(&history, &process, &worker, request, true).await {
                    Ok(got) => taken += got,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }));
        active.note = Some(format!(
            "node {old} at {:+} ms granted {held} leases of {lease_ttl_ms} ms and was killed; node {new} leads at {offset_ms:+} ms; nodes {third:?} drift at {drift_rate}",
            -offset_ms
        ));
        Ok(vec![old, new])
    }

    async fn set_clock(&self, id: u64, offset_ms: i64, rate: f64) -> anyhow::Result<()> {
        let mut faults = self.supervisor.faults(id)?;
        let mut request = tonic::Request::new(v1::SetClockRequest { offset_ms, rate });
        request.set_timeout(Duration::from_secs(2));
        faults.set_clock(request).await?;
        Ok(())
    }

    /// Injects `fault` (round `round`) and answers what heal must undo —
    /// also when the injection failed halfway — with the injection's result.
    /// `hold_ms` is how long it will hold (a drift is beyond the bound only
    /// some time in).
    pub async fn inject(
        &mut self,
        round: usize,
        fault: &Fault,
        hold_ms: u64,
    ) -> (Active, anyhow::Result<()>) {
        let describe = OpValue {
            fault: Some(fault.kind().to_string()),
            round: Some(round),
            message: Some(format!("{fault:?}")),
            ..OpValue::default()
        };
        self.history.invoke(PROCESS, OpFunction::Fault, describe.clone());
        let mut active = Active { round, kind: fault.kind(), ..Active::default() };
        let result = self.apply(fault, &mut active).await;
        let mut nodes: Vec<u64> = active
            .restart
            .iter()
            .chain(&active.resume)
            .chain(&active.clocks)
            .chain(&active.kill_then_restart)
            .chain(&active.disks)
            .chain(&active.gate)
            .chain(&active.rejoin)
            .copied()
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        match &result {
            Ok(hit) => {
                let mut hit = hit.clone();
                hit.sort_unstable();
                hit.dedup();
                let message = active.note.clone().or(describe.message.clone());
                // What clock_bound judges the round by.
                let beyond_bound_after_ms =
                    fault.beyond_bound_after_ms(self.clock_bound_ms, hold_ms);
                let phase = fault
                    .within_bound(self.clock_bound_ms)
                    .then(|| crate::checkers::clock_bound::WITHIN_BOUND.to_string());
                self.history.record(
                    PROCESS,
                    OpType::Ok,
                    OpFunction::Fault,
                    OpValue { nodes: hit, message, beyond_bound_after_ms, phase, ..describe },
                );
            }
            Err(error) => {
                self.history.record(
                    PROCESS,
                    OpType::Info,
                    OpFunction::Fault,
                    OpValue { nodes, message: Some(error.to_string()), ..describe },
                );
            }
        }
        (active, result.map(|_| ()))
    }

    /// Applies the fault; answers the nodes it hit.
    async fn apply(&mut self, fault: &Fault, active: &mut Active) -> anyhow::Result<Vec<u64>> {
        match fault {
            Fault::Kill { target } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    if self.supervisor.state(*id) != ProcessState::Down {
                        self.supervisor.kill(*id).await?;
                    }
                    active.restart.push(*id);
                }
                Ok(nodes)
            }
            Fault::Terminate { target } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    if self.supervisor.state(*id) != ProcessState::Down {
                        self.supervisor.terminate(*id).await?;
                    }
                    active.restart.push(*id);
                }
                Ok(nodes)
            }
            Fault::Pause { target } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    self.supervisor.pause(*id)?;
                    active.resume.push(*id);
                }
                Ok(nodes)
            }
            Fault::Isolate { target } => {
                let nodes = self.resolve(*target, None).await?;
                let rest: Vec<u64> =
                    self.supervisor.ids().into_iter().filter(|id| !nodes.contains(id)).collect();
                active.network = true;
                self.network.partition(&[nodes.clone(), rest])?;
                Ok(nodes)
            }
            Fault::OneWay { from, to } => {
                let from = self.resolve(*from, None).await?;
                let from_id = from.first().copied().ok_or_else(|| anyhow::anyhow!("no sender"))?;
                let to = self.resolve(*to, Some(from_id)).await?;
                let to_id = to.first().copied().ok_or_else(|| anyhow::anyhow!("no receiver"))?;
                active.network = true;
                self.network.cut_one_way(from_id, to_id)?;
                Ok(vec![from_id, to_id])
            }
            Fault::Bridge { bridge } => {
                let bridge = self.resolve(*bridge, None).await?;
                let others: Vec<u64> =
                    self.supervisor.ids().into_iter().filter(|id| !bridge.contains(id)).collect();
                active.network = true;
                for (i, a) in others.iter().enumerate() {
                    for b in others.iter().skip(i + 1) {
                        self.network.cut(*a, *b)?;
                    }
                }
                Ok(bridge)
            }
            Fault::Delay { base_ms, jitter_ms } => {
                active.network = true;
                self.network
                    .all_peer_links(Mode::Delay { base_ms: *base_ms, jitter_ms: *jitter_ms });
                Ok(self.supervisor.ids())
            }
            Fault::HoldRelease { target } => {
                let nodes = self.resolve(*target, None).await?;
                active.network = true;
                for id in &nodes {
                    self.network.hold_into(*id)?;
                }
                Ok(nodes)
            }
            Fault::ResetLinks => {
                active.network = true;
                self.network.all_peer_links(Mode::Reset);
                Ok(self.supervisor.ids())
            }
            Fault::ClockBump { target, offset_ms } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    active.clocks.push(*id);
                    self.set_clock(*id, *offset_ms, 1.0).await?;
                }
                Ok(nodes)
            }
            Fault::ClockDrift { target, rate } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    active.clocks.push(*id);
                    self.set_clock(*id, 0, *rate).await?;
                }
                Ok(nodes)
            }
            Fault::ClockStrobe { target, offset_ms, period_ms } => {
                let nodes = self.resolve(*target, None).await?;
                let mut clients = Vec::new();
                for id in &nodes {
                    active.clocks.push(*id);
                    clients.push(self.supervisor.faults(*id)?);
                }
                let (offset_ms, period) = (*offset_ms, Duration::from_millis((*period_ms).max(50)));
                // Bounded: the task is aborted at heal, and stops by itself
                // after an hour of flips in any case.
                let flips = (3_600_000 / period.as_millis().max(1)) as u64;
                active.strobe = Some(tokio::spawn(async move {
                    for flip in 0..flips {
                        let offset = if flip % 2 == 0 { offset_ms } else { 0 };
                        for client in &mut clients {
                            let request = v1::SetClockRequest { offset_ms: offset, rate: 1.0 };
                            let _ = tokio::time::timeout(period, client.set_clock(request)).await;
                        }
                        tokio::time::sleep(period).await;
                    }
                }));
                Ok(nodes)
            }
            Fault::ClockHandover { offset_ms, lease_ttl_ms, drift_rate } => {
                self.handover(active, *offset_ms, *lease_ttl_ms, *drift_rate).await
            }
            Fault::LateReplies { target, delay_ms } => {
                let Some(extras) = self.extras.as_ref() else {
                    anyhow::bail!("late replies need the workload's queue");
                };
                let (security, queue) = (extras.security.clone(), extras.queue.clone());
                let nodes = self.resolve(*target, None).await?;
                let mut addrs = Vec::new();
                for id in &nodes {
                    addrs.push(self.network.proxy(*id)?.listen_addr().to_string());
                }
                // The workers may not be talking to this node just now: a
                // claimer of its own that only reaches it makes sure some
                // claim is answered after its lease lapsed. It settles what
                // it gets as a worker would: acks it (refused once the job
                // went to someone else) or nacks a poison job. Its
                // connection is made first: a TLS handshake under the delay
                // would take several delays.
                let client = security.client(&addrs.join(","), Role::Worker)?;
                tokio::time::timeout(Duration::from_secs(5), client.status())
                    .await
                    .map_err(|_| anyhow::anyhow!("late replies: status timed out"))??;
                active.network = true;
                for id in &nodes {
                    // Only what the node sends back: requests arrive on time,
                    // so claims are granted on time and answered late.
                    self.network.proxy(*id)?.set_direction(
                        Source::Client,
                        None,
                        Some(Mode::Delay { base_ms: *delay_ms, jitter_ms: 0 }),
                    );
                }
                let history = self.history.clone();
                let limit = Duration::from_secs(60);
                active.claimer = Some(tokio::spawn(async move {
                    let started = tokio::time::Instant::now();
                    while started.elapsed() < limit {
                        let request = v1::ClaimRequest {
                            worker: LATE.to_string(),
                            queue: queue.clone(),
                            max: 1,
                            lease_ttl_ms: Some(2_000),
                            wait_ms: 500,
                            ..Default::default()
                        };
                        if claim_recorded(&history, LATE, &client, request, true).await.is_err() {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }));
                Ok(nodes)
            }
            Fault::StoreFault { target } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    active.kill_then_restart.push(*id);
                    let mut faults = self.supervisor.faults(*id)?;
                    let mut request = tonic::Request::new(v1::SetFaultRequest { on: true });
                    request.set_timeout(Duration::from_secs(2));
                    faults.set_store_fault(request).await?;
                }
                Ok(nodes)
            }
            Fault::Drain { target } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    self.drain_node(active.round, *id, false).await?;
                }
                Ok(nodes)
            }
            Fault::RollingDrain => {
                let ids = self.supervisor.ids();
                for id in &ids {
                    self.drain_node(active.round, *id, true).await?;
                }
                Ok(ids)
            }
            Fault::ClientLinks { target, mode } => {
                let nodes = self.resolve(*target, None).await?;
                let mode = match mode {
                    ClientLinkMode::Blackhole => Mode::Blackhole,
                    ClientLinkMode::Reset => Mode::Reset,
                    ClientLinkMode::Delay => Mode::Delay { base_ms: 300, jitter_ms: 300 },
                };
                active.network = true;
                for id in &nodes {
                    self.network.client_links(*id, mode)?;
                }
                Ok(nodes)
            }
            Fault::GateFlip { target } => {
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    active.gate.push(*id);
                    self.set_gate(active.round, *id, false).await?;
                }
                Ok(nodes)
            }
            Fault::AdvertLoss { target } => {
                let nodes = self.resolve(*target, None).await?;
                let id = nodes.first().copied().ok_or_else(|| anyhow::anyhow!("no target"))?;
                active.network = true;
                for other in self.supervisor.ids().into_iter().filter(|other| *other != id) {
                    self.network.cut_one_way(id, other)?;
                }
                // Behind the cut: the others never hear of the change.
                active.gate.push(id);
                self.set_gate(active.round, id, false).await?;
                Ok(nodes)
            }
            Fault::Rejoin { target } => {
                let nodes = self.resolve(*target, None).await?;
                let id = nodes.first().copied().ok_or_else(|| anyhow::anyhow!("no target"))?;
                if self.supervisor.state(id) != ProcessState::Down {
                    self.supervisor.kill(id).await?;
                }
                active.rejoin.push(id);
                self.remove_member(id).await?;
                wipe(&self.supervisor.spec(id)?.data_dir)?;
                Ok(nodes)
            }
            Fault::DiskFull { target } => {
                let disks = self.extras.as_ref().and_then(|e| e.disks.as_ref());
                let why = match disks {
                    None => Some("the plan put no data dir on tmpfs".to_string()),
                    Some(disks) => disks.unavailable.clone(),
                };
                if let Some(why) = why {
                    anyhow::bail!("disk-full skipped: {why}");
                }
                let nodes = self.resolve(*target, None).await?;
                for id in &nodes {
                    let dir = &self.supervisor.spec(*id)?.data_dir;
                    let mounted = self
                        .extras
                        .as_ref()
                        .and_then(|e| e.disks.as_ref())
                        .is_some_and(|d| d.is_mounted(dir));
                    if !mounted {
                        anyhow::bail!("disk-full skipped: {} is not a tmpfs", dir.display());
                    }
                }
                let mut filled = Vec::new();
                for id in &nodes {
                    let dir = self.supervisor.spec(*id)?.data_dir.clone();
                    active.disks.push(*id);
                    let (bytes, full) = tokio::task::spawn_blocking(move || {
                        crate::disk::fill(&dir, 4 * 1024 * 1024 * 1024)
                    })
                    .await??;
                    filled.push(format!(
                        "node {id}: ballast {} MiB{}",
                        bytes / (1024 * 1024),
                        if full { "; ENOSPC" } else { "; not full" }
                    ));
                }
                active.note = Some(filled.join(", "));
                // The window must see writes: a fast cluster may have enqueued
                // the workload's whole share before this round, and a node
                // whose log fails stops at once. A writer of the round's own
                // enqueues through every node until heal, each recorded like
                // a producer's, so the checker has acknowledged writes to
                // hold the full disk's window to.
                if let Some(extras) = self.extras.as_ref() {
                    let client = extras.security.client(&extras.addrs.join(","), Role::Producer)?;
                    let (history, queue, round) =
                        (self.history.clone(), extras.queue.clone(), active.round);
                    active.claimer =
                        Some(tokio::spawn(disk_full_writer(history, client, queue, round)));
                }
                Ok(nodes)
            }
        }
    }

    /// Undoes a fault: links pass, clocks are true, paused nodes continue,
    /// downed nodes restart, store-faulted nodes are killed and restarted.
    /// Then it makes sure no node is left down or paused whatever happened.
    pub async fn heal(&mut self, active: Active) -> anyhow::Result<()> {
        let describe = OpValue {
            fault: Some(active.kind.to_string()),
            round: Some(active.round),
            ..OpValue::default()
        };
        self.history.invoke(PROCESS, OpFunction::Heal, describe.clone());
        let result = self.undo(active).await;
        let (kind, message) = match &result {
            Ok(()) => (OpType::Ok, self.heal_note.take()),
            Err(error) => (OpType::Info, Some(error.to_string())),
        };
        self.history.record(PROCESS, kind, OpFunction::Heal, OpValue { message, ..describe });
        result
    }

    async fn undo(&mut self, active: Active) -> anyhow::Result<()> {
        let mut first_error: Option<anyhow::Error> = None;
        let mut note = |result: anyhow::Result<()>| {
            if let Err(error) = result
                && first_error.is_none()
            {
                first_error = Some(error);
            }
        };
        let mut disk_restarts: Vec<u64> = Vec::new();
        if let Some(strobe) = active.strobe {
            strobe.abort();
        }
        if let Some(claimer) = active.claimer {
            claimer.abort();
        }
        if active.network {
            self.network.heal();
        }
        for id in &active.resume {
            if self.supervisor.state(*id) == ProcessState::Paused {
                note(self.supervisor.resume(*id));
            }
        }
        for id in &active.clocks {
            if self.supervisor.state(*id) == ProcessState::Running {
                note(self.set_clock(*id, 0, 1.0).await);
            }
        }
        for id in &active.kill_then_restart {
            if self.supervisor.state(*id) != ProcessState::Down {
                note(self.supervisor.kill(*id).await);
            }
        }
        for id in &active.gate {
            // A node restarted meanwhile starts with its configured flags.
            if self.supervisor.state(*id) == ProcessState::Running {
                note(self.set_gate(active.round, *id, true).await);
            }
        }
        for id in &active.rejoin {
            note(self.join_fresh(*id).await);
        }
        for id in &active.disks {
            let emptied = match self.supervisor.spec(*id) {
                Ok(spec) => crate::disk::empty(&spec.data_dir),
                Err(error) => Err(error),
            };
            note(emptied);
            // Space is back: a node that recovers by itself keeps running;
            // one that does not (its store gave up on the failed write) is
            // restarted, as after a crash.
            if self.supervisor.state(*id) == ProcessState::Running
                && self.wait_serving(*id, Duration::from_secs(8)).await.is_err()
            {
                tracing::warn!(
                    node = id,
                    "did not recover after the disk had room again; restarting"
                );
                disk_restarts.push(*id);
                note(self.supervisor.kill(*id).await);
            }
        }
        if !active.disks.is_empty() {
            self.heal_note = Some(if disk_restarts.is_empty() {
                format!("ballast removed; nodes {:?} recovered by themselves", active.disks)
            } else {
                format!(
                    "ballast removed; nodes {disk_restarts:?} restarted (no recovery within 8 s)"
                )
            });
        }
        // Whatever the fault was, no node stays down or paused.
        self.network.heal();
        for id in self.supervisor.ids() {
            match self.supervisor.state(id) {
                // A wiped node restarted without a join would found a
                // cluster of its own.
                ProcessState::Down if active.rejoin.contains(&id) => {
                    note(self.join_fresh(id).await)
                }
                ProcessState::Down => note(self.supervisor.restart(id)),
                ProcessState::Paused => note(self.supervisor.resume(id)),
                ProcessState::Running => {}
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(payload: &str) -> v1::Job {
        v1::Job { payload: payload.as_bytes().to_vec(), ..v1::Job::default() }
    }

    #[test]
    fn a_fault_claimer_nacks_a_poison_job_and_acks_the_others() {
        let poison = format!("{}7-p0-414", crate::workload::POISON_PREFIX);
        assert_eq!(settle(Some(&job(&poison))), OpFunction::Nack);
        assert_eq!(settle(Some(&job("job-7-p0-415"))), OpFunction::Ack);
        assert_eq!(settle(Some(&job("handover-3-0"))), OpFunction::Ack);
        assert_eq!(settle(None), OpFunction::Ack);
    }
}
