//! One run of a plan, in phases:
//!
//! 1. write the plan, write the run's credentials (certificates and tokens
//!    from `leasehold dev-certs`, or a shared cluster secret with
//!    `--plaintext`), start a proxy per node and the nodes behind them
//!    (node 1 bootstraps, the others join), wait for every voter, check
//!    that the nodes enforce the client roles;
//! 2. start producers and workers; warm up;
//! 3. fault rounds: inject, hold, heal, time the first write that succeeds,
//!    settle — within the plan's wall-clock budget;
//! 4. drain: no more faults, producers settle unknown enqueues, workers
//!    behave, until the queue is empty or the drain limit passes;
//! 5. read the final state, sample every node's applied index and digest
//!    until they are stable, stop the nodes;
//! 6. check, summarise, write everything to the run directory, and keep the
//!    plan as a regression case if the run failed.
//!
//! Every wait is bounded; the run stops by itself.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::Client;
use leasehold_proto::v1;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::checkers::{self, FinalJob, RunRecord, StatusSample};
use crate::faults::{Extras, Nemesis, Network};
use crate::history::History;
use crate::plan::Plan;
use crate::proxy::Proxy;
use crate::security::{Role, Security, Transport};
use crate::sink::FencedSink;
use crate::summary::{Recovery, RunFacts, Summary};
use crate::supervisor::{NodeSpec, Supervisor, free_port};
use crate::workload::{self, Context, Phase};

/// Where and how to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `leasehold` binary.
    pub bin: PathBuf,
    /// Directory under which each run gets its own directory.
    pub runs_root: PathBuf,
    /// Node N gets 127.0.0.(ip_base + N).
    pub ip_base: u8,
    /// Where failing plans are kept (None: nowhere).
    pub regressions_dir: Option<PathBuf>,
    /// Mutual TLS and tokens (the default), or plaintext.
    pub transport: Transport,
}

/// How long the cluster may take to form.
const FORM_LIMIT: Duration = Duration::from_secs(90);
/// How long the final read may keep retrying.
const FINAL_READ_LIMIT: Duration = Duration::from_secs(60);
/// Most status sampling rounds after heal.
const SAMPLE_ROUNDS: u32 = 40;
/// Pause between status sampling rounds.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(500);
/// How long pausing the schedules and letting their last runs finish may take.
const CRON_FINISH_LIMIT: Duration = Duration::from_secs(30);
/// How long stopping the workload may take.
const STOP_LIMIT: Duration = Duration::from_secs(45);

