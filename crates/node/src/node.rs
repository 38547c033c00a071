//! Starting and stopping a node: opens the store, starts Raft, bootstraps a
//! single-node cluster when the data dir holds no membership, and serves
//! gRPC and HTTP on the listeners it is given, behind the node's security
//! (mutual TLS, node identities, client tokens: see docs/security.md).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::{Client, ClientTls, RetryPolicy};
use leasehold_core::Limits;
use leasehold_proto::v1::JoinRequest;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::cluster_server::ClusterServer;
use leasehold_proto::v1::faults_server::FaultsServer;
use leasehold_proto::v1::peer_server::PeerServer;
use leasehold_proto::v1::queue_server::QueueServer;
use leasehold_proto::v1::raft_server::RaftServer;
use leasehold_proto::v1::schedules_server::SchedulesServer;
use leasehold_raft::{NetworkFactory, PeerSecurity, PeerTls, Raft};
use leasehold_replica::bus::Bus;
use leasehold_replica::{Clock, Gate, GateConfig, Journal, JournalConfig, Readiness};
use leasehold_security::secret::NODE_PROOF_HEADER;
use leasehold_security::{
    ClusterSecret, Identity, NodeServerVerifier, SharedServerConfig, SharedTokens, TlsFiles,
    TlsMaterial, TokenSet,
};
use leasehold_server::auth::{AuthConfig, AuthLayer};
use leasehold_server::cluster_service::ClusterService;
use leasehold_server::faults_service::FaultsService;
use leasehold_server::health::HealthService;
use leasehold_server::incoming::{self, ConnectionLimits};
use leasehold_server::limits::{self, SizeLimitLayer};
use leasehold_server::peer_service::PeerService;
use leasehold_server::queue_service::QueueService;
use leasehold_server::raft_service::RaftService;
use leasehold_server::schedules_service::SchedulesService;
use leasehold_server::status::StatusSources;
use leasehold_storage::LogStore;
use openraft::{BasicNode, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::commands;
use crate::config::{Config, ConfigError};
use crate::driver::{self, DriverConfig};
use crate::executor::{self, ExecutorConfig};
use crate::secret::{ResolvedSecret, keep_dev_secret, resolve_secret};

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
    /// TLS material or the tokens file could not be used.
    #[error("{0}")]
    Security(String),
    /// TLS material could not be read or used.
    #[error(transparent)]
    Tls(#[from] leasehold_security::TlsError),
    /// The tokens file could not be read or used.
    #[error(transparent)]
    Tokens(#[from] leasehold_security::tokens::TokensError),
    /// openraft refused to start, bootstrap or stop.
    #[error("raft: {0}")]
    Raft(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The cluster refused to add this node, or could not be reached in time.
    #[error("join: {0}")]
    Join(String),
    /// A serving task failed.
    #[error("serve: {0}")]
    Serve(String),
    /// The Raft core stopped on a fatal error (a storage fault) before the
    /// node was shut down.
    #[error("the Raft core stopped on a fatal error: {0}")]
    RaftFailed(String),
}

/// A running node.
pub struct NodeHandle {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    journal: Journal,
    /// The node's own log store, for tests that read it or slow its syncs;
    /// the journal sees it only through `leasehold_replica::stores`.
    log: LogStore,
    shutdown: watch::Sender<bool>,
    /// Why a server stopped before the node was shut down, once one did.
    server_stopped: watch::Receiver<Option<String>>,
    tasks: Vec<ServingTask>,
    intake: watch::Sender<bool>,
    intake_tasks: Vec<JoinHandle<()>>,
    drain_grace: Duration,
    credentials: Credentials,
}

/// Entry point: `Node::start(config, transport)`.
pub struct Node;

/// What this node proves itself with and checks callers against; what
/// SIGHUP reloads.
#[derive(Clone)]
struct Credentials {
    id: u64,
    tls_files: Option<TlsFiles>,
    tls: Option<TlsMaterial>,
    server_tls: Option<SharedServerConfig>,
    tokens_file: Option<std::path::PathBuf>,
    tokens: Option<SharedTokens>,
    secret: ClusterSecret,
    peers: NetworkFactory,
    /// Clients of this node's own port made as this node (the executor's),
    /// moved onto reloaded TLS material with the rest.
    own_clients: Arc<std::sync::Mutex<Vec<OwnClient>>>,
}

/// A client [`Credentials::own_client`] made, and what it was made for.
struct OwnClient {
    client: Client,
    addr: String,
    advertise: String,
}

impl Credentials {
    /// Loads TLS material and tokens named by `config`.
    fn load(config: &Config, secret: ClusterSecret) -> Result<Credentials, NodeError> {
        let tls_files = config.tls_files();
        let tls = tls_files.as_ref().map(|files| node_tls(files, config.id)).transpose()?;
        let server_tls =
            tls.as_ref().map(|tls| tls.server_config().map(SharedServerConfig::new)).transpose()?;
        let tokens = config
            .tokens_file
            .as_ref()
            .map(|path| TokenSet::from_file(path).map(SharedTokens::new))
            .transpose()?;
        let mut credentials = Credentials {
            id: config.id,
            tls_files,
            tls,
            server_tls,
            tokens_file: config.tokens_file.clone(),
            tokens,
            secret,
            peers: NetworkFactory::new(),
            own_clients: Arc::default(),
        };
        credentials.peers =
            NetworkFactory::with_security(credentials.peer_security()?, peer_source(config));
        credentials.report_file_modes();
        if let Some(path) = &config.cluster_secret_file {
            report_file_mode("cluster_secret_file", path, true);
        }
        Ok(credentials)
    }

    /// Warns of the TLS and tokens files whose modes give away more than
    /// they should, short of the refusal of a file any user may write.
    fn report_file_modes(&self) {
        if let Some(files) = &self.tls_files {
            report_file_mode("tls_ca", &files.ca, false);
            report_file_mode("tls_cert", &files.cert, false);
            report_file_mode("tls_key", &files.key, true);
        }
        if let Some(path) = &self.tokens_file {
            report_file_mode("tokens_file", path, false);
        }
    }

    /// How this node proves itself when it calls a peer.
    fn peer_security(&self) -> Result<PeerSecurity, NodeError> {
        let node_proof = self.secret.node_proof(self.id).parse().ok();
        let tls = match &self.tls {
            Some(material) => Some(PeerTls {
                config: tonic::transport::ClientTlsConfig::new().identity(
                    tonic::transport::Identity::from_pem(material.cert_pem(), material.key_pem()),
                ),
                verifier: NodeServerVerifier::new(material)?,
            }),
            None => None,
        };
        Ok(PeerSecurity { tls, node_proof })
    }

    /// A client of this node's own gRPC port at `addr`, as this node: its
    /// certificate with TLS (the server's checked as `advertise`'s host),
    /// its node proof without. A reload of the TLS files moves it (and its
    /// clones) onto the new material.
    fn own_client(&self, addr: &str, advertise: &str) -> Result<Client, NodeError> {
        let client = self.build_own_client(addr, advertise)?;
        let own = OwnClient {
            client: client.clone(),
            addr: addr.to_string(),
            advertise: advertise.to_string(),
        };
        self.own_clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(own);
        Ok(client)
    }

    fn build_own_client(&self, addr: &str, advertise: &str) -> Result<Client, NodeError> {
        let builder = match &self.tls {
            Some(material) => Client::builder(addr).tls(ClientTls {
                ca_pem: material.ca_pem().to_vec(),
                cert_pem: material.cert_pem().to_vec(),
                key_pem: material.key_pem().to_vec(),
                domain: Some(host_of(advertise)),
            }),
            None => {
                Client::builder(addr).header(NODE_PROOF_HEADER, self.secret.node_proof(self.id))
            }
        };
        builder.build().map_err(|e| NodeError::Security(format!("executor client: {e}")))
    }

    /// Reads the tokens file and the TLS files again and puts them in
    /// force for every later call and connection. Each kind is taken on its
    /// own: a broken TLS file must not hold back a token's removal, nor a
    /// broken tokens file a certificate's rotation. A kind that fails to
    /// load changes nothing and is reported.
    fn reload(&self) -> Result<(), NodeError> {
        self.report_file_modes();
        let tokens = self.reload_tokens().err().map(|e| format!("tokens file kept: {e}"));
        let tls = self.reload_tls().err().map(|e| format!("TLS files kept: {e}"));
        match (tokens, tls) {
            (None, None) => Ok(()),
            (Some(failed), None) | (None, Some(failed)) => Err(NodeError::Security(failed)),
            (Some(tokens), Some(tls)) => Err(NodeError::Security(format!("{tokens}; {tls}"))),
        }
    }

    fn reload_tokens(&self) -> Result<(), NodeError> {
        if let (Some(path), Some(shared)) = (&self.tokens_file, &self.tokens) {
            shared.replace(TokenSet::from_file(path)?);
        }
        Ok(())
    }

    fn reload_tls(&self) -> Result<(), NodeError> {
        let tls = self.tls_files.as_ref().map(|files| node_tls(files, self.id)).transpose()?;
        let server = tls.as_ref().map(TlsMaterial::server_config).transpose()?;
        let reloaded = Credentials { tls, ..self.clone() };
        let peer_security = reloaded.peer_security()?;
        // Every part is built before any is put in force, so a failure
        // keeps the old material everywhere.
        let own_clients =
            self.own_clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Without TLS they carry the node proof, which SIGHUP does not
        // change: nothing to move.
        let fresh = if reloaded.tls.is_some() {
            own_clients
                .iter()
                .map(|own| reloaded.build_own_client(&own.addr, &own.advertise))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        if let (Some(shared), Some(server)) = (&self.server_tls, server) {
            shared.replace(server);
        }
        self.peers.set_security(peer_security);
        for (own, fresh) in own_clients.iter().zip(&fresh) {
            own.client.reconnect(fresh);
        }
        Ok(())
    }
}

/// Logs `auth.file_mode` when a credentials file's mode lets any user read
/// a secret or its group write it (see [`leasehold_security::file_mode`]).
fn report_file_mode(field: &'static str, path: &std::path::Path, secret: bool) {
    use leasehold_security::file_mode::{Exposure, check};
    let (mode, lets, fix) = match check(path, secret) {
        Ok(Ok(Exposure::Readable { mode })) => (mode, "any user read it", "chmod o-r"),
        Ok(Ok(Exposure::GroupWritable { mode })) => (mode, "its group write it", "chmod g-w"),
        // Private, refused or unreadable: the load that follows says so.
        Ok(Ok(Exposure::Private) | Err(_)) | Err(_) => return,
    };
    tracing::warn!(
        event = "auth.file_mode",
        field,
        file = %path.display(),
        mode = format!("{mode:04o}"),
        "a credentials file's mode lets {lets}; tighten it ({fix})"
    );
}

/// An openraft error, kept as the source.
fn raft_error(error: impl std::error::Error + Send + Sync + 'static) -> NodeError {
    NodeError::Raft(Box::new(error))
}

/// Loads TLS files for node `id`; the certificate must name that node.
fn node_tls(files: &TlsFiles, id: u64) -> Result<TlsMaterial, NodeError> {
    let material = files.load()?;
    match material.identity() {
        Identity::Node(named) if *named == id => Ok(material),
        other => Err(NodeError::Security(format!(
            "--tls-cert {}: the certificate is {other}'s, but this node's id is {id}; a node's \
             certificate must name leasehold://node/{id}",
            files.cert.display()
        ))),
    }
}

/// The address peer connections leave from: the gRPC listen address when
/// it names one, so per-link network faults can tell nodes apart.
fn peer_source(config: &Config) -> Option<std::net::IpAddr> {
    let ip = config.grpc.parse::<SocketAddr>().ok()?.ip();
    (!ip.is_unspecified() && ip != std::net::Ipv4Addr::LOCALHOST).then_some(ip)
}

/// How long a drain waits for each of its writes (marking the node
/// draining, releasing what its executor holds) before going on without
/// it: a node that lost its quorum still stops within its supervisor's
/// patience (systemd's `TimeoutStopSec`, docs/deployment.md).
const DRAIN_WRITE_WITHIN: Duration = Duration::from_secs(5);

impl Node {
    /// Starts a node serving on `transport`, in named steps: configuration
    /// and credentials, storage and Raft, the journal and gate, the
    /// servers, the node's own loops, and, if asked, the join.
    pub async fn start(config: Config, transport: Transport) -> Result<NodeHandle, NodeError> {
        Node::start_until(config, transport, std::future::pending()).await
    }

    /// [`Node::start`], given up if `stop` completes while the node is
    /// still joining (a join may wait minutes for an unreachable member):
    /// the node then shuts down, with nothing to drain, and answers
    /// [`NodeError::Join`] saying so. `stop` is polled only during the
    /// join; a node that does not join never looks at it (a caller drains
    /// such a node once it has started).
    pub async fn start_until(
        config: Config,
        transport: Transport,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<NodeHandle, NodeError> {
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
        let (log, state) = tokio::task::spawn_blocking(move || {
            let (log, state) = leasehold_storage::open(&data)?;
            leasehold_storage::check_purged_within_snapshot(&log, &state, &data)?;
            Ok::<_, leasehold_storage::StorageError>((log, state))
        })
        .await
        .map_err(|e| NodeError::Serve(e.to_string()))??;
        let bus_table = log.bus_table()?;
        let peer_store = log.peer_store()?;
        let resolved = cluster_secret(&config)?;
        let secret = resolved.secret.clone();
        let credentials = Credentials::load(&config, secret.clone())?;
        let peers = credentials.peers.clone();

        let raft =
            Raft::new(config.id, raft_config(&config)?, peers.clone(), log.clone(), state.clone())
                .await
                .map_err(raft_error)?;
        if resolved.fresh
            && let Err(error) = keep_fresh_secret(&config, &raft, &resolved).await
        {
            let _ = raft.shutdown().await;
            return Err(error);
        }
        // The leader sends each batch to its followers as its own sync
        // starts, rather than after it (leasehold_raft::ahead).
        let ahead = config.replicate_ahead.then(|| {
            let (observer, batches) = leasehold_raft::ahead::AheadObserver::new(raft.clone());
            log.observe_appends(Arc::new(observer));
            batches
        });
        if config.join.is_none() && !raft.is_initialized().await.map_err(raft_error)? {
            let members = BTreeMap::from([(config.id, BasicNode { addr: advertise.clone() })]);
            raft.initialize(members).await.map_err(raft_error)?;
            tracing::info!(node = config.id, addr = %advertise, "bootstrapped a single-node cluster");
        }

        let journal = Journal::new(
            JournalConfig {
                node_id: config.id,
                limits: Limits { max_payload_bytes: config.max_payload_bytes, ..Limits::default() },
                quorum_timeout: config.quorum_timeout(),
                batches_in_flight: config.batches_in_flight,
                max_clock_offset_ms: config.max_clock_offset_ms,
                // Five adverts' worth (adverts carry the measurements), and
                // never less than three seconds.
                clock_fresh_for: Duration::from_millis(
                    config.advert_interval_ms.saturating_mul(5).max(3_000),
                ),
            },
            raft.clone(),
            Arc::new(log.clone()),
            Arc::new(state),
            node_clock(&config),
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
            leasehold_core::claim_path::GateFlags {
                journal_lease: config.journal_lease,
                journal_lease_dry_run: config.journal_lease_dry_run,
            },
            secret,
            Bus::new(config.id, Arc::new(bus_table)),
            Arc::new(peer_store),
        );
        let (shutdown, shutdown_rx) = watch::channel(false);
        // Intake (driver ticks, executor claims) stops first on a drain,
        // while the servers keep serving.
        let (intake, intake_rx) = watch::channel(false);

        let (mut tasks, server_stopped) =
            serve(&config, transport, &journal, &log, &gate, &credentials, &shutdown_rx)?;
        if let Some(batches) = ahead {
            let sender =
                leasehold_raft::ahead::run(journal.peers().clone(), batches, shutdown_rx.clone());
            tasks.push(tokio::spawn(async move {
                sender.await;
                Ok(())
            }));
        }
        let unprotected = config.unprotected_ports();
        if config.insecure && !unprotected.is_empty() {
            tasks.push(tokio::spawn(warn_insecure(unprotected, shutdown_rx.clone())));
        }
        // Adverts go on through a drain (they say the node drains) until the
        // servers stop.
        let adverts = leasehold_replica::gate::run_adverts(gate.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            adverts.await;
            Ok(())
        }));
        let guard =
            leasehold_replica::clock_watch::guard_elections(journal.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            guard.await;
            Ok(())
        }));
        let intake_tasks =
            start_intake(&config, &journal, &gate, &credentials, grpc_addr, &advertise, intake_rx)?;
        tracing::info!(
            node = config.id,
            grpc = %grpc_addr,
            http = %http_addr,
            tls = credentials.tls.is_some(),
            tokens = credentials.tokens.is_some(),
            runtime_threads = tokio::runtime::Handle::current().metrics().num_workers(),
            "node started"
        );
        let handle = NodeHandle {
            grpc_addr,
            http_addr,
            journal,
            log,
            shutdown,
            server_stopped,
            tasks,
            intake,
            intake_tasks,
            drain_grace: Duration::from_millis(config.drain_grace_ms),
            credentials,
        };
        if let Some(member) = &config.join {
            let initialized = raft.is_initialized().await.map_err(raft_error)?;
            if initialized {
                tracing::info!(node = config.id, "data dir holds a membership; not joining again");
            } else {
                let joined = tokio::select! {
                    joined = join(config.id, &advertise, member, handle.journal.peers()) => joined,
                    () = stop => Err(NodeError::Join(format!(
                        "--join {member}: stopped while joining; the cluster may have added \
                         this node already (see `leasehold cluster status`, and remove it \
                         there if it will not come back)"
                    ))),
                };
                if let Err(error) = joined {
                    let _ = handle.shutdown(Duration::from_secs(5)).await;
                    return Err(error);
                }
            }
        }
        Ok(handle)
    }
}

/// The cluster secret (configured, kept, or generated; a generated one is
/// kept by [`keep_fresh_secret`] once Raft has read the data dir). A node
/// that is to join a cluster without TLS must be given the cluster's
/// secret: it proves the node to its peers, and is never sent to it.
fn cluster_secret(config: &Config) -> Result<ResolvedSecret, NodeError> {
    let secret = resolve_secret(config)?;
    if secret.fresh && config.join.is_some() && config.tls_files().is_none() {
        return Err(NodeError::Join(
            "a node joining a cluster without TLS needs that cluster's secret: set \
             cluster_secret_file (LEASEHOLD_CLUSTER_SECRET_FILE) or LEASEHOLD_CLUSTER_SECRET \
             to the secret every member uses (a first node that generated one keeps it in \
             its data dir, file cluster-secret)"
                .into(),
        ));
    }
    Ok(secret)
}

/// Keeps a secret generated at this start in the data dir, unless the data
/// dir says the node is a member of a cluster with others and has no TLS:
/// then the others prove themselves with a secret this node was given
/// before (in its configuration, now missing), and a new one would only
/// have its peers refuse it. The node refuses to start instead, naming
/// the setting.
async fn keep_fresh_secret(
    config: &Config,
    raft: &Raft,
    resolved: &ResolvedSecret,
) -> Result<(), NodeError> {
    // With TLS the node certificates prove the nodes and vouch for their
    // messages: nobody else needs this secret.
    let plaintext = config.tls_files().is_none();
    if plaintext {
        let me = config.id;
        // The membership, and the node its saved vote names: a joining
        // learner votes for its leader (it saves the leader's vote) before
        // any membership entry reaches it, a large snapshot's transfer long.
        let others: Vec<u64> = raft
            .with_raft_state(move |state| {
                let membership = state.membership_state.effective().membership();
                let vote = state.vote_ref().leader_id();
                // A pristine node's vote is the default (term 0), no one.
                let voted = vote.voted_for().filter(|_| vote.get_term() > 0);
                let mut others: Vec<u64> = membership
                    .nodes()
                    .map(|(id, _)| *id)
                    .chain(voted)
                    .filter(|id| *id != me)
                    .collect();
                others.sort_unstable();
                others.dedup();
                others
            })
            .await
            .map_err(raft_error)?;
        if !others.is_empty() {
            return Err(NodeError::Config(ConfigError::Invalid {
                field: "cluster_secret",
                problem: format!(
                    "the data dir {} names nodes {others:?} of its cluster but no cluster \
                     secret is configured or kept there: set cluster_secret_file \
                     (LEASEHOLD_CLUSTER_SECRET_FILE) or LEASEHOLD_CLUSTER_SECRET to the secret \
                     the cluster uses (a new one would be refused by every peer)",
                    config.data.display()
                ),
            }));
        }
    }
    if let Err(error) = keep_dev_secret(&config.data, &resolved.secret) {
        tracing::warn!(%error, "could not keep the generated cluster secret in the data dir");
    }
    if plaintext {
        tracing::warn!(
            file = %crate::secret::dev_secret_path(&config.data).display(),
            "no cluster secret configured: generated one and kept it in the data dir; nodes \
             that join this one need it (cluster_secret_file), or use TLS"
        );
    }
    Ok(())
}

/// The node's clock, skewed at start under fault injection.
fn node_clock(config: &Config) -> Clock {
    let clock = Clock::system();
    if config.clock_offset_ms != 0 {
        tracing::warn!(offset_ms = config.clock_offset_ms, "fault injection: clock starts skewed");
        clock.set_offset_ms(config.clock_offset_ms);
    }
    clock
}

/// How often [`NodeHandle::raft_failed`] looks whether the Raft core has
/// stopped: a fatal storage error is noticed (and the node exits) this
/// much later at most.
pub const RAFT_FAILED_CHECK: Duration = Duration::from_millis(100);

/// A task that serves until shutdown; its error says why it stopped early.
type ServingTask = JoinHandle<Result<(), String>>;

/// Starts the gRPC and HTTP servers; answers their tasks and the handle
/// that sets the gRPC health status.
fn serve(
    config: &Config,
    transport: Transport,
    journal: &Journal,
    log: &LogStore,
    gate: &Gate,
    credentials: &Credentials,
    shutdown: &watch::Receiver<bool>,
) -> Result<(Vec<ServingTask>, watch::Receiver<Option<String>>), NodeError> {
    let readiness = Readiness::new(journal.clone());
    let (stopped, server_stopped) = watch::channel(None);
    let health =
        HealthService::new(readiness.clone()).with_shutdown(shutdown.clone()).into_server();
    // Reflection lists the services this node serves, and only those (the
    // Faults service only with fault injection on), in both protocol
    // versions: many tools still speak only v1alpha.
    let reflection = || {
        let mut builder = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(leasehold_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            // Both versions' descriptors in both, so each describes both.
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            );
        for name in served_services(config.fault_injection) {
            builder = builder.with_service_name(name);
        }
        builder
    };
    let reflection_v1 = reflection().build_v1().map_err(|e| NodeError::Serve(e.to_string()))?;
    let reflection_v1alpha =
        reflection().build_v1alpha().map_err(|e| NodeError::Serve(e.to_string()))?;
    let faults = config.fault_injection.then(|| {
        let log = log.clone();
        let store_fault = Arc::new(move |on| log.set_fault(on));
        FaultsServer::new(FaultsService::new(journal.clone(), store_fault))
            .max_decoding_message_size(limits::MAX_SMALL_REQUEST_BYTES)
    });
    if faults.is_some() {
        tracing::warn!(node = config.id, "fault injection is on: the Faults service is exposed");
    }
    let auth = AuthLayer::new(
        AuthConfig {
            tls: credentials.tls.is_some(),
            secret: credentials.secret.clone(),
            tokens: credentials.tokens.clone(),
        },
        journal.metrics().auth_refused.clone(),
    );
    // One instance of each public service: gRPC serves them, and the status
    // page reads the same ones, so the page and the CLI share one source.
    let queue = QueueService::new(journal.clone()).with_shutdown(shutdown.clone());
    let cluster = ClusterService::new(journal.clone(), gate.clone(), readiness.clone());
    let schedules = SchedulesService::new(journal.clone());
    let status = StatusSources::new(
        cluster.clone(),
        queue.clone(),
        schedules.clone(),
        credentials.tokens.clone(),
    );
    let layers = tower::ServiceBuilder::new().layer(SizeLimitLayer).layer(auth).into_inner();
    let grpc = tonic::transport::Server::builder()
        .timeout(limits::CALL_DEADLINE)
        .max_concurrent_streams(Some(limits::MAX_STREAMS_PER_CONNECTION))
        .http2_max_header_list_size(Some(limits::MAX_HEADER_LIST_BYTES))
        .layer(layers)
        .add_optional_service(faults)
        // Health is open to anyone, reflection to any reader: their
        // requests are a service name or a symbol, so they take as little
        // as the Cluster service's.
        .add_service(health.max_decoding_message_size(limits::MAX_SMALL_REQUEST_BYTES))
        .add_service(reflection_v1.max_decoding_message_size(limits::MAX_SMALL_REQUEST_BYTES))
        .add_service(reflection_v1alpha.max_decoding_message_size(limits::MAX_SMALL_REQUEST_BYTES))
        .add_service(
            QueueServer::new(queue.clone())
                .max_decoding_message_size(limits::MAX_QUEUE_REQUEST_BYTES)
                .max_encoding_message_size(limits::MAX_QUEUE_RESPONSE_BYTES),
        )
        .add_service(
            ClusterServer::new(cluster.clone())
                .max_decoding_message_size(limits::MAX_SMALL_REQUEST_BYTES),
        )
        .add_service(
            PeerServer::new(PeerService::new(gate.clone()))
                .max_decoding_message_size(limits::MAX_SMALL_REQUEST_BYTES),
        )
        .add_service(
            SchedulesServer::new(schedules.clone())
                .max_decoding_message_size(limits::MAX_SCHEDULES_REQUEST_BYTES),
        )
        .add_service(
            RaftServer::new(RaftService::new(journal.clone()).with_shutdown(shutdown.clone()))
                .max_decoding_message_size(limits::MAX_RAFT_MESSAGE_BYTES)
                .max_encoding_message_size(limits::MAX_RAFT_MESSAGE_BYTES),
        );
    let incoming = incoming::incoming(
        transport.grpc,
        credentials.server_tls.clone(),
        ConnectionLimits { http2_opening: true, ..ConnectionLimits::default() },
    );
    let grpc = grpc.serve_with_incoming_shutdown(incoming, signalled(shutdown.clone()));
    let http = leasehold_server::http::serve(
        transport.http,
        readiness.clone(),
        status,
        signalled(shutdown.clone()),
    );
    let leader = leasehold_replica::readiness::track_leader(readiness, shutdown.clone());
    let tasks = vec![
        tokio::spawn(watched("gRPC", grpc, shutdown.clone(), stopped.clone())),
        tokio::spawn(watched("HTTP", http, shutdown.clone(), stopped.clone())),
        tokio::spawn(async move {
            leader.await;
            Ok(())
        }),
    ];
    Ok((tasks, server_stopped))
}

/// Runs server `name` and, when it ends before the node is shut down (its
/// listener failed: a socket error that is not a passing one), says so on
/// `stopped`, so the node does not go on as if it served
/// ([`NodeHandle::server_stopped`]).
async fn watched<E: std::fmt::Display>(
    name: &'static str,
    server: impl std::future::Future<Output = Result<(), E>>,
    shutdown: watch::Receiver<bool>,
    stopped: watch::Sender<Option<String>>,
) -> Result<(), String> {
    let result = server.await.map_err(|e| e.to_string());
    if !*shutdown.borrow() {
        let why = match &result {
            Ok(()) => format!("the {name} server stopped"),
            Err(error) => format!("the {name} server stopped: {error}"),
        };
        stopped.send_replace(Some(why));
    }
    result
}

/// The gRPC services a node serves, by full name, as reflection lists them.
fn served_services(fault_injection: bool) -> Vec<&'static str> {
    leasehold_server::auth::SERVICES
        .into_iter()
        .filter(|name| fault_injection || *name != "leasehold.v1.Faults")
        .collect()
}

