//! Goal: every Queue RPC refuses empty, oversized and malformed input with
//! the documented code (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for size
//! limits), a message that names the offending field, and no change at all
//! to the queues (SPEC §6, queue.proto).
//!
//! Method: seed a node with a few jobs (one claimed, so real tokens exist),
//! take a full Stats snapshot, fire a table of bad requests at each of the
//! ten RPCs through the raw generated stub (no client-side retries or
//! checks), and compare a second snapshot. Then the limits' edges (exactly
//! 256 KiB, exactly 1,000 jobs, TTL 1 s and 12 h, a 64-char queue) must be
//! accepted, so the refusals are not off by one. Mismatched answers are
//! collected and judged last, so one run shows all of them and every other
//! check still runs.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::queue_client::QueueClient;
use tonic::Code;
use tonic::transport::Channel;

use super::support::{Node, Sandbox, job, phase, stats_snapshot};

const QUEUE: &str = "seed";
const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
const HOUR_MS: u64 = 60 * 60 * 1_000;

/// One request to one RPC.
enum Call {
    Enqueue(v1::EnqueueRequest),
    Claim(v1::ClaimRequest),
    Refresh(v1::RefreshRequest),
    Ack(v1::AckRequest),
    Nack(v1::NackRequest),
    Release(v1::ReleaseRequest),
    GetJob(v1::GetJobRequest),
    ListJobs(v1::ListJobsRequest),
    Stats(v1::StatsRequest),
    Redrive(v1::RedriveRequest),
}

/// A bad request and what the server must answer.
struct Case {
    name: &'static str,
    call: Call,
    code: Code,
    /// The field the message must name.
    field: &'static str,
}

fn case(name: &'static str, call: Call, code: Code, field: &'static str) -> Case {
    Case { name, call, code, field }
}

async fn send(stub: &mut QueueClient<Channel>, call: Call) -> Result<(), tonic::Status> {
    match call {
        Call::Enqueue(r) => stub.enqueue(r).await.map(drop),
        Call::Claim(r) => stub.claim(r).await.map(drop),
        Call::Refresh(r) => stub.refresh(r).await.map(drop),
        Call::Ack(r) => stub.ack(r).await.map(drop),
        Call::Nack(r) => stub.nack(r).await.map(drop),
        Call::Release(r) => stub.release(r).await.map(drop),
        Call::GetJob(r) => stub.get_job(r).await.map(drop),
        Call::ListJobs(r) => stub.list_jobs(r).await.map(drop),
        Call::Stats(r) => stub.stats(r).await.map(drop),
        Call::Redrive(r) => stub.redrive(r).await.map(drop),
    }
}

fn enqueue(jobs: Vec<v1::JobSpec>) -> Call {
    Call::Enqueue(v1::EnqueueRequest { jobs })
}

fn one(spec: v1::JobSpec) -> Call {
    enqueue(vec![spec])
}

fn claim(edit: impl FnOnce(&mut v1::ClaimRequest)) -> Call {
    let mut request = v1::ClaimRequest {
        worker: "probe".to_string(),
        queue: QUEUE.to_string(),
        max: 1,
        lease_ttl_ms: None,
        selector: Vec::new(),
        wait_ms: 0,
    };
    edit(&mut request);
    Call::Claim(request)
}

fn refresh(edit: impl FnOnce(&mut v1::RefreshRequest), lease: v1::LeaseRef) -> Call {
    let mut request =
        v1::RefreshRequest { worker: "probe".to_string(), leases: vec![lease], lease_ttl_ms: None };
    edit(&mut request);
    Call::Refresh(request)
}

fn list(edit: impl FnOnce(&mut v1::ListJobsRequest)) -> Call {
    let mut request = v1::ListJobsRequest::default();
    edit(&mut request);
    Call::ListJobs(request)
}