/// Runs `plan`; answers its summary. `label` names the run directory.
pub async fn run(plan: &Plan, options: &Options) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let run_dir = options.runs_root.join(format!("{}-{}-{stamp}", plan.profile.name(), plan.seed));
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", run_dir.display()))?;
    plan.write(&run_dir.join("plan.json"))?;
    println!("run {} seed {} → {}", plan.profile.name(), plan.seed, shown(&run_dir));

    let history = History::to_file(&run_dir.join("history.jsonl"))?;
    let sink = FencedSink::new();

    // Phase 1: proxies and nodes.
    tracing::info!("--- start {} nodes behind their proxies", plan.nodes);
    let mut specs = Vec::new();
    let mut proxies = BTreeMap::new();
    let mut listeners = Vec::new();
    let mut ips = BTreeMap::new();
    let mut node_ips = Vec::new();
    for id in 1..=plan.nodes {
        let last = u8::try_from(u64::from(options.ip_base) + id).map_err(|_| {
            anyhow::anyhow!("--ip-base {} too large for {} nodes", options.ip_base, plan.nodes)
        })?;
        let ip = Ipv4Addr::new(127, 0, 0, last);
        ips.insert(IpAddr::V4(ip), id);
        node_ips.push(ip);
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|e| anyhow::anyhow!("binding a proxy on {ip}: {e}"))?;
        let advertise = listener.local_addr()?;
        specs.push(NodeSpec {
            id,
            ip,
            grpc: free_port(ip)?,
            http: free_port(ip)?,
            advertise,
            data_dir: run_dir.join(format!("data/n{id}")),
            log_path: run_dir.join(format!("n{id}.log")),
            config: Some(run_dir.join(format!("n{id}.toml"))),
        });
        listeners.push((id, listener));
    }
    for ((id, listener), spec) in listeners.into_iter().zip(&specs) {
        proxies.insert(id, Proxy::start(listener, spec.grpc, ips.clone())?);
    }
    for spec in &specs {
        if let Some(config) = &spec.config {
            std::fs::write(config, plan.tuning.config_text())
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", config.display()))?;
        }
    }
    // Disk-full rounds need every data dir on its own small tmpfs (the
    // target is chosen at run time).
    let mut disk_skipped: Option<String> = None;
    let disks = if plan.disk_mb > 0 && plan.rounds.iter().any(|r| r.fault.kind() == "disk-full") {
        let dirs: Vec<PathBuf> = specs.iter().map(|s| s.data_dir.clone()).collect();
        let disks = crate::disk::Disks::mount(&dirs, plan.disk_mb);
        if let Some(why) = &disks.unavailable {
            println!("disk-full rounds will be skipped: {why}");
            disk_skipped = Some(why.clone());
        }
        Some(disks)
    } else {
        None
    };
    let network = Network::new(proxies);
    let addrs = network.client_addrs();
    let bin = pin_binary(&options.bin, &run_dir);
    // Peers dial each other at their proxies' addresses and clients at the
    // proxies too, all on the nodes' IPs: the node certificates name every
    // one of them.
    let security =
        Security::prepare(options.transport, &bin, &run_dir, plan.nodes, &node_ips).await?;
    println!("security: {}", security.describe());
    let mut supervisor = Supervisor::new(&bin, specs, security.clone())?;
    supervisor.start(1, None)?;
    supervisor.wait_for_leader(FORM_LIMIT).await?;
    let first = supervisor.spec(1)?.grpc;
    for id in 2..=plan.nodes {
        supervisor.start(id, Some(first))?;
    }
    if let Err(error) = supervisor.wait_for_voters(plan.nodes as usize, FORM_LIMIT).await {
        anyhow::bail!("{error:#}\n{}", supervisor.describe_nodes());
    }
    let roles = security.preflight(&addrs).await?;
    println!("security: {roles}");
    let ttl_read_after = Duration::from_millis(
        plan.cron.iter().flat_map(|c| &c.schedules).map(|s| s.lease_ttl_ms).max().unwrap_or(0)
            + 2 * 1_000
            + 3_000,
    );
    let extras = Extras {
        addrs: addrs.clone(),
        command_queue: crate::cron::COMMAND_QUEUE.to_string(),
        ttl_read_after,
        disks,
        security: security.clone(),
        queue: plan.queue.clone(),
    };
    let mut nemesis =
        Nemesis::new(supervisor, network, history.clone(), StdRng::seed_from_u64(plan.seed))
            .with_extras(extras)
            .with_clock_bound(plan.tuning.clock_bound_ms());
    let exec_log = run_dir.join("exec.log");
    let cron_names: Vec<String> =
        plan.cron.iter().flat_map(|c| &c.schedules).map(|s| s.name.clone()).collect();
    if let Some(cron) = &plan.cron {
        tracing::info!("--- put {} cron schedules", cron.schedules.len());
        crate::cron::put_schedules(&security, &addrs, cron, &exec_log, FORM_LIMIT).await?;
    }

    // Phase 2: workload.
    tracing::info!("--- start the workload");
    let (phase_tx, phase_rx) = watch::channel(Phase::Chaos);
    let ctx = Context {
        history: history.clone(),
        sink: sink.clone(),
        addrs: addrs.clone(),
        security: security.clone(),
        plan: Arc::new(plan.workload.clone()),
        queue: plan.queue.clone(),
        seed: plan.seed,
        phase: phase_rx,
    };
    let mut producers = JoinSet::new();
    for index in 0..plan.workload.producers {
        producers.spawn(workload::producer(ctx.clone(), index));
    }
    let mut workers = JoinSet::new();
    for index in 0..plan.workload.workers {
        workers.spawn(workload::worker(ctx.clone(), index));
    }
    if let Some(cron) = &plan.cron {
        workers.spawn(crate::cron::poller(
            history.clone(),
            security.clone(),
            addrs.clone(),
            cron_names.clone(),
            Duration::from_millis(cron.poll_interval_ms.max(500)),
            ctx.phase.clone(),
        ));
    }
    tokio::time::sleep(Duration::from_millis(plan.warmup_ms)).await;

    // Phase 3: fault rounds.
    let fault_phase = Instant::now();
    let budget = Duration::from_millis(plan.fault_phase_budget_ms);
    let recovery_limit = Duration::from_millis(plan.recovery_timeout_ms);
    let mut recoveries = Vec::new();
    let mut rounds_skipped = 0u64;
    for (round, planned) in plan.rounds.iter().enumerate() {
        // Past the budget, only the rounds some checker's expectation needs
        // still run (see `Fault::feeds_expectation`).
        if fault_phase.elapsed() >= budget
            && !planned.fault.feeds_expectation(plan.tuning.clock_bound_ms(), planned.hold_ms)
        {
            rounds_skipped += 1;
            continue;
        }
        tracing::info!(round, fault = planned.fault.kind(), "--- inject");
        let (active, injected) = nemesis.inject(round, &planned.fault, planned.hold_ms).await;
        if let Err(error) = injected {
            tracing::warn!(round, %error, "fault injection failed; healing");
        }
        let hold = Duration::from_millis(planned.hold_ms);
        let bound_ms = plan.tuning.clock_bound_ms();
        let beyond_after_ms = planned.fault.beyond_bound_after_ms(bound_ms, planned.hold_ms);
        let clock_round = beyond_after_ms.is_some() || planned.fault.within_bound(bound_ms);
        if clock_round {
            let probe_after = Duration::from_millis(
                beyond_after_ms.unwrap_or(0) + crate::checkers::clock_bound::STAND_ASIDE_GRACE_MS,
            );
            let watch = ClockWatch { supervisor: &nemesis.supervisor, history: &history, round };
            watch.hold(&security, &addrs, plan.seed, hold, probe_after).await;
        } else {
            tokio::time::sleep(hold).await;
        }
        tracing::info!(round, "--- heal");
        let nodes = last_fault_nodes(&history, round);
        let target = nodes.clone();
        if let Err(error) = nemesis.heal(active).await {
            tracing::warn!(round, %error, "heal reported an error");
        }
        if clock_round {
            let watch = ClockWatch { supervisor: &nemesis.supervisor, history: &history, round };
            watch.rejoin(&target).await;
        }
        let key = format!("probe-{}-{round}", plan.seed);
        let recovered =
            workload::probe_write(&history, &security, &addrs, &key, round, recovery_limit).await;
        recoveries.push(Recovery {
            round,
            fault: planned.fault.kind().to_string(),
            nodes,
            recovery_ms: recovered.map(|d| d.as_millis() as u64),
        });
        tokio::time::sleep(Duration::from_millis(planned.settle_ms)).await;
    }

    // Phase 4: drain.
    tracing::info!("--- drain");
    let _ = phase_tx.send(Phase::Drain);
    drain(
        &security,
        &addrs,
        &plan.queue,
        &mut producers,
        Duration::from_millis(plan.drain_timeout_ms),
    )
    .await;
    if !cron_names.is_empty() {
        crate::cron::finish(&history, &security, &addrs, &cron_names, CRON_FINISH_LIMIT).await;
    }
    nemesis.finish().await;
    let _ = phase_tx.send(Phase::Stop);
    stop(&mut workers).await;
    stop(&mut producers).await;

    // Phase 5: final state and convergence.
    tracing::info!("--- final read and convergence");
    let final_jobs = read_final(&security, &addrs, &plan.queue).await;
    let final_exec_jobs = if cron_names.is_empty() {
        None
    } else {
        read_final(&security, &addrs, crate::cron::COMMAND_QUEUE).await
    };
    let samples = sample_statuses(&nemesis.supervisor, &history).await;
    let network_stats: BTreeMap<String, u64> =
        nemesis.network.stats().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let node_starts = nemesis.supervisor.starts();
    nemesis.supervisor.stop_all().await;
    nemesis.release_disks();

    // Phase 6: check and summarise.
    history.flush()?;
    let sink_log = sink.log();
    write_jsonl(&run_dir.join("sink.jsonl"), &sink_log)?;
    write_json(&run_dir.join("final-jobs.json"), &final_jobs)?;
    write_json(&run_dir.join("final-exec-jobs.json"), &final_exec_jobs)?;
    write_json(&run_dir.join("samples.json"), &samples)?;
    let (runs, malformed) = crate::execlog::read(&exec_log)?;
    if malformed > 0 {
        tracing::warn!(malformed, "execution log lines cut short (runs killed mid-write)");
    }
    let record = RunRecord {
        history: history.snapshot(),
        sink: sink_log,
        final_jobs,
        samples,
        nodes: plan.nodes,
        runs,
        final_exec_jobs,
        cron: plan.cron.clone().map(|c| c.schedules).unwrap_or_default(),
        clock_bound_ms: plan.tuning.clock_bound_ms(),
    };
    let verdicts = checkers::all().iter().map(|c| c.check(&record)).collect();
    let mut expect = plan.expect.clone();
    if let Some(why) = &disk_skipped {
        // No disk could be filled here: durable_acks has nothing to hold.
        println!("durable_acks not applicable in this run: {why}");
        expect.disk_full = false;
    }
    let facts = RunFacts {
        seed: plan.seed,
        profile: plan.profile.name().to_string(),
        mode: plan.mode,
        expect,
        run_dir: shown(&run_dir),
        duration_ms: started.elapsed().as_millis() as u64,
        rounds_skipped,
        recoveries: recoveries.clone(),
        network: network_stats,
        node_starts,
        recovery_timeout_ms: plan.recovery_timeout_ms,
        security: format!("{}; {roles}", security.describe()),
    };
    let summary = Summary::build(&record, verdicts, facts);
    write_json(&run_dir.join("summary.json"), &summary)?;
    std::fs::write(run_dir.join("summary.txt"), summary.render() + "\n")?;
    if summary.failed > 0 {
        keep_regression(plan, &summary, options.regressions_dir.as_deref())?;
    } else {
        // The data dirs, the credentials and the pinned binary only matter
        // when something failed.
        let _ = std::fs::remove_dir_all(run_dir.join("data"));
        let _ = std::fs::remove_dir_all(run_dir.join("certs"));
        let _ = std::fs::remove_file(run_dir.join("cluster-secret"));
        if bin != options.bin {
            let _ = std::fs::remove_file(&bin);
        }
    }
    Ok(summary)
}

