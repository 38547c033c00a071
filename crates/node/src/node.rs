//! Starting and stopping a node: opens the store, starts Raft, bootstraps a
//! single-node cluster when the data dir holds no membership, and serves
//! gRPC and HTTP on the listeners it is given.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::Limits;
use leasehold_proto::v1::JoinRequest;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::cluster_server::ClusterServer;
use leasehold_proto::v1::faults_server::FaultsServer;
use leasehold_proto::v1::peer_server::PeerServer;
use leasehold_proto::v1::queue_server::QueueServer;
use leasehold_proto::v1::raft_server::RaftServer;
use leasehold_proto::v1::schedules_server::SchedulesServer;
use leasehold_raft::{NetworkFactory, Raft, envelope};
use leasehold_server::bus::Bus;
use leasehold_server::cluster_service::ClusterService;
use leasehold_server::faults_service::FaultsService;
use leasehold_server::peer_service::PeerService;
use leasehold_server::queue_service::QueueService;
use leasehold_server::raft_service::RaftService;
use leasehold_server::schedules_service::SchedulesService;
use leasehold_server::secret::ClusterSecret;
use leasehold_server::{Clock, Gate, GateConfig, Journal, JournalConfig, Readiness};
use openraft::{BasicNode, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{Config, ConfigError};
use crate::driver::{self, DriverConfig};
use crate::executor::{self, ExecutorConfig};
use crate::gate::{keep_dev_secret, resolve_secret};

/// The listeners a node serves on. Tests bind port 0 and pass them in.
pub struct Transport {
    /// gRPC: public API and peer traffic.
    pub grpc: TcpListener,
    /// HTTP: health endpoints.
    pub http: TcpListener,
}

impl Transport {
    /// Binds the addresses named in `config`.
    pub async fn bind(config: &Config) -> Result<Transport, NodeError> {
        let grpc = TcpListener::bind(&config.grpc)
            .await
            .map_err(|source| NodeError::Bind { addr: config.grpc.clone(), source })?;
        let http = TcpListener::bind(&config.http)
            .await
            .map_err(|source| NodeError::Bind { addr: config.http.clone(), source })?;
        Ok(Transport { grpc, http })
    }
}

/// Why a node could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listen address could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The IO error.
        source: std::io::Error,
    },
    /// The data dir could not be opened.
    #[error("storage: {0}")]
    Storage(#[from] leasehold_storage::StorageError),
    /// openraft refused to start or bootstrap.
    #[error("raft: {0}")]
    Raft(String),
    /// The cluster refused to add this node, or could not be reached in time.
    #[error("join: {0}")]
    Join(String),
    /// A serving task failed.
    #[error("serve: {0}")]
    Serve(String),
}

/// A running node.
pub struct NodeHandle {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    journal: Journal,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Result<(), String>>>,
    intake: watch::Sender<bool>,
    intake_tasks: Vec<JoinHandle<()>>,
    drain_grace: Duration,
}

/// Entry point: `Node::start(config, transport)`.
pub struct Node;

