//! The queue workload: producers and workers, all recording into the history.
//!
//! Producers enqueue jobs whose payload is a value unique to the run, with
//! that value as the idempotency key, and a few poison jobs. Workers claim,
//! write to the [`FencedSink`] with their token, and then — at random —
//! ack, refresh then ack, nack, release, or abandon the lease to a *zombie*:
//! a task that sleeps past the TTL and then writes, refreshes and acks with
//! its stale token, exactly what a paused or partitioned worker does. Poison
//! jobs are always nacked and must end dead.
//!
//! Workers and producers are tasks of the harness process rather than
//! separate processes: each has its own client (its own connections, through
//! the proxies, from 127.0.0.1), and the history only needs each to be
//! sequential. In a TLS run producers (and the probe) call with a
//! `producer` token and workers and zombies with a `worker` token, so the
//! roles are exercised under every fault too. A worker crash is modelled by the zombie (a holder that stops
//! talking), which exercises the same server paths without losing the
//! record of what the dead worker did.
//!
//! Every call is bounded by [`CALL_LIMIT`]; an answer that does not come in
//! time, or an error that does not prove the call failed, is `info`.

use std::sync::Arc;
use std::time::Duration;

use leasehold_client::{Client, ClientError, RetryPolicy};
use leasehold_proto::v1;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::history::{History, LeaseRecord, OpFunction, OpType, OpValue};
use crate::plan::WorkloadPlan;
use crate::security::{Role, Security};
use crate::sink::FencedSink;

/// Longest any single client call may take before it counts as `info`.
pub const CALL_LIMIT: Duration = Duration::from_secs(12);
/// Prefix of a poison job's value.
pub const POISON_PREFIX: &str = "poison-";

/// Where the workload is in the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Faults are being injected: producers produce, workers misbehave.
    Chaos,
    /// Faults are over: producers settle unknown enqueues, workers behave.
    Drain,
    /// Stop after the current operation.
    Stop,
}

/// What the workload tasks share.
#[derive(Clone)]
pub struct Context {
    /// The history.
    pub history: History,
    /// The fenced sink.
    pub sink: FencedSink,
    /// Client addresses (the proxies).
    pub addrs: Vec<String>,
    /// The run's credentials.
    pub security: Security,
    /// The workload's shape.
    pub plan: Arc<WorkloadPlan>,
    /// The queue.
    pub queue: String,
    /// The run's seed (values and task RNGs derive from it).
    pub seed: u64,
    /// The phase.
    pub phase: watch::Receiver<Phase>,
}

/// A client over every address, started at a given one; rebuilt at the
/// next address when a call gets no answer (the client library moves on by
/// itself only on UNAVAILABLE, not on a deadline). Clients started at an
/// even offset follow the leader hint to the leader; the others stay
/// where they are, so faults find calls both direct and forwarded.
struct Rotating {
    addrs: Vec<String>,
    offset: usize,
    follow_hints: bool,
    security: Security,
    role: Role,
    client: Client,
}

impl Rotating {
    fn new(
        addrs: &[String],
        offset: usize,
        security: &Security,
        role: Role,
    ) -> anyhow::Result<Rotating> {
        let follow_hints = offset.is_multiple_of(2);
        let client = Self::build(addrs, offset, follow_hints, security, role)?;
        Ok(Rotating {
            addrs: addrs.to_vec(),
            offset,
            follow_hints,
            security: security.clone(),
            role,
            client,
        })
    }

    fn build(
        addrs: &[String],
        offset: usize,
        follow_hints: bool,
        security: &Security,
        role: Role,
    ) -> anyhow::Result<Client> {
        if addrs.is_empty() {
            anyhow::bail!("no client address");
        }
        let ordered: Vec<&str> = (0..addrs.len())
            .filter_map(|i| addrs.get((offset + i) % addrs.len()).map(String::as_str))
            .collect();
        let retry = RetryPolicy {
            attempts: 4,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        let client = security
            .client(&ordered.join(","), role)
            .map_err(|e| anyhow::anyhow!("{} client: {e}", role.name()))?;
        Ok(client.with_retry(retry).follow_leader_hints(follow_hints))
    }

    fn rotate(&mut self) {
        self.offset = (self.offset + 1) % self.addrs.len().max(1);
        match Self::build(&self.addrs, self.offset, self.follow_hints, &self.security, self.role) {
            Ok(client) => self.client = client,
            Err(error) => tracing::warn!(%error, "could not rebuild a workload client"),
        }
    }
}

/// How a call ended, for the history.
enum Ended<T> {
    Ok(T),
    Fail { code: String, message: String },
    Info { code: String, message: String },
}

/// Codes that prove the call had no effect.
fn definite(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
            | tonic::Code::NotFound
            | tonic::Code::ResourceExhausted
            | tonic::Code::AlreadyExists
            | tonic::Code::OutOfRange
            | tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::Unimplemented
    )
}

