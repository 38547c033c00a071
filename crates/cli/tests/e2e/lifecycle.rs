//! Goal: the node lifecycle of SPEC §5 holds on real processes — a drain on
//! SIGTERM lets a running command finish and be acked, gives back what the
//! node still holds and hands leadership over before exiting 0; a second
//! SIGTERM exits at once; `/readyz` and grpc.health.v1 turn failing on an
//! induced store fault and on losing quorum and recover when healed, while
//! `/livez` stays up; `/metrics` parses with a standard Prometheus
//! text-format parser and its counters move exactly as the test's own calls.
//!
//! Method: `leasehold serve` processes started here (one node, or a
//! three-node cluster joined one by one), each with its own TOML config,
//! driven by the generated gRPC stubs, plain HTTP/1.0 requests to the health
//! and metrics endpoints, POSIX signals (SIGTERM, SIGSTOP, SIGCONT) and the
//! `Faults` service of `--fault-injection`. Every wait is a named condition
//! with a deadline; nothing sleeps to synchronize.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use leasehold_client::Client;
use leasehold_proto::v1;
use leasehold_proto::v1::faults_client::FaultsClient;
use leasehold_proto::v1::queue_client::QueueClient;
use nix::sys::signal::Signal;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::support::{
    Check, Cluster, ClusterOptions, Node, RPC_TIMEOUT, Sandbox, deadline_in, free_port, http_get,
    job, phase, queue_stats, wait_until,
};

/// The queue every node's built-in executor works.
const EXEC_QUEUE: &str = "exec";
/// How long a freshly started single node may take to serve.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(45);
/// Readiness is cached about a second (grpc.health reads the same cache):
/// a change shows on both within this.
const READINESS_FLIP_TIMEOUT: Duration = Duration::from_secs(4);
/// A node cut off from its peers notices within a few election timeouts
/// (500–1000 ms each) plus the readiness cache.
const QUORUM_LOSS_TIMEOUT: Duration = Duration::from_secs(10);

/// Only one three-node cluster of this module runs at a time: two of them
/// on a small CI machine (two cores) starve each other's heartbeats and
/// turn the timing bounds these stories check into noise.
static CLUSTER_SLOT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------
// Stories
// ---------------------------------------------------------------------------

/// How long the drained node's running command takes.
const COMMAND_SECONDS: u64 = 5;
/// The drain grace of the three-node cluster of the drain story.
const DRAIN_GRACE_MS: u64 = 20_000;
/// The executed job's lease: shorter than the command, so the job is only
/// acked with its first token if the lease is renewed throughout the drain.
const EXEC_LEASE_TTL_MS: u64 = 3_000;
/// The lease of the job the node holds without running it: long, so taking
/// it back early proves the drain released it rather than letting it lapse.
const PARKED_LEASE_TTL_MS: u64 = 60_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_node_with_a_running_command() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-drain")?;
    let _slot = CLUSTER_SLOT.lock().await;
    sandbox.run(Duration::from_secs(120), drain_story(&sandbox)).await
}