impl Node {
    /// Starts a node serving on `transport`.
    pub async fn start(config: Config, transport: Transport) -> Result<NodeHandle, NodeError> {
        config.validate()?;
        let grpc_addr = transport
            .grpc
            .local_addr()
            .map_err(|source| NodeError::Bind { addr: config.grpc.clone(), source })?;
        let http_addr = transport
            .http
            .local_addr()
            .map_err(|source| NodeError::Bind { addr: config.http.clone(), source })?;
        let advertise = config.advertise.clone().unwrap_or_else(|| grpc_addr.to_string());

        let data = config.data.clone();
        let (log, state) = tokio::task::spawn_blocking(move || leasehold_storage::open(&data))
            .await
            .map_err(|e| NodeError::Serve(e.to_string()))??;
        let bus_tree = log.open_local_tree(leasehold_storage::layout::BUS_TREE)?;
        let peers_tree = log.open_local_tree(leasehold_storage::layout::PEERS_TREE)?;
        let secret = resolve_secret(&config)?;
        if secret.fresh {
            if let Err(error) = keep_dev_secret(&config.data, &secret.secret) {
                tracing::warn!(%error, "could not keep the generated cluster secret in the data dir");
            }
            if config.join.is_none() {
                let text = String::from_utf8_lossy(secret.secret.as_bytes()).into_owned();
                tracing::warn!(
                    cluster_secret = %text,
                    "no cluster secret configured: generated one for this dev cluster (nodes that \
                     join through this one receive it); for a fleet set cluster_secret, \
                     LEASEHOLD_CLUSTER_SECRET or cluster_secret_file on every node"
                );
                println!("generated cluster secret: {text}");
            }
        }

        let raft_config = raft_config(&config)?;
        // Peer connections leave from the gRPC listen address when it names
        // one, so per-link network faults can tell nodes apart.
        let local_ip = grpc_addr.ip();
        let peers = NetworkFactory::with_local_address(
            (!local_ip.is_unspecified() && local_ip != std::net::Ipv4Addr::LOCALHOST)
                .then_some(local_ip),
        );
        let raft = Raft::new(config.id, raft_config, peers.clone(), log.clone(), state.clone())
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;

        if config.join.is_none()
            && !raft.is_initialized().await.map_err(|e| NodeError::Raft(e.to_string()))?
        {
            let members = BTreeMap::from([(config.id, BasicNode { addr: advertise.clone() })]);
            raft.initialize(members).await.map_err(|e| NodeError::Raft(e.to_string()))?;
            tracing::info!(node = config.id, addr = %advertise, "bootstrapped a single-node cluster");
        }

        let limits = Limits { max_payload_bytes: config.max_payload_bytes, ..Limits::default() };
        let clock = Clock::system();
        if config.clock_offset_ms != 0 {
            tracing::warn!(
                offset_ms = config.clock_offset_ms,
                "fault injection: clock starts skewed"
            );
            clock.set_offset_ms(config.clock_offset_ms);
        }
        let journal = Journal::new(
            JournalConfig {
                node_id: config.id,
                limits,
                quorum_timeout: config.quorum_timeout(),
                batches_in_flight: config.batches_in_flight,
            },
            raft.clone(),
            log,
            state,
            clock,
            peers,
        );
        let gate = Gate::new(
            journal.clone(),
            GateConfig {
                advert_interval: Duration::from_millis(config.advert_interval_ms),
                stale_after_ms: config.advert_stale_after_ms,
                bus_window: Duration::from_millis(config.bus_window_ms),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            leasehold_core::gate::GateFlags {
                journal_lease: config.journal_lease,
                journal_lease_dry_run: config.journal_lease_dry_run,
            },
            secret.secret,
            secret.generated,
            Bus::new(config.id, bus_tree),
            peers_tree,
        );
        let readiness = Readiness::new(journal.clone());
        let (shutdown, shutdown_rx) = watch::channel(false);
        // Intake (driver ticks, executor claims) stops first on a drain,
        // while the servers keep serving.
        let (intake, intake_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut intake_tasks = Vec::new();

        let (health, health_service) = tonic_health::server::health_reporter();
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(leasehold_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| NodeError::Serve(e.to_string()))?;
        let faults =
            config.fault_injection.then(|| FaultsServer::new(FaultsService::new(journal.clone())));
        if faults.is_some() {
            tracing::warn!(
                node = config.id,
                "fault injection is on: the Faults service is exposed"
            );
        }
        let grpc = tonic::transport::Server::builder()
            .add_optional_service(faults)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(QueueServer::new(QueueService::new(journal.clone())))
            .add_service(ClusterServer::new(ClusterService::new(journal.clone(), gate.clone())))
            .add_service(PeerServer::new(PeerService::new(gate.clone())))
            .add_service(SchedulesServer::new(SchedulesService::new(journal.clone())))
            .add_service(
                RaftServer::new(RaftService::new(journal.clone()))
                    .max_decoding_message_size(envelope::MAX_ENVELOPE_BYTES)
                    .max_encoding_message_size(envelope::MAX_ENVELOPE_BYTES),
            );
        // Accepted sockets get TCP_NODELAY: with Nagle on, a reply waits for
        // the peer's delayed ACK (about 40 ms stalls, measured by the bench).
        let incoming =
            tonic::transport::server::TcpIncoming::from(transport.grpc).with_nodelay(Some(true));
        let grpc = grpc.serve_with_incoming_shutdown(incoming, signalled(shutdown_rx.clone()));
        tasks.push(tokio::spawn(async move { grpc.await.map_err(|e| e.to_string()) }));
        let http = leasehold_server::http::serve(
            transport.http,
            readiness.clone(),
            signalled(shutdown_rx.clone()),
        );
        tasks.push(tokio::spawn(async move { http.await.map_err(|e| e.to_string()) }));

        tasks.push(tokio::spawn(report_health(readiness, health, shutdown_rx.clone())));
        // Adverts go on through a drain (they say the node drains) until the
        // servers stop.
        let adverts = leasehold_server::gate::run_adverts(gate.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            adverts.await;
            Ok(())
        }));
        let driver_config = DriverConfig {
            sweep_interval: Duration::from_millis(config.sweep_interval_ms),
            purge_interval: Duration::from_millis(config.purge_interval_ms),
            run_commands: config.executor,
            tags: config.tags.clone(),
            command_timeout: Duration::from_millis(config.executor_timeout_ms),
            grace: Duration::from_millis(config.drain_grace_ms),
        };
        if config.executor {
            let executor_config = ExecutorConfig {
                node_id: config.id,
                queues: config.executor_queues.clone(),
                concurrency: config.executor_concurrency,
                timeout: Duration::from_millis(config.executor_timeout_ms),
                tags: config.tags.clone(),
                grace: Duration::from_millis(config.drain_grace_ms),
            };
            let executor = executor::run(executor_config, grpc_addr, intake_rx.clone());
            intake_tasks.push(tokio::spawn(executor));
        }
        intake_tasks.push(tokio::spawn(register(
            journal.clone(),
            config.tags.clone(),
            intake_rx.clone(),
        )));
        let driver = driver::run(journal.clone(), gate.clone(), driver_config, intake_rx);
        intake_tasks.push(tokio::spawn(driver));
        tracing::info!(node = config.id, grpc = %grpc_addr, http = %http_addr, "node started");
        let handle = NodeHandle {
            grpc_addr,
            http_addr,
            journal,
            shutdown,
            tasks,
            intake,
            intake_tasks,
            drain_grace: Duration::from_millis(config.drain_grace_ms),
        };
        if let Some(member) = &config.join {
            let initialized =
                raft.is_initialized().await.map_err(|e| NodeError::Raft(e.to_string()))?;
            if initialized {
                tracing::info!(node = config.id, "data dir holds a membership; not joining again");
            } else {
                match join(config.id, &advertise, member).await {
                    Ok(dev_secret) => adopt_dev_secret(&gate, &config, dev_secret),
                    Err(error) => {
                        let _ = handle.shutdown(Duration::from_secs(5)).await;
                        return Err(error);
                    }
                }
            }
        }
        Ok(handle)
    }
}

