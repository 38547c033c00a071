//! Goal: SIGTERM drains a node that leads and is running commands: a command
//! that fits in the grace period finishes and its job is acked; one that
//! does not is stopped and its job released at once rather than left held
//! until its lease lapses; leadership moves to another node; the process
//! exits 0 (SPEC §5 "Drain"; §7 guarantee 6).
//!
//! Method: every node runs command jobs of queue "exec" itself; the nodes
//! run with a 6 s drain grace. Enqueue there, tagged `node:L` for the
//! leader L so that only L's executor may claim them, a short command
//! (`sleep 3`, then append its job id to a file) and a long one (`sleep 60`,
//! then append "late"); each first notes its start in another file. Once L
//! holds both and both have started (a claim alone is not enough: a grant
//! still on its way to the executor at the SIGTERM is released unrun), and
//! the file is still empty, SIGTERM L. L must exit 0 within the grace plus slack; by then the file
//! must hold the short job's id once and nothing else; the short job must
//! read acked under L's token, the long one ready again with no attempt
//! charged (released, not lapsed: its 30 s lease would still be running);
//! L's log must show the drain steps in order, the handover included; and
//! the other two nodes must have a leader between them that takes writes.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_client::Client;
use leasehold_proto::v1;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, ClusterOptions, Sandbox, deadline_in, job, phase,
    wait_until,
};
use super::cluster_slot;

const QUEUE: &str = "exec";
const DRAIN_GRACE_MS: u64 = 6_000;
/// The short command's run time: long enough to be mid-run at the SIGTERM,
/// short enough to finish within the grace.
const SHORT_COMMAND_SECONDS: u64 = 3;
/// The long command's run time: far past the grace.
const LONG_COMMAND_SECONDS: u64 = 60;
/// The drained node must be gone by then: the grace, then the release,
/// handover and shutdown steps.
const EXIT_WITHIN: Duration = Duration::from_millis(DRAIN_GRACE_MS + 12_000);
/// The steps the drained node logs, in order (SPEC §5 "Drain").
const DRAIN_STEPS: [&str; 7] = [
    "step=\"not ready\"",
    "step=\"stop intake\"",
    "step=\"release\"",
    "step=\"hand over\"",
    "step=\"handed over\"",
    "step=\"close\"",
    "step=\"exit\"",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_releases_and_hands_over() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-drain")?;
    sandbox.run(Duration::from_secs(90), story(&sandbox)).await
}

