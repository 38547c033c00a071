//! The harness the end-to-end stories share: a per-test sandbox directory,
//! a guard that SIGKILLs its process on drop, a `leasehold serve` node that
//! can be killed and restarted on the same data and ports, a cluster of such
//! nodes formed through `--join`, a runner for one-shot CLI invocations, a
//! plain HTTP GET for the health and metrics endpoints, TLS clients for
//! nodes started with `leasehold dev-certs` certificates, and `wait_until`,
//! the only way a test waits.
//!
//! Nothing here sleeps to synchronize: every wait is a named condition with
//! a deadline, and a timeout says what was awaited and what was last seen.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use leasehold_client::{Client, ClientTls};
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::faults_client::FaultsClient;
use leasehold_proto::v1::queue_client::QueueClient;
use leasehold_proto::v1::schedules_client::SchedulesClient;
pub use leasehold_testkit::{Check, NODE_READY_TIMEOUT, Process, Sandbox, deadline_in, wait_until};
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The id every single-node test cluster runs as.
pub const NODE_ID: u64 = 1;

/// Deadline of one raw gRPC call made by a test.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a one-shot CLI invocation may run.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of one HTTP request to a node.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Logs a phase of a story, so a failure's output reads as the story does.
pub fn phase(name: &str) {
    eprintln!("--- {name}");
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    leasehold_testkit::free_port(std::net::Ipv4Addr::LOCALHOST.into())
}

/// The `leasehold` binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_leasehold")
}

/// One `leasehold serve` process with fixed id, ports and data directory,
/// so it can be killed and restarted as the same node: alone (node 1, which
/// bootstraps a single-node cluster) or as a member of a [`Cluster`].
pub struct Node {
    /// Node id.
    pub id: u64,
    /// gRPC listen address.
    pub grpc: SocketAddr,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// sled data directory.
    pub data: PathBuf,
    /// TOML configuration file passed with `--config`, if any; a story may
    /// point it at another file between runs (a clock offset, say).
    pub config: Option<PathBuf>,
    /// The member to join through; `None` bootstraps (when the data
    /// directory holds no membership yet).
    join: Option<SocketAddr>,
    /// `LEASEHOLD_LOG` of the process (empty: unset, the node's default).
    log_filter: String,
    /// A `leasehold dev-certs` directory: the node then runs with mutual
    /// TLS (its `node-ID` certificate) and the directory's tokens file.
    pub secure: Option<PathBuf>,
    /// More `serve` flags, after the ones every node gets.
    pub extra_args: Vec<String>,
    process: Option<Process>,
    log: Option<PathBuf>,
    incarnation: u32,
}

/// The log filter of every node unless a test asks for another: none, so
/// the node logs what it logs for an operator who sets nothing.
const DEFAULT_LOG_FILTER: &str = "";
/// The cluster secret every node started here shares: adverts and bus
/// claims are authenticated with it (`LEASEHOLD_CLUSTER_SECRET`).
pub const CLUSTER_SECRET: &str = "leasehold-e2e-cluster-secret";

impl Node {
    /// Starts node 1 in `sandbox` on free ports and waits until it serves.
    pub async fn start(sandbox: &Sandbox) -> Result<Node> {
        let mut node = Node::new(sandbox, NODE_ID, None, None)?;
        node.launch(sandbox)?;
        node.wait_leading().await?;
        Ok(node)
    }

    /// Node `id` on free ports with its data in `sandbox/data-ID`, not started.
    pub fn new(
        sandbox: &Sandbox,
        id: u64,
        config: Option<PathBuf>,
        join: Option<SocketAddr>,
    ) -> Result<Node> {
        Ok(Node {
            id,
            grpc: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            http: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            data: sandbox.path().join(format!("data-{id}")),
            config,
            join,
            log_filter: DEFAULT_LOG_FILTER.to_string(),
            secure: None,
            extra_args: Vec::new(),
            process: None,
            log: None,
            incarnation: 0,
        })
    }