/// Records this node's tags in the journal (and clears a draining mark left
/// by an earlier drain), retrying until it commits or the node stops.
async fn register(journal: Journal, tags: Vec<String>, mut stop: watch::Receiver<bool>) {
    let node = journal.node_id();
    let mut tags = tags;
    tags.sort();
    tags.dedup();
    loop {
        let current = journal.read_stale(|state| state.nodes().get(&node).cloned());
        let registered = current.as_ref().is_some_and(|n| n.tags == tags);
        let draining = current.as_ref().is_some_and(|n| n.draining);
        let command = if !registered {
            Some(leasehold_core::Command::RegisterNode { node, tags: tags.clone() })
        } else if draining {
            Some(leasehold_core::Command::SetDraining { node, draining: false })
        } else {
            None
        };
        let Some(command) = command else { return };
        if let Err(error) = journal.propose(command).await {
            tracing::debug!(%error, "node registration not committed yet");
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// Takes the secret a dev cluster handed out at join, when this node has
/// none configured, and keeps it in the data dir for restarts.
fn adopt_dev_secret(gate: &Gate, config: &Config, handed: Vec<u8>) {
    if handed.is_empty() || gate.dev_secret().is_none() {
        return;
    }
    match ClusterSecret::from_bytes(handed) {
        Ok(secret) => {
            if let Err(error) = keep_dev_secret(&config.data, &secret) {
                tracing::warn!(%error, "could not keep the cluster's dev secret in the data dir");
            }
            gate.adopt_secret(secret);
            tracing::info!("using the dev cluster secret handed out at join");
        }
        Err(error) => tracing::warn!(%error, "the cluster handed out an unusable secret"),
    }
}

/// How long a joining node keeps asking before it gives up.
const JOIN_DEADLINE: Duration = Duration::from_secs(180);

/// Asks `member` to add this node (learner, then voter once caught up).
/// Retries while the cluster is unavailable; a refusal (id or address in use,
/// bad input) ends the attempt with its message. Answers the dev secret the
/// cluster handed out (empty when it has a configured one).
async fn join(id: u64, advertise: &str, member: &str) -> Result<Vec<u8>, NodeError> {
    let channel = leasehold_raft::network::endpoint(member)
        .map_err(|e| NodeError::Join(format!("--join {member}: {e}")))?
        .connect_lazy();
    let mut client = ClusterClient::new(channel);
    let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
    loop {
        let request = JoinRequest { id, addr: advertise.to_string() };
        match client.join(request).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                tracing::info!(node = id, leader = reply.leader, voters = ?reply.voters, "joined the cluster");
                return Ok(reply.dev_cluster_secret);
            }
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::AlreadyExists
                        | tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                ) =>
            {
                return Err(NodeError::Join(status.message().to_string()));
            }
            Err(status) if tokio::time::Instant::now() < deadline => {
                tracing::info!(node = id, member, error = %status.message(), "join not done yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(status) => {
                return Err(NodeError::Join(format!("--join {member}: {}", status.message())));
            }
        }
    }
}

async fn signalled(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Mirrors readiness into grpc.health.v1 (service "" and the Queue service).
async fn report_health(
    readiness: Readiness,
    health: tonic_health::server::HealthReporter,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), String> {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = tick.tick() => {}
        }
        let status = if readiness.report().await.ready {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        health.set_service_status("", status).await;
        health.set_service_status("leasehold.v1.Queue", status).await;
    }
}

fn raft_config(config: &Config) -> Result<Arc<openraft::Config>, NodeError> {
    let raft = openraft::Config {
        cluster_name: "leasehold".to_string(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        // A snapshot chunk may take a while on a loaded peer; the default
        // 200 ms makes large catch-ups fail and restart forever.
        install_snapshot_timeout: 10_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
        max_in_snapshot_log_to_keep: 1_000,
        ..Default::default()
    };
    raft.validate().map(Arc::new).map_err(|e| NodeError::Raft(e.to_string()))
}

impl NodeHandle {
    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The node's journal handle.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The node's Raft handle.
    pub fn raft(&self) -> &Raft {
        self.journal.raft()
    }

    /// Resolves when this node's Raft core has stopped on a fatal error (a
    /// storage write it could not make, such as on a full disk), with the
    /// error. The node can serve nothing from then on; the binary exits
    /// non-zero so a supervisor restarts it on its data dir.
    pub async fn raft_failed(&self) -> String {
        let mut metrics = self.journal.raft().metrics();
        match metrics.wait_for(|m| m.running_state.is_err()).await {
            Ok(metrics) => match &metrics.running_state {
                Err(fatal) => fatal.to_string(),
                Ok(()) => "stopped".to_string(),
            },
            // The metrics channel closed: the core is gone.
            Err(_) => "the Raft core stopped".to_string(),
        }
    }

    /// Drains the node, in order: readiness false and claims refused here →
    /// tickers and executor intake stopped, running commands finishing
    /// within the grace period (their leases still renewed) → what this
    /// node's executor still holds released → leadership handed to a
    /// caught-up voter if this node leads → servers and Raft stopped.
    pub async fn drain(mut self) -> Result<(), NodeError> {
        let step = |name: &str| {
            tracing::info!(
                event = "drain.step",
                step = name,
                node = self.journal.node_id(),
                "drain"
            )
        };
        step("not ready");
        self.journal.set_draining(true);
        // A node on its way out must not stand for election again. Without
        // this, a leader's handover mostly failed: openraft rejects votes
        // while the leader's lease runs, so the successor's first campaign
        // loses, this node steps down on seeing its higher term, and, with
        // the longest log, wins the next election itself and exits as leader.
        self.journal.raft().runtime_config().elect(false);
        step("mark draining");
        let mark =
            leasehold_core::Command::SetDraining { node: self.journal.node_id(), draining: true };
        if let Err(error) = self.journal.propose(mark).await {
            tracing::warn!(%error, "could not mark the node draining in the journal");
        }
        step("stop intake");
        let _ = self.intake.send(true);
        let intake_tasks = std::mem::take(&mut self.intake_tasks);
        let wait_intake = async {
            for task in intake_tasks {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(self.drain_grace + Duration::from_secs(2), wait_intake)
            .await
            .is_err()
        {
            tracing::warn!(
                event = "drain.step",
                step = "grace over",
                "running commands did not finish within the grace period"
            );
        }
        step("release");
        self.release_held().await;
        step("hand over");
        self.hand_over().await;
        step("close");
        self.shutdown(Duration::from_secs(5)).await
    }

    /// Releases every lease this node's executor still holds, so other
    /// nodes can take the jobs now rather than after the TTL.
    async fn release_held(&self) {
        let worker = format!("node-{}", self.journal.node_id());
        let held: Vec<(u64, u64)> = self.journal.read_stale(|state| {
            let filter = leasehold_core::JobFilter {
                queue: None,
                state: Some(leasehold_core::JobState::Claimed),
            };
            let mut held = Vec::new();
            let mut after = 0;
            loop {
                let page = state.jobs(&filter, after, 1_000);
                let Some(last) = page.last() else { break };
                after = last.id;
                held.extend(page.iter().filter_map(|job| {
                    job.lease.as_ref().filter(|l| l.holder == worker).map(|l| (job.id, l.token))
                }));
            }
            held
        });
        for (job_id, token) in held {
            match self.journal.propose(leasehold_core::Command::Release { job_id, token }).await {
                Ok(response) => tracing::info!(
                    event = "lease.release",
                    job = job_id,
                    token,
                    ?response,
                    "released on drain"
                ),
                Err(error) => {
                    tracing::warn!(job = job_id, token, %error, "release on drain failed; the lease will lapse")
                }
            }
        }
    }

    /// If this node leads, asks the most caught-up other voter to start an
    /// election and waits (briefly) for leadership to move.
    async fn hand_over(&self) {
        if !self.journal.is_leader() {
            return;
        }
        let metrics = self.journal.raft().metrics().borrow().clone();
        let me = self.journal.node_id();
        let membership = metrics.membership_config.membership().clone();
        let matched = |id: &u64| {
            metrics
                .replication
                .as_ref()
                .and_then(|r| r.get(id).cloned().flatten())
                .map(|log_id| log_id.index)
                .unwrap_or(0)
        };
        let Some(successor) = membership.voter_ids().filter(|id| *id != me).max_by_key(matched)
        else {
            return;
        };
        let Some(addr) = membership.get_node(&successor).map(|n| n.addr.clone()) else {
            return;
        };
        if let Err(error) = self.journal.ask_to_campaign(successor, addr).await {
            tracing::warn!(%error, successor, "handover failed; followers will elect after the timeout");
            return;
        }
        let mut watch = self.journal.raft().metrics();
        let moved = watch.wait_for(|m| m.current_leader.is_some_and(|leader| leader != me));
        match tokio::time::timeout(Duration::from_secs(3), moved).await {
            Ok(Ok(_)) => tracing::info!(
                event = "drain.step",
                step = "handed over",
                successor,
                "leadership moved"
            ),
            _ => tracing::warn!(successor, "leadership did not move within 3 s"),
        }
    }

    /// Stops serving, stops Raft, and waits for every task, at most `grace`.
    pub async fn shutdown(self, grace: Duration) -> Result<(), NodeError> {
        let _ = self.intake.send(true);
        let _ = self.shutdown.send(true);
        for task in self.intake_tasks {
            task.abort();
        }
        let mut failure = None;
        let wait_tasks = async {
            for task in self.tasks {
                match task.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => failure = Some(e),
                    Err(e) => failure = Some(e.to_string()),
                }
            }
        };
        if tokio::time::timeout(grace, wait_tasks).await.is_err() {
            tracing::warn!("serving tasks did not stop within {} ms", grace.as_millis());
        }
        self.journal.raft().shutdown().await.map_err(|e| NodeError::Raft(e.to_string()))?;
        match failure {
            Some(e) => Err(NodeError::Serve(e)),
            None => Ok(()),
        }
    }
}
