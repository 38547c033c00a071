//! The Queue service's bad requests.

use leasehold_proto::v1;
use tonic::Code;

use super::wire::{Call, rpc};
use super::{Case, HOUR_MS, MAX_PAYLOAD_BYTES, QUEUE};
use crate::e2e::support::job;

fn one(spec: v1::JobSpec) -> Call {
    rpc::enqueue(v1::EnqueueRequest { jobs: vec![spec] })
}

fn claim(edit: impl FnOnce(&mut v1::ClaimRequest)) -> Call {
    let mut request = v1::ClaimRequest {
        worker: "probe".to_string(),
        queue: QUEUE.to_string(),
        max: 1,
        lease_ttl_ms: None,
        selector: Vec::new(),
        wait_ms: 0,
        ..Default::default()
    };
    edit(&mut request);
    rpc::claim(request)
}

fn refresh(edit: impl FnOnce(&mut v1::RefreshRequest), lease: v1::LeaseRef) -> Call {
    let mut request =
        v1::RefreshRequest { worker: "probe".to_string(), leases: vec![lease], lease_ttl_ms: None };
    edit(&mut request);
    rpc::refresh(request)
}

fn list(edit: impl FnOnce(&mut v1::ListJobsRequest)) -> Call {
    let mut request = v1::ListJobsRequest::default();
    edit(&mut request);
    rpc::list_jobs(request)
}

/// A job id the node never assigned (it holds three).
const UNKNOWN_JOB: u64 = 999;

