//! Goal: a worker session (`Queue.Session`, docs/api.md) is the unary
//! calls as frames on one stream, and nothing more: against a real node
//! with mutual TLS and tokens, each frame is held to the role of the call
//! of its name (a producer's session cannot claim, a worker's cannot
//! enqueue) and refused frames change nothing; a worker token can neither
//! settle, renew nor hand back a job of a command queue, by session or
//! unary call, though it knows the lease's token, nor get that lease by
//! replaying the executor's claim on its own queue; a malformed frame is
//! answered INVALID_ARGUMENT naming the field and the session goes on;
//! frames sent at once are all answered, each under its own id; a frame
//! over the Queue service's size limit ends the session with
//! RESOURCE_EXHAUSTED naming the limit; a token removed by a reload stops
//! working on the session it opened; and a node that shuts down ends its
//! open sessions by saying so, rather than by dropping them, and still
//! stops while another client floods a session and never reads its
//! answers.
//!
//! Method: one `leasehold serve` process with `leasehold dev-certs`
//! material, the SDK's `Session` with each role's token, and the raw
//! generated stub for frames the SDK would never send.
//!
//! Mutation checks (each run once against a deliberately broken build): a
//! session that skips the per-frame role check fails the role phase (the
//! producer's claim is served); a session that keeps the caller it was
//! opened with fails the reload phase (the removed token's frame is
//! served); without the command-job check the worker's ack is served, and
//! without it on refresh alone the refresh; a claim replay that ignores
//! the queue it names hands the worker the command's lease; a node whose
//! sessions ignore shutdown fails the last phase (the session ends without
//! the node's word). The flood is a liveness check, not a mutation-checked
//! one: a client that does not read holds its HTTP/2 stream open, so the
//! node's graceful stop waits for it until the node's grace (5 s) runs
//! out, whatever the session's task does.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_client::{Client, ClientTls, Session};
use leasehold_proto::v1;
use leasehold_proto::v1::session_request::Call;
use leasehold_proto::v1::session_response::Result as Answer;
use leasehold_security::tokens::{Role, toml_entry};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::support::{
    Check, Node, RPC_TIMEOUT, Sandbox, deadline_in, dev_certs, http_get, job, phase, tls_config,
    wait_until,
};

/// The queue of the story.
const QUEUE: &str = "sessions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holds_each_frame_to_its_calls_role_and_ends_when_the_node_stops() -> Result<()> {
    let sandbox = Sandbox::new("session")?;
    sandbox.run(Duration::from_secs(120), session_story(&sandbox)).await
}

/// Goal: a session's calls beyond the node's frames in flight wait in the
/// SDK, unsent, so a claim the node reads late still reaches its caller.
///
/// Method: one plain node; 16 long-poll claims of [`FIRST_WAIT`] on an
/// empty queue fill the node's frames in flight, and a 17th claim of
/// [`LAST_WAIT`] follows. A job is enqueued [`JOB_AFTER`] in, after the
/// first 16 gave up and while the 17th runs on the node. The 17th must be
/// answered with it. An SDK that sends the 17th at once has it read by
/// the node only when the others end, and gives up on it (its call
/// timeout, 10 s, plus its wait) before the node grants it the job: the
/// job's lease is then held by nobody (checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_beyond_the_frames_in_flight_waits_unsent() -> Result<()> {
    let sandbox = Sandbox::new("session-in-flight")?;
    sandbox.run(Duration::from_secs(60), in_flight_story(&sandbox)).await
}

/// The long-poll of the 16 claims that fill the node's frames in flight:
/// longer than the SDK's call timeout (10 s).
const FIRST_WAIT: Duration = Duration::from_secs(12);
/// The long-poll of the 17th claim: its call, waited out in the SDK for
/// a place, must still be sent ([`FIRST_WAIT`] within 10 s plus this).
const LAST_WAIT: Duration = Duration::from_secs(4);
/// When the job comes: after an SDK that sent the 17th at once gave up
/// on it (10 s + [`LAST_WAIT`]), and while the node still runs it (until
/// [`FIRST_WAIT`] + [`LAST_WAIT`]).
const JOB_AFTER: Duration = Duration::from_secs(15);