/// Starts what takes in work: the executor (when on), the node's
/// registration, and the driver. They stop first on a drain.
fn start_intake(
    config: &Config,
    journal: &Journal,
    gate: &Gate,
    credentials: &Credentials,
    grpc_addr: SocketAddr,
    advertise: &str,
    stop: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, NodeError> {
    let mut tasks = Vec::new();
    if config.executor {
        // The executor dials this node's own listener, never the advertised
        // address (which may be a proxy or a load balancer in front of it);
        // with TLS it checks the certificate against the advertised host,
        // which the node certificate names.
        let own = own_address(grpc_addr);
        // Retries outlast a failover (an ack forwarded to a leader that just
        // died must reach the next one, or the job runs twice): about 20 s.
        let client = credentials.own_client(&own, advertise)?.with_retry(RetryPolicy {
            attempts: 12,
            first_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(2),
        });
        let executor_config = ExecutorConfig {
            node_id: config.id,
            queues: config.executor_queues.clone(),
            concurrency: config.executor_concurrency,
            timeout: Duration::from_millis(config.executor_timeout_ms),
            tags: config.tags.clone(),
            grace: Duration::from_millis(config.drain_grace_ms),
            commands: commands::shell(),
        };
        tasks.push(tokio::spawn(executor::run(executor_config, client, stop.clone())));
    }
    tasks.push(tokio::spawn(register(journal.clone(), config.tags.clone(), stop.clone())));
    let driver_config = driver_config(config);
    tasks.push(tokio::spawn(driver::run(journal.clone(), gate.clone(), driver_config, stop)));
    Ok(tasks)
}

/// The driver's settings: a bus tick is run here only where the executor
/// would run its journal job, so the driver judges by the executor's
/// queues and the tags it claims with (`node:ID` included).
fn driver_config(config: &Config) -> DriverConfig {
    DriverConfig {
        sweep_interval: Duration::from_millis(config.sweep_interval_ms),
        purge_interval: Duration::from_millis(config.purge_interval_ms),
        run_commands: config.executor,
        queues: config.executor_queues.clone(),
        tags: executor::selector(config.id, &config.tags),
        command_timeout: Duration::from_millis(config.executor_timeout_ms),
        grace: Duration::from_millis(config.drain_grace_ms),
        commands: commands::shell(),
    }
}

/// The address a node's own clients dial: its listener, on loopback when
/// it listens on every address.
fn own_address(grpc_addr: SocketAddr) -> String {
    let ip = match grpc_addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, grpc_addr.port()).to_string()
}