/// Waits until `job_id` is claimed by `holder`; answers its lease.
async fn wait_claimed(client: &Client, job_id: u64, holder: &str) -> Result<v1::Lease> {
    let what = format!("{holder} to claim job {job_id}");
    wait_until(&what, deadline_in(Duration::from_secs(20)), || {
        let client = client.clone();
        async move {
            let read = client.get_job(job_id, false).await?;
            Ok(match &read.lease {
                Some(lease) if read.state == v1::JobState::Claimed as i32 => {
                    ensure!(lease.holder == holder, "job {job_id} claimed by {lease:?}");
                    Check::Done(lease.clone())
                }
                _ => Check::NotYet(format!("{read:?}")),
            })
        }
    })
    .await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster with a 6 s drain grace");
    let options = ClusterOptions {
        config: format!("drain_grace_ms = {DRAIN_GRACE_MS}\n"),
        ..ClusterOptions::default()
    };
    let mut cluster = Cluster::start_with(sandbox, 3, options).await?;
    let leader = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?.leader;
    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != leader).collect();
    let client = cluster.client()?;
    let runs = sandbox.path().join("runs.txt");
    let started = sandbox.path().join("started.txt");
    for file in [&runs, &started] {
        std::fs::write(file, "").with_context(|| format!("creating {}", file.display()))?;
    }

    phase("enqueue a 3 s and a 60 s command that only the leader's executor may run");
    let note_start = format!("echo \"$LEASEHOLD_JOB_ID\" >> '{}'", started.display());
    let short = format!(
        "{note_start}; sleep {SHORT_COMMAND_SECONDS}; echo \"$LEASEHOLD_JOB_ID\" >> '{}'",
        runs.display()
    );
    let long =
        format!("{note_start}; sleep {LONG_COMMAND_SECONDS}; echo late >> '{}'", runs.display());
    let tags = vec![format!("node:{leader}")];
    let specs = [short, long]
        .iter()
        .map(|script| v1::JobSpec { tags: tags.clone(), ..job(QUEUE, script.as_bytes()) })
        .collect();
    let results = client.enqueue(specs).await?;
    let [short_job, long_job] = results.as_slice() else {
        bail!("two jobs enqueued, results {results:?}")
    };
    let (short_job, long_job) = (short_job.job_id, long_job.job_id);

    phase("wait until the leader's executor holds both and runs them");
    let holder = format!("node-{leader}");
    let short_lease = wait_claimed(&client, short_job, &holder).await?;
    let long_lease = wait_claimed(&client, long_job, &holder).await?;
    wait_until("both commands to start", deadline_in(Duration::from_secs(20)), || {
        let text = std::fs::read_to_string(&started).context("reading the started file");
        async move {
            let text = text?;
            let mut ids: Vec<u64> = text.lines().filter_map(|line| line.parse().ok()).collect();
            ids.sort_unstable();
            Ok(if ids == [short_job, long_job] {
                Check::Done(())
            } else {
                Check::NotYet(format!("started: {text:?}"))
            })
        }
    })
    .await?;
    let running = std::fs::read_to_string(&runs).context("reading the runs file")?;
    ensure!(running.is_empty(), "a command finished before the SIGTERM: {running:?}");

    phase("SIGTERM the leader while its commands run");
    let terminated_at = Instant::now();
    cluster.node(leader)?.signal(Signal::SIGTERM)?;
    let status = cluster.node_mut(leader)?.wait_exit(deadline_in(EXIT_WITHIN)).await?;
    let took = terminated_at.elapsed();
    eprintln!("node {leader} drained and exited ({status}) in {:.1} s", took.as_secs_f64());
    ensure!(status.success(), "the drained node exited with {status}");

    phase("the short command ran to the end, once; the long one was stopped");
    let lines = std::fs::read_to_string(&runs).context("reading the runs file")?;
    ensure!(
        lines == format!("{short_job}\n"),
        "runs file {lines:?}, expected job {short_job} once"
    );

    phase("another node leads and takes writes");
    let new_leader = cluster.wait_leader_among(&others, Duration::from_secs(10)).await?;
    let client = Client::connect(&cluster.addrs_of(&others)?)?;
    client.enqueue(vec![job("after-drain", b"ok")]).await.context("a write after the drain")?;
    eprintln!("leadership moved from {leader} to {new_leader}");

    phase("the short job is acked under the drained node's token");
    let read = client.get_job(short_job, false).await?;
    let kept = read.lease.as_ref().map(|kept| (kept.token, kept.holder.as_str()));
    ensure!(
        read.state == v1::JobState::Acked as i32
            && kept == Some((short_lease.token, holder.as_str()))
            && read.attempts == 0,
        "job {short_job} after the drain: {read:?}, expected acked under {short_lease:?}"
    );

    phase("the long job is ready again, released before its lease ran out");
    let read = client.get_job(long_job, false).await?;
    let stats = client.stats(None, false).await?;
    ensure!(
        stats.cluster_time_ms < long_lease.expires_at_ms,
        "the lease ran out before this check ({stats:?}, {long_lease:?}); it proves nothing"
    );
    ensure!(
        read.state == v1::JobState::Ready as i32 && read.attempts == 0,
        "job {long_job} after the drain: {read:?}, expected ready and no attempt charged"
    );

    phase("the drained node's log shows the steps in order, the handover included");
    let log = cluster.node(leader)?.log().context("no log")?;
    let text = std::fs::read_to_string(log).context("reading the drained node's log")?;
    let mut from = 0;
    for step in DRAIN_STEPS {
        match text[from..].find(step) {
            Some(at) => from += at + step.len(),
            None => bail!("the drained node's log lacks {step} after the steps before it: {log:?}"),
        }
    }
    Ok(())
}