async fn bounded<T>(call: impl std::future::Future<Output = Result<T, ClientError>>) -> Ended<T> {
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(Ok(value)) => Ended::Ok(value),
        Ok(Err(error)) => {
            let code = error.code();
            let (name, message) = (format!("{code:?}"), error.to_string());
            if definite(code) {
                Ended::Fail { code: name, message }
            } else {
                Ended::Info { code: name, message }
            }
        }
        Err(_) => Ended::Info {
            code: "Timeout".to_string(),
            message: format!("no answer within {} ms", CALL_LIMIT.as_millis()),
        },
    }
}

/// Records the completion; answers the value when ok. An unanswered call
/// moves the client to the next node.
fn complete<T>(
    ctx: &Context,
    process: &str,
    f: OpFunction,
    base: &OpValue,
    ended: Ended<T>,
    client: &mut Rotating,
    fill: impl FnOnce(&T, &mut OpValue),
) -> Result<T, (OpType, String)> {
    match ended {
        Ended::Ok(value) => {
            let mut recorded = base.clone();
            fill(&value, &mut recorded);
            ctx.history.record(process, OpType::Ok, f, recorded);
            Ok(value)
        }
        Ended::Fail { code, message } => {
            let recorded =
                OpValue { code: Some(code.clone()), message: Some(message), ..base.clone() };
            ctx.history.record(process, OpType::Fail, f, recorded);
            Err((OpType::Fail, code))
        }
        Ended::Info { code, message } => {
            let recorded =
                OpValue { code: Some(code.clone()), message: Some(message), ..base.clone() };
            ctx.history.record(process, OpType::Info, f, recorded);
            client.rotate();
            Err((OpType::Info, code))
        }
    }
}

pub(crate) fn lease_record(lease: &v1::Lease, job: Option<&v1::Job>) -> LeaseRecord {
    LeaseRecord {
        job_id: lease.job_id,
        holder: lease.holder.clone(),
        token: lease.token,
        epoch: lease.epoch,
        granted_at_ms: lease.granted_at_ms,
        expires_at_ms: lease.expires_at_ms,
        value: job.map(|j| String::from_utf8_lossy(&j.payload).into_owned()),
        attempts: job.map(|j| j.attempts),
    }
}

fn phase(ctx: &Context) -> Phase {
    *ctx.phase.borrow()
}

/// Sleeps `duration` unless the phase moves to Stop first.
async fn nap(ctx: &Context, duration: Duration) {
    let mut phase = ctx.phase.clone();
    let _ = tokio::time::timeout(duration, phase.wait_for(|p| *p == Phase::Stop)).await;
}

/// Runs producer `index` until it has enqueued its share or the chaos phase
/// ends; then, in the drain phase, enqueues again (same key) every value
/// whose enqueue was unknown, so the final state tells whether it exists.
pub async fn producer(ctx: Context, index: u32) -> anyhow::Result<()> {
    let process = format!("producer-{index}");
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ (0x7072_6f64 + u64::from(index)));
    let mut client = Rotating::new(&ctx.addrs, index as usize, &ctx.security, Role::Producer)?;
    let mut unknown: Vec<(String, bool)> = Vec::new();
    for n in 0..ctx.plan.jobs_per_producer {
        if phase(&ctx) != Phase::Chaos {
            break;
        }
        let poison = rng.gen_range(0..1_000) < ctx.plan.poison_per_mille;
        let prefix = if poison { POISON_PREFIX } else { "job-" };
        let value = format!("{prefix}{}-p{index}-{n}", ctx.seed);
        if enqueue(&ctx, &process, &mut client, &value, poison).await == Some(OpType::Info) {
            unknown.push((value, poison));
        }
        let jitter = rng.gen_range(0..=ctx.plan.enqueue_interval_ms / 2);
        nap(&ctx, Duration::from_millis(ctx.plan.enqueue_interval_ms / 2 + jitter)).await;
    }
    // Wait for the drain phase, then settle the unknowns (bounded tries).
    let mut phase_rx = ctx.phase.clone();
    let _ = phase_rx.wait_for(|p| *p != Phase::Chaos).await;
    for (value, poison) in unknown {
        for _ in 0..5 {
            if phase(&ctx) == Phase::Stop {
                return Ok(());
            }
            match enqueue(&ctx, &process, &mut client, &value, poison).await {
                Some(OpType::Info) => nap(&ctx, Duration::from_secs(1)).await,
                _ => break,
            }
        }
    }
    Ok(())
}