/// How often a clock round reads every node's own clock verdict.
const CLOCK_READ_EVERY: Duration = Duration::from_millis(250);

/// The clock rounds' reads of every node's own clock verdict (process
/// `clock-watch`), which `clock_bound` judges.
struct ClockWatch<'a> {
    supervisor: &'a Supervisor,
    history: &'a History,
    round: usize,
}

impl ClockWatch<'_> {
    /// Reads node `id`'s own status into the history as a `clock_read`;
    /// answers whether it judged its clock within the bound.
    async fn read(&self, id: u64) -> bool {
        use crate::checkers::clock_bound::CLOCK_WATCH;
        use crate::history::{OpFunction, OpType, OpValue};
        let base = OpValue { nodes: vec![id], round: Some(self.round), ..OpValue::default() };
        self.history.invoke(CLOCK_WATCH, OpFunction::ClockRead, base.clone());
        match self.supervisor.local_status(id).await {
            Ok(status) => {
                let skewed = status.clock_skewed;
                let value = OpValue {
                    role: Some(status.role),
                    clock_skewed: Some(skewed),
                    message: Some(status.clock),
                    ..base
                };
                self.history.record(CLOCK_WATCH, OpType::Ok, OpFunction::ClockRead, value);
                !skewed
            }
            Err(error) => {
                let value = OpValue { message: Some(error.to_string()), ..base };
                self.history.record(CLOCK_WATCH, OpType::Info, OpFunction::ClockRead, value);
                false
            }
        }
    }

    /// Holds the round for `hold`, reading every node every
    /// [`CLOCK_READ_EVERY`], and tries a write from `probe_after` on (once
    /// a skewed node has had its grace to stand aside) until the hold ends.
    async fn hold(
        &self,
        security: &Security,
        addrs: &[String],
        seed: u64,
        hold: Duration,
        probe_after: Duration,
    ) {
        let until = Instant::now() + hold;
        let reads = async {
            while Instant::now() < until {
                for id in self.supervisor.ids() {
                    self.read(id).await;
                }
                let left = until.saturating_duration_since(Instant::now());
                tokio::time::sleep(CLOCK_READ_EVERY.min(left)).await;
            }
        };
        let probe = async {
            tokio::time::sleep(probe_after).await;
            let left = until.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                let key = format!("probe-{seed}-{}-during", self.round);
                workload::probe_during(self.history, security, addrs, &key, self.round, left).await;
            }
        };
        tokio::join!(reads, probe);
    }

    /// After the heal, reads `targets` until each judges its clock within
    /// the bound again, at most the checker's rejoin limit.
    async fn rejoin(&self, targets: &[u64]) {
        use crate::checkers::clock_bound::REJOIN_LIMIT_MS;
        let until = Instant::now() + Duration::from_millis(REJOIN_LIMIT_MS);
        let mut left: Vec<u64> = targets.to_vec();
        while !left.is_empty() && Instant::now() < until {
            let mut still = Vec::new();
            for id in left {
                if !self.read(id).await {
                    still.push(id);
                }
            }
            left = still;
            tokio::time::sleep(CLOCK_READ_EVERY).await;
        }
    }
}

