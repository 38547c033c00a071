//! The supervisor: starts N real `leasehold serve` processes, each with its
//! own loopback IP, data directory and log file, and kills, pauses,
//! terminates and restarts them on demand. It finds the leader by asking
//! every node for its own status directly (not through the proxies, so a
//! partition never blinds the harness). Every node gets the run's
//! credentials ([`Security::node_args`]: TLS and tokens, or the shared
//! cluster secret), and the supervisor's own calls carry a token of the role
//! they need: `reader` for status, `admin` for flags and faults. Dropping it
//! SIGKILLs every process it started, by pid, and nothing else.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::faults_client::FaultsClient;
use leasehold_testkit::Check;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::security::{AuthChannel, Role, Security};

/// Where one node lives.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Node id (>= 1).
    pub id: u64,
    /// Its loopback IP; peer connections leave from it.
    pub ip: Ipv4Addr,
    /// The gRPC address the node listens on.
    pub grpc: SocketAddr,
    /// The HTTP address the node listens on.
    pub http: SocketAddr,
    /// The address peers and clients use (the harness proxy in front of it).
    pub advertise: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its log file (appended to across restarts).
    pub log_path: PathBuf,
    /// Its config file (written by the runner), if any.
    pub config: Option<PathBuf>,
}

/// The state of one node process as the supervisor knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessState {
    /// Running.
    Running,
    /// Stopped by SIGSTOP.
    Paused,
    /// Not running.
    Down,
}

struct NodeProcess {
    spec: NodeSpec,
    child: Option<Child>,
    paused: bool,
    starts: u32,
    channel: Channel,
    last_exit: Option<std::process::ExitStatus>,
}

/// How long a SIGTERMed node may take to drain before it is killed.
const TERMINATE_GRACE: Duration = Duration::from_secs(15);
/// Deadline of a status or fault call to one node.
const NODE_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts and signals node processes.
pub struct Supervisor {
    bin: PathBuf,
    security: Security,
    nodes: BTreeMap<u64, NodeProcess>,
}

/// A free port on `ip` (see [`leasehold_testkit::free_port`]).
pub fn free_port(ip: Ipv4Addr) -> anyhow::Result<SocketAddr> {
    let port = leasehold_testkit::free_port(IpAddr::V4(ip))?;
    Ok(SocketAddr::new(IpAddr::V4(ip), port))
}

impl Supervisor {
    /// A supervisor for `specs`, running `bin` with `security`'s
    /// credentials. Starts nothing yet.
    pub fn new(bin: &Path, specs: Vec<NodeSpec>, security: Security) -> anyhow::Result<Supervisor> {
        if !bin.is_file() {
            anyhow::bail!(
                "node binary {} not found (build it: cargo build -p leasehold-cli)",
                bin.display()
            );
        }
        let mut nodes = BTreeMap::new();
        for spec in specs {
            let channel = security.channel(spec.grpc)?;
            nodes.insert(
                spec.id,
                NodeProcess {
                    spec,
                    child: None,
                    paused: false,
                    starts: 0,
                    channel,
                    last_exit: None,
                },
            );
        }
        Ok(Supervisor { bin: bin.to_path_buf(), security, nodes })
    }