/// SIGTERM on the leader while its executor runs a 5-second command and it
/// holds a second job it never started. The leader is chosen on purpose (the
/// command is tagged `node:ID` so only its executor may take it): it is the
/// node whose drain has the most to do — release through its own journal,
/// then hand leadership to a caught-up voter.
async fn drain_story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster");
    let settings = Settings { drain_grace_ms: Some(DRAIN_GRACE_MS), ..Settings::default() };
    let mut cluster = start_cluster(sandbox, &settings).await?;
    let leader = cluster.wait_leader_among(&cluster.ids(), Duration::from_secs(10)).await?;
    let survivors: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    let worker = format!("node-{leader}");
    eprintln!("leader is node {leader}; it will be drained");
    let mut leader_stub = cluster.node(leader)?.stub()?;
    let mut survivor_stub = cluster.node(survivors[0])?.stub()?;

    phase("enqueue a 5-second command only the leader's executor may run");
    let started_file = sandbox.path().join("command-started");
    let done_file = sandbox.path().join("command-done");
    let script = format!(
        "echo $LEASEHOLD_JOB_ID > '{}'; sleep {COMMAND_SECONDS}; echo $LEASEHOLD_JOB_ID >> '{}'",
        started_file.display(),
        done_file.display()
    );
    let spec = v1::JobSpec {
        tags: vec![format!("node:{leader}")],
        lease_ttl_ms: Some(EXEC_LEASE_TTL_MS),
        max_attempts: Some(1),
        ..job(EXEC_QUEUE, script.as_bytes())
    };
    let command_job = enqueue_one(&mut leader_stub, spec).await?;

    phase("wait until the leader's executor holds it and the command runs");
    let command_token = wait_until(
        "the command job claimed by the leader",
        deadline_in(Duration::from_secs(20)),
        || {
            let mut stub = leader_stub.clone();
            let worker = worker.clone();
            async move {
                let job = get_job(&mut stub, command_job).await?;
                Ok(match job.lease.as_ref() {
                    Some(lease)
                        if job.state == v1::JobState::Claimed as i32 && lease.holder == worker =>
                    {
                        Check::Done(lease.token)
                    }
                    _ => Check::NotYet(format!("state {} lease {:?}", job.state, job.lease)),
                })
            }
        },
    )
    .await?;
    wait_until("the command to start", deadline_in(Duration::from_secs(10)), || {
        let started = std::fs::read_to_string(&started_file).unwrap_or_default();
        async move {
            Ok(if started.trim() == command_job.to_string() {
                Check::Done(())
            } else {
                Check::NotYet(format!("started file holds {started:?}"))
            })
        }
    })
    .await?;

    phase("the leader also holds a job it has not started (60 s lease)");
    let parked_job = enqueue_one(&mut leader_stub, job("parked", b"never run here")).await?;
    let parked_claim = v1::ClaimRequest {
        worker: worker.clone(),
        queue: "parked".to_string(),
        max: 1,
        lease_ttl_ms: Some(PARKED_LEASE_TTL_MS),
        selector: Vec::new(),
        wait_ms: 0,
        ..Default::default()
    };
    let parked_lease = claim_lease(&mut leader_stub, parked_claim).await?;
    ensure!(
        parked_lease.job_id == parked_job,
        "claimed {parked_lease:?}, expected job {parked_job}"
    );
    let parked_at = Instant::now();

    phase("SIGTERM the leader");
    let sigterm_at = Instant::now();
    cluster.node(leader)?.signal(Signal::SIGTERM)?;

    phase("while it drains: claims on it are refused UNAVAILABLE \"draining\", /readyz fails");
    let http = cluster.node(leader)?.http;
    wait_until("claims on the draining node refused", deadline_in(Duration::from_secs(4)), || {
        let mut stub = leader_stub.clone();
        async move {
            let probe = v1::ClaimRequest {
                worker: "e2e-probe".to_string(),
                queue: "nothing-here".to_string(),
                max: 1,
                lease_ttl_ms: None,
                selector: Vec::new(),
                wait_ms: 0,
                ..Default::default()
            };
            Ok(match stub.claim(probe).await {
                Err(status)
                    if status.code() == tonic::Code::Unavailable
                        && status.message().contains("draining") =>
                {
                    Check::Done(())
                }
                Err(status) => Check::NotYet(format!("{status:?}")),
                Ok(reply) => Check::NotYet(format!("claim answered {:?}", reply.into_inner())),
            })
        }
    })
    .await?;
    let readyz = http_get(http, "/readyz").await?;
    ensure!(
        readyz.status == 503 && readyz.body.contains("draining: failed"),
        "a draining node must not be ready: {readyz:?}"
    );
    ensure!(
        !done_file.exists(),
        "the command finished before the drain was even checked; the story proved nothing"
    );

    phase("the parked job is released: ready again, no attempt charged, long before its TTL");
    // Released, not lapsed: a lapse is swept with an attempt charged and
    // "lease expired" as its error; a release charges nothing.
    let reader = client_of(&cluster, &survivors)?;
    let released_after = wait_until(
        "the parked job to be ready again",
        parked_at + Duration::from_millis(PARKED_LEASE_TTL_MS / 2),
        || {
            let reader = reader.clone();
            async move {
                Ok(match reader.get_job(parked_job, false).await {
                    Ok(job) if job.state == v1::JobState::Ready as i32 => {
                        ensure!(
                            job.lease.is_none() && job.attempts == 0 && job.last_error.is_none(),
                            "the parked job came back as if its lease lapsed: {job:?}"
                        );
                        Check::Done(parked_at.elapsed())
                    }
                    Ok(job) => Check::NotYet(format!("state {} lease {:?}", job.state, job.lease)),
                    Err(error) => Check::NotYet(format!("get job: {error}")),
                })
            }
        },
    )
    .await?;
    eprintln!(
        "parked job released {:.1} s after it was claimed (lease {} s)",
        released_after.as_secs_f64(),
        PARKED_LEASE_TTL_MS / 1_000
    );

    phase("the leader exits 0 within the drain grace");
    let status = cluster
        .node_mut(leader)?
        .wait_exit(sigterm_at + Duration::from_millis(DRAIN_GRACE_MS))
        .await?;
    let drained_in = sigterm_at.elapsed();
    eprintln!("node {leader} exited {status} {:.1} s after SIGTERM", drained_in.as_secs_f64());
    ensure!(status.success(), "a drain must exit 0, got {status}");
    ensure!(
        drained_in >= Duration::from_secs(COMMAND_SECONDS - 1),
        "exited after {:.1} s, before its {COMMAND_SECONDS}-second command could finish",
        drained_in.as_secs_f64()
    );

    phase("it handed leadership to a survivor before exiting");
    let log_path = cluster.node(leader)?.log().context("the drained node has no log")?;
    let log = std::fs::read_to_string(log_path).context("reading the drained node's log")?;
    ensure!(
        log.contains("event=\"drain.step\" step=\"handed over\""),
        "the drained leader's log has no drain.step \"handed over\" event: leadership did not \
         move before it exited (see {})",
        log_path.display()
    );
    let survivor_client = client_of(&cluster, &survivors)?;
    wait_until("a survivor to lead", deadline_in(Duration::from_secs(5)), || {
        let client = survivor_client.clone();
        async move {
            Ok(match client.status().await {
                Ok(status) if status.leader != 0 && status.leader != leader => Check::Done(()),
                Ok(status) => Check::NotYet(format!("leader {}", status.leader)),
                Err(error) => Check::NotYet(format!("status: {error}")),
            })
        }
    })
    .await?;

    phase("another client claims the parked job through a survivor, with a larger token");
    let rescued = wait_until(
        "the parked job claimed through a survivor",
        deadline_in(Duration::from_secs(10)),
        || {
            let mut stub = survivor_stub.clone();
            async move {
                let request = v1::ClaimRequest {
                    worker: "e2e-rescuer".to_string(),
                    queue: "parked".to_string(),
                    max: 1,
                    lease_ttl_ms: Some(30_000),
                    selector: Vec::new(),
                    wait_ms: 1_000,
                    ..Default::default()
                };
                Ok(match stub.claim(request).await {
                    Ok(reply) => match reply.into_inner().grants.into_iter().next() {
                        Some(v1::Grant { lease: Some(lease), .. }) => Check::Done(lease),
                        other => Check::NotYet(format!("grant {other:?}")),
                    },
                    Err(status) => Check::NotYet(format!("claim: {status:?}")),
                })
            }
        },
    )
    .await?;
    let rescued_after = parked_at.elapsed();
    eprintln!("parked job taken back {:.1} s after it was claimed", rescued_after.as_secs_f64());
    ensure!(rescued.job_id == parked_job, "rescued {rescued:?}, expected job {parked_job}");
    ensure!(
        rescued.holder == "e2e-rescuer" && rescued.token > parked_lease.token,
        "the new lease must be the rescuer's with a larger token: {rescued:?} after {parked_lease:?}"
    );
    ensure!(
        rescued_after < Duration::from_millis(PARKED_LEASE_TTL_MS / 2),
        "the parked job came back only after {:.1} s",
        rescued_after.as_secs_f64()
    );

    phase("the command ran to its end exactly once and its job is acked with its first token");
    let done = std::fs::read_to_string(&done_file).context("the command never finished")?;
    ensure!(
        done.lines().collect::<Vec<_>>() == vec![command_job.to_string()],
        "the command's file should hold its job id once: {done:?}"
    );
    let acked = get_job(&mut survivor_stub, command_job).await?;
    let acked_token = acked.lease.as_ref().map(|lease| lease.token);
    ensure!(
        acked.state == v1::JobState::Acked as i32 && acked_token == Some(command_token),
        "the command job should be acked with token {command_token}: {acked:?}"
    );

    phase("no lease of the drained node is still held");
    let still_held: Vec<v1::Job> = list_claimed(&mut survivor_stub)
        .await?
        .into_iter()
        .filter(|job| job.lease.as_ref().is_some_and(|lease| lease.holder == worker))
        .collect();
    ensure!(still_held.is_empty(), "{worker} still holds {still_held:?}");

    for id in survivors {
        cluster.node_mut(id)?.ensure_running()?;
    }
    Ok(())
}