/// One enqueue; answers its outcome (None when ok).
async fn enqueue(
    ctx: &Context,
    process: &str,
    client: &mut Rotating,
    value: &str,
    poison: bool,
) -> Option<OpType> {
    let plan = &ctx.plan;
    let spec = v1::JobSpec {
        queue: ctx.queue.clone(),
        payload: value.as_bytes().to_vec(),
        max_attempts: Some(if poison { plan.poison_max_attempts } else { plan.max_attempts }),
        backoff: Some(v1::Backoff { base_ms: 100, cap_ms: 1_000 }),
        lease_ttl_ms: Some(plan.lease_ttl_ms),
        idempotency_key: Some(value.to_string()),
        ..v1::JobSpec::default()
    };
    let base =
        OpValue { value: Some(value.to_string()), poison: Some(poison), ..OpValue::default() };
    ctx.history.invoke(process, OpFunction::Enqueue, base.clone());
    let ended = bounded(client.client.enqueue(vec![spec])).await;
    let result = complete(ctx, process, OpFunction::Enqueue, &base, ended, client, |results, v| {
        if let Some(first) = results.first() {
            v.job_id = Some(first.job_id);
            v.duplicate = Some(first.duplicate);
        }
    });
    result.err().map(|(kind, _)| kind)
}

/// What a worker does with a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Ack,
    RefreshThenAck,
    Nack,
    Release,
    Zombie,
}

/// Runs worker `index` until the phase is Stop. Zombies it spawned are
/// waited for (each is bounded) before it returns.
pub async fn worker(ctx: Context, index: u32) -> anyhow::Result<()> {
    let process = format!("worker-{index}");
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ (0x776f_726b + u64::from(index)));
    let mut client = Rotating::new(&ctx.addrs, index as usize, &ctx.security, Role::Worker)?;
    let mut zombies: JoinSet<()> = JoinSet::new();
    let mut zombie_count = 0u64;
    let plan = ctx.plan.clone();
    while phase(&ctx) != Phase::Stop {
        while zombies.try_join_next().is_some() {}
        let request = v1::ClaimRequest {
            worker: process.clone(),
            queue: ctx.queue.clone(),
            max: rng.gen_range(1..=plan.claim_max.max(1)),
            lease_ttl_ms: Some(plan.lease_ttl_ms),
            selector: Vec::new(),
            wait_ms: 1_000,
            ..Default::default()
        };
        ctx.history.invoke(&process, OpFunction::Claim, OpValue::default());
        let ended = bounded(client.client.claim_with_wait(request)).await;
        let grants = match complete(
            &ctx,
            &process,
            OpFunction::Claim,
            &OpValue::default(),
            ended,
            &mut client,
            |reply: &v1::ClaimResponse, v| {
                v.leases = reply
                    .grants
                    .iter()
                    .filter_map(|g| g.lease.as_ref().map(|l| lease_record(l, g.job.as_ref())))
                    .collect();
                // How long the node held the call before granting: the
                // lease's local deadline counts from send time plus this.
                v.waited_ms = Some(reply.waited_ms);
            },
        ) {
            Ok(reply) => reply.grants,
            Err(_) => {
                nap(&ctx, Duration::from_millis(200)).await;
                continue;
            }
        };
        for grant in grants {
            let (Some(lease), Some(job)) = (grant.lease, grant.job) else { continue };
            let value = String::from_utf8_lossy(&job.payload).into_owned();
            let poison = value.starts_with(POISON_PREFIX);
            let action = choose(&mut rng, &plan, phase(&ctx), poison);
            if action == Action::Zombie && zombies.len() < plan.zombies_per_worker as usize {
                zombie_count += 1;
                let zombie_ctx = ctx.clone();
                let name = format!("{process}/zombie-{zombie_count}");
                let seed = rng.r#gen::<u64>();
                let offset = index as usize + zombie_count as usize;
                zombies.spawn(async move {
                    if let Err(error) = zombie(zombie_ctx, name, lease, offset, seed).await {
                        tracing::warn!(%error, "zombie stopped");
                    }
                });
                continue;
            }
            let action = if action == Action::Zombie { Action::Ack } else { action };
            handle(&ctx, &process, &mut client, &mut rng, &lease, poison, action).await;
        }
    }
    // Zombies end by themselves within a few TTLs; bound the wait anyway.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !zombies.is_empty() {
        if tokio::time::timeout_at(deadline, zombies.join_next()).await.is_err() {
            zombies.abort_all();
            while zombies.join_next().await.is_some() {}
        }
    }
    Ok(())
}

