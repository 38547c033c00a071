//! The harness the end-to-end stories share: a per-test sandbox directory,
//! a guard that SIGKILLs its process on drop, a `leasehold serve` node that
//! can be killed and restarted on the same data and ports, a runner for
//! one-shot CLI invocations, and `wait_until`, the only way a test waits.
//!
//! Nothing here sleeps to synchronize: every wait is a named condition with
//! a deadline, and a timeout says what was awaited and what was last seen.

use std::fs::File;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use leasehold_client::Client;
use leasehold_proto::v1;
use leasehold_proto::v1::queue_client::QueueClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// The id every single-node test cluster runs as.
pub const NODE_ID: u64 = 1;

/// How often a condition is re-checked while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a freshly started (or restarted) node may take to serve.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of one raw gRPC call made by a test.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a one-shot CLI invocation may run.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of each log printed when a test fails.
const LOG_TAIL_LINES: usize = 40;

/// The answer of one look at a condition.
pub enum Check<T> {
    /// The condition holds; the wait is over and answers this value.
    Done(T),
    /// Not yet; the text says what was seen, for the timeout message.
    NotYet(String),
}

/// Waits until `check` answers [`Check::Done`], re-checking every 50 ms,
/// and fails with `what` and the last observation once `deadline` passes.
/// An `Err` from `check` is fatal and ends the wait at once (a process that
/// died will not come back by waiting).
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Instant, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let started = Instant::now();
    loop {
        let seen = match check().await.with_context(|| format!("while waiting for {what}"))? {
            Check::Done(value) => return Ok(value),
            Check::NotYet(seen) => seen,
        };
        if Instant::now() >= deadline {
            bail!(
                "timed out after {:.1} s waiting for {what}; last seen: {seen}",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep_until((Instant::now() + POLL_INTERVAL).min(deadline)).await;
    }
}

/// A deadline `within` from now.
pub fn deadline_in(within: Duration) -> Instant {
    Instant::now() + within
}

/// Logs a phase of a story, so a failure's output reads as the story does.
pub fn phase(name: &str) {
    eprintln!("--- {name}");
}

/// A free TCP port on 127.0.0.1: bind port 0, read the port, let it go.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr().context("reading the bound address")?.port())
}

/// One test's sandbox: its temporary directory and the logs written there.
/// When the test fails (an `Err` from [`Sandbox::run`], a timeout, or a
/// panic) the directory is kept and every log's path and tail are printed.
pub struct Sandbox {
    name: String,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    logs: Mutex<Vec<PathBuf>>,
    files: AtomicU32,
    failed: AtomicBool,
}

impl Sandbox {
    /// A fresh sandbox for the test `name`.
    pub fn new(name: &str) -> Result<Sandbox> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("leasehold-e2e-{name}-"))
            .tempdir()
            .context("creating the test directory")?;
        let path = dir.path().to_path_buf();
        eprintln!("test {name}: directory {}", path.display());
        Ok(Sandbox {
            name: name.to_string(),
            dir: Some(dir),
            path,
            logs: Mutex::new(Vec::new()),
            files: AtomicU32::new(0),
            failed: AtomicBool::new(false),
        })
    }

    /// The sandbox directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new file path in the sandbox, numbered so repeated invocations never
    /// overwrite each other's logs, and remembered for the failure report.
    pub fn log_file(&self, label: &str) -> PathBuf {
        let number = self.files.fetch_add(1, Ordering::SeqCst);
        let path = self.path.join(format!("{number:03}-{label}.log"));
        if let Ok(mut logs) = self.logs.lock() {
            logs.push(path.clone());
        }
        path
    }

    /// Runs the story `body` with a time budget; on failure prints the logs
    /// and keeps the directory.
    pub async fn run(
        &self,
        budget: Duration,
        body: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let started = Instant::now();
        let outcome = match tokio::time::timeout(budget, body).await {
            Ok(outcome) => outcome,
            Err(_) => Err(anyhow!("test exceeded its budget of {} s", budget.as_secs())),
        };
        match &outcome {
            Ok(()) => {
                eprintln!("test {}: passed in {:.1} s", self.name, started.elapsed().as_secs_f64())
            }
            Err(error) => {
                eprintln!("test {}: FAILED: {error:#}", self.name);
                self.failed.store(true, Ordering::SeqCst);
            }
        }
        outcome
    }

    fn report_logs(&self) {
        eprintln!("test {}: kept directory {}", self.name, self.path.display());
        let logs = self.logs.lock().map(|logs| logs.clone()).unwrap_or_default();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!("===== {} (last {} lines) =====", log.display(), tail.len());
            for line in tail {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.failed.load(Ordering::SeqCst) || std::thread::panicking() {
            self.report_logs();
            if let Some(dir) = self.dir.take() {
                let _ = dir.keep();
            }
        }
    }
}