/// The Queue cases; `held` is the seeded lease.
pub fn cases(held: v1::LeaseRef) -> Vec<Case> {
    use Code::{
        FailedPrecondition as Stale, InvalidArgument as Invalid, NotFound,
        ResourceExhausted as TooLarge,
    };
    let bad = Case::malformed;
    let big = Case::too_large;
    let spec = |queue: &str| job(queue, b"x");
    let long_queue = "q".repeat(65);
    let long_text = "t".repeat(257);
    let ack = |job_id, token, result| rpc::ack(v1::AckRequest { job_id, token, result });
    let nack = |job_id, token| {
        rpc::nack(v1::NackRequest { job_id, token, error: "probe".into(), retry_after_ms: None })
    };
    let release = |job_id, token| rpc::release(v1::ReleaseRequest { job_id, token });
    let get = |job_id| rpc::get_job(v1::GetJobRequest { job_id, stale: false });
    let stats =
        |queue: &str| rpc::stats(v1::StatsRequest { queue: Some(queue.into()), stale: false });
    let redrive = |queue: Option<&str>, job_ids: Vec<u64>| {
        rpc::redrive(v1::RedriveRequest { queue: queue.map(str::to_string), job_ids })
    };
    let enqueue = |jobs| rpc::enqueue(v1::EnqueueRequest { jobs });
    let mut cases = vec![
        // Enqueue
        bad("enqueue: no jobs", enqueue(vec![]), Invalid, "jobs"),
        big("enqueue: 1,001 jobs", enqueue(vec![spec(QUEUE); 1_001]), TooLarge, "jobs"),
        bad("enqueue: empty queue", one(spec("")), Invalid, "jobs[0].queue"),
        bad("enqueue: queue with capitals", one(spec("Bad Name")), Invalid, "jobs[0].queue"),
        bad("enqueue: 65-char queue", one(spec(&long_queue)), Invalid, "jobs[0].queue"),
        bad(
            "enqueue: bad second job refuses the whole batch",
            enqueue(vec![spec(QUEUE), spec("Bad Name")]),
            Invalid,
            "jobs[1].queue",
        ),
        big(
            "enqueue: payload 256 KiB + 1",
            one(job(QUEUE, &vec![b'x'; MAX_PAYLOAD_BYTES + 1])),
            TooLarge,
            "jobs[0].payload",
        ),
        bad(
            "enqueue: lease_ttl_ms 10",
            one(v1::JobSpec { lease_ttl_ms: Some(10), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].lease_ttl_ms",
        ),
        bad(
            "enqueue: lease_ttl_ms 13 h",
            one(v1::JobSpec { lease_ttl_ms: Some(13 * HOUR_MS), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].lease_ttl_ms",
        ),
        bad(
            "enqueue: max_attempts 0",
            one(v1::JobSpec { max_attempts: Some(0), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].max_attempts",
        ),
        bad(
            "enqueue: both not_before_ms and delay_ms",
            one(v1::JobSpec { not_before_ms: Some(1), delay_ms: Some(1), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].delay_ms",
        ),
        bad(
            "enqueue: empty idempotency key",
            one(v1::JobSpec { idempotency_key: Some(String::new()), ..spec(QUEUE) }),
            Invalid,
            "jobs[0].idempotency_key",
        ),
        bad(
            "enqueue: a key reserved for a schedule's fire",
            one(v1::JobSpec {
                idempotency_key: Some("cron:nightly:1767225600".into()),
                ..spec(QUEUE)
            }),
            Invalid,
            "jobs[0].idempotency_key",
        ),
        big(
            "enqueue: 257-byte idempotency key",
            one(v1::JobSpec { idempotency_key: Some(long_text.clone()), ..spec(QUEUE) }),
            TooLarge,
            "jobs[0].idempotency_key",
        ),
        big(
            "enqueue: 33 tags",
            one(v1::JobSpec { tags: vec!["t".into(); 33], ..spec(QUEUE) }),
            TooLarge,
            "jobs[0].tags",
        ),
        big(
            "enqueue: 257-byte tag",
            one(v1::JobSpec { tags: vec![long_text.clone()], ..spec(QUEUE) }),
            TooLarge,
            "jobs[0].tags[0]",
        ),
        bad(
            "enqueue: zero backoff base",
            one(v1::JobSpec {
                backoff: Some(v1::Backoff { base_ms: 0, cap_ms: 10 }),
                ..spec(QUEUE)
            }),
            Invalid,
            "jobs[0].backoff.base_ms",
        ),
        big(
            "enqueue: 65 jobs of 256 KiB (over the decode limit)",
            enqueue(vec![job(QUEUE, &vec![b'x'; MAX_PAYLOAD_BYTES]); 65]),
            TooLarge,
            "16777216",
        ),
        // Claim
        bad("claim: max 0", claim(|r| r.max = 0), Invalid, "max"),
        big("claim: max 1,001", claim(|r| r.max = 1_001), TooLarge, "max"),
        big("claim: wait_ms 30,001", claim(|r| r.wait_ms = 30_001), Invalid, "wait_ms"),
        bad("claim: empty worker", claim(|r| r.worker.clear()), Invalid, "worker"),
        bad(
            "claim: a worker id reserved for a schedule's triggers, with a request id",
            claim(|r| {
                r.worker = "schedule nightly".into();
                r.request_id = "r-1".into();
            }),
            Invalid,
            "worker",
        ),
        big("claim: 257-byte worker", claim(|r| r.worker = long_text.clone()), TooLarge, "worker"),
        bad("claim: empty queue", claim(|r| r.queue.clear()), Invalid, "queue"),
        bad("claim: queue with capitals", claim(|r| r.queue = "Bad Name".into()), Invalid, "queue"),
        bad("claim: 65-char queue", claim(|r| r.queue = long_queue.clone()), Invalid, "queue"),
        bad(
            "claim: lease_ttl_ms 10",
            claim(|r| r.lease_ttl_ms = Some(10)),
            Invalid,
            "lease_ttl_ms",
        ),
        bad(
            "claim: lease_ttl_ms 13 h",
            claim(|r| r.lease_ttl_ms = Some(13 * HOUR_MS)),
            Invalid,
            "lease_ttl_ms",
        ),
        bad(
            "claim: empty selector tag",
            claim(|r| r.selector = vec![String::new()]),
            Invalid,
            "selector[0]",
        ),
        big(
            "claim: 33 selector tags",
            claim(|r| r.selector = vec!["t".into(); 33]),
            TooLarge,
            "selector",
        ),
        // Refresh
        bad("refresh: no leases", refresh(|r| r.leases.clear(), held), Invalid, "leases"),
        big(
            "refresh: 1,001 leases",
            refresh(
                |r| {
                    r.leases = (1..=1_001).map(|job_id| v1::LeaseRef { job_id, token: 1 }).collect()
                },
                held,
            ),
            TooLarge,
            "leases",
        ),
        bad(
            "refresh: a job listed twice",
            refresh(|r| r.leases.push(held), held),
            Invalid,
            "leases[1].job_id",
        ),
        bad(
            "refresh: job_id 0",
            refresh(|r| r.leases = vec![v1::LeaseRef { job_id: 0, token: 1 }], held),
            Invalid,
            "leases[0].job_id",
        ),
        bad("refresh: empty worker", refresh(|r| r.worker.clear(), held), Invalid, "worker"),
        bad(
            "refresh: lease_ttl_ms 10",
            refresh(|r| r.lease_ttl_ms = Some(10), held),
            Invalid,
            "lease_ttl_ms",
        ),
        bad(
            "refresh: lease_ttl_ms 13 h",
            refresh(|r| r.lease_ttl_ms = Some(13 * HOUR_MS), held),
            Invalid,
            "lease_ttl_ms",
        ),
        // Ack, Nack, Release: job ids start at 1, so 0 is malformed input,
        // as GetJob says for the same field; a job the node never had is
        // NOT_FOUND naming it; a token that is not the current one is stale.
        bad("ack: job_id 0", ack(0, held.token, Vec::new()), Invalid, "job_id"),
        bad("ack: unknown job", ack(UNKNOWN_JOB, 1, Vec::new()), NotFound, "job 999"),
        bad("ack: stale token", ack(held.job_id, held.token + 1, Vec::new()), Stale, "token"),
        big(
            "ack: result over 16 KiB",
            ack(held.job_id, held.token, vec![b'x'; 16 * 1024 + 1]),
            TooLarge,
            "result",
        ),
        bad("nack: job_id 0", nack(0, held.token), Invalid, "job_id"),
        bad("nack: unknown job", nack(UNKNOWN_JOB, 1), NotFound, "job 999"),
        bad("nack: stale token", nack(held.job_id, held.token + 1), Stale, "token"),
        bad("release: job_id 0", release(0, held.token), Invalid, "job_id"),
        bad("release: unknown job", release(UNKNOWN_JOB, 1), NotFound, "job 999"),
        bad("release: stale token", release(held.job_id, held.token + 1), Stale, "token"),
        // GetJob
        bad("get job: id 0", get(0), Invalid, "job_id"),
        bad("get job: unknown id", get(UNKNOWN_JOB), NotFound, "job 999"),
        // ListJobs
        big("list: page_size 1,001", list(|r| r.page_size = 1_001), Invalid, "page_size"),
        big("list: page_size 5,000", list(|r| r.page_size = 5_000), Invalid, "page_size"),
        bad(
            "list: garbage page_token",
            list(|r| r.page_token = "not-a-token!".into()),
            Invalid,
            "page_token",
        ),
        bad("list: unknown state 99", list(|r| r.state = 99), Invalid, "state"),
        bad(
            "list: queue with capitals",
            list(|r| r.queue = Some("Bad Name".into())),
            Invalid,
            "queue",
        ),
        // Stats
        bad("stats: queue BAD", stats("BAD"), Invalid, "queue"),
        bad("stats: empty queue", stats(""), Invalid, "queue"),
        big("stats: 65-char queue", stats(&long_queue), Invalid, "queue"),
        bad(
            "stats: queue that is not UTF-8 (tonic's decoder names the field)",
            Call::raw("/leasehold.v1.Queue/Stats", &[0x0a, 0x01, 0xff]),
            Code::Internal,
            "StatsRequest.queue",
        ),
        // Redrive
        bad("redrive: neither queue nor job_ids", redrive(None, vec![]), Invalid, "job_ids"),
        bad("redrive: both queue and job_ids", redrive(Some(QUEUE), vec![1]), Invalid, "job_ids"),
        bad("redrive: queue with capitals", redrive(Some("Bad Name"), vec![]), Invalid, "queue"),
        bad("redrive: job id 0", redrive(None, vec![1, 0]), Invalid, "job_ids[1]"),
        big("redrive: 1,001 job ids", redrive(None, (1..=1_001).collect()), TooLarge, "job_ids"),
    ];
    // Every RPC: a message over the decode limit, and bytes that are no
    // message at all. Under the limit the padded calls would be served (an
    // enqueue, a claim), so a limit that did not hold shows; those on the
    // held job name an unknown one instead, to keep the seed intact.
    let unknown = v1::LeaseRef { job_id: UNKNOWN_JOB, token: 1 };
    let harmless = [
        one(spec(QUEUE)),
        claim(|_| {}),
        refresh(|_| {}, unknown),
        ack(UNKNOWN_JOB, 1, Vec::new()),
        nack(UNKNOWN_JOB, 1),
        release(UNKNOWN_JOB, 1),
        get(held.job_id),
        list(|_| {}),
        stats(QUEUE),
        redrive(Some(QUEUE), vec![]),
    ];
    for call in harmless {
        cases.push(Case::garbage(call.path));
        cases.push(Case::over_limit(call));
    }
    cases
}
