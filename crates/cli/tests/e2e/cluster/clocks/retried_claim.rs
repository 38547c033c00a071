//! Goal: a Claim whose answer was lost, retried under the same request id,
//! leaves one lease, not two, and charges one attempt (issue acceptance,
//! clocks: "answered once").
//!
//! Method: one node, one job. A raw Queue stub talks to the node through a
//! proxy that, once its connection is up, swallows every answer: the claim
//! reaches the node and is granted, and the stub only sees its own
//! deadline pass. The node's state must show the job claimed by that
//! worker (else the retry would prove nothing). The same worker retries
//! with the same request id, straight to the node: the answer must be the
//! first try's lease — same job, same token, same expiry — and no second
//! token may have been issued. Another worker then finds nothing to claim.
//! Last, the one lease fails once (a nack with its token): the job's
//! attempts count is 1, and the token is dead afterwards.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::queue_client::QueueClient;
use tonic::transport::Endpoint;

use super::proxy::Proxy;
use crate::e2e::cluster::cluster_slot;
use crate::e2e::support::{Node, Sandbox, enqueue_job, phase};

const QUEUE: &str = "retried";
const WORKER: &str = "worker-retry";
const REQUEST_ID: &str = "claim-lost-answer-1";
/// Long enough that the lease cannot lapse between the try and the retry,
/// however slow the machine.
const LEASE_TTL_MS: u64 = 60_000;
/// The deadline the stub behind the proxy gives up after.
const LOST_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_retried_after_a_lost_answer_leaves_one_lease() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("clocks-retried-claim")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

fn claim(worker: &str, request_id: &str) -> v1::ClaimRequest {
    v1::ClaimRequest {
        worker: worker.to_string(),
        queue: QUEUE.to_string(),
        max: 1,
        lease_ttl_ms: Some(LEASE_TTL_MS),
        wait_ms: 0,
        request_id: request_id.to_string(),
        ..Default::default()
    }
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a node and enqueue one job");
    let node = Node::start(sandbox).await?;
    let mut direct = node.stub()?;
    let job_id = enqueue_job(&mut direct, QUEUE, b"claimed once").await?;
    let tokens_before = direct
        .stats(v1::StatsRequest { queue: None, stale: false })
        .await
        .context("stats")?
        .into_inner()
        .last_token;

    phase("connect through a proxy, then cut its answers");
    let proxy = Proxy::start(node.grpc, Duration::ZERO).await?;
    let channel = Endpoint::from_shared(proxy.addr())
        .context("proxy endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(LOST_ANSWER_TIMEOUT)
        .connect_lazy();
    let mut lossy = QueueClient::new(channel);
    // One call that succeeds first, so the connection (and its HTTP/2
    // handshake) is up before answers stop: the claim below is then sent
    // for sure, and only its answer is lost.
    lossy
        .stats(v1::StatsRequest { queue: None, stale: false })
        .await
        .context("a call through the proxy before the cut")?;
    proxy.cut_answers();

    phase("claim through the proxy: granted by the node, the answer lost");
    let lost = lossy.claim(claim(WORKER, REQUEST_ID)).await;
    match lost {
        Ok(answer) => bail!("the claim's answer came through a cut proxy: {answer:?}"),
        Err(status) => eprintln!("the first try saw {:?}: {}", status.code(), status.message()),
    }
    let after_try = get_job(&mut direct, job_id).await?;
    let first = after_try.lease.clone().context("the first try granted no lease")?;
    ensure!(
        after_try.state == v1::JobState::Claimed as i32 && first.holder == WORKER,
        "the first try did not leave the job claimed by {WORKER}: {after_try:?}"
    );
    ensure!(first.token > tokens_before, "lease token {} not new: {first:?}", first.token);
    proxy.stop().await;

    phase("the same worker retries with the same request id, straight to the node");
    let retried = direct.claim(claim(WORKER, REQUEST_ID)).await.context("retry")?.into_inner();
    let [v1::Grant { job: Some(retried_job), lease: Some(retried_lease) }] =
        retried.grants.as_slice()
    else {
        bail!("the retry was not answered with the first try's one lease: {:?}", retried.grants);
    };
    ensure!(
        *retried_lease == first,
        "the retry answered another lease: {retried_lease:?}, the first try granted {first:?}"
    );
    ensure!(retried_job.id == job_id, "the retry answered job {}", retried_job.id);
    let stats = direct
        .stats(v1::StatsRequest { queue: Some(QUEUE.to_string()), stale: false })
        .await
        .context("stats after the retry")?
        .into_inner();
    ensure!(
        stats.last_token == first.token,
        "a second token was issued: last token {}, the one lease has {}",
        stats.last_token,
        first.token
    );
    let after_retry = get_job(&mut direct, job_id).await?;
    ensure!(
        after_retry.lease.as_ref() == Some(&first) && after_retry.attempts == 0,
        "the job after the retry: {after_retry:?}"
    );

    phase("another worker finds nothing to claim");
    let other = direct
        .claim(claim("worker-other", "claim-other-1"))
        .await
        .context("another worker's claim")?
        .into_inner();
    ensure!(other.grants.is_empty(), "a second lease was granted: {:?}", other.grants);

    phase("the one lease fails once: one attempt charged, its token dead after");
    direct
        .nack(v1::NackRequest {
            job_id,
            token: first.token,
            error: "failed once".to_string(),
            // Not due again within the story.
            retry_after_ms: Some(LEASE_TTL_MS),
        })
        .await
        .context("nack with the one lease's token")?;
    let failed = get_job(&mut direct, job_id).await?;
    ensure!(
        failed.attempts == 1 && failed.state == v1::JobState::Ready as i32,
        "after one failed lease the job shows attempts {} in state {}",
        failed.attempts,
        failed.state
    );
    let again = direct
        .nack(v1::NackRequest {
            job_id,
            token: first.token,
            error: "failed twice".to_string(),
            retry_after_ms: Some(LEASE_TTL_MS),
        })
        .await;
    match again {
        Ok(answer) => bail!("a second nack with the same token was accepted: {answer:?}"),
        Err(status) => ensure!(
            status.code() == tonic::Code::FailedPrecondition,
            "a second nack answered {status:?}, expected FAILED_PRECONDITION"
        ),
    }
    let settled = get_job(&mut direct, job_id).await?;
    ensure!(settled.attempts == 1, "attempts {} after a refused nack", settled.attempts);
    Ok(())
}

async fn get_job(
    stub: &mut QueueClient<tonic::transport::Channel>,
    job_id: u64,
) -> Result<v1::Job> {
    stub.get_job(v1::GetJobRequest { job_id, stale: false })
        .await
        .with_context(|| format!("get job {job_id}"))?
        .into_inner()
        .job
        .with_context(|| format!("job {job_id} missing"))
}
