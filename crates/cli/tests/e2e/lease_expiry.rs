//! Goal: a worker that stops renewing loses its lease at the TTL, the job is
//! redelivered to another worker under a strictly larger fencing token, and
//! the first worker's token is dead from then on (SPEC §3 "Fencing", §7
//! guarantees 1 and 2).
//!
//! Method: claim one job with a 1 s lease and never refresh it. Another
//! worker's claim finds nothing while the lease holds, then long-polls and
//! must receive the job within TTL + 2 s of the first claim (the leader's
//! sweep runs about every second). The old token's ack is refused with
//! FAILED_PRECONDITION; the job's attempts went up by one.
//!
//! And (SPEC §3 "an expired lease not yet re-granted still counts"): a
//! worker whose lease the sweep took back, with nobody granted the job
//! since, still lands its ack; the job is then acked and never handed out.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;
use tokio::time::Instant;

use super::support::{Node, Sandbox, enqueue_job, get_job, phase};

const QUEUE: &str = "expiry";
const LEASE_TTL_MS: u64 = 1_000;
/// How long after the first claim the job must be claimable again.
const RECLAIM_WITHIN: Duration = Duration::from_millis(LEASE_TTL_MS + 2_000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrefreshed_lease_expires_and_is_reclaimed_with_larger_token() -> Result<()> {
    let sandbox = Sandbox::new("lease-expiry")?;
    sandbox.run(Duration::from_secs(40), story(&sandbox)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_lease_still_acks_until_the_job_is_granted_again() -> Result<()> {
    let sandbox = Sandbox::new("swept-ack")?;
    sandbox.run(Duration::from_secs(40), swept_story(&sandbox)).await
}

async fn swept_story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1, enqueue one job, claim it with a 1 s lease");
    let node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;
    let job_id = enqueue_job(&mut stub, QUEUE, b"late but done").await?;
    let claim = v1::ClaimRequest {
        worker: "worker-a".to_string(),
        queue: QUEUE.to_string(),
        max: 1,
        lease_ttl_ms: Some(LEASE_TTL_MS),
        ..Default::default()
    };
    let grants = stub.claim(claim.clone()).await.context("claim")?.into_inner();
    let (_, lease) = only_grant(grants.grants, "worker-a")?;

    phase("the sweep takes the lease back: ready again, one attempt charged, no lease shown");
    let deadline = Instant::now() + RECLAIM_WITHIN + Duration::from_secs(5);
    let swept = loop {
        let job = get_job(&mut stub, job_id).await?;
        if job.state == v1::JobState::Ready as i32 {
            break job;
        }
        ensure!(Instant::now() < deadline, "lease never swept: {job:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(swept.attempts == 1 && swept.lease.is_none(), "swept job {swept:?}");

    phase("worker-a's late ack under the swept token is accepted");
    stub.ack(v1::AckRequest { job_id, token: lease.token, ..Default::default() })
        .await
        .context("late ack under the swept token")?;
    let acked = get_job(&mut stub, job_id).await?;
    ensure!(acked.state == v1::JobState::Acked as i32, "state after the late ack {acked:?}");
    ensure!(
        acked.lease.as_ref().map(|l| l.token) == Some(lease.token),
        "the tombstone does not name the acking lease: {acked:?}"
    );

    phase("the acked job is not handed out again");
    let again = stub.claim(claim).await.context("claim after the ack")?.into_inner();
    ensure!(again.grants.is_empty(), "acked job granted again: {:?}", again.grants);
    Ok(())
}

fn only_grant(grants: Vec<v1::Grant>, who: &str) -> Result<(v1::Job, v1::Lease)> {
    ensure!(grants.len() == 1, "{who}: expected one grant, got {}", grants.len());
    match grants.into_iter().next() {
        Some(v1::Grant { job: Some(job), lease: Some(lease) }) => Ok((job, lease)),
        other => bail!("{who}: grant without job or lease: {other:?}"),
    }
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1 and enqueue one job");
    let node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;
    let job_id = enqueue_job(&mut stub, QUEUE, b"only one").await?;

    phase("worker-a claims with a 1 s lease and never refreshes");
    let claim = |worker: &str, wait_ms: u64| v1::ClaimRequest {
        worker: worker.to_string(),
        queue: QUEUE.to_string(),
        max: 1,
        lease_ttl_ms: Some(LEASE_TTL_MS),
        selector: Vec::new(),
        wait_ms,
        ..Default::default()
    };
    let first_claim_sent = Instant::now();
    let grants = stub.claim(claim("worker-a", 0)).await.context("first claim")?.into_inner();
    let (first_job, first) = only_grant(grants.grants, "worker-a")?;
    ensure!(first.job_id == job_id && first.holder == "worker-a", "first lease {first:?}");
    ensure!(
        first.expires_at_ms.checked_sub(first.granted_at_ms) == Some(LEASE_TTL_MS),
        "first lease does not last the asked {LEASE_TTL_MS} ms: {first:?}"
    );
    ensure!(first_job.attempts == 0, "fresh job has attempts {}", first_job.attempts);

    phase("while the lease holds, worker-b gets nothing");
    let early = stub.claim(claim("worker-b", 0)).await.context("early claim")?.into_inner();
    let elapsed = first_claim_sent.elapsed();
    if elapsed < Duration::from_millis(LEASE_TTL_MS) {
        ensure!(
            early.grants.is_empty(),
            "job handed to worker-b {} ms into worker-a's 1 s lease: {:?}",
            elapsed.as_millis(),
            early.grants
        );
    } else {
        eprintln!("machine too slow to test the held lease ({} ms); skipping", elapsed.as_millis());
    }

    phase("worker-b long-polls; the job comes back within TTL + 2 s");
    let remaining = RECLAIM_WITHIN.saturating_sub(first_claim_sent.elapsed());
    let wait_ms = u64::try_from(remaining.as_millis()).context("wait")?;
    let grants = stub.claim(claim("worker-b", wait_ms)).await.context("reclaim")?.into_inner();
    let reclaimed_after = first_claim_sent.elapsed();
    ensure!(
        !grants.grants.is_empty(),
        "job {job_id} not claimable again {} ms after the first claim (TTL {LEASE_TTL_MS} ms)",
        reclaimed_after.as_millis()
    );
    let (second_job, second) = only_grant(grants.grants, "worker-b")?;
    eprintln!("reclaimed {} ms after the first claim", reclaimed_after.as_millis());
    ensure!(second.job_id == job_id && second.holder == "worker-b", "second lease {second:?}");
    ensure!(
        second.token > first.token,
        "token did not grow: first {}, second {}",
        first.token,
        second.token
    );
    ensure!(
        second.granted_at_ms >= first.expires_at_ms,
        "second lease granted at {} before the first expired at {} (overlap)",
        second.granted_at_ms,
        first.expires_at_ms
    );
    ensure!(second_job.attempts == 1, "grant shows attempts {}", second_job.attempts);

    phase("worker-a's token is refused: ack and refresh");
    let refused =
        stub.ack(v1::AckRequest { job_id, token: first.token, ..Default::default() }).await;
    match refused {
        Ok(_) => bail!("ack with the expired token {} was accepted", first.token),
        Err(status) => ensure!(
            status.code() == tonic::Code::FailedPrecondition,
            "stale ack answered {status:?}, expected FailedPrecondition"
        ),
    }
    let refresh = stub
        .refresh(v1::RefreshRequest {
            worker: "worker-a".to_string(),
            leases: vec![v1::LeaseRef { job_id, token: first.token }],
            lease_ttl_ms: None,
        })
        .await
        .context("refresh")?
        .into_inner();
    ensure!(
        refresh.renewed.is_empty() && refresh.lost == vec![job_id],
        "refresh of the expired lease: {refresh:?}"
    );

    phase("the job records one failed attempt and worker-b's lease");
    let current = stub
        .get_job(v1::GetJobRequest { job_id, stale: false })
        .await
        .context("get job")?
        .into_inner()
        .job
        .context("reply without a job")?;
    ensure!(current.attempts == first_job.attempts + 1, "attempts {}", current.attempts);
    ensure!(current.state == v1::JobState::Claimed as i32, "state {}", current.state);
    ensure!(current.lease.as_ref() == Some(&second), "lease {:?}", current.lease);

    phase("worker-b's current token is accepted");
    stub.ack(v1::AckRequest { job_id, token: second.token, ..Default::default() })
        .await
        .context("ack by worker-b")?;
    let acked = stub
        .get_job(v1::GetJobRequest { job_id, stale: false })
        .await
        .context("get job")?
        .into_inner()
        .job
        .context("reply without a job")?;
    ensure!(acked.state == v1::JobState::Acked as i32, "state after ack {}", acked.state);
    Ok(())
}