fn choose(rng: &mut StdRng, plan: &WorkloadPlan, phase: Phase, poison: bool) -> Action {
    if poison {
        return Action::Nack;
    }
    if phase != Phase::Chaos {
        return Action::Ack;
    }
    let roll = rng.gen_range(0..1_000);
    let mut bound = plan.zombie_per_mille;
    if roll < bound {
        return Action::Zombie;
    }
    bound += plan.nack_per_mille;
    if roll < bound {
        return Action::Nack;
    }
    bound += plan.release_per_mille;
    if roll < bound {
        return Action::Release;
    }
    bound += plan.refresh_per_mille;
    if roll < bound {
        return Action::RefreshThenAck;
    }
    Action::Ack
}

/// Writes to the sink under the lease's token (poison jobs do no work).
fn sink_write(ctx: &Context, process: &str, lease: &v1::Lease) -> bool {
    let base =
        OpValue { job_id: Some(lease.job_id), token: Some(lease.token), ..OpValue::default() };
    ctx.history.invoke(process, OpFunction::SinkWrite, base.clone());
    let accepted = ctx.sink.write(ctx.history.now_ns(), lease.job_id, lease.token, process);
    if accepted {
        ctx.history.record(process, OpType::Ok, OpFunction::SinkWrite, base);
    } else {
        let refused = OpValue {
            code: Some("Refused".to_string()),
            message: Some("a higher token already wrote".to_string()),
            ..base
        };
        ctx.history.record(process, OpType::Fail, OpFunction::SinkWrite, refused);
    }
    accepted
}

async fn handle(
    ctx: &Context,
    process: &str,
    client: &mut Rotating,
    rng: &mut StdRng,
    lease: &v1::Lease,
    poison: bool,
    action: Action,
) {
    if !poison {
        sink_write(ctx, process, lease);
    }
    match action {
        Action::Ack | Action::Zombie => {
            ack(ctx, process, client, lease).await;
        }
        Action::RefreshThenAck => {
            let times = rng.gen_range(1..=2);
            for _ in 0..times {
                nap(ctx, Duration::from_millis(ctx.plan.lease_ttl_ms / 4)).await;
                if refresh(ctx, process, client, lease).await == Some(false) {
                    break;
                }
            }
            ack(ctx, process, client, lease).await;
        }
        Action::Nack => {
            let retry_after_ms = if poison { 100 } else { rng.gen_range(50..=300) };
            nack(ctx, process, client, lease, retry_after_ms).await;
        }
        Action::Release => {
            release(ctx, process, client, lease).await;
        }
    }
}

fn token_value(lease: &v1::Lease) -> OpValue {
    OpValue { job_id: Some(lease.job_id), token: Some(lease.token), ..OpValue::default() }
}

async fn ack(ctx: &Context, process: &str, client: &mut Rotating, lease: &v1::Lease) {
    let base = token_value(lease);
    ctx.history.invoke(process, OpFunction::Ack, base.clone());
    let ended = bounded(client.client.ack(lease.job_id, lease.token)).await;
    let _ = complete(ctx, process, OpFunction::Ack, &base, ended, client, |_, _| {});
}

async fn nack(
    ctx: &Context,
    process: &str,
    client: &mut Rotating,
    lease: &v1::Lease,
    retry_after_ms: u64,
) {
    let base = token_value(lease);
    ctx.history.invoke(process, OpFunction::Nack, base.clone());
    let request = v1::NackRequest {
        job_id: lease.job_id,
        token: lease.token,
        error: "chaos: nacked on purpose".to_string(),
        retry_after_ms: Some(retry_after_ms),
    };
    let ended = bounded(client.client.nack(request)).await;
    let _ = complete(ctx, process, OpFunction::Nack, &base, ended, client, |reply, v| {
        let state = v1::JobState::try_from(reply.state).unwrap_or(v1::JobState::Unspecified);
        v.state = Some(state.as_str_name().to_string());
    });
}

async fn release(ctx: &Context, process: &str, client: &mut Rotating, lease: &v1::Lease) {
    let base = token_value(lease);
    ctx.history.invoke(process, OpFunction::Release, base.clone());
    let ended = bounded(client.client.release(lease.job_id, lease.token)).await;
    let _ = complete(ctx, process, OpFunction::Release, &base, ended, client, |_, _| {});
}