    /// The gRPC address as a URI, as clients and `LEASEHOLD_ADDR` take it.
    pub fn addr(&self) -> String {
        let scheme = if self.secure.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.grpc)
    }

    /// A typed client of this node (lazy: connects on first use); on a
    /// secure node, with the client certificate and the admin token.
    pub fn client(&self) -> Result<Client> {
        secure_client(&self.addr(), self.secure.as_deref())
    }

    /// A raw generated Queue stub (no retries, answers exactly what the
    /// server said).
    pub fn stub(&self) -> Result<QueueClient<Channel>> {
        Ok(QueueClient::new(self.channel()?)
            .max_encoding_message_size(64 * 1024 * 1024)
            .max_decoding_message_size(64 * 1024 * 1024))
    }

    /// A raw generated Cluster stub.
    pub fn cluster_stub(&self) -> Result<ClusterClient<Channel>> {
        Ok(ClusterClient::new(self.channel()?))
    }

    /// A raw generated Schedules stub.
    pub fn schedules_stub(&self) -> Result<SchedulesClient<Channel>> {
        Ok(SchedulesClient::new(self.channel()?))
    }

    /// A raw generated Faults stub (served only with `fault_injection`).
    pub fn faults_stub(&self) -> Result<FaultsClient<Channel>> {
        Ok(FaultsClient::new(self.channel()?))
    }

    /// A raw channel. On a secure node it speaks TLS as node 1 (a node's
    /// certificate may call anything), so the harness's own polls need no
    /// token; the stories judge clients with [`secure_client`] and friends.
    fn channel(&self) -> Result<Channel> {
        let mut endpoint = Endpoint::from_shared(self.addr())
            .context("endpoint")?
            .connect_timeout(Duration::from_secs(2))
            .timeout(RPC_TIMEOUT);
        if let Some(certs) = &self.secure {
            endpoint = endpoint.tls_config(tls_config(certs, "node-1")?)?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// The log of the current (or last) run.
    pub fn log(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Fails if the node process has died.
    pub fn ensure_running(&mut self) -> Result<()> {
        match &mut self.process {
            Some(process) => process.ensure_running(),
            None => bail!("node {} is not running", self.id),
        }
    }

    /// Sends `signal` to the node process (SIGSTOP, SIGCONT, SIGTERM…).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        match &self.process {
            Some(process) => process.signal(signal),
            None => bail!("node {} is not running; cannot send {signal}", self.id),
        }
    }

    /// Waits for the node process to exit by itself before `deadline`.
    pub async fn wait_exit(&mut self, deadline: Instant) -> Result<ExitStatus> {
        match &mut self.process {
            Some(process) => process.wait_exit(deadline).await,
            None => bail!("node {} is not running", self.id),
        }
    }

    /// SIGKILLs the node: no drain, no flush, no goodbye.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            process.kill()?;
        }
        Ok(())
    }

    /// Whether a process of this node was started and not yet stopped or
    /// killed by the test (it may still have died on its own: see
    /// [`Node::ensure_running`]).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Stops the node as an operator would: SIGTERM, then waits until the
    /// drained process exits by itself, which must be with status 0 and
    /// before `deadline`.
    pub async fn stop(&mut self, deadline: Instant) -> Result<()> {
        let Some(process) = &mut self.process else { return Ok(()) };
        process.signal(Signal::SIGTERM)?;
        let status = process.wait_exit(deadline).await?;
        self.process = None;
        ensure!(status.success(), "node {} exited {status} after SIGTERM", self.id);
        Ok(())
    }

    /// Starts a single node again on the same ports and data, and waits
    /// until it leads, reports ready and serves.
    pub async fn restart(&mut self, sandbox: &Sandbox) -> Result<()> {
        self.kill()?;
        self.launch(sandbox)?;
        self.wait_leading().await
    }

    /// Starts the process (`--join` when the node has a member to join
    /// through) without waiting for anything.
    pub fn launch(&mut self, sandbox: &Sandbox) -> Result<()> {
        ensure!(self.process.is_none(), "node {} is already running", self.id);
        self.incarnation += 1;
        let log = sandbox.log_file(&format!("node-{}-run-{}", self.id, self.incarnation));
        let mut command = Command::new(binary());
        command
            .arg("serve")
            .args(["--id", &self.id.to_string()])
            .args(["--grpc", &self.grpc.to_string()])
            .args(["--http", &self.http.to_string()])
            .arg("--data")
            .arg(&self.data)
            .env_remove("LEASEHOLD_ADDR")
            .env_remove("LEASEHOLD_TOKENS")
            .env_remove("LEASEHOLD_INSECURE")
            .env_remove("LEASEHOLD_TLS_CA")
            .env_remove("LEASEHOLD_TLS_CERT")
            .env_remove("LEASEHOLD_TLS_KEY")
            // A thread count from the caller's shell would change every node.
            .env_remove("LEASEHOLD_RUNTIME_THREADS")
            .env_remove("TOKIO_WORKER_THREADS")
            .env("LEASEHOLD_CLUSTER_SECRET", CLUSTER_SECRET)
            .env("NO_COLOR", "1");
        if self.log_filter.is_empty() {
            command.env_remove("LEASEHOLD_LOG");
        } else {
            command.env("LEASEHOLD_LOG", &self.log_filter);
        }
        if let Some(config) = &self.config {
            command.arg("--config").arg(config);
        }
        if let Some(member) = self.join {
            command.args(["--join", &member.to_string()]);
        }
        if let Some(certs) = &self.secure {
            command
                .arg("--tls-ca")
                .arg(certs.join("ca.pem"))
                .arg("--tls-cert")
                .arg(certs.join(format!("node-{}.pem", self.id)))
                .arg("--tls-key")
                .arg(certs.join(format!("node-{}.key", self.id)))
                .arg("--tokens")
                .arg(certs.join("tokens.toml"));
        }
        command.args(&self.extra_args);
        let name = format!("node {} (run {})", self.id, self.incarnation);
        self.process = Some(Process::spawn(&name, command, &log)?);
        self.log = Some(log);
        Ok(())
    }

    /// Waits until the node names itself leader, reports itself ready and
    /// answers a linearizable read, failing at once if the process dies
    /// meanwhile.
    pub async fn wait_leading(&mut self) -> Result<()> {
        let client = self.client()?;
        let id = self.id;
        let what = format!("node {id} at {} to lead, be ready and serve reads", self.grpc);
        wait_until(&what, deadline_in(NODE_READY_TIMEOUT), || {
            let running = self.ensure_running();
            let client = client.clone();
            async move {
                running?;
                let status = match client.status().await {
                    Ok(status) => status,
                    Err(error) => return Ok(Check::NotYet(format!("status: {error}"))),
                };
                if status.leader != id {
                    return Ok(Check::NotYet(format!("leader is {}", status.leader)));
                }
                // Readiness is cached for a second: an answer from before
                // the election would otherwise outlive this wait, and a
                // story's next status would show the node not ready.
                match status.nodes.iter().find(|node| node.id == id) {
                    Some(node) if node.ready => {}
                    Some(node) => {
                        return Ok(Check::NotYet(format!("not ready: {:?}", node.not_ready)));
                    }
                    None => return Ok(Check::NotYet("not in its own status".to_string())),
                }
                match client.stats(None, false).await {
                    Ok(_) => Ok(Check::Done(())),
                    Err(error) => Ok(Check::NotYet(format!("stats: {error}"))),
                }
            }
        })
        .await
    }

    /// The first panic the current run's log reports, with the line after
    /// it (where Rust prints the message). A node whose Raft task panicked
    /// may keep serving stale answers, but it will never converge again.
    pub fn panic_in_log(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.log.as_ref()?).ok()?;
        let mut lines = text.lines().skip_while(|line| !line.contains("panicked at"));
        let first = lines.next()?;
        Some(format!("node {} panicked: {first} {}", self.id, lines.next().unwrap_or_default()))
    }

    /// This node's own status (Cluster.Status with `local_only`).
    pub async fn local_status(&self) -> Result<v1::NodeStatus> {
        let mut stub = self.cluster_stub()?;
        let reply = stub
            .status(v1::StatusRequest { local_only: true })
            .await
            .with_context(|| format!("status of node {}", self.id))?
            .into_inner();
        reply
            .nodes
            .into_iter()
            .find(|n| n.id == self.id)
            .with_context(|| format!("node {}'s status does not list itself", self.id))
    }
}