/// A started child process, SIGKILLed by its pid and reaped when dropped so
/// no test leaves a process behind, whatever way it ends.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Process> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log handle")?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command.spawn().with_context(|| format!("starting {name}: {command:?}"))?;
        eprintln!("started {name} (pid {}), log {}", child.id(), log.display());
        Ok(Process { name: name.to_string(), child, log: log.to_path_buf(), exited: None })
    }

    fn pid(&self) -> Result<Pid> {
        let raw = i32::try_from(self.child.id()).context("pid does not fit a pid_t")?;
        Ok(Pid::from_raw(raw))
    }

    /// Sends `signal` to the process (by its pid).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        if self.exited.is_some() {
            bail!("{} already exited; cannot send {signal}", self.name);
        }
        kill(self.pid()?, signal).with_context(|| format!("sending {signal} to {}", self.name))
    }

    /// The exit status, if the process has exited.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited =
                self.child.try_wait().with_context(|| format!("polling {}", self.name))?;
        }
        Ok(self.exited)
    }

    /// Waits for the process to exit by itself before `deadline`.
    pub async fn wait_exit(&mut self, deadline: Instant) -> Result<ExitStatus> {
        let what = format!("{} to exit", self.name);
        wait_until(&what, deadline, || {
            let status = self.exit_status();
            async move {
                Ok(match status? {
                    Some(status) => Check::Done(status),
                    None => Check::NotYet("still running".to_string()),
                })
            }
        })
        .await
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        if self.exit_status()?.is_some() {
            return Ok(());
        }
        self.signal(Signal::SIGKILL)?;
        let status = self.child.wait().with_context(|| format!("reaping {}", self.name))?;
        self.exited = Some(status);
        Ok(())
    }

    /// Fails if the process has exited (it was expected to keep running).
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.exit_status()? {
            None => Ok(()),
            Some(status) => {
                bail!("{} exited unexpectedly ({status}); log {}", self.name, self.log.display())
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Err(error) = self.kill() {
            eprintln!("cleanup of {} (log {}): {error:#}", self.name, self.log.display());
        }
    }
}

/// The `leasehold` binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_leasehold")
}

/// A single-node cluster: one `leasehold serve` process with fixed ports and
/// data directory, so it can be killed and restarted as the same node.
pub struct Node {
    /// gRPC listen address.
    pub grpc: SocketAddr,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// sled data directory.
    pub data: PathBuf,
    process: Option<Process>,
    incarnation: u32,
}

impl Node {
    /// Starts node 1 in `sandbox` on free ports and waits until it serves.
    pub async fn start(sandbox: &Sandbox) -> Result<Node> {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut node =
            Node { grpc, http, data: sandbox.path().join("data-1"), process: None, incarnation: 0 };
        node.spawn(sandbox).await?;
        Ok(node)
    }

