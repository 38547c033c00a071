//! Goal: `leasehold worker -- CMD…` runs the command once per job with the
//! job id, fencing token and attempt in its environment and the payload on
//! stdin; exit 0 acks, a failure nacks with the command's stderr as the
//! job's last_error; SIGTERM stops the worker cleanly with status 0 (SPEC §3
//! "Fencing", §6 CLI).
//!
//! Method: start a node and a worker process whose command is a shell script
//! that appends "ID TOKEN ATTEMPT PAYLOAD" to a file and fails (saying
//! "boom") on the payload "fail". Enqueue three good jobs and one failing job
//! with max_attempts 1, wait for 3 acked and 1 dead, and check the file
//! against what the server recorded. The command's standard output becomes
//! the acked job's result, for `leasehold worker` and for the node's
//! built-in executor alike.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;
use nix::sys::signal::Signal;

use super::support::{
    Check, Node, Process, Sandbox, binary, deadline_in, job, phase, queue_stats, run_cli,
    wait_until,
};

const QUEUE: &str = "q";
const WORKER_ID: &str = "e2e-command-worker";
/// Appends one line per run; fails on the payload "fail".
const SCRIPT: &str = r#"payload=$(cat)
echo "$LEASEHOLD_JOB_ID $LEASEHOLD_FENCING_TOKEN $LEASEHOLD_ATTEMPT $payload" >> "$E2E_RUNS_FILE"
echo "out-$LEASEHOLD_JOB_ID"
if [ "$payload" = fail ]; then echo boom >&2; exit 1; fi"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_runs_commands_with_token_and_nacks_failures() -> Result<()> {
    let sandbox = Sandbox::new("command-worker")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

/// One line of the runs file.
#[derive(Debug)]
struct Run {
    token: u64,
    attempt: u32,
    payload: String,
}

/// `leasehold worker FLAGS -- sh -c SCRIPT` against `node`, with the
/// story's file named in `file`'s variable.
fn worker_command(
    node: &Node,
    flags: &[&str],
    script: &str,
    file: (&str, &std::path::Path),
) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("worker")
        .args(flags)
        .args(["--", "sh", "-c", script])
        .env("LEASEHOLD_ADDR", node.addr())
        .env(file.0, file.1)
        .env("NO_COLOR", "1");
    command
}