async fn in_flight_story(sandbox: &Sandbox) -> Result<()> {
    const QUEUE: &str = "in-flight";
    phase("start a node; 16 long-poll claims fill a session's frames in flight");
    let node = Node::start(sandbox).await?;
    let client = Client::connect(&node.addr())?;
    let session = client.session().await?;
    let claim = |wait: Duration| v1::ClaimRequest {
        worker: "w".into(),
        queue: QUEUE.into(),
        max: 1,
        lease_ttl_ms: Some(60_000),
        wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        ..Default::default()
    };
    let started = tokio::time::Instant::now();
    let first = futures::future::join_all((0..16).map(|_| session.claim(claim(FIRST_WAIT))));
    let last = session.claim(claim(LAST_WAIT));
    let enqueue = async {
        tokio::time::sleep_until(started + JOB_AFTER).await;
        client.enqueue(vec![job(QUEUE, b"late")]).await
    };
    let (first, last, enqueued) = tokio::join!(first, last, enqueue);
    phase("the first 16 found nothing; the 17th got the job");
    let job_id = enqueued?.first().map(|r| r.job_id).context("no enqueue result")?;
    for answer in first {
        ensure!(answer?.grants.is_empty(), "a claim of an empty queue was granted");
    }
    let last = last.context("the 17th claim")?;
    let granted: Vec<u64> =
        last.grants.iter().filter_map(|g| g.job.as_ref()).map(|j| j.id).collect();
    ensure!(granted == vec![job_id], "the 17th claim got {granted:?}, not job {job_id}");
    Ok(())
}

/// A client of `node` with the client certificate and the token of `role`.
fn client_as(node: &Node, certs: &Path, role: &str) -> Result<Client> {
    let tls = ClientTls::from_files(
        &certs.join("ca.pem"),
        &certs.join("client.pem"),
        &certs.join("client.key"),
    )?;
    let token = std::fs::read_to_string(certs.join(format!("token-{role}")))?;
    Ok(Client::builder(&node.addr()).tls(tls).token(token.trim()).build()?)
}

fn claim_request(worker: &str) -> v1::ClaimRequest {
    v1::ClaimRequest {
        worker: worker.into(),
        queue: QUEUE.into(),
        max: 1,
        lease_ttl_ms: Some(30_000),
        ..Default::default()
    }
}

/// The counts of the story's queue (a linearizable read).
async fn counts(admin: &Client) -> Result<v1::QueueStats> {
    let stats = admin.stats(Some(QUEUE.into()), false).await?;
    Ok(stats.queues.into_iter().find(|q| q.queue == QUEUE).unwrap_or_default())
}

/// The code of a failed session call; an error if it did not fail.
fn refusal<T: std::fmt::Debug>(
    what: &str,
    answer: Result<T, leasehold_client::ClientError>,
) -> Result<leasehold_client::ClientError> {
    match answer {
        Ok(answer) => bail!("{what} was served: {answer:?}"),
        Err(error) => Ok(error),
    }
}