/// A client of `addrs`: plain, or, with a `dev-certs` directory, with its
/// client certificate and admin token.
pub fn secure_client(addrs: &str, certs: Option<&Path>) -> Result<Client> {
    let Some(certs) = certs else {
        return Client::connect(addrs).map_err(|error| anyhow!("client of {addrs}: {error}"));
    };
    let tls = ClientTls::from_files(
        &certs.join("ca.pem"),
        &certs.join("client.pem"),
        &certs.join("client.key"),
    )?;
    let token = std::fs::read_to_string(certs.join("token-admin")).context("token-admin")?;
    Client::builder(addrs)
        .tls(tls)
        .token(token.trim())
        .build()
        .map_err(|error| anyhow!("client of {addrs}: {error}"))
}

/// A tonic TLS configuration trusting `certs/ca.pem`, with `certs/NAME.pem`
/// and `certs/NAME.key` as identity.
pub fn tls_config(certs: &Path, name: &str) -> Result<ClientTlsConfig> {
    let read = |file: String| {
        std::fs::read(certs.join(&file)).with_context(|| format!("{}", certs.join(file).display()))
    };
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem".into())?))
        .identity(Identity::from_pem(read(format!("{name}.pem"))?, read(format!("{name}.key"))?)))
}

/// Runs `leasehold dev-certs DIR` (the real command) for `nodes` nodes.
pub async fn dev_certs(sandbox: &Sandbox, dir: &Path, nodes: u64) -> Result<()> {
    let dir = dir.to_str().context("a UTF-8 path")?;
    run_cli(sandbox, &["dev-certs", dir, "--nodes", &nodes.to_string()], &[]).await?.success()?;
    Ok(())
}