/// Refreshes one lease: Some(true) renewed, Some(false) lost, None unknown.
async fn refresh(
    ctx: &Context,
    process: &str,
    client: &mut Rotating,
    lease: &v1::Lease,
) -> Option<bool> {
    let base = token_value(lease);
    ctx.history.invoke(process, OpFunction::Refresh, base.clone());
    let request = v1::RefreshRequest {
        worker: process.to_string(),
        leases: vec![v1::LeaseRef { job_id: lease.job_id, token: lease.token }],
        lease_ttl_ms: Some(ctx.plan.lease_ttl_ms),
    };
    let ended = bounded(client.client.refresh(request)).await;
    let reply = complete(ctx, process, OpFunction::Refresh, &base, ended, client, |reply, v| {
        v.leases = reply.renewed.iter().map(|l| lease_record(l, None)).collect();
        v.lost = reply.lost.clone();
    })
    .ok()?;
    Some(reply.renewed.iter().any(|l| l.job_id == lease.job_id && l.token == lease.token))
}

/// A worker that stops talking while it holds a lease (paused, partitioned,
/// stuck in GC), then wakes up and carries on with its stale token: it
/// sometimes refreshes, writes to the sink, and acks. Most zombies wait
/// (bounded) until the job's next holder has written, so the sink's fence
/// is really exercised; the others write at once, usually before anyone
/// else holds the job.
async fn zombie(
    ctx: Context,
    process: String,
    lease: v1::Lease,
    offset: usize,
    seed: u64,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = Rotating::new(&ctx.addrs, offset, &ctx.security, Role::Worker)?;
    // Past the TTL and the next sweep.
    let sleep_ms = ctx.plan.lease_ttl_ms + 1_500 + rng.gen_range(0..1_000);
    nap(&ctx, Duration::from_millis(sleep_ms)).await;
    if rng.gen_bool(0.8) {
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline && phase(&ctx) != Phase::Stop {
            if ctx.sink.highest_token(lease.job_id).is_some_and(|t| t > lease.token) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    if rng.gen_bool(0.5) {
        refresh(&ctx, &process, &mut client, &lease).await;
    }
    sink_write(&ctx, &process, &lease);
    ack(&ctx, &process, &mut client, &lease).await;
    Ok(())
}

/// Enqueues a probe job (queue `probe`, never claimed) as `producer` until
/// one write succeeds or `limit` passes; answers how long that took.
pub async fn probe_write(
    history: &History,
    security: &Security,
    addrs: &[String],
    key: &str,
    round: usize,
    limit: Duration,
) -> Option<Duration> {
    probe(history, security, addrs, key, round, None, limit).await
}

/// A probe write while a fault holds (phase `during`): whether the nodes
/// the fault spared still serve.
pub async fn probe_during(
    history: &History,
    security: &Security,
    addrs: &[String],
    key: &str,
    round: usize,
    limit: Duration,
) -> Option<Duration> {
    probe(history, security, addrs, key, round, Some("during"), limit).await
}

async fn probe(
    history: &History,
    security: &Security,
    addrs: &[String],
    key: &str,
    round: usize,
    phase: Option<&str>,
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut client = match Rotating::new(addrs, round, security, Role::Producer) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no probe client");
            return None;
        }
    };
    let process = "probe";
    while started.elapsed() < limit {
        let spec = v1::JobSpec {
            queue: "probe".to_string(),
            payload: key.as_bytes().to_vec(),
            idempotency_key: Some(key.to_string()),
            ..v1::JobSpec::default()
        };
        let base = OpValue {
            value: Some(key.to_string()),
            round: Some(round),
            phase: phase.map(str::to_string),
            ..OpValue::default()
        };
        history.invoke(process, OpFunction::Probe, base.clone());
        let remaining = limit.saturating_sub(started.elapsed()).min(Duration::from_secs(5));
        match tokio::time::timeout(remaining, client.client.enqueue(vec![spec])).await {
            Ok(Ok(_)) => {
                history.record(process, OpType::Ok, OpFunction::Probe, base);
                return Some(started.elapsed());
            }
            Ok(Err(error)) => {
                let failed = OpValue { message: Some(error.to_string()), ..base };
                history.record(process, OpType::Info, OpFunction::Probe, failed);
            }
            Err(_) => {
                let failed = OpValue { message: Some("timed out".to_string()), ..base };
                history.record(process, OpType::Info, OpFunction::Probe, failed);
            }
        }
        client.rotate();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