/// Pins the node binary for the run: a hard link in the run directory, so a
/// rebuild of the shared target directory during the run cannot change what
/// a restarted node runs (and a failed run keeps the exact binary). Falls
/// back to the original path when linking is not possible.
fn pin_binary(bin: &Path, run_dir: &Path) -> PathBuf {
    let pinned = run_dir.join("leasehold");
    match std::fs::hard_link(bin, &pinned) {
        Ok(()) => pinned,
        Err(error) => {
            tracing::warn!(%error, bin = %bin.display(), "could not pin the node binary; using it in place");
            bin.to_path_buf()
        }
    }
}

/// A path as the summary shows it: relative to the current directory when
/// it lies below it.
fn shown(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| path.display().to_string())
}

/// The nodes the nemesis recorded for round `round`'s fault.
fn last_fault_nodes(history: &History, round: usize) -> Vec<u64> {
    history
        .snapshot()
        .iter()
        .rev()
        .find(|op| {
            op.f == crate::history::OpFunction::Fault
                && op.kind != crate::history::OpType::Invoke
                && op.value.round == Some(round)
        })
        .map(|op| op.value.nodes.clone())
        .unwrap_or_default()
}

/// Waits until producers are done and the queue holds no ready, delayed or
/// claimed job, or `limit` passes (reading as `reader`).
async fn drain(
    security: &Security,
    addrs: &[String],
    queue: &str,
    producers: &mut JoinSet<anyhow::Result<()>>,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    let client = match security.client(&addrs.join(","), Role::Reader) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no client to watch the drain");
            return;
        }
    };
    while Instant::now() < deadline {
        while let Some(done) = producers.try_join_next() {
            if let Ok(Err(error)) = done {
                tracing::warn!(%error, "producer stopped");
            }
        }
        let open = match tokio::time::timeout(
            Duration::from_secs(10),
            client.stats(Some(queue.to_string()), false),
        )
        .await
        {
            Ok(Ok(stats)) => stats
                .queues
                .iter()
                .filter(|q| q.queue == queue)
                .map(|q| q.ready + q.delayed + q.claimed)
                .sum::<u64>(),
            _ => u64::MAX,
        };
        if open == 0 && producers.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tracing::warn!("drain limit reached with work left");
}