/// Waits until the node at `http` says it drains (`/readyz` 503).
async fn wait_draining(http: SocketAddr) -> Result<()> {
    wait_until("readiness to say draining", deadline_in(READINESS_FLIP_TIMEOUT), || async move {
        let readyz = http_get(http, "/readyz").await?;
        Ok(if readyz.status == 503 && readyz.body.contains("draining: failed") {
            Check::Done(())
        } else {
            Check::NotYet(format!("{readyz:?}"))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sigterm_exits_at_once() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-second-sigterm")?;
    sandbox.run(Duration::from_secs(60), second_sigterm_story(&sandbox)).await
}

/// A drain waits for a running 30-second command; an operator who sends a
/// second SIGTERM means "now": the node exits at once, non-zero, and takes
/// the command's process group down with it rather than orphaning it.
async fn second_sigterm_story(sandbox: &Sandbox) -> Result<()> {
    phase("start one node with a 60 s drain grace");
    let settings = Settings { drain_grace_ms: Some(60_000), ..Settings::default() };
    let mut node = start_single(sandbox, "single", &settings).await?;
    let mut stub = node.stub()?;

    phase("run a 30-second command on its executor");
    let pid_file = sandbox.path().join("command-pid");
    let script = format!("echo $$ > '{}'; sleep 30", pid_file.display());
    let command_job = enqueue_one(&mut stub, job(EXEC_QUEUE, script.as_bytes())).await?;
    let command_pid =
        wait_until("the command to start", deadline_in(Duration::from_secs(20)), || {
            let written = std::fs::read_to_string(&pid_file).unwrap_or_default();
            async move {
                Ok(match written.trim().parse::<i32>() {
                    Ok(pid) => Check::Done(pid),
                    Err(_) => Check::NotYet(format!("pid file holds {written:?}")),
                })
            }
        })
        .await?;
    eprintln!("job {command_job} runs as process group {command_pid}");

    phase("first SIGTERM: the node starts draining");
    node.signal(Signal::SIGTERM)?;
    wait_draining(node.http).await?;
    node.ensure_running().context("the first SIGTERM must drain, not exit")?;

    phase("second SIGTERM: the node exits at once, non-zero");
    let second_at = Instant::now();
    node.signal(Signal::SIGTERM)?;
    let status = node.wait_exit(second_at + Duration::from_secs(3)).await?;
    eprintln!(
        "exited {status} {:.2} s after the second SIGTERM",
        second_at.elapsed().as_secs_f64()
    );
    ensure!(!status.success(), "an interrupted drain must not report success: {status}");

    phase("the command's process group went with it");
    wait_until(
        "the command's process group to be gone",
        deadline_in(Duration::from_secs(3)),
        || {
            let alive = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(command_pid), None);
            async move {
                Ok(match alive {
                    Err(nix::errno::Errno::ESRCH) => Check::Done(()),
                    other => Check::NotYet(format!("killpg(0): {other:?}")),
                })
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_that_comes_with_a_reload_still_drains() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-interrupt-with-reload")?;
    sandbox.run(Duration::from_secs(90), interrupt_with_reload_story(&sandbox)).await
}

/// An operator's SIGINT that arrives with a SIGHUP (a reload, sent by a
/// config tool at the same moment) still drains the node: the node keeps
/// the interrupt while it reloads and drains once the reload is done.
///
/// Mutation check: with a `ctrl_c()` future made anew for each wait, the
/// node took one of the two signals at random, and when that was the
/// SIGHUP the interrupt was lost and the node ran on; and an interrupt
/// right after the start, before the first wait, ended the node undrained
/// (no handler yet). Some rounds pass either way, so there are ten: the
/// story failed in three runs of three against that code.
async fn interrupt_with_reload_story(sandbox: &Sandbox) -> Result<()> {
    for round in 1..=10 {
        phase(&format!("round {round}: start one node"));
        let mut node =
            start_single(sandbox, &format!("single-{round}"), &Settings::default()).await?;
        phase("SIGHUP and SIGINT at once: the node drains and exits");
        // Stopped while both are sent, the node meets them together.
        node.signal(Signal::SIGSTOP)?;
        let signalled_at = Instant::now();
        node.signal(Signal::SIGHUP)?;
        node.signal(Signal::SIGINT)?;
        node.signal(Signal::SIGCONT)?;
        let status = node.wait_exit(signalled_at + Duration::from_secs(15)).await?;
        eprintln!("exited {status} {:.2} s after SIGINT", signalled_at.elapsed().as_secs_f64());
        ensure!(status.success(), "an interrupted node drains and exits zero: {status}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_node_still_joining() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-sigterm-joining")?;
    sandbox.run(Duration::from_secs(60), joining_story(&sandbox)).await
}

/// A node told to join through a member that does not answer keeps asking
/// for minutes; SIGTERM then stops it at once (it is no member yet, so
/// there is nothing to drain), non-zero and saying why, instead of the
/// supervisor's stop timeout running out and a SIGKILL ending it.
///
/// Mutation check: with the signal not watched during the join, the node
/// goes on asking and the story fails waiting for it to exit.
async fn joining_story(sandbox: &Sandbox) -> Result<()> {
    phase("a node joining through a port where nothing listens");
    let nobody = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut node = Node::new(sandbox, 2, None, Some(nobody))?;
    node.launch(sandbox)?;
    let log = node.log().context("the node's log")?.to_path_buf();
    wait_until("the node to retry its join", deadline_in(Duration::from_secs(20)), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move {
            Ok(if text.contains("join not done yet") {
                Check::Done(())
            } else {
                Check::NotYet(String::new())
            })
        }
    })
    .await?;

    phase("SIGTERM: the node stops at once");
    let signalled_at = Instant::now();
    node.signal(Signal::SIGTERM)?;
    let status = node.wait_exit(signalled_at + Duration::from_secs(10)).await?;
    eprintln!("exited {status} {:.2} s after SIGTERM", signalled_at.elapsed().as_secs_f64());
    ensure!(!status.success(), "a node that never joined must not report success: {status}");
    let text = std::fs::read_to_string(&log)?;
    ensure!(text.contains("stopped while joining"), "the log does not say why: {text}");
    Ok(())
}

/// A node whose Raft core stops on a storage error (a write it cannot make,
/// as on a full disk) acknowledges nothing it could not store and exits
/// non-zero instead of staying up serving nothing, so a supervisor restarts
/// it; restarted on its data dir without the fault, it serves again and
/// still holds what it acknowledged before.
///
/// Mutation check: without the fail-stop branch in `serve` the node stays
/// up and the story fails waiting for it to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_raft_stops_on_a_store_fault_exits_non_zero() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-fail-stop")?;
    sandbox.run(Duration::from_secs(90), fail_stop_story(&sandbox)).await
}

async fn fail_stop_story(sandbox: &Sandbox) -> Result<()> {
    phase("start one node with fault injection; one acknowledged enqueue");
    let settings = Settings { fault_injection: true, ..Settings::default() };
    let mut single = start_single(sandbox, "single", &settings).await?;
    let mut stub = QueueClient::new(channel(&single)?);
    let before = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![job("failstop", b"before")] })
        .await
        .context("enqueue before the fault")?
        .into_inner();
    let acked_id = before.results.first().context("enqueue answered nothing")?.job_id;

    phase("store write fault on, then a write: not acknowledged, and the process exits non-zero");
    let mut faults = FaultsClient::new(channel(&single)?);
    faults.set_store_fault(v1::SetFaultRequest { on: true }).await.context("SetStoreFault on")?;
    let mut request =
        tonic::Request::new(v1::EnqueueRequest { jobs: vec![job("failstop", b"during")] });
    request.set_timeout(Duration::from_secs(5));
    let during = stub.enqueue(request).await;
    ensure!(during.is_err(), "a write was acknowledged on a failing store: {during:?}");
    let status = single.wait_exit(deadline_in(Duration::from_secs(20))).await?;
    ensure!(!status.success(), "the node exited {status} after its Raft core stopped");
    eprintln!("node exited {status} after its Raft core stopped");

    phase("restart on the data dir (the fault is gone with the process): the acked job is there");
    single.kill()?;
    single.launch(sandbox)?;
    let stub = QueueClient::new(channel(&single)?);
    wait_until(
        "the restarted node to serve the acked job",
        deadline_in(NODE_READY_TIMEOUT),
        || {
            let mut stub = stub.clone();
            async move {
                let reply =
                    stub.get_job(v1::GetJobRequest { job_id: acked_id, stale: false }).await;
                Ok(match reply {
                    Ok(reply) if reply.get_ref().job.is_some() => Check::Done(()),
                    Ok(reply) => bail!("job {acked_id} is gone after the restart: {reply:?}"),
                    Err(status) => Check::NotYet(format!("{status}")),
                })
            }
        },
    )
    .await?;
    single.kill()
}

/// A storage fault during a drain is still a storage fault: the drain goes
/// on (it releases what it can, then stops the servers), but the process
/// exits non-zero, so a supervisor or a rolling restart does not take the
/// broken disk for a clean stop.
///
/// Mutation check: with the shutdown not asking whether the Raft core had
/// stopped on a fatal error, the node exits 0 and the story fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fault_during_a_drain_exits_non_zero() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-drain-fault")?;
    sandbox.run(Duration::from_secs(90), drain_fault_story(&sandbox)).await
}

async fn drain_fault_story(sandbox: &Sandbox) -> Result<()> {
    phase("start one node with fault injection and a 3 s drain grace; a 30 s command runs");
    let settings =
        Settings { drain_grace_ms: Some(3_000), fault_injection: true, ..Settings::default() };
    let mut single = start_single(sandbox, "single", &settings).await?;
    let mut stub = single.stub()?;
    let pid_file = sandbox.path().join("command-pid");
    let script = format!("echo $$ > '{}'; sleep 30", pid_file.display());
    enqueue_one(&mut stub, job(EXEC_QUEUE, script.as_bytes())).await?;
    wait_until("the command to start", deadline_in(Duration::from_secs(20)), || {
        let started = pid_file.exists();
        async move {
            Ok(if started { Check::Done(()) } else { Check::NotYet("no pid file".into()) })
        }
    })
    .await?;

    phase("SIGTERM: the node drains, waiting for the command");
    let mut faults = FaultsClient::new(channel(&single)?);
    single.signal(Signal::SIGTERM)?;
    wait_draining(single.http).await?;

    phase("the store fails while it drains: its next write stops Raft, and the exit is non-zero");
    faults.set_store_fault(v1::SetFaultRequest { on: true }).await.context("SetStoreFault on")?;
    let status = single.wait_exit(deadline_in(Duration::from_secs(40))).await?;
    eprintln!("node exited {status} after a drain on a failing store");
    ensure!(!status.success(), "a drain on a failing store reported success: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_flips_on_store_fault_and_on_quorum_loss() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-readiness")?;
    sandbox.run(Duration::from_secs(150), readiness_story(&sandbox)).await
}

/// An induced store-probe fault and then lost quorum — first on the leader
/// (whose followers stop answering), then on a follower (whose leader and
/// other peer stop) — each turn readiness failing with the check named, and
/// healing turns it back; liveness never moves.
async fn readiness_story(sandbox: &Sandbox) -> Result<()> {
    phase("start one node with fault injection");
    let settings = Settings { fault_injection: true, ..Settings::default() };
    let mut single = start_single(sandbox, "single", &settings).await?;
    let http = single.http;
    let mut faults = FaultsClient::new(channel(&single)?);
    let mut health = HealthClient::new(channel(&single)?);
    wait_readiness(http, &mut health, Ready::Yes, "", deadline_in(READINESS_FLIP_TIMEOUT)).await?;

    phase("store probe fault on: /readyz 503 naming the store, health NOT_SERVING, /livez 200");
    faults.set_probe_fault(v1::SetFaultRequest { on: true }).await.context("SetProbeFault on")?;
    let failing = wait_readiness(
        http,
        &mut health,
        Ready::No,
        "store: failed",
        deadline_in(READINESS_FLIP_TIMEOUT),
    )
    .await?;
    eprintln!("/readyz while faulted:\n{failing}");
    ensure_live(http).await?;

    phase("store probe fault off: ready again");
    faults.set_probe_fault(v1::SetFaultRequest { on: false }).await.context("SetProbeFault off")?;
    wait_readiness(http, &mut health, Ready::Yes, "store: ok", deadline_in(READINESS_FLIP_TIMEOUT))
        .await?;
    single.kill()?;

    let _slot = CLUSTER_SLOT.lock().await;
    phase("start a three-node cluster");
    let mut cluster = start_cluster(sandbox, &Settings::default()).await?;
    for id in cluster.ids() {
        let member = cluster.node(id)?;
        let mut health = HealthClient::new(channel(member)?);
        wait_readiness(
            member.http,
            &mut health,
            Ready::Yes,
            "",
            deadline_in(READINESS_FLIP_TIMEOUT),
        )
        .await
        .with_context(|| format!("node {id} before any fault"))?;
    }

    let leader = cluster.wait_leader_among(&cluster.ids(), Duration::from_secs(10)).await?;
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    quorum_loss(&mut cluster, leader, &followers, "the leader, its followers stopped").await?;

    let leader = cluster.wait_leader_among(&cluster.ids(), Duration::from_secs(15)).await?;
    let (survivor, stopped) = {
        let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
        (followers[0], vec![leader, followers[1]])
    };
    quorum_loss(&mut cluster, survivor, &stopped, "a follower, its leader and peer stopped")
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_agrees_with_readyz_at_once_and_reflection_lists_what_is_served() -> Result<()>
{
    let sandbox = Sandbox::new("lifecycle-health")?;
    sandbox.run(Duration::from_secs(120), health_story(&sandbox)).await
}

/// grpc.health answers from the same readiness as `/readyz`: the first
/// `/readyz` that shows a flip is followed at once by a health answer that
/// agrees (a copy refreshed once a second lagged here), and a `Watch` sees
/// the flip. Reflection answers in both protocol versions and lists the
/// Faults service exactly when fault injection is on.
async fn health_story(sandbox: &Sandbox) -> Result<()> {
    phase("a node with fault injection, and one without");
    let with = Settings { fault_injection: true, ..Settings::default() };
    let mut faulty = start_single(sandbox, "with-faults", &with).await?;
    let http = faulty.http;
    let mut faults = FaultsClient::new(channel(&faulty)?);
    let mut health = HealthClient::new(channel(&faulty)?);
    wait_readiness(http, &mut health, Ready::Yes, "", deadline_in(READINESS_FLIP_TIMEOUT)).await?;
    let request = |service: &str| HealthCheckRequest { service: service.to_string() };
    let mut watch = health.watch(request("")).await.context("Watch")?.into_inner();
    let first = watch.message().await.context("the first Watch message")?;
    ensure!(
        first.map(|m| m.status) == Some(ServingStatus::Serving as i32),
        "Watch starts with SERVING"
    );
    let unknown = health.check(request("leasehold.v1.Nothing")).await;
    ensure!(
        matches!(&unknown, Err(s) if s.code() == tonic::Code::NotFound),
        "an unknown service is NOT_FOUND: {unknown:?}"
    );

    for (on, want, status) in
        [(true, 503, ServingStatus::NotServing), (false, 200, ServingStatus::Serving)]
    {
        phase(&format!("probe fault {on}: the first /readyz {want} and grpc.health agree"));
        faults.set_probe_fault(v1::SetFaultRequest { on }).await.context("SetProbeFault")?;
        wait_until(
            &format!("/readyz to answer {want}"),
            deadline_in(READINESS_FLIP_TIMEOUT),
            || async move {
                let readyz = http_get(http, "/readyz").await?;
                Ok(if readyz.status == want { Check::Done(()) } else { Check::NotYet(readyz.body) })
            },
        )
        .await?;
        let answered = health.check(request("")).await.context("Check")?.into_inner().status;
        ensure!(
            answered == status as i32,
            "right after /readyz {want}, grpc.health said {answered}"
        );
        let queue = health.check(request("leasehold.v1.Queue")).await?.into_inner().status;
        ensure!(queue == status as i32, "the Queue service's health follows too: {queue}");
        let seen = tokio::time::timeout(Duration::from_secs(2), watch.message())
            .await
            .context("Watch sent nothing within 2 s of the flip")?
            .context("Watch")?;
        ensure!(seen.map(|m| m.status) == Some(status as i32), "Watch sent the new status");
    }

    phase("reflection, v1 and v1alpha, lists what each node serves");
    let plain = start_single(sandbox, "without-faults", &Settings::default()).await?;
    for (node, faults_served) in [(&faulty, true), (&plain, false)] {
        let v1 = reflection_v1_services(node).await?;
        let v1alpha = reflection_v1alpha_services(node).await?;
        ensure!(v1 == v1alpha, "the two versions list the same services: {v1:?} / {v1alpha:?}");
        for name in ["leasehold.v1.Queue", "leasehold.v1.Schedules", "grpc.health.v1.Health"] {
            ensure!(v1.contains(name), "{name} is listed: {v1:?}");
        }
        ensure!(
            v1.contains("leasehold.v1.Faults") == faults_served,
            "Faults listed iff fault injection is on ({faults_served}): {v1:?}"
        );
    }

    phase("an open Watch ends when its node stops, and does not hold the stop");
    faulty.stop(deadline_in(Duration::from_secs(30))).await?;
    let mut last = None;
    while let Ok(Some(message)) = watch.message().await {
        last = Some(message.status);
    }
    ensure!(
        last == Some(ServingStatus::NotServing as i32),
        "the Watch's last word was {last:?}, not NOT_SERVING"
    );
    let log = std::fs::read_to_string(faulty.log().context("the node's log")?)?;
    ensure!(!log.contains("serving tasks did not stop"), "the open Watch held the stop");
    Ok(())
}

/// The services a node lists through grpc.reflection.v1.
async fn reflection_v1_services(node: &Node) -> Result<std::collections::BTreeSet<String>> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut client = ServerReflectionClient::new(channel(node)?);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers =
        client.server_reflection_info(futures::stream::iter([request])).await?.into_inner();
    let answer = answers.message().await?.context("no v1 reflection answer")?;
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => bail!("v1 reflection answered {other:?}"),
    }
}

/// The services a node lists through grpc.reflection.v1alpha.
async fn reflection_v1alpha_services(node: &Node) -> Result<std::collections::BTreeSet<String>> {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let mut client = ServerReflectionClient::new(channel(node)?);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers =
        client.server_reflection_info(futures::stream::iter([request])).await?.into_inner();
    let answer = answers.message().await?.context("no v1alpha reflection answer")?;
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => bail!("v1alpha reflection answered {other:?}"),
    }
}