fn parse_runs(text: &str) -> Result<BTreeMap<u64, Run>> {
    let mut runs = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.splitn(4, ' ');
        let mut next = |what: &str| fields.next().with_context(|| format!("no {what} in {line:?}"));
        let job_id: u64 = next("job id")?.parse().with_context(|| format!("job id in {line:?}"))?;
        let token = next("token")?.parse().with_context(|| format!("token in {line:?}"))?;
        let attempt = next("attempt")?.parse().with_context(|| format!("attempt in {line:?}"))?;
        let payload = next("payload")?.to_string();
        if runs.insert(job_id, Run { token, attempt, payload }).is_some() {
            bail!("job {job_id} ran twice: {text:?}");
        }
    }
    Ok(runs)
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1");
    let node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;
    let runs_file = sandbox.path().join("runs.txt");

    phase("start `leasehold worker --queue q --concurrency 2 -- sh -c SCRIPT`");
    let flags = ["--queue", QUEUE, "--concurrency", "2", "--worker-id", WORKER_ID];
    let command = worker_command(&node, &flags, SCRIPT, ("E2E_RUNS_FILE", &runs_file));
    let mut worker = Process::spawn("worker", command, &sandbox.log_file("worker"))?;

    phase("enqueue three good jobs and one that fails, max_attempts 1");
    let mut specs: Vec<v1::JobSpec> =
        (1..=3).map(|n| job(QUEUE, format!("ok-{n}").as_bytes())).collect();
    specs.push(v1::JobSpec { max_attempts: Some(1), ..job(QUEUE, b"fail") });
    let results = stub
        .enqueue(v1::EnqueueRequest { jobs: specs.clone() })
        .await
        .context("enqueue")?
        .into_inner()
        .results;
    ensure!(results.len() == 4, "enqueue answered {results:?}");
    let payloads: BTreeMap<u64, String> = results
        .iter()
        .zip(&specs)
        .map(|(r, s)| (r.job_id, String::from_utf8_lossy(&s.payload).into_owned()))
        .collect();

    phase("wait until 3 acked and 1 dead");
    wait_until("3 jobs acked and 1 dead", deadline_in(Duration::from_secs(30)), || {
        let running = worker.ensure_running();
        let mut stub = stub.clone();
        async move {
            running?;
            let stats = queue_stats(&mut stub, QUEUE).await?;
            Ok(if stats.acked == 3 && stats.dead == 1 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{stats:?}"))
            })
        }
    })
    .await?;

    phase("check each run against the job the server recorded");
    let text = std::fs::read_to_string(&runs_file).context("reading the runs file")?;
    let runs = parse_runs(&text)?;
    ensure!(runs.len() == 4, "expected 4 runs, file has {text:?}");
    let mut tokens = BTreeSet::new();
    for (job_id, payload) in &payloads {
        let run = runs.get(job_id).with_context(|| format!("job {job_id} never ran: {text:?}"))?;
        ensure!(
            &run.payload == payload,
            "job {job_id} got stdin {:?}, not {payload:?}",
            run.payload
        );
        ensure!(run.attempt == 1, "job {job_id} ran as attempt {}", run.attempt);
        ensure!(tokens.insert(run.token), "token {} given to two runs", run.token);
        let job = stub
            .get_job(v1::GetJobRequest { job_id: *job_id, stale: false })
            .await
            .context("get job")?
            .into_inner()
            .job
            .context("reply without a job")?;
        if payload == "fail" {
            ensure!(job.state == v1::JobState::Dead as i32, "failing job {job_id}: {job:?}");
            ensure!(job.attempts == 1, "failing job {job_id} attempts {}", job.attempts);
            let error = job.last_error.clone().unwrap_or_default();
            ensure!(error.contains("boom"), "last_error {error:?} lacks the command's stderr");
        } else {
            ensure!(job.state == v1::JobState::Acked as i32, "job {job_id}: {job:?}");
            let lease = job.lease.as_ref().context("acked job without its lease")?;
            ensure!(
                lease.token == run.token && lease.holder == WORKER_ID,
                "job {job_id}: command saw token {}, server acked lease {lease:?}",
                run.token
            );
            let expected = format!("out-{job_id}\n");
            ensure!(
                job.result == expected.as_bytes(),
                "job {job_id}: result {:?}, not the command's output {expected:?}",
                String::from_utf8_lossy(&job.result)
            );
        }
    }
    let last_token = stub
        .stats(v1::StatsRequest { queue: None, stale: false })
        .await
        .context("stats")?
        .into_inner()
        .last_token;
    ensure!(
        tokens.iter().all(|&t| t >= 1 && t <= last_token),
        "tokens {tokens:?} outside 1..={last_token}"
    );

    phase("SIGTERM the worker: it exits 0 within a few seconds");
    worker.signal(Signal::SIGTERM)?;
    let status = worker.wait_exit(deadline_in(Duration::from_secs(5))).await?;
    ensure!(status.code() == Some(0), "worker exited with {status} after SIGTERM");
    Ok(())
}

/// The node's built-in executor runs a job of its `exec` queue with
/// `sh -c PAYLOAD`, acks it, and keeps the command's output as the job's
/// result, which `leasehold job get` shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_executor_keeps_command_output_as_the_result() -> Result<()> {
    let sandbox = Sandbox::new("executor-result")?;
    sandbox.run(Duration::from_secs(60), executor_result_story(&sandbox)).await
}

async fn executor_result_story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1 (executor on) and enqueue a command job on `exec`");
    let node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;
    let command = b"echo \"ran $LEASEHOLD_JOB_ID\"; echo ignored >&2";
    let results = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![job("exec", command)] })
        .await
        .context("enqueue")?
        .into_inner()
        .results;
    let job_id = results.first().context("enqueue answered nothing")?.job_id;

    phase("wait until the executor acked it");
    wait_until("the command job acked", deadline_in(Duration::from_secs(30)), || {
        let mut stub = stub.clone();
        async move {
            let job = stub
                .get_job(v1::GetJobRequest { job_id, stale: false })
                .await?
                .into_inner()
                .job
                .context("reply without a job")?;
            Ok(if job.state == v1::JobState::Acked as i32 {
                Check::Done(())
            } else {
                Check::NotYet(format!("state {}", job.state))
            })
        }
    })
    .await?;

    phase("`leasehold job get --output json` shows the command's stdout as the result");
    let id = job_id.to_string();
    let addr = node.addr();
    let got =
        run_cli(sandbox, &["job", "get", &id, "--output", "json"], &[("LEASEHOLD_ADDR", &addr)])
            .await?
            .success()?
            .json()?;
    let expected = format!("ran {job_id}\n");
    ensure!(
        got["result"]["text"] == expected.as_str(),
        "job {job_id} result {} is not the command's stdout {expected:?}",
        got["result"]
    );
    Ok(())
}

