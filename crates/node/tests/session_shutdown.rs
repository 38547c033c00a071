//! Goal: a node that shuts down answers the session frames it is already
//! running before it ends the session, so a write that took effect is
//! answered as done, not cut off with "node shutting down" (which a worker
//! must take for "outcome unknown": an ack it would repeat, a claim whose
//! leases nobody then holds).
//!
//! Method: one node in this process; its log store reports every append
//! synced [`SYNC_DELAY`] late (a slow disk), so an enqueue sent on a
//! session is still running when the node is told to stop. The enqueue
//! must be answered with its job id, the job must be in the state, and
//! only then does the session end, saying the node shut down. A session
//! that ends at once on shutdown answers the enqueue "node shutting down"
//! (checked).
//!
//! And a long-poll claim waiting on another session when the node is told
//! to stop grants nothing more: it fails UNAVAILABLE, and the job the
//! enqueue wrote during the shutdown stays ready. A claim that went on
//! polling through the session's grace takes that job (checked).

use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use leasehold_client::Client;
use leasehold_proto::v1;
use support::phase;

mod support;

/// How late the node's appends are reported synced.
const SYNC_DELAY: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_answers_its_running_frames_before_the_node_stops() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(60), story()).await.context("story timed out")?
}

async fn story() -> Result<()> {
    let dir = tempfile::tempdir()?;
    phase("start node 1 and open a session");
    let node = support::start_alone(dir.path()).await?;
    support::wait_for("node 1 leads", Duration::from_secs(20), || node.journal().is_leader())
        .await?;
    let client = Client::connect(&format!("http://{}", node.grpc_addr()))?;
    let session = client.session().await?;
    session.ack(1, 1).await.err().context("an ack of no job is refused")?;
    let poller = client.session().await?;
    let claim = v1::ClaimRequest {
        worker: "w".into(),
        queue: "q".into(),
        max: 1,
        wait_ms: 20_000,
        ..Default::default()
    };
    let polling = tokio::spawn(async move { poller.claim(claim).await });

    phase("an enqueue is under way on a slow disk when the node is told to stop");
    node.log_store().set_sync_delay(SYNC_DELAY);
    let journal = node.journal().clone();
    let spec = v1::JobSpec { queue: "q".into(), payload: b"late".to_vec(), ..Default::default() };
    let enqueue =
        tokio::spawn(async move { session.enqueue(vec![spec]).await.map(|r| (r, session)) });
    tokio::time::sleep(SYNC_DELAY / 3).await;
    ensure!(!enqueue.is_finished(), "the enqueue finished before the shutdown");
    let stopping = tokio::spawn(node.shutdown(Duration::from_secs(20)));

    phase("the enqueue is answered done, then the session ends saying why");
    let (results, session) = enqueue.await?.context("the running enqueue was cut off")?;
    let job_id = results.first().map(|r| r.job_id).context("no enqueue result")?;
    ensure!(
        journal.read_stale(|state| state.job(job_id).is_some()),
        "job {job_id} was answered but is not in the state"
    );
    let polled = polling.await?;
    ensure!(
        matches!(&polled, Err(e) if e.code() == tonic::Code::Unavailable),
        "the long-poll claim at shutdown was answered {polled:?}"
    );
    let state = journal.read_stale(|state| state.job(job_id).map(|job| job.state));
    ensure!(
        state == Some(leasehold_core::JobState::Ready),
        "job {job_id} is {state:?} after the shutdown"
    );
    let after = session.ack(job_id, 1).await.err().context("a frame after the shutdown")?;
    ensure!(
        after.code() == tonic::Code::Unavailable && after.to_string().contains("shutting down"),
        "the session ended with {after}"
    );
    stopping.await?.map_err(|e| anyhow!("shutdown: {e}"))?;
    Ok(())
}