/// How long a cluster may take to form, or to converge again after a fault.
pub const CLUSTER_CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a cluster must apply nothing to count as quiet: longer than
/// the one-second retry of a joining node's self-registration.
pub const QUIET: Duration = Duration::from_secs(2);

/// How a [`Cluster`] is started.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// TOML written to a file every node gets with `--config` (empty: none).
    pub config: String,
    /// `LEASEHOLD_LOG` of every node (empty: unset, the node's default).
    pub log_filter: String,
    /// A `leasehold dev-certs` directory: every node runs with mutual TLS
    /// and its tokens (see [`Node::secure`]).
    pub secure: Option<PathBuf>,
    /// More TOML for one node (by id), appended to `config` in a file of
    /// that node's own, so it must not repeat a key of `config`: one node's
    /// clock skew or election timeouts, say.
    pub node_config: Vec<(u64, String)>,
}

/// What a converged cluster answered: every member a reachable voter, one
/// leader that all agree on, and one digest at one applied index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converged {
    /// The leader's id.
    pub leader: u64,
    /// The leader's term.
    pub term: u64,
    /// The applied index every node reported.
    pub applied_index: u64,
    /// The state digest every node reported.
    pub digest: u64,
}

/// A cluster of `leasehold serve` processes on 127.0.0.1: node 1 bootstraps
/// and the others join through it. Each node keeps its ports and data
/// directory, so it can be killed, paused, wiped and restarted as itself.
pub struct Cluster {
    nodes: Vec<Node>,
    /// The configuration every node shares (without any one node's extra).
    config: Option<PathBuf>,
}

impl Cluster {
    /// Starts `size` nodes with default settings; see [`Cluster::start_with`].
    pub async fn start(sandbox: &Sandbox, size: u64) -> Result<Cluster> {
        Cluster::start_with(sandbox, size, ClusterOptions::default()).await
    }

    /// Starts node 1, waits until it leads, then starts nodes 2…`size` one
    /// at a time with `--join` node 1, each once the previous is a voter, and
    /// waits until the cluster has converged and gone quiet.
    pub async fn start_with(
        sandbox: &Sandbox,
        size: u64,
        options: ClusterOptions,
    ) -> Result<Cluster> {
        ensure!(size >= 1, "a cluster needs at least one node");
        let config = if options.config.is_empty() {
            None
        } else {
            let path = sandbox.path().join("node.toml");
            std::fs::write(&path, &options.config).context("writing the node config")?;
            Some(path)
        };
        let config_of = |id: u64| -> Result<Option<PathBuf>> {
            let extra: Vec<&str> = options
                .node_config
                .iter()
                .filter(|(node, _)| *node == id)
                .map(|(_, toml)| toml.as_str())
                .collect();
            if extra.is_empty() {
                return Ok(config.clone());
            }
            let path = sandbox.path().join(format!("node-{id}.toml"));
            let text = format!("{}\n{}\n", options.config, extra.join("\n"));
            std::fs::write(&path, text).with_context(|| format!("writing node {id}'s config"))?;
            Ok(Some(path))
        };
        let mut first = Node::new(sandbox, 1, config_of(1)?, None)?;
        if !options.log_filter.is_empty() {
            first.log_filter = options.log_filter.clone();
        }
        first.secure = options.secure.clone();
        first.launch(sandbox)?;
        first.wait_leading().await?;
        let join = first.grpc;
        let mut cluster = Cluster { nodes: vec![first], config: config.clone() };
        for id in 2..=size {
            let mut node = Node::new(sandbox, id, config_of(id)?, Some(join))?;
            node.log_filter = cluster.nodes[0].log_filter.clone();
            node.secure = options.secure.clone();
            node.launch(sandbox)?;
            cluster.nodes.push(node);
            cluster.wait_voter(id).await?;
        }
        let converged = cluster.wait_quiet(QUIET, CLUSTER_CONVERGE_TIMEOUT).await?;
        eprintln!("cluster of {size} formed: {converged:?}");
        Ok(cluster)
    }

    /// Node `id`.
    pub fn node(&self, id: u64) -> Result<&Node> {
        self.nodes.iter().find(|n| n.id == id).with_context(|| format!("no node {id}"))
    }

    /// Node `id`, to kill, signal or restart it.
    pub fn node_mut(&mut self, id: u64) -> Result<&mut Node> {
        self.nodes.iter_mut().find(|n| n.id == id).with_context(|| format!("no node {id}"))
    }