    /// The node ids, ascending.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// A node's spec.
    pub fn spec(&self, id: u64) -> anyhow::Result<&NodeSpec> {
        self.nodes.get(&id).map(|n| &n.spec).ok_or_else(|| anyhow::anyhow!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut NodeProcess> {
        self.nodes.get_mut(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))
    }

    /// How often each node was started (restarts included).
    pub fn starts(&self) -> BTreeMap<u64, u32> {
        self.nodes.iter().map(|(id, n)| (*id, n.starts)).collect()
    }

    /// Starts node `id`; `join` names a member's gRPC address for a first
    /// start (a restarted node finds its membership in its data dir).
    pub fn start(&mut self, id: u64, join: Option<SocketAddr>) -> anyhow::Result<()> {
        let bin = self.bin.clone();
        let credentials = self.security.node_args(id);
        let node = self.node_mut(id)?;
        if node.child.is_some() {
            anyhow::bail!("node {id} is already running");
        }
        let spec = &node.spec;
        std::fs::create_dir_all(&spec.data_dir)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_path)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", spec.log_path.display()))?;
        let mut command = Command::new(&bin);
        command
            .arg("serve")
            .arg("--id")
            .arg(spec.id.to_string())
            .arg("--grpc")
            .arg(spec.grpc.to_string())
            .arg("--http")
            .arg(spec.http.to_string())
            .arg("--data")
            .arg(&spec.data_dir)
            .arg("--advertise")
            .arg(spec.advertise.to_string())
            .arg("--fault-injection")
            .args(&credentials)
            .env("LEASEHOLD_LOG", "info,openraft=warn,raft_log=warn,chunked_wal=warn")
            // The cron workload's commands report which node ran them.
            .env("CHAOS_NODE_ID", spec.id.to_string())
            // Log files, not a terminal: no colour codes.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(member) = join {
            command.arg("--join").arg(member.to_string());
        }
        if let Some(config) = &spec.config {
            command.arg("--config").arg(config);
        }
        let child =
            command.spawn().map_err(|e| anyhow::anyhow!("starting {}: {e}", bin.display()))?;
        tracing::info!(node = id, pid = child.id(), "node started");
        node.child = Some(child);
        node.paused = false;
        node.starts += 1;
        Ok(())
    }

    fn pid(&self, id: u64) -> anyhow::Result<Pid> {
        let node = self.nodes.get(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        let child =
            node.child.as_ref().ok_or_else(|| anyhow::anyhow!("node {id} is not running"))?;
        let pid = i32::try_from(child.id())?;
        Ok(Pid::from_raw(pid))
    }

    /// The process state of node `id` (reaping it if it exited).
    pub fn state(&mut self, id: u64) -> ProcessState {
        let Some(node) = self.nodes.get_mut(&id) else { return ProcessState::Down };
        let exited = match node.child.as_mut() {
            None => return ProcessState::Down,
            Some(child) => matches!(child.try_wait(), Ok(Some(_))),
        };
        if exited {
            if let Some(status) = node.child.take().and_then(|mut c| c.try_wait().ok().flatten()) {
                tracing::warn!(node = id, %status, "node exited");
                node.last_exit = Some(status);
            }
            node.paused = false;
            return ProcessState::Down;
        }
        if node.paused { ProcessState::Paused } else { ProcessState::Running }
    }

    /// One line per node: its process state, how its last process ended,
    /// and the last lines of its log; what a failure to form names, so a
    /// node that exited at start (a port taken meanwhile, a refusal) is
    /// told apart from one that runs and does not answer.
    pub fn describe_nodes(&mut self) -> String {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        let mut lines = Vec::new();
        for id in ids {
            let state = self.state(id);
            let Some(node) = self.nodes.get(&id) else { continue };
            let exit =
                node.last_exit.map(|status| format!(", last exit {status}")).unwrap_or_default();
            let log = std::fs::read_to_string(&node.spec.log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            lines.push(format!("node {id}: {state:?}{exit}; log ends: {}", tail.join(" | ")));
        }
        lines.join("\n")
    }

    /// How node `id`'s last process ended: `Some(code)` for an exit,
    /// `None` for a signal (or not known).
    pub fn last_exit_code(&self, id: u64) -> Option<i32> {
        self.nodes.get(&id).and_then(|n| n.last_exit).and_then(|s| s.code())
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let pid = self.pid(id)?;
        kill(pid, Signal::SIGKILL)?;
        self.wait_exit(id, Duration::from_secs(10)).await
    }

    /// SIGSTOP.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        let pid = self.pid(id)?;
        kill(pid, Signal::SIGSTOP)?;
        self.node_mut(id)?.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        let pid = self.pid(id)?;
        kill(pid, Signal::SIGCONT)?;
        self.node_mut(id)?.paused = false;
        Ok(())
    }

    /// SIGTERM (the node drains), then SIGKILL if it has not exited within
    /// the grace period.
    pub async fn terminate(&mut self, id: u64) -> anyhow::Result<()> {
        let pid = self.pid(id)?;
        if self.node_mut(id)?.paused {
            kill(pid, Signal::SIGCONT)?;
        }
        kill(pid, Signal::SIGTERM)?;
        if self.wait_exit(id, TERMINATE_GRACE).await.is_err() {
            tracing::warn!(node = id, "did not exit after SIGTERM; killing");
            self.kill(id).await?;
        }
        Ok(())
    }

    /// Starts a node that is down again (no join: its data dir knows).
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.state(id) != ProcessState::Down {
            anyhow::bail!("node {id} is still running");
        }
        self.start(id, None)
    }

    async fn wait_exit(&mut self, id: u64, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if self.state(id) == ProcessState::Down {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!("node {id} did not exit within {} ms", limit.as_millis());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A node's own status (asked directly, local only).
    pub async fn local_status(&self, id: u64) -> anyhow::Result<v1::NodeStatus> {
        let mut client = self.cluster(id, Role::Reader)?;
        let mut request = tonic::Request::new(v1::StatusRequest { local_only: true });
        request.set_timeout(NODE_CALL_TIMEOUT);
        let reply = tokio::time::timeout(NODE_CALL_TIMEOUT, client.status(request))
            .await
            .map_err(|_| anyhow::anyhow!("node {id}: status timed out"))??;
        reply
            .into_inner()
            .nodes
            .into_iter()
            .find(|n| n.id == id)
            .ok_or_else(|| anyhow::anyhow!("node {id}: status carried no entry for itself"))
    }

    /// Every running node's own status (nodes that do not answer are left out).
    pub async fn statuses(&self) -> BTreeMap<u64, v1::NodeStatus> {
        let mut result = BTreeMap::new();
        for id in self.ids() {
            if let Ok(status) = self.local_status(id).await {
                result.insert(id, status);
            }
        }
        result
    }

    /// The leader: among nodes that say they lead, the one with the highest
    /// term (a deposed leader may not know yet).
    pub async fn leader(&self) -> Option<u64> {
        leasehold_testkit::highest_term_leader(self.statuses().await.values())
    }

    /// Waits until some node leads.
    pub async fn wait_for_leader(&self, limit: Duration) -> anyhow::Result<u64> {
        let deadline = leasehold_testkit::deadline_in(limit);
        leasehold_testkit::wait_until("a leader", deadline, || async {
            Ok(match self.leader().await {
                Some(leader) => Check::Done(leader),
                None => Check::NotYet("no node leads".to_string()),
            })
        })
        .await
    }

    /// Waits until the leader counts `voters` voters and every node answers.
    pub async fn wait_for_voters(&self, voters: usize, limit: Duration) -> anyhow::Result<()> {
        let what = format!("{voters} voters, every node answering");
        leasehold_testkit::wait_until(&what, leasehold_testkit::deadline_in(limit), || async {
            let statuses = self.statuses().await;
            let all_voters = statuses.values().filter(|s| s.voter).count();
            Ok(if statuses.len() == self.nodes.len() && all_voters >= voters {
                Check::Done(())
            } else {
                Check::NotYet(format!("answering: {}, voters: {all_voters}", statuses.len()))
            })
        })
        .await
    }

    /// A Cluster client for node `id` (direct, not through its proxy),
    /// calling as `role`.
    pub fn cluster(&self, id: u64, role: Role) -> anyhow::Result<ClusterClient<AuthChannel>> {
        let node = self.nodes.get(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        Ok(ClusterClient::new(self.security.intercept(node.channel.clone(), role)))
    }

    /// A Faults client for node `id` (direct, not through its proxy); the
    /// Faults service needs `admin`.
    pub fn faults(&self, id: u64) -> anyhow::Result<FaultsClient<AuthChannel>> {
        let node = self.nodes.get(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        Ok(FaultsClient::new(self.security.intercept(node.channel.clone(), Role::Admin)))
    }

    /// Stops every node: SIGCONT the paused, SIGTERM all, SIGKILL stragglers.
    pub async fn stop_all(&mut self) {
        for id in self.ids() {
            if self.state(id) == ProcessState::Down {
                continue;
            }
            if let Err(error) = self.terminate(id).await {
                tracing::warn!(node = id, %error, "stopping node");
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                let _ = child.wait();
            }
        }
    }
}