fn cases(held: v1::LeaseRef) -> Vec<Case> {
    use Code::{InvalidArgument as Invalid, ResourceExhausted as TooLarge};
    let spec = |queue: &str| job(queue, b"x");
    let long_queue = "q".repeat(65);
    vec![
        // Enqueue
        case("enqueue: no jobs", enqueue(vec![]), Invalid, "jobs"),
        case("enqueue: 1,001 jobs", enqueue(vec![spec(QUEUE); 1_001]), TooLarge, "jobs"),
        case("enqueue: empty queue", one(spec("")), Invalid, "jobs[0].queue"),
        case("enqueue: queue with capitals", one(spec("Bad Name")), Invalid, "jobs[0].queue"),
        case("enqueue: 65-char queue", one(spec(&long_queue)), Invalid, "jobs[0].queue"),
        case(
            "enqueue: bad second job refuses the whole batch",
            enqueue(vec![spec(QUEUE), spec("Bad Name")]),
            Invalid,
            "jobs[1].queue",
        ),
        case(
            "enqueue: payload 256 KiB + 1",
            one(job(QUEUE, &vec![b'x'; MAX_PAYLOAD_BYTES + 1])),
            TooLarge,
            "jobs[0].payload",
        ),
        case(
            "enqueue: lease_ttl_ms 10",
            one(v1::JobSpec { lease_ttl_ms: Some(10), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].lease_ttl_ms",
        ),
        case(
            "enqueue: lease_ttl_ms 13 h",
            one(v1::JobSpec { lease_ttl_ms: Some(13 * HOUR_MS), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].lease_ttl_ms",
        ),
        case(
            "enqueue: max_attempts 0",
            one(v1::JobSpec { max_attempts: Some(0), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].max_attempts",
        ),
        case(
            "enqueue: both not_before_ms and delay_ms",
            one(v1::JobSpec { not_before_ms: Some(1), delay_ms: Some(1), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].delay_ms",
        ),
        case(
            "enqueue: empty idempotency key",
            one(v1::JobSpec { idempotency_key: Some(String::new()), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].idempotency_key",
        ),
        case(
            "enqueue: zero backoff base",
            one(v1::JobSpec {
                backoff: Some(v1::Backoff { base_ms: 0, cap_ms: 10 }),
                ..spec(QUEUE)
            }),
            Invalid,
            "jobs[0].backoff.base_ms",
        ),
        // Claim
        case("claim: max 0", claim(|r| r.max = 0), Invalid, "max"),
        case("claim: max 1,001", claim(|r| r.max = 1_001), TooLarge, "max"),
        case("claim: wait_ms 31,000", claim(|r| r.wait_ms = 31_000), Invalid, "wait_ms"),
        case("claim: empty worker", claim(|r| r.worker.clear()), Invalid, "worker"),
        case("claim: empty queue", claim(|r| r.queue.clear()), Invalid, "queue"),
        case(
            "claim: queue with capitals",
            claim(|r| r.queue = "Bad Name".into()),
            Invalid,
            "queue",
        ),
        case("claim: 65-char queue", claim(|r| r.queue = long_queue.clone()), Invalid, "queue"),
        case(
            "claim: lease_ttl_ms 10",
            claim(|r| r.lease_ttl_ms = Some(10)),
            Invalid,
            "lease_ttl_ms",
        ),
        case(
            "claim: lease_ttl_ms 13 h",
            claim(|r| r.lease_ttl_ms = Some(13 * HOUR_MS)),
            Invalid,
            "lease_ttl_ms",
        ),
        case(
            "claim: empty selector tag",
            claim(|r| r.selector = vec![String::new()]),
            Invalid,
            "selector[0]",
        ),
        // Refresh
        case("refresh: no leases", refresh(|r| r.leases.clear(), held), Invalid, "leases"),
        case(
            "refresh: a job listed twice",
            refresh(|r| r.leases.push(held), held),
            Invalid,
            "leases[1].job_id",
        ),
        case("refresh: empty worker", refresh(|r| r.worker.clear(), held), Invalid, "worker"),
        case(
            "refresh: lease_ttl_ms 10",
            refresh(|r| r.lease_ttl_ms = Some(10), held),
            Invalid,
            "lease_ttl_ms",
        ),
        case(
            "refresh: lease_ttl_ms 13 h",
            refresh(|r| r.lease_ttl_ms = Some(13 * HOUR_MS), held),
            Invalid,
            "lease_ttl_ms",
        ),
        // Ack, Nack, Release: job ids start at 1, so 0 is malformed input,
        // as GetJob says for the same field.
        case(
            "ack: job_id 0",
            Call::Ack(v1::AckRequest { job_id: 0, token: held.token, ..Default::default() }),
            Invalid,
            "job_id",
        ),
        case(
            "ack: result over 16 KiB",
            Call::Ack(v1::AckRequest {
                job_id: held.job_id,
                token: held.token,
                result: vec![b'x'; 16 * 1024 + 1],
            }),
            TooLarge,
            "result",
        ),
        case(
            "nack: job_id 0",
            Call::Nack(v1::NackRequest {
                job_id: 0,
                token: held.token,
                error: "probe".into(),
                retry_after_ms: None,
            }),
            Invalid,
            "job_id",
        ),
        case(
            "release: job_id 0",
            Call::Release(v1::ReleaseRequest { job_id: 0, token: held.token }),
            Invalid,
            "job_id",
        ),
        // GetJob
        case(
            "get job: id 0",
            Call::GetJob(v1::GetJobRequest { job_id: 0, stale: false }),
            Invalid,
            "job_id",
        ),
        // ListJobs
        case("list: page_size 5,000", list(|r| r.page_size = 5_000), Invalid, "page_size"),
        case(
            "list: garbage page_token",
            list(|r| r.page_token = "not-a-token!".into()),
            Invalid,
            "page_token",
        ),
        case("list: unknown state 99", list(|r| r.state = 99), Invalid, "state"),
        case(
            "list: queue with capitals",
            list(|r| r.queue = Some("Bad Name".into())),
            Invalid,
            "queue",
        ),
        // Stats
        case(
            "stats: queue BAD",
            Call::Stats(v1::StatsRequest { queue: Some("BAD".into()), stale: false }),
            Invalid,
            "queue",
        ),
        // Redrive
        case(
            "redrive: neither queue nor job_ids",
            Call::Redrive(v1::RedriveRequest { queue: None, job_ids: vec![] }),
            Invalid,
            "job_ids",
        ),
        case(
            "redrive: both queue and job_ids",
            Call::Redrive(v1::RedriveRequest { queue: Some(QUEUE.into()), job_ids: vec![1] }),
            Invalid,
            "job_ids",
        ),
        case(
            "redrive: queue with capitals",
            Call::Redrive(v1::RedriveRequest { queue: Some("Bad Name".into()), job_ids: vec![] }),
            Invalid,
            "queue",
        ),
        case(
            "redrive: 1,001 job ids",
            Call::Redrive(v1::RedriveRequest { queue: None, job_ids: (1..=1_001).collect() }),
            TooLarge,
            "job_ids",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_changes_nothing() -> Result<()> {
    let sandbox = Sandbox::new("bad-input")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1 and seed a queue: three ready jobs, one of them claimed");
    let node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;
    let seeded = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, b"seed"); 3] })
        .await
        .context("seed enqueue")?
        .into_inner();
    ensure!(seeded.results.len() == 3, "seed: {seeded:?}");
    let claimed = stub
        .claim(v1::ClaimRequest {
            worker: "holder".into(),
            queue: QUEUE.into(),
            max: 1,
            lease_ttl_ms: Some(12 * HOUR_MS),
            selector: Vec::new(),
            wait_ms: 0,
        })
        .await
        .context("seed claim")?
        .into_inner();
    let held = match claimed.grants.first().and_then(|g| g.lease.as_ref()) {
        Some(lease) => v1::LeaseRef { job_id: lease.job_id, token: lease.token },
        None => bail!("seed claim granted nothing: {claimed:?}"),
    };

    phase("snapshot Stats before the barrage");
    let before = stats_snapshot(&mut stub).await?;
    ensure!(
        before.last_job_id == 3 && before.last_token == held.token && before.queues.len() == 1,
        "unexpected seed state: {before:?}"
    );

    phase("send every bad request");
    let cases = cases(held);
    let total = cases.len();
    let mut mismatches = Vec::new();
    for Case { name, call, code, field } in cases {
        match send(&mut stub, call).await {
            Ok(()) => {
                mismatches.push(format!("{name}: accepted; expected {code:?} naming {field}"))
            }
            Err(status) => {
                let named = status.message().contains(field);
                if status.code() != code || !named {
                    mismatches.push(format!(
                        "{name}: got {:?} {:?}; expected {code:?} naming {field:?}",
                        status.code(),
                        status.message()
                    ));
                } else {
                    eprintln!("ok   {name}: {:?} {:?}", status.code(), status.message());
                }
            }
        }
    }
    for mismatch in &mismatches {
        eprintln!("FAIL {mismatch}");
    }

    phase("compare Stats after the barrage");
    let after = stats_snapshot(&mut stub).await?;
    ensure!(after == before, "bad input changed state:\nbefore {before:?}\nafter  {after:?}");
    let held_job = stub
        .get_job(v1::GetJobRequest { job_id: held.job_id, stale: false })
        .await
        .context("get the held job")?
        .into_inner()
        .job
        .context("reply without a job")?;
    ensure!(
        held_job.lease.as_ref().map(|l| (l.job_id, l.token)) == Some((held.job_id, held.token)),
        "the held lease changed: {:?}",
        held_job.lease
    );

    phase("the limits' edges are accepted");
    let edges = stub
        .enqueue(v1::EnqueueRequest {
            jobs: vec![
                job("edges", &vec![b'x'; MAX_PAYLOAD_BYTES]),
                v1::JobSpec { lease_ttl_ms: Some(1_000), ..job("edges", b"short") },
                v1::JobSpec { lease_ttl_ms: Some(12 * HOUR_MS), ..job("edges", b"long") },
                v1::JobSpec { queue: "q".repeat(64), ..job("edges", b"64-char queue") },
            ],
        })
        .await
        .context("enqueue at the limits")?
        .into_inner();
    ensure!(edges.results.len() == 4, "edges: {edges:?}");
    let full_batch = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![job("edges", b"batch"); 1_000] })
        .await
        .context("enqueue 1,000 jobs")?
        .into_inner();
    ensure!(full_batch.results.len() == 1_000, "{} results", full_batch.results.len());

    phase("judge the barrage");
    ensure!(
        mismatches.is_empty(),
        "{} of {total} bad requests were not refused as specified:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    Ok(())
}