    /// The gRPC address as a URI, as clients and `LEASEHOLD_ADDR` take it.
    pub fn addr(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// A typed client of this node (lazy: connects on first use).
    pub fn client(&self) -> Result<Client> {
        Client::connect(&self.addr()).map_err(|error| anyhow!("client of {}: {error}", self.addr()))
    }

    /// A raw generated Queue stub (no retries, answers exactly what the
    /// server said).
    pub fn stub(&self) -> Result<QueueClient<Channel>> {
        let channel = Endpoint::from_shared(self.addr())
            .context("endpoint")?
            .connect_timeout(Duration::from_secs(2))
            .timeout(RPC_TIMEOUT)
            .connect_lazy();
        Ok(QueueClient::new(channel)
            .max_encoding_message_size(64 * 1024 * 1024)
            .max_decoding_message_size(64 * 1024 * 1024))
    }

    /// Fails if the node process has died.
    pub fn ensure_running(&mut self) -> Result<()> {
        match &mut self.process {
            Some(process) => process.ensure_running(),
            None => bail!("node {NODE_ID} is not running"),
        }
    }

    /// SIGKILLs the node: no drain, no flush, no goodbye.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut process) = self.process.take() {
            process.kill()?;
        }
        Ok(())
    }

    /// Starts the node again on the same ports and data, and waits until it
    /// serves.
    pub async fn restart(&mut self, sandbox: &Sandbox) -> Result<()> {
        self.kill()?;
        self.spawn(sandbox).await
    }

    async fn spawn(&mut self, sandbox: &Sandbox) -> Result<()> {
        self.incarnation += 1;
        let log = sandbox.log_file(&format!("node-{NODE_ID}-run-{}", self.incarnation));
        let mut command = Command::new(binary());
        command
            .arg("serve")
            .args(["--id", &NODE_ID.to_string()])
            .args(["--grpc", &self.grpc.to_string()])
            .args(["--http", &self.http.to_string()])
            .arg("--data")
            .arg(&self.data)
            .env_remove("LEASEHOLD_ADDR")
            .env("LEASEHOLD_LOG", "info,openraft=warn")
            .env("NO_COLOR", "1");
        let name = format!("node {NODE_ID} (run {})", self.incarnation);
        self.process = Some(Process::spawn(&name, command, &log)?);
        self.wait_serving().await
    }

    /// Waits until the node names itself leader and answers a linearizable
    /// read, failing at once if the process dies meanwhile.
    async fn wait_serving(&mut self) -> Result<()> {
        let client = self.client()?;
        let what = format!("node {NODE_ID} at {} to lead and serve reads", self.grpc);
        wait_until(&what, deadline_in(NODE_READY_TIMEOUT), || {
            let running = self.ensure_running();
            let client = client.clone();
            async move {
                running?;
                let status = match client.status().await {
                    Ok(status) => status,
                    Err(error) => return Ok(Check::NotYet(format!("status: {error}"))),
                };
                if status.leader != NODE_ID {
                    return Ok(Check::NotYet(format!("leader is {}", status.leader)));
                }
                match client.stats(None, false).await {
                    Ok(_) => Ok(Check::Done(())),
                    Err(error) => Ok(Check::NotYet(format!("stats: {error}"))),
                }
            }
        })
        .await
    }
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
    let label = args.iter().take(2).copied().collect::<Vec<_>>().join("-");
    let stdout_path = sandbox.log_file(&format!("cli-{label}.stdout"));
    let stderr_path = sandbox.log_file(&format!("cli-{label}.stderr"));
    let mut command = Command::new(binary());
    command.args(args).env_remove("LEASEHOLD_ADDR").env("NO_COLOR", "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let stdout = File::create(&stdout_path).context("creating the stdout file")?;
    let stderr = File::create(&stderr_path).context("creating the stderr file")?;
    command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    let child = command.spawn().with_context(|| format!("starting leasehold {args:?}"))?;
    let mut process = Process {
        name: format!("leasehold {}", args.join(" ")),
        child,
        log: stderr_path.clone(),
        exited: None,
    };
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