    /// Every node, in id order, for a story that polls them all itself.
    pub fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes
    }

    /// A node `id` that is not part of the cluster yet, set to join through
    /// node 1, with the configuration every node shares, not started (a
    /// story launches it, or changes it first).
    pub fn spare_node(&self, sandbox: &Sandbox, id: u64) -> Result<Node> {
        let first = self.node(1)?;
        Node::new(sandbox, id, self.config.clone(), Some(first.grpc))
    }

    /// Every node id.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The gRPC addresses of `ids`, comma-separated, as `Client::connect` takes them.
    pub fn addrs_of(&self, ids: &[u64]) -> Result<String> {
        let addrs: Result<Vec<String>> = ids.iter().map(|id| Ok(self.node(*id)?.addr())).collect();
        Ok(addrs?.join(","))
    }

    /// Every node's gRPC address, comma-separated.
    pub fn addrs(&self) -> String {
        self.nodes.iter().map(Node::addr).collect::<Vec<_>>().join(",")
    }

    /// A client of every node (it rotates on UNAVAILABLE and broken
    /// connections); on a secure cluster with the client certificate and
    /// the admin token.
    pub fn client(&self) -> Result<Client> {
        let secure = self.nodes.first().and_then(|n| n.secure.as_deref());
        secure_client(&self.addrs(), secure)
    }

    /// Waits until node 1 lists node `id` as a reachable voter, failing at
    /// once if the joining process dies.
    async fn wait_voter(&mut self, id: u64) -> Result<()> {
        let asked = self.node(1)?.cluster_stub()?;
        let what = format!("node {id} to join as a voter");
        wait_until(&what, deadline_in(CLUSTER_CONVERGE_TIMEOUT), || {
            let running = self.node_mut(id).and_then(Node::ensure_running);
            let mut asked = asked.clone();
            async move {
                running?;
                let status = match asked.status(v1::StatusRequest { local_only: false }).await {
                    Ok(status) => status.into_inner(),
                    Err(error) => return Ok(Check::NotYet(format!("status: {error}"))),
                };
                Ok(match status.nodes.iter().find(|n| n.id == id) {
                    Some(node) if node.voter && node.reachable => Check::Done(()),
                    Some(node) => Check::NotYet(format!("{node:?}")),
                    None => Check::NotYet(format!("not a member yet: {:?}", status.nodes)),
                })
            }
        })
        .await
    }

    /// Waits until every node is running and, asked in turn, each answers
    /// the same picture: all nodes reachable voters, exactly one leader (the
    /// one its `leader` field names), one term, and equal digests at equal
    /// applied indexes. One node is asked per poll until its answer looks
    /// converged; only then are the others asked to confirm.
    pub async fn wait_converged(&mut self, within: Duration) -> Result<Converged> {
        let size = self.nodes.len();
        let what = format!("{size} nodes to converge: one leader, equal digests");
        wait_until(&what, deadline_in(within), || {
            let stubs = self.converge_stubs();
            async move { look_converged(stubs?, size).await }
        })
        .await
    }

    /// Waits until the cluster has converged and applied no write for
    /// `quiet`. Nodes write on their own for a moment after they start or
    /// join (each registers itself, retrying every second until it is a
    /// member), so a story comparing digests across a step starts from
    /// here rather than from the first converged answer.
    pub async fn wait_quiet(&mut self, quiet: Duration, within: Duration) -> Result<Converged> {
        let size = self.nodes.len();
        let what =
            format!("{size} nodes to converge and apply nothing for {} ms", quiet.as_millis());
        // The picture last seen and since when, shared with each look.
        let mark: Arc<Mutex<Option<(Converged, Instant)>>> = Arc::default();
        wait_until(&what, deadline_in(within), || {
            let stubs = self.converge_stubs();
            let mark = mark.clone();
            async move {
                let seen = match look_converged(stubs?, size).await? {
                    Check::Done(seen) => seen,
                    Check::NotYet(why) => return Ok(Check::NotYet(why)),
                };
                let mut mark = mark.lock().map_err(|_| anyhow!("the quiet mark is poisoned"))?;
                Ok(match mark.as_ref() {
                    Some((first, at)) if *first == seen && at.elapsed() >= quiet => {
                        Check::Done(seen)
                    }
                    Some((first, at)) if *first == seen => {
                        Check::NotYet(format!("quiet for {} ms", at.elapsed().as_millis()))
                    }
                    _ => {
                        let landed = format!("a write landed: {seen:?}");
                        *mark = Some((seen, Instant::now()));
                        Check::NotYet(landed)
                    }
                })
            }
        })
        .await
    }

    /// Status stubs of every node, or why a look would be pointless: a
    /// node process died, or a node's log reports a panic (a node whose
    /// Raft task panicked may keep answering, but never converges again).
    fn converge_stubs(&mut self) -> Result<Vec<(u64, ClusterClient<Channel>)>> {
        self.nodes.iter_mut().try_for_each(Node::ensure_running)?;
        if let Some(panic) = self.nodes.iter().find_map(Node::panic_in_log) {
            bail!("{panic}");
        }
        self.nodes.iter().map(|n| Ok((n.id, n.cluster_stub()?))).collect()
    }

    /// Waits until one of `candidates` leads, as each of them that is asked
    /// sees it: the first that answers names a leader among `candidates`
    /// that reports itself leader. Answers its id.
    pub async fn wait_leader_among(&self, candidates: &[u64], within: Duration) -> Result<u64> {
        let stubs: Vec<(u64, ClusterClient<Channel>)> = candidates
            .iter()
            .map(|id| Ok((*id, self.node(*id)?.cluster_stub()?)))
            .collect::<Result<_>>()?;
        let what = format!("one of nodes {candidates:?} to lead");
        wait_until(&what, deadline_in(within), || {
            let stubs = stubs.clone();
            async move {
                let mut seen = Vec::new();
                for (asked, mut stub) in stubs {
                    let status = match stub.status(v1::StatusRequest { local_only: true }).await {
                        Ok(status) => status.into_inner(),
                        Err(error) => {
                            seen.push(format!("node {asked}: {}", error.message()));
                            continue;
                        }
                    };
                    let me = status.nodes.iter().find(|n| n.id == asked);
                    if let Some(me) = me
                        && me.role == "leader"
                        && status.leader == asked
                    {
                        return Ok(Check::Done(asked));
                    }
                    seen.push(format!(
                        "node {asked}: leader {}, role {:?}",
                        status.leader,
                        me.map(|m| m.role.as_str())
                    ));
                }
                Ok(Check::NotYet(seen.join("; ")))
            }
        })
        .await
    }

    /// Kills node `id` and deletes its data directory, as a replaced disk
    /// would. Its next start joins through another member: node 1 included,
    /// which would otherwise bootstrap a cluster of its own.
    pub fn wipe(&mut self, id: u64) -> Result<()> {
        let other = self
            .nodes
            .iter()
            .find(|node| node.id != id)
            .map(|node| node.grpc)
            .context("no other member to rejoin through")?;
        let node = self.node_mut(id)?;
        node.kill()?;
        std::fs::remove_dir_all(&node.data)
            .with_context(|| format!("wiping {}", node.data.display()))?;
        node.join.get_or_insert(other);
        Ok(())
    }

    /// Starts node `id` again on its ports and data directory (with
    /// `--join` unless it bootstrapped the cluster; a node whose data holds
    /// a membership does not join again), and waits until it answers and
    /// knows a leader.
    pub async fn restart(&mut self, sandbox: &Sandbox, id: u64) -> Result<()> {
        let node = self.node_mut(id)?;
        node.kill()?;
        node.launch(sandbox)?;
        let what = format!("node {id} to answer and know a leader");
        wait_until(&what, deadline_in(NODE_READY_TIMEOUT), || {
            let probe = self.node_mut(id).and_then(|node| {
                node.ensure_running()?;
                node.cluster_stub()
            });
            async move {
                let mut stub = probe?;
                let status = match stub.status(v1::StatusRequest { local_only: true }).await {
                    Ok(status) => status.into_inner(),
                    Err(error) => return Ok(Check::NotYet(error.message().to_string())),
                };
                Ok(if status.leader != 0 {
                    Check::Done(())
                } else {
                    Check::NotYet("no leader known".to_string())
                })
            }
        })
        .await
    }

    /// Waits until node `id` has applied everything the leader had
    /// committed when the wait began: a restarted node has caught up. The
    /// target is read once, so the wait ends under a load that keeps
    /// committing.
    pub async fn wait_caught_up(&mut self, id: u64, within: Duration) -> Result<()> {
        let deadline = deadline_in(within);
        let client = self.client()?;
        let (client, cluster) = (&client, &*self);
        let (leader, target) = wait_until("a leader's commit index", deadline, || async move {
            let leader = match client.status().await {
                Ok(status) if status.leader != 0 => status.leader,
                Ok(_) => return Ok(Check::NotYet("no leader known".to_string())),
                Err(error) => return Ok(Check::NotYet(format!("status: {error}"))),
            };
            Ok(match cluster.node(leader)?.local_status().await {
                Ok(me) if me.role == "leader" => Check::Done((leader, me.commit_index)),
                Ok(me) => Check::NotYet(format!("named leader answers {me:?}")),
                Err(error) => Check::NotYet(format!("{error:#}")),
            })
        })
        .await?;
        let stub = self.node(id)?.cluster_stub()?;
        let what = format!("node {id} to apply index {target}, leader {leader}'s commit");
        wait_until(&what, deadline, || {
            let running = self.node_mut(id).and_then(Node::ensure_running);
            let mut stub = stub.clone();
            async move {
                running?;
                let status = match stub.status(v1::StatusRequest { local_only: true }).await {
                    Ok(status) => status.into_inner(),
                    Err(error) => return Ok(Check::NotYet(error.message().to_string())),
                };
                let applied = status.nodes.iter().find(|n| n.id == id).map(|n| n.applied_index);
                Ok(match applied {
                    Some(applied) if applied >= target => Check::Done(()),
                    other => Check::NotYet(format!("applied {other:?}")),
                })
            }
        })
        .await
    }
}