async fn session_story(sandbox: &Sandbox) -> Result<()> {
    phase("one node with mutual TLS and tokens");
    let certs = sandbox.path().join("certs");
    dev_certs(sandbox, &certs, 1).await?;
    let mut node = Node::new(sandbox, 1, None, None)?;
    node.secure = Some(certs.clone());
    node.launch(sandbox)?;
    let admin = client_as(&node, &certs, "admin")?;
    wait_until("the node to serve", deadline_in(Duration::from_secs(60)), || {
        let admin = admin.clone();
        async move {
            Ok(match admin.stats(None, false).await {
                Ok(_) => Check::Done(()),
                Err(error) => Check::NotYet(error.to_string()),
            })
        }
    })
    .await?;
    let mut stub = admin.queue_stub();

    phase("a producer's session enqueues; its claim is refused and the session goes on");
    let producer = client_as(&node, &certs, "producer")?.session().await?;
    let first = producer.enqueue(vec![job(QUEUE, b"first")]).await?;
    let error = refusal("a producer's claim", producer.claim(claim_request("p")).await)?;
    ensure!(
        error.code() == tonic::Code::PermissionDenied && error.to_string().contains("worker"),
        "a producer's claim was refused with {error}"
    );
    let second = producer.enqueue(vec![job(QUEUE, b"second")]).await?;
    ensure!(first.len() == 1 && second.len() == 1, "enqueues answered {first:?} {second:?}");
    let stats = counts(&admin).await?;
    ensure!(
        stats.ready == 2 && stats.claimed == 0,
        "after the refused claim the queue holds {stats:?}"
    );

    phase("a worker's session cannot enqueue; it claims and acks");
    let worker = client_as(&node, &certs, "worker")?.session().await?;
    let error = refusal("a worker's enqueue", worker.enqueue(vec![job(QUEUE, b"x")]).await)?;
    ensure!(
        error.code() == tonic::Code::PermissionDenied && error.to_string().contains("producer"),
        "a worker's enqueue was refused with {error}"
    );
    let stats = counts(&admin).await?;
    ensure!(stats.ready == 2, "the refused enqueue changed the queue: {stats:?}");
    let claimed = worker.claim(claim_request("w")).await?;
    let lease = claimed
        .grants
        .first()
        .and_then(|grant| grant.lease.clone())
        .context("the worker's claim granted nothing")?;
    ensure!(lease.job_id == first[0].job_id, "claimed {lease:?}, not the first job");
    worker.ack(lease.job_id, lease.token).await?;
    let stale =
        refusal("an ack with a stale token", worker.ack(lease.job_id, lease.token + 1).await)?;
    ensure!(
        stale.code() == tonic::Code::FailedPrecondition,
        "an ack under the wrong token was refused with {stale}"
    );

    phase("frames sent at once are all answered, each under its own id");
    let enqueues = (0..20).map(|i| producer.enqueue(vec![job(QUEUE, format!("{i}").as_bytes())]));
    let answers = futures::future::try_join_all(enqueues).await?;
    let mut ids: Vec<u64> = answers.iter().flatten().map(|result| result.job_id).collect();
    ids.sort_unstable();
    ids.dedup();
    ensure!(ids.len() == 20, "20 enqueues at once were answered with {} job ids", ids.len());

    phase("malformed frames are refused naming the field; the session goes on");
    malformed_frames(&mut stub).await?;

    phase("a frame over the size limit ends the session with RESOURCE_EXHAUSTED");
    oversized_frame(&mut stub).await?;

    phase("the SDK refuses a call over the frame limit alone, unsent; its session goes on");
    let session = admin.session().await?;
    let big = v1::JobSpec { payload: vec![0; 17 * 1024 * 1024], ..job("sessions.big", b"") };
    let error = refusal("a 17 MiB enqueue", session.enqueue(vec![big]).await)?;
    ensure!(
        error.code() == tonic::Code::ResourceExhausted
            && error.to_string().contains(&(16 * 1024 * 1024).to_string()),
        "a 17 MiB enqueue was refused with {error}"
    );
    let after = session.enqueue(vec![job("sessions.big", b"after")]).await?;
    ensure!(after.len() == 1, "the session's next call was answered {after:?}");

    phase("a worker token can neither settle nor hand back a command job, nor replay its claim");
    command_jobs(&admin, &client_as(&node, &certs, "worker")?, &worker).await?;

    phase("a worker's calls on a job that does not exist are answered without a proposal");
    let (worker_client, producer_client) =
        (client_as(&node, &certs, "worker")?, client_as(&node, &certs, "producer")?);
    unknown_jobs(&node, &admin, &worker_client, &producer_client, &worker).await?;

    phase("a token removed by a reload stops working on the session it opened");
    let read = |role: &str| -> Result<String> {
        Ok(std::fs::read_to_string(certs.join(format!("token-{role}")))?.trim().to_string())
    };
    let kept = [
        toml_entry("admin", &[Role::Admin], &read("admin")?),
        toml_entry("producer", &[Role::Producer], &read("producer")?),
    ];
    std::fs::write(certs.join("tokens.toml"), kept.join("\n"))?;
    node.signal(Signal::SIGHUP)?;
    let worker_client = client_as(&node, &certs, "worker")?;
    wait_until("the worker token to be refused", deadline_in(Duration::from_secs(30)), || {
        let worker_client = worker_client.clone();
        async move {
            Ok(match worker_client.stats(None, false).await {
                Err(error) if error.code() == tonic::Code::Unauthenticated => Check::Done(()),
                other => Check::NotYet(format!("{other:?}")),
            })
        }
    })
    .await?;
    let error = refusal("a removed token's frame", worker.claim(claim_request("w")).await)?;
    ensure!(
        error.code() == tonic::Code::Unauthenticated,
        "a frame under a removed token was refused with {error}"
    );

    phase("a node that shuts down ends its sessions with its reason, and stops with one unread");
    // A session flooded with frames whose answers are never read: the
    // node's answers fill the stream's window, and the node stops reading.
    // A small stream window (64 KiB) makes the node's answers fill it
    // after a thousand or so.
    let endpoint = tonic::transport::Endpoint::from_shared(node.addr())?
        .tls_config(tls_config(&certs, "client")?)?
        .initial_stream_window_size(Some(65_535));
    let bearer: tonic::metadata::AsciiMetadataValue =
        format!("Bearer {}", read("admin")?).parse()?;
    let mut small_window = v1::queue_client::QueueClient::with_interceptor(
        endpoint.connect().await?,
        move |mut request: tonic::Request<()>| {
            request.metadata_mut().insert("authorization", bearer.clone());
            Ok(request)
        },
    );
    let (flood, outgoing) = mpsc::channel(8);
    let unread = small_window.session(ReceiverStream::new(outgoing)).await?.into_inner();
    let flooding = tokio::spawn(async move {
        for id in 0..5_000 {
            let frame = v1::SessionRequest {
                id,
                call: Some(Call::Ack(v1::AckRequest { job_id: 0, token: 0, result: Vec::new() })),
            };
            if flood.send(frame).await.is_err() {
                break;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.stop(deadline_in(Duration::from_secs(30))).await?;
    flooding.abort();
    drop(unread);
    let error = refusal("a call after the node stopped", worker.ack(1, 1).await)?;
    ensure!(
        error.code() == tonic::Code::Unavailable && error.to_string().contains("shutting down"),
        "the session of a stopped node ended with {error}"
    );
    Ok(())
}

/// A command job claimed by an admin standing in for an executor: the
/// worker's session and its unary calls, given the lease's token (a
/// reader can see it), are refused ack, nack, release and refresh, and a
/// claim naming the executor's worker and request id on the worker's own
/// queue gets none of the command's lease. Nothing they try changes the
/// job.
async fn command_jobs(admin: &Client, worker_client: &Client, worker: &Session) -> Result<()> {
    const COMMANDS: &str = "exec.story";
    admin.enqueue(vec![job(COMMANDS, b"true")]).await?;
    let executor = admin.session().await?;
    let request = v1::ClaimRequest {
        worker: "executor-1".into(),
        queue: COMMANDS.into(),
        max: 1,
        lease_ttl_ms: Some(60_000),
        request_id: "executor-claim-1".into(),
        ..Default::default()
    };
    let claimed = executor.claim(request).await?;
    let lease = claimed
        .grants
        .first()
        .and_then(|grant| grant.lease.clone())
        .context("the admin's claim on the command queue granted nothing")?;
    let read = admin.get_job(lease.job_id, false).await?;
    ensure!(
        read.lease.as_ref().map(|l| l.token) == Some(lease.token),
        "a read shows the lease: {read:?}"
    );
    let (job_id, token) = (lease.job_id, lease.token);
    let nack =
        || v1::NackRequest { job_id, token, error: "no".into(), retry_after_ms: Some(u64::MAX) };
    let refresh = || v1::RefreshRequest {
        worker: "executor-1".into(),
        leases: vec![v1::LeaseRef { job_id, token }],
        lease_ttl_ms: Some(600_000),
    };
    let denied = |what: &str, error: leasehold_client::ClientError| -> Result<()> {
        let text = error.to_string();
        ensure!(
            error.code() == tonic::Code::PermissionDenied
                && text.contains("admin")
                && text.contains(&format!("command job {job_id}")),
            "{what} was refused with {error}"
        );
        Ok(())
    };
    denied("a session's ack", refusal("a session's ack", worker.ack(job_id, token).await)?)?;
    denied("a session's nack", refusal("a session's nack", worker.nack(nack()).await)?)?;
    denied(
        "a session's release",
        refusal("a session's release", worker.release(job_id, token).await)?,
    )?;
    denied(
        "a session's refresh",
        refusal("a session's refresh", worker.refresh(refresh()).await)?,
    )?;
    denied("an ack", refusal("an ack", worker_client.ack(job_id, token).await)?)?;
    denied("a nack", refusal("a nack", worker_client.nack(nack()).await)?)?;
    denied("a release", refusal("a release", worker_client.release(job_id, token).await)?)?;
    denied("a refresh", refusal("a refresh", worker_client.refresh(refresh()).await)?)?;
    let replay = v1::ClaimRequest {
        worker: "executor-1".into(),
        queue: QUEUE.into(),
        max: 1,
        lease_ttl_ms: Some(30_000),
        request_id: "executor-claim-1".into(),
        ..Default::default()
    };
    let replayed = worker.claim(replay).await?;
    ensure!(
        replayed.grants.iter().all(|grant| grant.job.as_ref().is_none_or(|j| j.queue == QUEUE)),
        "a replayed claim handed a worker the command's lease: {replayed:?}"
    );
    let after = admin.get_job(job_id, false).await?;
    ensure!(
        after.state == v1::JobState::Claimed as i32
            && after.lease.as_ref().map(|l| (l.token, l.expires_at_ms))
                == read.lease.as_ref().map(|l| (l.token, l.expires_at_ms))
            && after.attempts == read.attempts,
        "the refused calls changed the command job: {read:?} -> {after:?}"
    );
    executor.ack(job_id, token).await.context("the executor's own ack")?;
    Ok(())
}

/// How many proposals the node's journal has taken (each is timed in the
/// `queue` stage of a commit round once).
async fn proposals(node: &Node) -> Result<u64> {
    let metrics = http_get(node.http, "/metrics").await?;
    let series = "leasehold_commit_stage_seconds_count{stage=\"queue\"} ";
    let Some(line) = metrics.body.lines().find(|line| line.starts_with(series)) else {
        return Ok(0);
    };
    line[series.len()..].trim().parse().with_context(|| format!("metric line {line:?}"))
}

/// Ack, release and refresh from a worker, and redrive from a producer, on
/// a job id past the last one: NOT_FOUND, the refresh's lease lost and
/// nothing redriven, as apply would answer, but not proposed. Ids and tokens are counters anyone may read, so a call
/// proposed for a job unknown at its check could meet, at apply, a command
/// job enqueued and claimed in between.
async fn unknown_jobs(
    node: &Node,
    admin: &Client,
    worker_client: &Client,
    producer_client: &Client,
    worker: &Session,
) -> Result<()> {
    const CALLS: u64 = 10;
    let missing = admin.stats(None, false).await?.last_job_id + 1_000;
    let before = proposals(node).await?;
    for _ in 0..CALLS {
        let ack = refusal("an ack of a missing job", worker_client.ack(missing, 1).await)?;
        ensure!(ack.code() == tonic::Code::NotFound, "an ack of a missing job: {ack}");
        let release = refusal("a release of a missing job", worker.release(missing, 1).await)?;
        ensure!(release.code() == tonic::Code::NotFound, "a release of a missing job: {release}");
        let redrive = v1::RedriveRequest { queue: None, job_ids: vec![missing] };
        let redriven = producer_client.redrive(redrive).await?;
        ensure!(redriven == 0, "a redrive of a missing job redrove {redriven}");
    }
    let refresh = v1::RefreshRequest {
        worker: "w".into(),
        leases: vec![v1::LeaseRef { job_id: missing, token: 1 }],
        lease_ttl_ms: Some(30_000),
    };
    let refreshed = worker.refresh(refresh).await?;
    ensure!(
        refreshed.lost == vec![missing] && refreshed.renewed.is_empty(),
        "a refresh of a missing job answered {refreshed:?}"
    );
    let after = proposals(node).await?;
    // The node's own proposals (its heartbeat) may fall in the window; the
    // calls, had they been proposed, would add 3 × CALLS + 1.
    ensure!(
        after.saturating_sub(before) < CALLS,
        "{} proposals during {} calls on a missing job",
        after.saturating_sub(before),
        3 * CALLS + 1
    );
    Ok(())
}

type Stub = v1::queue_client::QueueClient<leasehold_client::AuthChannel>;

/// Opens a raw session; the sender of its frames and its answers.
async fn raw_session(
    stub: &mut Stub,
) -> Result<(mpsc::Sender<v1::SessionRequest>, tonic::Streaming<v1::SessionResponse>)> {
    let (frames, outgoing) = mpsc::channel(8);
    let answers = stub.session(ReceiverStream::new(outgoing)).await?.into_inner();
    Ok((frames, answers))
}

/// Sends `frame` and reads the next answer.
async fn exchange(
    frames: &mpsc::Sender<v1::SessionRequest>,
    answers: &mut tonic::Streaming<v1::SessionResponse>,
    frame: v1::SessionRequest,
) -> Result<Result<v1::SessionResponse, tonic::Status>> {
    frames.send(frame).await.context("the session closed")?;
    let answer = tokio::time::timeout(RPC_TIMEOUT, answers.message())
        .await
        .context("no answer on the session")?;
    Ok(answer.and_then(|answer| {
        answer.ok_or_else(|| tonic::Status::unknown("the session ended without an answer"))
    }))
}

async fn malformed_frames(stub: &mut Stub) -> Result<()> {
    let (frames, mut answers) = raw_session(stub).await?;
    let empty = exchange(&frames, &mut answers, v1::SessionRequest { id: 7, call: None }).await??;
    match &empty.result {
        Some(Answer::Error(error))
            if error.code == tonic::Code::InvalidArgument as i32
                && error.message.starts_with("call:") => {}
        other => bail!("a frame without a call was answered {other:?}"),
    }
    ensure!(empty.id == 7, "the answer of frame 7 came as {}", empty.id);
    let zero = v1::ClaimRequest { max: 0, ..claim_request("w") };
    let frame = v1::SessionRequest { id: 8, call: Some(Call::Claim(zero)) };
    let answer = exchange(&frames, &mut answers, frame).await??;
    match &answer.result {
        Some(Answer::Error(error))
            if error.code == tonic::Code::InvalidArgument as i32
                && error.message.contains("max") => {}
        other => bail!("a claim of max 0 was answered {other:?}"),
    }
    let release = v1::SessionRequest {
        id: 9,
        call: Some(Call::Release(v1::ReleaseRequest { job_id: 999_999, token: 1 })),
    };
    let answer = exchange(&frames, &mut answers, release).await??;
    match &answer.result {
        Some(Answer::Error(error)) if error.code == tonic::Code::NotFound as i32 => {}
        other => bail!("a release of an unknown job was answered {other:?}"),
    }
    ensure!(answer.id == 9, "the session did not go on after its refusals");
    Ok(())
}

async fn oversized_frame(stub: &mut Stub) -> Result<()> {
    let (frames, mut answers) = raw_session(stub).await?;
    let spec = v1::JobSpec { payload: vec![0; 17 * 1024 * 1024], ..job(QUEUE, b"") };
    let frame = v1::SessionRequest {
        id: 1,
        call: Some(Call::Enqueue(v1::EnqueueRequest { jobs: vec![spec] })),
    };
    match exchange(&frames, &mut answers, frame).await? {
        Err(status)
            if status.code() == tonic::Code::ResourceExhausted
                && status.message().contains(&(16 * 1024 * 1024).to_string()) => {}
        other => bail!("a 17 MiB frame was answered {other:?}"),
    }
    Ok(())
}