/// A command that records its pid in `$E2E_PID_FILE`, then sleeps a
/// minute: a job still running when the worker is told to stop.
const SLEEPER: &str =
    r#"echo $$ > "$E2E_PID_FILE.tmp" && mv "$E2E_PID_FILE.tmp" "$E2E_PID_FILE"; exec sleep 60"#;

/// Goal: a stopping `leasehold worker` leaves no command behind. After the
/// grace period (SIGTERM, `--grace-s 1`) the running command is killed and
/// its job released at once, not after its lease's TTL; on a second
/// signal the worker exits at once, non-zero, and kills its command too
/// (each runs in a process group of its own, which outlives a plain exit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_kills_its_commands_and_releases_their_jobs() -> Result<()> {
    let sandbox = Sandbox::new("worker-stop")?;
    sandbox.run(Duration::from_secs(60), stop_story(&sandbox)).await
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// Starts a worker on `queue` running [`SLEEPER`], enqueues one job with a
/// lease of a minute, and waits for the command to start; the worker and
/// the command's pid.
async fn sleeping_worker(
    sandbox: &Sandbox,
    node: &Node,
    queue: &str,
    grace_s: &str,
) -> Result<(Process, i32)> {
    let pid_file = sandbox.path().join(format!("{queue}.pid"));
    let flags = ["--queue", queue, "--lease-ttl-ms", "60000", "--grace-s", grace_s];
    let command = worker_command(node, &flags, SLEEPER, ("E2E_PID_FILE", &pid_file));
    let worker = Process::spawn(queue, command, &sandbox.log_file(queue))?;
    let mut stub = node.stub()?;
    stub.enqueue(v1::EnqueueRequest { jobs: vec![job(queue, b"sleep")] }).await?;
    let pid = wait_until("the command started", deadline_in(Duration::from_secs(20)), || {
        let pid = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse().ok());
        async move {
            Ok(match pid {
                Some(pid) => Check::Done(pid),
                None => Check::NotYet("no pid file yet".to_string()),
            })
        }
    })
    .await?;
    ensure!(running(pid), "the command {pid} is not running");
    Ok((worker, pid))
}

async fn stop_story(sandbox: &Sandbox) -> Result<()> {
    let node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;

    phase("SIGTERM, a grace of 1 s: the command is killed and its job released");
    let (mut worker, pid) = sleeping_worker(sandbox, &node, "graced", "1").await?;
    worker.signal(Signal::SIGTERM)?;
    let status = worker.wait_exit(deadline_in(Duration::from_secs(15))).await?;
    ensure!(status.code() == Some(0), "worker exited with {status} after SIGTERM");
    ensure!(!running(pid), "the command {pid} outlived the worker");
    let stats = queue_stats(&mut stub, "graced").await?;
    ensure!(
        stats.ready == 1 && stats.claimed == 0,
        "the abandoned job is not ready again at once (its lease has 60 s left): {stats:?}"
    );

    phase("SIGTERM twice: the worker exits at once and its command with it");
    let (mut worker, pid) = sleeping_worker(sandbox, &node, "twice", "30").await?;
    worker.signal(Signal::SIGTERM)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.signal(Signal::SIGTERM)?;
    let status = worker.wait_exit(deadline_in(Duration::from_secs(5))).await?;
    ensure!(status.code() == Some(1), "worker exited with {status} after a second SIGTERM");
    let gone = deadline_in(Duration::from_secs(2));
    while running(pid) {
        ensure!(tokio::time::Instant::now() < gone, "the command {pid} outlived the worker");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
