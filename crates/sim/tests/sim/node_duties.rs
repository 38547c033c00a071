//! The node's duties on a simulated host: its real driver and built-in
//! executor, with every command they run recorded on simulated time
//! instead of started (`duties` runs them; `journal_hosts` starts them on
//! each host).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_client::Outcome;
use leasehold_client::exec::{CommandLine, Run};
use leasehold_cluster_tests::execlog::{ExecEvent, RunPhase};
use leasehold_core::schedule::DEFAULT_COMMAND_QUEUE;
use leasehold_node::commands::{self, RunCommand};
use leasehold_node::driver::{self, DriverConfig};
use leasehold_node::executor::{self, ExecutorConfig};
use leasehold_raft::NodeId;
use leasehold_replica::{Gate, Journal};
use leasehold_security::ClusterSecret;
use leasehold_sim::grpc;

/// The node's duties, run on every host of
/// [`crate::journal_hosts::start_with_duties`]: the
/// node's real driver (sweeps, purges, cron ticks on either path) and, on
/// `executors`, its real built-in executor claiming the command queue
/// through the host's own Queue service. Every command they run is
/// recorded in `runs` by [`SimCommands`] instead of being started.
#[derive(Clone)]
pub struct Duties {
    /// Every run of a command, by every host.
    pub runs: RunLog,
    /// The hosts whose executor is on (the driver takes bus claims only
    /// there, as a node without an executor does not).
    pub executors: Vec<NodeId>,
    /// How long each command runs, in simulated time.
    pub run_for: Duration,
    /// Plants [`ReleaseBothPaths`] in every host's bus table.
    pub release_both_paths: bool,
}

/// Every run of a command, shared by the hosts and the test: its start
/// and end, and the runs cut off before their end (the node dropped the
/// run, as it kills a command whose lease it lost).
#[derive(Clone, Debug, Default)]
pub struct RunLog {
    events: Arc<Mutex<Vec<ExecEvent>>>,
    cuts: Arc<Mutex<Vec<RunCut>>>,
}

/// A run cut off: its job and token (0 for a bus run), and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RunCut {
    pub job_id: u64,
    pub token: u64,
    pub at_ns: u64,
}

impl RunLog {
    fn record(&self, event: ExecEvent) {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).push(event);
    }

    /// The runs so far, in the order they were recorded.
    pub fn events(&self) -> Vec<ExecEvent> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The runs cut off so far, in order (a crash drops a host's runs in
    /// no set order).
    pub fn cuts(&self) -> Vec<RunCut> {
        let mut cuts = self.cuts.lock().unwrap_or_else(PoisonError::into_inner).clone();
        cuts.sort_unstable();
        cuts
    }
}

/// Records a run as cut off when dropped before [`RunGuard::finish`].
struct RunGuard<'a> {
    log: &'a RunLog,
    job_id: u64,
    token: u64,
    finished: bool,
}

impl RunGuard<'_> {
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let cut = RunCut { job_id: self.job_id, token: self.token, at_ns: sim_ns() };
            self.log.cuts.lock().unwrap_or_else(PoisonError::into_inner).push(cut);
        }
    }
}

impl Duties {
    /// Starts host `id`'s driver and (when on here) its executor, on the
    /// host's runtime, until `shutdown` turns true or the host's life ends.
    pub fn start(
        &self,
        id: NodeId,
        journal: &Journal,
        gate: &Gate,
        secret: &ClusterSecret,
        shutdown: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let commands: Arc<dyn RunCommand> =
            Arc::new(SimCommands { node: id, runs: self.runs.clone(), run_for: self.run_for });
        let executor = self.executors.contains(&id);
        let driver_config = DriverConfig {
            sweep_interval: Duration::from_millis(500),
            purge_interval: Duration::from_secs(60),
            run_commands: executor,
            queues: vec![DEFAULT_COMMAND_QUEUE.to_string()],
            tags: Vec::new(),
            command_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(1),
            commands: commands.clone(),
        };
        tokio::spawn(driver::run(journal.clone(), gate.clone(), driver_config, shutdown.clone()));
        if executor {
            let config = ExecutorConfig {
                node_id: id,
                queues: vec![DEFAULT_COMMAND_QUEUE.to_string()],
                concurrency: 4,
                timeout: Duration::from_secs(10),
                tags: Vec::new(),
                grace: Duration::from_secs(1),
                commands,
            };
            let client = grpc::own_client(id, secret)?;
            tokio::spawn(executor::run(config, client, shutdown.clone()));
        }
        Ok(())
    }
}

/// Runs a command as the simulation's: records its start, waits
/// `run_for` on the host's simulated clock, records its end and acks. The
/// run's facts come from the environment the node gives the command (the
/// job, its fencing token and attempt from the executor; the schedule, the
/// bucket, the claim path and the node from either).
#[derive(Debug)]
pub struct SimCommands {
    node: NodeId,
    runs: RunLog,
    run_for: Duration,
}

impl RunCommand for SimCommands {
    fn run<'a>(&'a self, command: &'a CommandLine) -> commands::Running<'a> {
        Box::pin(async move {
            let var = |name: &str| {
                command.env.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
            };
            let number = |name: &str| var(name).and_then(|value| value.parse().ok()).unwrap_or(0);
            let event = |phase| ExecEvent {
                phase,
                wall_ns: sim_ns(),
                schedule: var("LEASEHOLD_SCHEDULE").unwrap_or("none").to_string(),
                bucket: number("LEASEHOLD_BUCKET"),
                node: self.node,
                token: number("LEASEHOLD_FENCING_TOKEN"),
                job_id: number("LEASEHOLD_JOB_ID"),
                attempt: u32::try_from(number("LEASEHOLD_ATTEMPT")).unwrap_or(0),
                path: var("LEASEHOLD_CLAIM_PATH").unwrap_or("journal").to_string(),
            };
            let start = event(RunPhase::Start);
            let running = RunGuard {
                log: &self.runs,
                job_id: start.job_id,
                token: start.token,
                finished: false,
            };
            self.runs.record(start);
            tokio::time::sleep(self.run_for).await;
            self.runs.record(event(RunPhase::End));
            running.finish();
            Run {
                outcome: Outcome::Ack { result: Vec::new() },
                stdout: String::new(),
                stderr: String::new(),
            }
        })
    }
}

/// Simulated nanoseconds since the start of the simulation, on any host.
pub fn sim_ns() -> u64 {
    turmoil::sim_elapsed()
        .map_or(0, |elapsed| u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
}