/// SIGSTOPs `stopped`, checks that `survivor` turns unready (leader check)
/// while staying live, SIGCONTs them and checks it is ready again.
async fn quorum_loss(
    cluster: &mut Cluster,
    survivor: u64,
    stopped: &[u64],
    story: &str,
) -> Result<()> {
    phase(&format!("quorum loss on node {survivor}, {story}: SIGSTOP nodes {stopped:?}"));
    let member = cluster.node(survivor)?;
    let http = member.http;
    let mut health = HealthClient::new(channel(member)?);
    for id in stopped {
        cluster.node(*id)?.signal(Signal::SIGSTOP)?;
    }
    let stopped_at = Instant::now();
    let body = wait_readiness(
        http,
        &mut health,
        Ready::No,
        "leader: failed",
        deadline_in(QUORUM_LOSS_TIMEOUT),
    )
    .await
    .with_context(|| format!("node {survivor} after losing quorum ({story})"))?;
    eprintln!(
        "node {survivor} unready {:.1} s after losing quorum:\n{body}",
        stopped_at.elapsed().as_secs_f64()
    );
    ensure_live(http).await?;
    cluster.node_mut(survivor)?.ensure_running()?;

    phase(&format!("SIGCONT nodes {stopped:?}: node {survivor} ready again"));
    for id in stopped {
        cluster.node(*id)?.signal(Signal::SIGCONT)?;
    }
    wait_readiness(http, &mut health, Ready::Yes, "leader: ok", deadline_in(QUORUM_LOSS_TIMEOUT))
        .await
        .with_context(|| format!("node {survivor} after quorum came back ({story})"))?;
    for id in cluster.ids() {
        cluster.node_mut(id)?.ensure_running()?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_move_with_operations() -> Result<()> {
    let sandbox = Sandbox::new("lifecycle-metrics")?;
    sandbox.run(Duration::from_secs(60), metrics_story(&sandbox)).await
}

/// The node runs without its executor, so this story's calls are the only
/// Queue RPCs it serves and every counter delta is known exactly.
async fn metrics_story(sandbox: &Sandbox) -> Result<()> {
    const QUEUE: &str = "metered";
    phase("start one node without an executor");
    let settings = Settings { executor: Some(false), ..Settings::default() };
    let node = start_single(sandbox, "single", &settings).await?;
    let mut stub = node.stub()?;

    phase("first scrape: well-formed, typed, Raft and drain gauges present");
    let before = scrape(node.http).await?;
    ensure!(before.gauge("leasehold_raft_leader", &[])? == 1.0, "a single node leads itself");
    ensure!(before.gauge("leasehold_draining", &[])? == 0.0, "not draining");
    ensure!(before.gauge("leasehold_raft_term", &[])? >= 1.0, "a term was started");
    let applied_before = before.gauge("leasehold_raft_applied_index", &[])?;
    ensure!(applied_before >= 1.0, "the bootstrap entries are applied");

    phase("5 enqueues, 3 claims, 2 acks and 1 stale ack");
    let mut jobs = Vec::new();
    for n in 0..5 {
        jobs.push(enqueue_one(&mut stub, job(QUEUE, format!("metered {n}").as_bytes())).await?);
    }
    let mut leases = Vec::new();
    for _ in 0..3 {
        let request = v1::ClaimRequest {
            worker: "e2e-metered".to_string(),
            queue: QUEUE.to_string(),
            max: 1,
            lease_ttl_ms: Some(60_000),
            selector: Vec::new(),
            wait_ms: 0,
            ..Default::default()
        };
        leases.push(claim_lease(&mut stub, request).await?);
    }
    for lease in &leases[..2] {
        stub.ack(v1::AckRequest { job_id: lease.job_id, token: lease.token, ..Default::default() })
            .await
            .with_context(|| format!("ack of {lease:?}"))?;
    }
    // The third lease acked with the first lease's token: stale.
    let stale = stub
        .ack(v1::AckRequest {
            job_id: leases[2].job_id,
            token: leases[0].token,
            ..Default::default()
        })
        .await;
    match stale {
        Err(status) if status.code() == tonic::Code::FailedPrecondition => {}
        other => bail!("an ack with another lease's token must fail FailedPrecondition: {other:?}"),
    }

    phase("second scrape: the counters moved by exactly those calls");
    let after = scrape(node.http).await?;
    for (method, code, calls) in [
        ("enqueue", "ok", 5.0),
        ("claim", "ok", 3.0),
        ("ack", "ok", 2.0),
        ("ack", "failed_precondition", 1.0),
    ] {
        let labels = [("method", method), ("code", code)];
        let moved = after.counter("leasehold_rpc_requests_total", &labels)?
            - before.counter("leasehold_rpc_requests_total", &labels)?;
        ensure!(moved == calls, "{method} {code}: moved by {moved}, expected {calls}");
    }
    for (method, calls) in [("enqueue", 5), ("claim", 3), ("ack", 3)] {
        let seen_before = before.histogram_count("leasehold_rpc_duration_seconds", method)?;
        let seen_after = after.histogram_count("leasehold_rpc_duration_seconds", method)?;
        ensure!(
            seen_after - seen_before == calls as f64,
            "{method} latencies observed: {seen_before} then {seen_after}, expected +{calls}"
        );
    }
    let granted = after.counter("leasehold_leases_granted_total", &[])?
        - before.counter("leasehold_leases_granted_total", &[])?;
    ensure!(granted == 3.0, "leases granted moved by {granted}, expected 3");
    ensure!(
        after.gauge("leasehold_raft_applied_index", &[])? >= applied_before + 10.0,
        "ten committed commands (5 enqueues, 3 claims, 2 acks) must move the applied index"
    );

    phase("the queue gauges match Stats");
    let stats = queue_stats(&mut stub, QUEUE).await?;
    let expected = v1::QueueStats {
        queue: QUEUE.to_string(),
        ready: 2,
        delayed: 0,
        claimed: 1,
        acked: 2,
        dead: 0,
    };
    ensure!(stats == expected, "Stats {stats:?}, expected {expected:?}");
    for (state, count) in [
        ("ready", stats.ready),
        ("delayed", stats.delayed),
        ("claimed", stats.claimed),
        ("acked", stats.acked),
        ("dead", stats.dead),
    ] {
        let gauge = after.gauge("leasehold_queue_jobs", &[("queue", QUEUE), ("state", state)])?;
        ensure!(gauge == count as f64, "queue_jobs {state}: {gauge}, Stats says {count}");
    }

    phase("queues past the series cap: the largest keep their series, all are counted");
    // Producers name queues; a scrape publishes the 1,000 holding the most
    // jobs, so 1,100 one-job queues beside QUEUE (four jobs) leave 101
    // without series of their own, and QUEUE keeps its.
    const MANY: usize = 1_100;
    const SERIES: usize = 1_000;
    for chunk in (0..MANY).collect::<Vec<_>>().chunks(500) {
        let jobs = chunk.iter().map(|n| job(&format!("many-{n:04}"), b"x")).collect();
        stub.enqueue(v1::EnqueueRequest { jobs }).await.context("enqueue into many queues")?;
    }
    let capped = scrape(node.http).await?;
    let queues = capped.gauge("leasehold_queues", &[])?;
    ensure!(queues == (MANY + 1) as f64, "leasehold_queues {queues}, expected {}", MANY + 1);
    let with_series: BTreeSet<&str> = capped
        .samples
        .iter()
        .filter(|sample| sample.metric == "leasehold_queue_jobs")
        .filter_map(|sample| sample.labels.get("queue"))
        .collect();
    ensure!(with_series.len() == SERIES, "{} queues with series", with_series.len());
    ensure!(with_series.contains(QUEUE), "the largest queue lost its series");
    // Of the one-job queues, the first by name are kept.
    ensure!(
        with_series.contains("many-0000") && !with_series.contains("many-1099"),
        "ties are not broken by name"
    );

    phase("Stats lists the largest queues and counts them all; a named one is looked up");
    let all = stub
        .stats(v1::StatsRequest { queue: None, stale: false })
        .await
        .context("Stats of every queue")?
        .into_inner();
    ensure!(all.queue_count == (MANY + 1) as u64, "queue_count {}", all.queue_count);
    let listed: BTreeSet<&str> = all.queues.iter().map(|q| q.queue.as_str()).collect();
    ensure!(listed == with_series, "Stats lists other queues than the scrape has series of");
    let ready: BTreeSet<&str> = all.oldest_ready.iter().map(|o| o.queue.as_str()).collect();
    ensure!(ready.is_subset(&listed), "oldest_ready names queues Stats does not list");
    let one = stub
        .stats(v1::StatsRequest { queue: Some("many-1099".into()), stale: false })
        .await
        .context("Stats of one queue")?
        .into_inner();
    let names: Vec<&str> = one.queues.iter().map(|q| q.queue.as_str()).collect();
    ensure!(names == ["many-1099"] && one.queue_count == 1, "{names:?}, {}", one.queue_count);
    ensure!(one.queues[0].ready == 1, "many-1099: {:?}", one.queues[0]);
    Ok(())
}

// ---------------------------------------------------------------------------
// Nodes and clusters
// ---------------------------------------------------------------------------

/// The TOML settings a story gives its nodes (everything else defaulted).
#[derive(Clone, Debug, Default)]
struct Settings {
    drain_grace_ms: Option<u64>,
    executor: Option<bool>,
    fault_injection: bool,
}

impl Settings {
    fn toml(&self) -> String {
        let mut text = String::new();
        if let Some(grace) = self.drain_grace_ms {
            text.push_str(&format!("drain_grace_ms = {grace}\n"));
        }
        if let Some(executor) = self.executor {
            text.push_str(&format!("executor = {executor}\n"));
        }
        if self.fault_injection {
            text.push_str("fault_injection = true\n");
        }
        text
    }
}

/// Starts node 1 alone with `settings`, its config and data named `name`
/// (a story may start a cluster in the same sandbox afterwards), and waits
/// until it answers a linearizable read.
async fn start_single(sandbox: &Sandbox, name: &str, settings: &Settings) -> Result<Node> {
    let config = sandbox.path().join(format!("{name}.toml"));
    std::fs::write(&config, settings.toml())
        .with_context(|| format!("writing {}", config.display()))?;
    let mut node = Node::new(sandbox, 1, Some(config), None)?;
    node.data = sandbox.path().join(format!("data-{name}"));
    node.launch(sandbox)?;
    let what = format!("node 1 ({name}) at {} to serve linearizable reads", node.grpc);
    let stub = node.stub()?;
    wait_until(&what, deadline_in(NODE_READY_TIMEOUT), || {
        let running = node.ensure_running();
        let mut stub = stub.clone();
        async move {
            running?;
            Ok(match stub.stats(v1::StatsRequest { queue: None, stale: false }).await {
                Ok(_) => Check::Done(()),
                Err(status) => Check::NotYet(format!("stats: {status:?}")),
            })
        }
    })
    .await?;
    Ok(node)
}

/// A three-node cluster whose nodes all run with `settings`.
async fn start_cluster(sandbox: &Sandbox, settings: &Settings) -> Result<Cluster> {
    let options = ClusterOptions { config: settings.toml(), ..ClusterOptions::default() };
    Cluster::start_with(sandbox, 3, options).await
}

/// A retrying client of the nodes `ids` (it rotates on UNAVAILABLE).
fn client_of(cluster: &Cluster, ids: &[u64]) -> Result<Client> {
    let addrs = cluster.addrs_of(ids)?;
    Client::connect(&addrs).map_err(|error| anyhow!("client of {addrs}: {error}"))
}

/// A lazily connected channel to `node`, for the Health and Faults stubs.
fn channel(node: &Node) -> Result<Channel> {
    Ok(Endpoint::from_shared(node.addr())
        .context("endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(RPC_TIMEOUT)
        .connect_lazy())
}

// ---------------------------------------------------------------------------
// Queue calls
// ---------------------------------------------------------------------------

async fn enqueue_one(stub: &mut QueueClient<Channel>, spec: v1::JobSpec) -> Result<u64> {
    let reply = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![spec] })
        .await
        .context("enqueue")?
        .into_inner();
    match reply.results.as_slice() {
        [result] if !result.duplicate => Ok(result.job_id),
        other => bail!("enqueue of one fresh job answered {other:?}"),
    }
}

async fn claim_lease(
    stub: &mut QueueClient<Channel>,
    request: v1::ClaimRequest,
) -> Result<v1::Lease> {
    let queue = request.queue.clone();
    let reply = stub.claim(request).await.with_context(|| format!("claim on {queue}"))?;
    match reply.into_inner().grants.as_slice() {
        [v1::Grant { lease: Some(lease), .. }] => Ok(lease.clone()),
        other => bail!("a claim of one ready job on {queue} answered {other:?}"),
    }
}

async fn get_job(stub: &mut QueueClient<Channel>, job_id: u64) -> Result<v1::Job> {
    stub.get_job(v1::GetJobRequest { job_id, stale: false })
        .await
        .with_context(|| format!("get job {job_id}"))?
        .into_inner()
        .job
        .ok_or_else(|| anyhow!("get job {job_id}: no job in the reply"))
}

/// Every claimed job of every queue (linearizable).
async fn list_claimed(stub: &mut QueueClient<Channel>) -> Result<Vec<v1::Job>> {
    let mut claimed = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = stub
            .list_jobs(v1::ListJobsRequest {
                queue: None,
                state: v1::JobState::Claimed as i32,
                page_size: 1_000,
                page_token: page_token.clone(),
                stale: false,
            })
            .await
            .context("list claimed jobs")?
            .into_inner();
        claimed.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(claimed);
        }
        page_token = page.next_page_token;
    }
}