/// One look at a cluster through `stubs`: each node is asked in turn, and
/// the look ends at the first answer that is not converged or differs from
/// the answers before it.
async fn look_converged(
    stubs: Vec<(u64, ClusterClient<Channel>)>,
    size: usize,
) -> Result<Check<Converged>> {
    let mut agreed: Option<Converged> = None;
    for (asked, mut stub) in stubs {
        let status = match stub.status(v1::StatusRequest { local_only: false }).await {
            Ok(status) => status.into_inner(),
            Err(error) => return Ok(Check::NotYet(format!("node {asked}: {}", error.message()))),
        };
        let seen = match converged_view(&status, size) {
            Ok(seen) => seen,
            Err(why) => return Ok(Check::NotYet(format!("node {asked}: {why}"))),
        };
        match &agreed {
            Some(first) if *first != seen => {
                return Ok(Check::NotYet(format!(
                    "node {asked} sees {seen:?}, an earlier node {first:?}"
                )));
            }
            _ => agreed = Some(seen),
        }
    }
    Ok(agreed.map_or_else(|| Check::NotYet("no nodes".to_string()), Check::Done))
}

/// The converged picture in one node's status answer, or why it is not one.
fn converged_view(status: &v1::StatusResponse, size: usize) -> Result<Converged, String> {
    if status.nodes.len() != size {
        return Err(format!("{} members, expected {size}", status.nodes.len()));
    }
    if let Some(node) = status.nodes.iter().find(|n| !n.reachable || !n.voter) {
        return Err(format!("not a reachable voter: {node:?}"));
    }
    let leaders: Vec<u64> =
        status.nodes.iter().filter(|n| n.role == "leader").map(|n| n.id).collect();
    if leaders != [status.leader] {
        return Err(format!("leader field {}, nodes in role leader {leaders:?}", status.leader));
    }
    if let Some(node) = status.nodes.iter().find(|n| n.id != status.leader && n.role != "follower")
    {
        return Err(format!("neither leader nor follower: {node:?}"));
    }
    // A digest describes the state at its own index, which trails the
    // applied index while a node's last digest is still being reused.
    if let Some(node) = status.nodes.iter().find(|n| n.digest_index != n.applied_index) {
        return Err(format!(
            "node {} applied {} but its digest is of index {}",
            node.id, node.applied_index, node.digest_index
        ));
    }
    let first = &status.nodes[0];
    let apart = status.nodes.iter().find(|n| {
        n.term != first.term || n.applied_index != first.applied_index || n.digest != first.digest
    });
    if let Some(node) = apart {
        return Err(format!(
            "node {} at term {} applied {} digest {:016x}, node {} at term {} applied {} digest \
             {:016x}",
            first.id,
            first.term,
            first.applied_index,
            first.digest,
            node.id,
            node.term,
            node.applied_index,
            node.digest
        ));
    }
    Ok(Converged {
        leader: status.leader,
        term: first.term,
        applied_index: first.applied_index,
        digest: first.digest,
    })
}