async fn stop(tasks: &mut JoinSet<anyhow::Result<()>>) {
    let deadline = Instant::now() + STOP_LIMIT;
    while !tasks.is_empty() {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(Some(Ok(Err(error)))) => tracing::warn!(%error, "workload task failed"),
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(left = tasks.len(), "workload did not stop in time; aborting");
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
    }
}

fn state_name(state: i32) -> String {
    match v1::JobState::try_from(state) {
        Ok(v1::JobState::Ready) => "ready",
        Ok(v1::JobState::Claimed) => "claimed",
        Ok(v1::JobState::Acked) => "acked",
        Ok(v1::JobState::Dead) => "dead",
        _ => "unknown",
    }
    .to_string()
}

/// Every job of `queue`, read linearizably as `reader`, page by page;
/// `None` if the cluster would not answer within the limit.
async fn read_final(security: &Security, addrs: &[String], queue: &str) -> Option<Vec<FinalJob>> {
    let client: Client = match security.client(&addrs.join(","), Role::Reader) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no client for the final read");
            return None;
        }
    };
    let deadline = Instant::now() + FINAL_READ_LIMIT;
    'attempt: while Instant::now() < deadline {
        let mut jobs = Vec::new();
        let mut page_token = String::new();
        // Bounded: at most this many pages of 1,000.
        for _ in 0..1_000 {
            let request = v1::ListJobsRequest {
                queue: Some(queue.to_string()),
                state: v1::JobState::Unspecified as i32,
                page_size: 1_000,
                page_token: page_token.clone(),
                stale: false,
            };
            let page = match tokio::time::timeout(
                Duration::from_secs(15),
                client.list_jobs(request),
            )
            .await
            {
                Ok(Ok(page)) => page,
                _ => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue 'attempt;
                }
            };
            for job in page.jobs {
                let state = state_name(job.state);
                jobs.push(FinalJob {
                    id: job.id,
                    value: FinalJob::value_of(&job.payload, &state, job.idempotency_key.as_deref()),
                    state,
                    attempts: job.attempts,
                    lease_token: job.lease.as_ref().map(|l| l.token),
                    key: job.idempotency_key.clone(),
                });
            }
            if page.next_page_token.is_empty() {
                return Some(jobs);
            }
            page_token = page.next_page_token;
        }
        return Some(jobs);
    }
    None
}