// ---------------------------------------------------------------------------
// HTTP, readiness and metrics
// ---------------------------------------------------------------------------

async fn ensure_live(http: SocketAddr) -> Result<()> {
    let livez = http_get(http, "/livez").await?;
    ensure!(livez.status == 200, "/livez must stay 200: {livez:?}");
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ready {
    Yes,
    No,
}

/// Waits until `/readyz` says `want` with `line` in its body and
/// grpc.health.v1 (service "") agrees; answers the `/readyz` body.
async fn wait_readiness(
    http: SocketAddr,
    health: &mut HealthClient<Channel>,
    want: Ready,
    line: &str,
    deadline: Instant,
) -> Result<String> {
    let what = format!("/readyz and grpc.health to say {want:?} with {line:?}");
    wait_until(&what, deadline, || {
        let mut health = health.clone();
        async move {
            let readyz = http_get(http, "/readyz").await?;
            let http_ready = match readyz.status {
                200 => Ready::Yes,
                503 => Ready::No,
                other => bail!("/readyz answered {other}: {readyz:?}"),
            };
            let request = HealthCheckRequest { service: String::new() };
            let serving = match health.check(request).await {
                Ok(reply) => reply.into_inner().status,
                Err(status) => return Ok(Check::NotYet(format!("health: {status:?}"))),
            };
            let grpc_ready = if serving == ServingStatus::Serving as i32 {
                Ready::Yes
            } else if serving == ServingStatus::NotServing as i32 {
                Ready::No
            } else {
                return Ok(Check::NotYet(format!("health status {serving}")));
            };
            Ok(if http_ready == want && grpc_ready == want && readyz.body.contains(line) {
                Check::Done(readyz.body)
            } else {
                Check::NotYet(format!(
                    "/readyz {} {:?}, grpc.health {grpc_ready:?}",
                    readyz.status, readyz.body
                ))
            })
        }
    })
    .await
}

/// One `/metrics` scrape parsed by `prometheus-parse`, with the format its
/// content type declared and the type each family was declared with.
pub(super) struct Scrape {
    open_metrics: bool,
    types: BTreeMap<String, prometheus_parse::SampleType>,
    samples: Vec<prometheus_parse::Sample>,
}

/// The content type of the OpenMetrics text format.
const OPEN_METRICS: &str = "application/openmetrics-text; version=1.0.0";
/// The content type of the classic Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

/// Scrapes `/metrics` and parses it as a Prometheus server would: by the
/// format its content type declares, every sample line one the parser
/// understands, and an OpenMetrics body closed by `# EOF`.
pub(super) async fn scrape(http: SocketAddr) -> Result<Scrape> {
    let reply = http_get(http, "/metrics").await?;
    ensure!(reply.status == 200, "/metrics answered {}", reply.status);
    let open_metrics = reply.content_type.starts_with(OPEN_METRICS);
    ensure!(
        open_metrics || reply.content_type.starts_with(PROMETHEUS_TEXT),
        "not a Prometheus text content type: {:?}",
        reply.content_type
    );
    if open_metrics {
        ensure!(
            reply.body.trim_end().ends_with("# EOF"),
            "an OpenMetrics body ends with # EOF: {:?}",
            reply.body
        );
    }
    let mut types = BTreeMap::new();
    let mut sample_lines = 0;
    for line in reply.body.lines().map(str::trim) {
        match prometheus_parse::LineInfo::parse(line) {
            prometheus_parse::LineInfo::Sample { value, .. } => {
                ensure!(value.parse::<f64>().is_ok(), "bad sample value in {line:?}");
                sample_lines += 1;
            }
            prometheus_parse::LineInfo::Type { metric_name, metric_alias, sample_type } => {
                // The parser names a histogram by its `_bucket` series and
                // keeps the family name as the alias.
                types.insert(metric_alias.unwrap_or(metric_name), sample_type);
            }
            prometheus_parse::LineInfo::Ignored if !line.starts_with('#') => {
                bail!("line not in the text format: {line:?}")
            }
            _ => {}
        }
    }
    ensure!(sample_lines > 0, "no samples in {:?}", reply.body);
    let lines = reply.body.lines().map(|line| Ok(line.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).context("parsing /metrics")?;
    Ok(Scrape { open_metrics, types, samples: parsed.samples })
}

impl Scrape {
    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&prometheus_parse::Sample> {
        self.samples.iter().find(|sample| {
            sample.metric == name
                && sample.labels.len() == labels.len()
                && labels.iter().all(|(key, value)| sample.labels.get(key) == Some(*value))
        })
    }

    /// Whether `name` is a counter's sample. In the classic format a sample
    /// is typed by a # TYPE line of its own name (the parser types it); in
    /// OpenMetrics the family `X` is declared and its samples are `X_total`.
    fn is_counter(&self, name: &str, value: &prometheus_parse::Value) -> bool {
        match value {
            prometheus_parse::Value::Counter(_) => true,
            prometheus_parse::Value::Untyped(_) if self.open_metrics => name
                .strip_suffix("_total")
                .and_then(|family| self.types.get(family))
                .is_some_and(|declared| *declared == prometheus_parse::SampleType::Counter),
            _ => false,
        }
    }

    /// A counter's value; 0 when the labelled series does not exist yet
    /// (series are created on first use).
    pub(super) fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        match self.find(name, labels).map(|sample| &sample.value) {
            None => Ok(0.0),
            Some(
                value @ (prometheus_parse::Value::Counter(number)
                | prometheus_parse::Value::Untyped(number)),
            ) if self.is_counter(name, value) => Ok(*number),
            Some(other) => bail!("{name} {labels:?} is not typed a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        match self.find(name, labels).map(|sample| &sample.value) {
            Some(prometheus_parse::Value::Gauge(value)) => Ok(*value),
            Some(other) => bail!("{name} {labels:?} is not typed a gauge: {other:?}"),
            None => bail!("no {name} {labels:?} in the scrape"),
        }
    }

    /// The `_count` of a per-method histogram; 0 before its first
    /// observation. Its buckets must parse as a histogram whose last bucket
    /// (+Inf) equals the count.
    fn histogram_count(&self, name: &str, method: &str) -> Result<f64> {
        let count = match self.find(&format!("{name}_count"), &[("method", method)]) {
            None => return Ok(0.0),
            Some(sample) => match sample.value {
                prometheus_parse::Value::Untyped(value)
                | prometheus_parse::Value::Counter(value) => value,
                ref other => bail!("{name}_count {method}: {other:?}"),
            },
        };
        let buckets = match self.find(name, &[("method", method)]).map(|sample| &sample.value) {
            Some(prometheus_parse::Value::Histogram(buckets)) => buckets,
            other => bail!("{name} {method} is not a parsed histogram: {other:?}"),
        };
        let infinite = buckets.iter().find(|bucket| bucket.less_than.is_infinite());
        ensure!(
            infinite.is_some_and(|bucket| bucket.count == count),
            "{name} {method}: +Inf bucket {infinite:?} differs from count {count}"
        );
        Ok(count)
    }
}