/// One HTTP response, read whole.
#[derive(Debug)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The Content-Type header (empty when absent).
    pub content_type: String,
    /// The body.
    pub body: String,
}

/// `GET path` over HTTP/1.0 (so the body is delimited by the connection's
/// close, never chunked), bounded by [`HTTP_TIMEOUT`].
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<HttpReply> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.context("connect")?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.context("write")?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.context("read")?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("GET {path} on {addr}: no answer within {HTTP_TIMEOUT:?}"))?
        .with_context(|| format!("GET {path} on {addr}"))?;
    let text = String::from_utf8(raw).context("the response is not UTF-8")?;
    let (head, body) =
        text.split_once("\r\n\r\n").ok_or_else(|| anyhow!("no end of headers: {text:?}"))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let mut content_type = String::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("transfer-encoding") {
                bail!("unexpected {line:?} in an HTTP/1.0 response");
            }
            if name.eq_ignore_ascii_case("content-type") {
                content_type = value.trim().to_string();
            }
        }
    }
    Ok(HttpReply { status, content_type, body: body.to_string() })
}

/// What a one-shot CLI invocation did.
pub struct CliRun {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

impl CliRun {
    /// Fails unless the command exited 0.
    pub fn success(self) -> Result<CliRun> {
        if !self.status.success() {
            bail!(
                "command failed ({}); stdout: {:?}; stderr: {:?}",
                self.status,
                self.stdout,
                self.stderr
            );
        }
        Ok(self)
    }