/// Samples every node's own applied index and digest, reading each node
/// twice per round (so a torn read can be told apart), until one round
/// shows every node stable at one index, or the rounds run out.
async fn sample_statuses(supervisor: &Supervisor, history: &History) -> Vec<StatusSample> {
    let mut samples = Vec::new();
    let ids = supervisor.ids();
    for round in 0..SAMPLE_ROUNDS {
        let mut settled = Vec::new();
        for id in &ids {
            let mut reads = Vec::new();
            for read in 0..2u8 {
                // A digest of an earlier index than the node's applied one
                // (the node reused its last) pairs with neither: not a read.
                if let Ok(status) = supervisor.local_status(*id).await
                    && status.digest_index == status.applied_index
                {
                    samples.push(StatusSample {
                        round,
                        read,
                        time_ns: history.now_ns(),
                        node: *id,
                        applied_index: status.applied_index,
                        digest: status.digest,
                    });
                    reads.push((status.applied_index, status.digest));
                }
            }
            if reads.len() == 2 && reads[0] == reads[1] {
                settled.push(reads[0].0);
            }
        }
        if settled.len() == ids.len() && settled.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        tokio::time::sleep(SAMPLE_INTERVAL).await;
    }
    samples
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n")
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

fn write_jsonl<T: serde::Serialize>(path: &Path, values: &[T]) -> anyhow::Result<()> {
    let mut text = String::new();
    for value in values {
        text.push_str(&serde_json::to_string(value)?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// Copies a failing plan into the regressions directory, so the quick
/// profile replays it from then on. One plan per failure signature (profile,
/// mode, the set of failed checkers) is enough: a bug that fails every seed
/// must not grow the directory, and the quick profile's time, by one plan
/// per run.
fn keep_regression(plan: &Plan, summary: &Summary, dir: Option<&Path>) -> anyhow::Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    std::fs::create_dir_all(dir)?;
    let mode = match plan.mode {
        crate::plan::Mode::SafetyLiveness => "safety-liveness",
        crate::plan::Mode::SafetyOnly => "safety-only",
    };
    let failed: Vec<&str> =
        summary.checkers.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
    let signature = format!("{}-{mode}-{}-", plan.profile.name(), failed.join("+"));
    let known = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .any(|entry| entry.file_name().to_string_lossy().starts_with(&signature));
    if known {
        println!("a regression plan with this failure signature is already kept ({signature}*)");
        return Ok(());
    }
    let path = dir.join(format!("{signature}{}.json", plan.seed));
    plan.write(&path)?;
    println!("failing plan kept as regression case {}", shown(&path));
    Ok(())
}

/// Re-checks a finished run from its directory (history, sink log, final
/// state, samples, plan) and answers its summary.
pub fn check_dir(run_dir: &Path) -> anyhow::Result<Summary> {
    let plan = Plan::read(&run_dir.join("plan.json"))?;
    let history = crate::history::read_jsonl(&run_dir.join("history.jsonl"))?;
    let sink = read_jsonl_values(&run_dir.join("sink.jsonl"))?;
    let final_jobs: Option<Vec<FinalJob>> = read_json(&run_dir.join("final-jobs.json"))?;
    let samples: Vec<StatusSample> = read_json(&run_dir.join("samples.json"))?;
    let final_exec_jobs: Option<Vec<FinalJob>> =
        read_json(&run_dir.join("final-exec-jobs.json")).unwrap_or(None);
    let (runs, _) = crate::execlog::read(&run_dir.join("exec.log"))?;
    let record = RunRecord {
        history,
        sink,
        final_jobs,
        samples,
        nodes: plan.nodes,
        runs,
        final_exec_jobs,
        cron: plan.cron.clone().map(|c| c.schedules).unwrap_or_default(),
        clock_bound_ms: plan.tuning.clock_bound_ms(),
    };
    let verdicts = checkers::all().iter().map(|c| c.check(&record)).collect();
    let previous: Option<Summary> = read_json(&run_dir.join("summary.json")).ok();
    let facts = RunFacts {
        seed: plan.seed,
        profile: plan.profile.name().to_string(),
        mode: plan.mode,
        expect: plan.expect.clone(),
        run_dir: shown(run_dir),
        duration_ms: previous.as_ref().map(|s| s.duration_ms).unwrap_or(0),
        rounds_skipped: previous.as_ref().map(|s| s.rounds_skipped).unwrap_or(0),
        recoveries: previous.as_ref().map(|s| s.recoveries.clone()).unwrap_or_default(),
        network: previous.as_ref().map(|s| s.network.clone()).unwrap_or_default(),
        node_starts: previous.as_ref().map(|s| s.node_starts.clone()).unwrap_or_default(),
        recovery_timeout_ms: plan.recovery_timeout_ms,
        security: previous.as_ref().map(|s| s.security.clone()).unwrap_or_default(),
    };
    Ok(Summary::build(&record, verdicts, facts))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("parsing {}: {e}", path.display()))
}

fn read_jsonl_values<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| anyhow::anyhow!("{}: {e}", path.display())))
        .collect()
}