/// The host of `host:port` or `scheme://host:port` (brackets of an IPv6
/// literal removed), for TLS name checks.
fn host_of(addr: &str) -> String {
    let rest = addr.split_once("://").map_or(addr, |(_, rest)| rest).trim_end_matches('/');
    let host = match rest.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => rest,
    };
    host.trim_start_matches('[').trim_end_matches(']').to_string()
}

/// How often a node listening beyond loopback without TLS and tokens says so.
const INSECURE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Logs, every minute until shutdown, that this node is exposed.
async fn warn_insecure(
    ports: Vec<String>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), String> {
    let mut tick = tokio::time::interval(INSECURE_WARNING_EVERY);
    let ports = ports.join("; ");
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = tick.tick() => tracing::warn!(
                event = "auth.insecure",
                ports = %ports,
                "--insecure: this node listens beyond loopback without its protection; anyone who \
                 reaches a gRPC port so exposed can run commands on the fleet, and an HTTP port \
                 so exposed shows the cluster"
            ),
        }
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
        let command = registration(node, &tags, current.as_ref(), journal.is_draining());
        let Some(command) = command else { return };
        match journal.propose(command).await {
            // Refused when applied (the journal judged it and will again):
            // proposing it once more would only write the log in a loop.
            Ok(leasehold_core::Response::Refused(refusal)) => {
                tracing::error!(?refusal, ?tags, "the journal refused this node's registration");
                return;
            }
            Ok(_) => {}
            // The leader refused the forwarded batch it rode in, which may
            // be another command's doing (or a build it cannot read, in an
            // upgrade): tried again, less often.
            Err(leasehold_replica::JournalError::PeerRefused(why)) => {
                tracing::error!(%why, ?tags, "the leader refused the batch this node's registration rode in");
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
            }
            Err(error) => {
                tracing::debug!(%error, "node registration not committed yet");
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// What `register` proposes for node `node` with `tags`, given its entry
/// in the journal: its registration, or the end of an earlier drain's mark
/// (a node restarted after a drain serves again), or nothing. Never the
/// end of the mark while this node drains (`draining_here`): that mark is
/// the drain's own, which a registration still retrying when the drain
/// began would otherwise erase.
fn registration(
    node: u64,
    tags: &[String],
    current: Option<&leasehold_core::node_info::NodeInfo>,
    draining_here: bool,
) -> Option<leasehold_core::Command> {
    let registered = current.is_some_and(|n| n.tags == tags);
    let marked = current.is_some_and(|n| n.draining);
    if !registered {
        Some(leasehold_core::Command::RegisterNode { node, tags: tags.to_vec() })
    } else if marked && !draining_here {
        Some(leasehold_core::Command::SetDraining { node, draining: false })
    } else {
        None
    }
}

/// How long a joining node keeps asking before it gives up.
const JOIN_DEADLINE: Duration = Duration::from_secs(180);

/// Asks `member` to add this node (learner, then voter once caught up),
/// over a peer channel, so the call carries this node's credentials.
/// Retries while the cluster is unavailable; a refusal (id or address in
/// use, bad input, credentials the cluster does not accept) ends the
/// attempt with its message.
async fn join(
    id: u64,
    advertise: &str,
    member: &str,
    peers: &NetworkFactory,
) -> Result<(), NodeError> {
    let channel =
        peers.channel(member).map_err(|e| NodeError::Join(format!("--join {member}: {e}")))?;
    let mut client = ClusterClient::new(channel);
    let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
    loop {
        let request = JoinRequest {
            id,
            addr: advertise.to_string(),
            log_format: leasehold_core::command::LOG_FORMAT,
        };
        match client.join(request).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                tracing::info!(node = id, leader = reply.leader, voters = ?reply.voters, "joined the cluster");
                return Ok(());
            }
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::AlreadyExists
                        | tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::Unauthenticated
                        | tonic::Code::PermissionDenied
                ) =>
            {
                return Err(NodeError::Join(format!("--join {member}: {}", status.message())));
            }
            Err(status) if tls_failure(&status).is_some() => {
                // Certificates do not fix themselves; say so at once.
                let problem = tls_failure(&status).unwrap_or_default();
                return Err(NodeError::Join(format!(
                    "--join {member}: TLS handshake failed: {problem} (are --tls-ca, --tls-cert \
                     and --tls-key this cluster's?)"
                )));
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

/// The TLS error under a failed call, if the call failed in the
/// handshake (a certificate the other side refused, or that this side did).
fn tls_failure(status: &tonic::Status) -> Option<String> {
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(status);
    while let Some(error) = cause {
        let text = error.to_string();
        let lower = text.to_ascii_lowercase();
        if lower.contains("certificate") || lower.contains("handshake") || lower.contains("alert") {
            return Some(text);
        }
        cause = error.source();
    }
    None
}

async fn signalled(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
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
    raft.validate().map(Arc::new).map_err(raft_error)
}

impl NodeHandle {
    /// Reads the tokens file and the TLS files again (on SIGHUP) and puts
    /// them in force: later calls are checked against the new tokens,
    /// later connections (both ways) use the new certificates, and open
    /// connections keep theirs. The tokens file and the TLS files are
    /// taken each on its own: the error names the kind that failed to
    /// load, which keeps what it had, while the other is in force.
    pub fn reload_credentials(&self) -> Result<(), NodeError> {
        self.credentials.reload()?;
        tracing::info!(
            event = "auth.reload",
            tls = self.credentials.tls_files.is_some(),
            tokens = self.credentials.tokens_file.is_some(),
            "credentials reloaded"
        );
        Ok(())
    }

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

    /// The node's Raft log store: tests read entries from it and slow its
    /// syncs (`LogStore::set_sync_delay`).
    pub fn log_store(&self) -> &LogStore {
        &self.log
    }

    /// The node's Raft handle.
    pub fn raft(&self) -> &Raft {
        self.journal.raft()
    }

    /// Resolves when this node's Raft core has stopped on a fatal error (a
    /// storage write it could not make, such as on a full disk), with the
    /// error, within [`RAFT_FAILED_CHECK`]. The node can serve nothing from
    /// then on; the binary exits non-zero so a supervisor restarts it on
    /// its data dir.
    pub async fn raft_failed(&self) -> String {
        // Looked at on a timer, not on every change: openraft 0.9 republishes
        // its metrics on each turn of its core, many times per write, and a
        // waiter on that channel was woken (a thread unparked) every time
        // (about 2% of the nodes' CPU at 32 clients) to find nothing wrong.
        let metrics = self.journal.raft().metrics();
        let mut check = tokio::time::interval(RAFT_FAILED_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            check.tick().await;
            if let Err(fatal) = &metrics.borrow().running_state {
                return fatal.to_string();
            }
            // The metrics channel closed: the core is gone.
            if metrics.has_changed().is_err() {
                return "the Raft core stopped".to_string();
            }
        }
    }

    /// Resolves, with why, once the gRPC or HTTP server stopped while the
    /// node was not shutting down (its listener failed); pending until then.
    pub async fn server_stopped(&self) -> String {
        let mut stopped = self.server_stopped.clone();
        match stopped.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The node's own sender is gone only when it is dropped.
            Err(_) => std::future::pending().await,
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
        match tokio::time::timeout(DRAIN_WRITE_WITHIN, self.journal.propose(mark)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not mark the node draining in the journal");
            }
            Err(_) => tracing::warn!(
                "could not mark the node draining in the journal within {} ms",
                DRAIN_WRITE_WITHIN.as_millis()
            ),
        }
        step("stop intake");
        let _ = self.intake.send(true);
        let intake_tasks = std::mem::take(&mut self.intake_tasks);
        let aborts: Vec<_> = intake_tasks.iter().map(JoinHandle::abort_handle).collect();
        let mut wait_intake = std::pin::pin!(async {
            for task in intake_tasks {
                let _ = task.await;
            }
        });
        if tokio::time::timeout(self.drain_grace + Duration::from_secs(2), wait_intake.as_mut())
            .await
            .is_err()
        {
            tracing::warn!(
                event = "drain.step",
                step = "grace over",
                "running commands did not finish within the grace period"
            );
            // Stopped before their leases are released below: a command
            // still running then would run on beside the next holder.
            for abort in &aborts {
                abort.abort();
            }
            let _ = tokio::time::timeout(Duration::from_secs(2), wait_intake).await;
        }
        // A command dropped at the end of the grace period was killed (or
        // is about to be, its task's abort still under way), and a killed
        // process lives on until it next runs: given back before it is
        // gone, its job could start on another node beside it.
        let killed_gone =
            leasehold_client::exec::commands_gone(leasehold_client::exec::KILL_SETTLE).await;
        step("release");
        if killed_gone {
            self.release_held().await;
        } else {
            tracing::warn!(
                event = "drain.step",
                step = "release",
                "a process of a command this node ran is still there; the leases are left to lapse"
            );
        }
        step("hand over");
        self.hand_over().await;
        step("close");
        self.shutdown(Duration::from_secs(5)).await
    }

    /// Releases every lease this node's executor still holds, so other
    /// nodes can take the jobs now rather than after the TTL: in one
    /// proposal (one log entry) per 256, all within [`DRAIN_WRITE_WITHIN`],
    /// so a node that lost its quorum waits once, not once per lease,
    /// before leaving them to lapse.
    async fn release_held(&self) {
        let worker = format!("node-{}", self.journal.node_id());
        let held = self.journal.read_stale(|state| state.leases_held_by(&worker, None));
        let deadline = tokio::time::Instant::now() + DRAIN_WRITE_WITHIN;
        for chunk in held.chunks(leasehold_core::command::MAX_BATCH_COMMANDS) {
            let commands = chunk
                .iter()
                .map(|&(job_id, token)| leasehold_core::Command::Release { job_id, token })
                .collect();
            let batch = leasehold_core::Command::Batch { commands };
            let answer = tokio::time::timeout_at(deadline, self.journal.propose(batch));
            match answer.await {
                Ok(Ok(leasehold_core::Response::Batch(responses))) => {
                    for ((job_id, token), response) in chunk.iter().zip(responses) {
                        tracing::info!(
                            event = "lease.release",
                            job = job_id,
                            token,
                            ?response,
                            "released on drain"
                        );
                    }
                }
                Ok(Ok(other)) => tracing::warn!(
                    ?other,
                    "release on drain answered unexpectedly; the leases will lapse"
                ),
                Ok(Err(error)) => tracing::warn!(
                    leases = chunk.len(),
                    %error,
                    "release on drain failed; the leases will lapse"
                ),
                Err(_) => tracing::warn!(
                    leases = chunk.len(),
                    "release on drain not committed within {} ms; the leases will lapse",
                    DRAIN_WRITE_WITHIN.as_millis()
                ),
            }
        }
    }

    /// If this node leads, asks the most caught-up other voter to start an
    /// election (`Journal::hand_over`) and waits (briefly) for leadership
    /// to move.
    async fn hand_over(&self) {
        if !self.journal.is_leader() {
            return;
        }
        let me = self.journal.node_id();
        let successor = match self
            .journal
            .hand_over(leasehold_replica::journal::HAND_OVER_CATCH_UP, None)
            .await
        {
            Some((successor, Ok(()))) => successor,
            Some((successor, Err(error))) => {
                tracing::warn!(%error, successor, "handover failed; followers will elect after the timeout");
                return;
            }
            None => return,
        };
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
        for task in &self.intake_tasks {
            task.abort();
        }
        for task in self.intake_tasks {
            let _ = task.await;
        }
        let mut failure = None;
        let aborts: Vec<_> = self.tasks.iter().map(JoinHandle::abort_handle).collect();
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
            tracing::warn!(
                "serving tasks did not stop within {} ms; ending them",
                grace.as_millis()
            );
            for abort in aborts {
                abort.abort();
            }
        }
        self.journal.shutdown().await;
        // Read before stopping Raft, which then reports itself stopped: a
        // core that quit on a fatal error meanwhile (a storage fault during
        // a drain, say) makes this shutdown a failure, so the process does
        // not exit 0 as if it had drained cleanly.
        let fatal = match &self.journal.raft().metrics().borrow().running_state {
            Err(fatal) => Some(fatal.to_string()),
            Ok(()) => None,
        };
        self.journal.raft().shutdown().await.map_err(raft_error)?;
        if let Some(fatal) = fatal {
            return Err(NodeError::RaftFailed(fatal));
        }
        match failure {
            Some(e) => Err(NodeError::Serve(e)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node restarted after a drain clears the old mark; a node that
    /// drains now never clears its own.
    #[test]
    fn registration_never_clears_the_mark_of_a_drain_under_way() {
        let tags = vec!["eu".to_string()];
        let info =
            |draining: bool| leasehold_core::node_info::NodeInfo { tags: tags.clone(), draining };
        let clear = leasehold_core::Command::SetDraining { node: 3, draining: false };
        assert_eq!(registration(3, &tags, Some(&info(true)), false), Some(clear));
        assert_eq!(registration(3, &tags, Some(&info(true)), true), None);
        assert_eq!(registration(3, &tags, Some(&info(false)), false), None);
        let register = leasehold_core::Command::RegisterNode { node: 3, tags: tags.clone() };
        assert_eq!(registration(3, &tags, None, true), Some(register));
    }

    #[test]
    fn the_driver_judges_bus_ticks_by_the_executors_queues_and_tags() {
        let config = Config {
            id: 3,
            tags: vec!["db".into()],
            executor_queues: vec!["exec.db".into()],
            ..Config::default()
        };
        let driver = driver_config(&config);
        assert_eq!(driver.queues, vec!["exec.db".to_string()]);
        assert!(driver.tags.contains(&"db".to_string()), "{:?}", driver.tags);
        assert!(driver.tags.contains(&"node:3".to_string()), "{:?}", driver.tags);
        assert_eq!(driver.run_commands, config.executor);
    }

    #[test]
    fn own_clients_dial_the_listener_and_check_the_advertised_host() {
        assert_eq!(own_address("0.0.0.0:7070".parse().expect("addr")), "127.0.0.1:7070");
        assert_eq!(own_address("[::]:7070".parse().expect("addr")), "[::1]:7070");
        assert_eq!(own_address("127.0.0.12:7071".parse().expect("addr")), "127.0.0.12:7071");
        assert_eq!(host_of("127.0.0.21:9001"), "127.0.0.21");
        assert_eq!(host_of("https://node1.example:7070/"), "node1.example");
        assert_eq!(host_of("[::1]:7070"), "::1");
        assert_eq!(host_of("node1.example"), "node1.example");
    }
}