    /// stdout as one JSON document.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("stdout is not JSON: {:?}", self.stdout))
    }
}

/// Runs `leasehold ARGS…` with `env` set, bounded by a deadline; its stdout
/// and stderr are kept as files in the sandbox.
pub async fn run_cli(sandbox: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Result<CliRun> {
    let label: String = args
        .iter()
        .take(2)
        .copied()
        .collect::<Vec<_>>()
        .join("-")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .take(40)
        .collect();
    let stdout_path = sandbox.log_file(&format!("cli-{label}.stdout"));
    let stderr_path = sandbox.log_file(&format!("cli-{label}.stderr"));
    let mut command = Command::new(binary());
    command.args(args).env("NO_COLOR", "1");
    for inherited in [
        "LEASEHOLD_ADDR",
        "LEASEHOLD_TOKEN",
        "LEASEHOLD_TLS_CA",
        "LEASEHOLD_TLS_CERT",
        "LEASEHOLD_TLS_KEY",
        "LEASEHOLD_RUNTIME_THREADS",
        "TOKIO_WORKER_THREADS",
    ] {
        command.env_remove(inherited);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let name = format!("leasehold {}", args.join(" "));
    let mut process = Process::spawn_split(&name, command, &stdout_path, &stderr_path)?;
    let status = process.wait_exit(deadline_in(CLI_TIMEOUT)).await?;
    let run = CliRun {
        status,
        stdout: std::fs::read_to_string(&stdout_path).context("reading stdout")?,
        stderr: std::fs::read_to_string(&stderr_path).context("reading stderr")?,
    };
    eprintln!("$ leasehold {} -> {}", args.join(" "), run.status);
    Ok(run)
}

/// The part of Stats that only a change of state moves: every queue's
/// counts, the last token and the last job id (cluster time moves on its own).
#[derive(Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Counts of every queue.
    pub queues: Vec<v1::QueueStats>,
    /// Last fencing token issued.
    pub last_token: u64,
    /// Last job id assigned.
    pub last_job_id: u64,
}

/// A linearizable Stats snapshot of all queues.
pub async fn stats_snapshot(stub: &mut QueueClient<Channel>) -> Result<StatsSnapshot> {
    let stats = stub
        .stats(v1::StatsRequest { queue: None, stale: false })
        .await
        .context("stats")?
        .into_inner();
    Ok(StatsSnapshot {
        queues: stats.queues,
        last_token: stats.last_token,
        last_job_id: stats.last_job_id,
    })
}

/// The counts of one queue (all zero when the queue has no jobs).
pub async fn queue_stats(stub: &mut QueueClient<Channel>, queue: &str) -> Result<v1::QueueStats> {
    let stats = stub
        .stats(v1::StatsRequest { queue: Some(queue.to_string()), stale: false })
        .await
        .with_context(|| format!("stats of {queue}"))?
        .into_inner();
    Ok(stats
        .queues
        .into_iter()
        .find(|q| q.queue == queue)
        .unwrap_or(v1::QueueStats { queue: queue.to_string(), ..Default::default() }))
}

/// A job spec on `queue` with `payload` and every other field defaulted.
pub fn job(queue: &str, payload: &[u8]) -> v1::JobSpec {
    v1::JobSpec { queue: queue.to_string(), payload: payload.to_vec(), ..Default::default() }
}

/// Job `job_id` as a linearizable read through `stub` answers it.
pub async fn get_job(stub: &mut QueueClient<Channel>, job_id: u64) -> Result<v1::Job> {
    stub.get_job(v1::GetJobRequest { job_id, stale: false })
        .await
        .context("get job")?
        .into_inner()
        .job
        .context("reply without a job")
}

/// Enqueues one job of `payload` into `queue` through `stub`; its id.
pub async fn enqueue_job(
    stub: &mut QueueClient<Channel>,
    queue: &str,
    payload: &[u8],
) -> Result<u64> {
    let enqueued = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![job(queue, payload)] })
        .await
        .context("enqueue")?
        .into_inner();
    match enqueued.results.as_slice() {
        [result] => Ok(result.job_id),
        other => bail!("enqueue answered {other:?}"),
    }
}
