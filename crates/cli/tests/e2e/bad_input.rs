//! Goal: every RPC of every service a node serves — Queue, Schedules,
//! Cluster, the internal Peer and Raft services, and Faults on a node
//! started with fault injection — refuses malformed and oversized input
//! with the documented code (INVALID_ARGUMENT, NOT_FOUND for an unknown
//! id, RESOURCE_EXHAUSTED for a size limit), a message that names the
//! offending field or limit, and no change at all to what the node holds
//! (SPEC §6, docs/security.md "Limits").
//!
//! Method: seed a node with a few jobs (one claimed, so real tokens exist)
//! and a paused schedule, then fire a table of bad requests (`bad_input/`,
//! one file per service) through a codec that sends each message's bytes
//! as given: a typed request, a typed request padded past its service's
//! decode limit with an unknown field, or bytes that are no message at
//! all. Internal calls carry the node proof of a node that is not a
//! member, so the body is what is judged, and each is sent a second time
//! without it, which must be UNAUTHENTICATED. After every case a snapshot
//! of the node (Stats counts, last token and last job id, the held lease,
//! the schedules, membership, gate flags, peer adverts, readiness) is
//! compared with the one before it. Then the limits' edges (a message of
//! exactly each decode limit, a 256 KiB payload, 1,000 jobs, TTL 1 s and
//! 12 h, a 64-char queue) must be accepted, so the refusals are not off by
//! one; and the health and reflection services, open to anyone and any
//! reader, decode 64 KiB and no more (checked against a node without their
//! limits: both answered a message one byte over). Mismatches are collected and judged last, so one run shows all of
//! them. The table also checks its own coverage: every RPC has at least
//! one malformed and one oversized case.
//!
//! Mutation checks (each run once against a deliberately broken build):
//! the advert registry without its bound on `version` fails the table
//! (the 257-byte version is answered OK and shows in the node's adverts);
//! the services as they were before this table was written fail it with
//! 20 mismatches (id 0 answered NOT_FOUND, Raft decode errors without the
//! field, invalid forwarded writes proposed, unbounded advert texts and
//! bus keys taken), and a Join with the address "not an address" put the
//! node into a joint configuration without a quorum.
//!
//! Undecodable bytes are answered by tonic's protobuf decoder, before any
//! service runs, with INTERNAL ("failed to decode Protobuf message"), as
//! gRPC's status-code guide prescribes for parse errors; the table pins
//! that answer so a change of it is noticed (docs/security.md says so).

mod cluster;
mod faults;
mod peer;
mod queue;
mod raft;
mod schedules;
mod wire;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::queue_client::QueueClient;
use leasehold_proto::v1::schedules_client::SchedulesClient;
use leasehold_security::secret::NODE_PROOF_HEADER;
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

use super::support::{
    CLUSTER_SECRET, Check, NODE_ID, Node, RPC_TIMEOUT, Sandbox, StatsSnapshot, deadline_in,
    http_get, job, phase, stats_snapshot, wait_until,
};
use wire::rpc::{self, EVERY_RPC};
use wire::{Call, GARBAGE, RawCodec};

/// The queue the node is seeded with.
const QUEUE: &str = "seed";
/// The schedule the node is seeded with (paused, yearly: it never fires
/// during the test).
const SCHEDULE: &str = "seeded";
/// The node the internal calls claim to come from: not a member, so
/// nothing it may legitimately send changes the cluster.
const PROBE_NODE: u64 = 2;
const MAX_PAYLOAD_BYTES: usize = 256 * 1024;
const HOUR_MS: u64 = 60 * 60 * 1_000;
/// The decode limits of docs/security.md, by service.
const QUEUE_LIMIT_BYTES: usize = 16 * 1024 * 1024;
const SCHEDULES_LIMIT_BYTES: usize = 1024 * 1024;
const SMALL_LIMIT_BYTES: usize = 64 * 1024;
const RAFT_LIMIT_BYTES: usize = 64 * 1024 * 1024;

/// The decode limit of the service at `path`.
fn limit_of(path: &str) -> usize {
    match path.trim_start_matches('/').split('/').next().unwrap_or_default() {
        "leasehold.v1.Queue" => QUEUE_LIMIT_BYTES,
        "leasehold.v1.Schedules" => SCHEDULES_LIMIT_BYTES,
        "leasehold.v1.Raft" => RAFT_LIMIT_BYTES,
        _ => SMALL_LIMIT_BYTES,
    }
}

/// Whether only nodes may call the RPC at `path`.
fn node_only(path: &str) -> bool {
    path.starts_with("/leasehold.v1.Raft/")
        || path.starts_with("/leasehold.v1.Peer/")
        || path == "/leasehold.v1.Cluster/Join"
}

/// What a case tests, for the coverage check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A missing, empty, invalid or unknown field, or bytes that decode to
    /// no message.
    Malformed,
    /// A message over the decode limit, an over-long field, too many items.
    Oversized,
    /// A node-only call without the node proof.
    NoProof,
}

/// A bad request and what the node must answer.
struct Case {
    name: String,
    call: Call,
    kind: Kind,
    /// The node whose proof the call carries (`None`: a client).
    as_node: Option<u64>,
    code: Code,
    /// What the message must contain: the field or the limit.
    names: String,
}

impl Case {
    /// A malformed request; node-only RPCs are sent as [`PROBE_NODE`].
    fn malformed(name: &str, call: Call, code: Code, names: &str) -> Case {
        let as_node = node_only(call.path).then_some(PROBE_NODE);
        Case {
            name: name.to_string(),
            call,
            kind: Kind::Malformed,
            as_node,
            code,
            names: names.into(),
        }
    }

    /// An oversized request (a field over its limit, too many items)
    /// that the service itself refuses.
    fn too_large(name: &str, call: Call, code: Code, names: &str) -> Case {
        Case { kind: Kind::Oversized, ..Case::malformed(name, call, code, names) }
    }

    /// `call` padded one byte past its service's decode limit: refused
    /// before decoding, RESOURCE_EXHAUSTED naming the limit.
    fn over_limit(call: Call) -> Case {
        let limit = limit_of(call.path);
        let name = format!("{}: message of {limit} + 1 bytes", call.path);
        let call = call.padded_to(limit + 1);
        Case::too_large(&name, call, Code::ResourceExhausted, &limit.to_string())
    }

    /// Bytes that are no message of the RPC at `path`.
    fn garbage(path: &'static str) -> Case {
        Case::malformed(
            &format!("{path}: undecodable bytes"),
            Call::raw(path, GARBAGE),
            Code::Internal,
            "failed to decode Protobuf message",
        )
    }

    /// The same call with node `id`'s proof.
    fn sent_by(self, id: u64) -> Case {
        Case { as_node: Some(id), ..self }
    }

    /// The same call without a node proof: a node-only RPC never reaches
    /// its service.
    fn without_proof(&self) -> Case {
        Case {
            name: format!("{} (without the node proof)", self.name),
            call: self.call.clone(),
            kind: Kind::NoProof,
            as_node: None,
            code: Code::Unauthenticated,
            names: NODE_PROOF_HEADER.to_string(),
        }
    }
}

/// Every case of `cases` whose RPC is node-only, also sent without the
/// node proof.
fn with_proofless_twins(cases: Vec<Case>) -> Vec<Case> {
    let mut all = Vec::with_capacity(cases.len() * 2);
    for case in cases {
        let twin =
            (case.as_node.is_some() && node_only(case.call.path)).then(|| case.without_proof());
        all.push(case);
        all.extend(twin);
    }
    all
}

/// Sends `call` as node `as_node` (by its proof), or as a client.
async fn send(channel: &Channel, call: &Call, as_node: Option<u64>) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("channel: {e}")))?;
    let mut request = tonic::Request::new(call.bytes.clone());
    if let Some(id) = as_node {
        request.metadata_mut().insert(NODE_PROOF_HEADER, node_proof(id)?);
    }
    grpc.unary(request, PathAndQuery::from_static(call.path), RawCodec).await.map(drop)
}

/// The `leasehold-node-proof` header of node `id` under the test cluster's
/// secret.
fn node_proof(id: u64) -> Result<AsciiMetadataValue, tonic::Status> {
    let secret = leasehold_security::ClusterSecret::from_text(CLUSTER_SECRET)
        .map_err(|e| tonic::Status::internal(format!("cluster secret: {e}")))?;
    secret
        .node_proof(id)
        .parse()
        .map_err(|e| tonic::Status::internal(format!("node proof header: {e}")))
}

/// Sends every case, compares `look` before and after each, and answers
/// what did not go as specified (empty when everything did). A case that
/// changed the state is reported and the new state becomes the baseline,
/// so one bad case does not blame every case after it.
async fn run_table<W, F, Fut>(
    channel: &Channel,
    cases: Vec<Case>,
    mut look: F,
) -> Result<Vec<String>>
where
    W: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<W>>,
{
    let mut mismatches = Vec::new();
    let mut before = look().await.context("snapshot before the table")?;
    for case in cases {
        let Case { name, call, code, names, as_node, .. } = case;
        let size = call.bytes.len();
        match send(channel, &call, as_node).await {
            Ok(()) => {
                mismatches.push(format!("{name}: accepted; expected {code:?} naming {names:?}"))
            }
            Err(status) if status.code() == code && status.message().contains(&names) => {
                eprintln!("ok   {name}: {:?} {:?}", status.code(), short(status.message()));
            }
            Err(status) => mismatches.push(format!(
                "{name}: got {:?} {:?}; expected {code:?} naming {names:?}",
                status.code(),
                short(status.message())
            )),
        }
        let after =
            look().await.with_context(|| format!("snapshot after {name} ({size} bytes)"))?;
        if after != before {
            mismatches.push(format!("{name}: changed state:\nbefore {before:?}\nafter  {after:?}"));
            before = after;
        }
    }
    Ok(mismatches)
}

/// A message cut to a readable length.
fn short(message: &str) -> String {
    match message.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &message[..at]),
        None => message.to_string(),
    }
}

/// Fails unless every RPC of `rpcs` has at least one malformed and one
/// oversized case (and, when node-only, a case without the proof), and
/// prints the table's size.
fn check_coverage(table: &str, rpcs: &[&str], cases: &[Case]) -> Result<()> {
    let mut counts: BTreeMap<&str, BTreeMap<Kind, usize>> = BTreeMap::new();
    for case in cases {
        *counts.entry(case.call.path).or_default().entry(case.kind).or_default() += 1;
    }
    let mut missing = Vec::new();
    for path in rpcs {
        let kinds = counts.get(path);
        let count = |kind| kinds.and_then(|k| k.get(&kind)).copied().unwrap_or(0);
        let mut needed = vec![Kind::Malformed, Kind::Oversized];
        if node_only(path) {
            needed.push(Kind::NoProof);
        }
        for kind in needed {
            if count(kind) == 0 {
                missing.push(format!("{path}: no {kind:?} case"));
            }
        }
    }
    if let Some(stray) = counts.keys().find(|path| !rpcs.contains(path)) {
        bail!("{table}: a case calls {stray}, which is not in the table's RPC list");
    }
    eprintln!("{table}: {} RPCs, {} cases", rpcs.len(), cases.len());
    for (path, kinds) in &counts {
        eprintln!("  {path}: {kinds:?}");
    }
    ensure!(missing.is_empty(), "{table} does not cover every RPC:\n{}", missing.join("\n"));
    Ok(())
}

/// What no refused call may change on the node.
#[derive(Debug, PartialEq)]
struct World {
    stats: StatsSnapshot,
    /// The lease seeded on the held job (a refresh would move its expiry).
    held: Option<v1::Lease>,
    /// Every schedule, without its next tick (which moves with the clock).
    schedules: Vec<v1::Schedule>,
    /// Members: id, address, voter.
    members: Vec<(u64, String, bool)>,
    /// The node's gate flags: journal_lease, dry_run.
    flags: Option<(bool, bool)>,
    /// The peer adverts the node holds: node, version, journal_lease.
    adverts: Vec<(u64, String, Option<bool>)>,
    /// `/readyz`'s status code (a drain or a fault would flip it).
    readyz: u16,
}

/// Stubs of the seeded node, for the snapshot.
struct Observer {
    queue: QueueClient<Channel>,
    schedules: SchedulesClient<Channel>,
    cluster: ClusterClient<Channel>,
    http: std::net::SocketAddr,
    held_job: u64,
}

impl Observer {
    async fn look(&self) -> Result<World> {
        let stats = stats_snapshot(&mut self.queue.clone()).await?;
        let held = self
            .queue
            .clone()
            .get_job(v1::GetJobRequest { job_id: self.held_job, stale: false })
            .await
            .context("get the held job")?
            .into_inner()
            .job
            .and_then(|job| job.lease);
        let mut schedules = self
            .schedules
            .clone()
            .list(v1::ListSchedulesRequest { stale: false })
            .await
            .context("list schedules")?
            .into_inner()
            .schedules;
        for schedule in &mut schedules {
            schedule.next_tick_ms = None;
        }
        let status = self
            .cluster
            .clone()
            .status(v1::StatusRequest { local_only: false })
            .await
            .context("cluster status")?
            .into_inner();
        let members = status.nodes.iter().map(|n| (n.id, n.addr.clone(), n.voter)).collect();
        let me = status.nodes.iter().find(|n| n.id == NODE_ID);
        let flags = me.and_then(|n| n.gate.as_ref()).map(|g| (g.journal_lease, g.dry_run));
        let adverts = me
            .map(|n| {
                n.adverts.iter().map(|a| (a.node_id, a.version.clone(), a.journal_lease)).collect()
            })
            .unwrap_or_default();
        let readyz = http_get(self.http, "/readyz").await?.status;
        Ok(World { stats, held, schedules, members, flags, adverts, readyz })
    }
}

/// Waits until `/readyz` answers 200 (readiness is cached for about a
/// second after start), so the snapshots compare a settled node.
async fn wait_ready(node: &Node) -> Result<()> {
    let http = node.http;
    wait_until("node 1 to report ready", deadline_in(Duration::from_secs(30)), || async move {
        let reply = http_get(http, "/readyz").await?;
        Ok(if reply.status == 200 {
            Check::Done(())
        } else {
            Check::NotYet(format!("{} {}", reply.status, reply.body.trim()))
        })
    })
    .await
}

/// A raw channel to `node`, with the harness's deadline on every call.
fn channel(node: &Node) -> Result<Channel> {
    Ok(Endpoint::from_shared(node.addr())
        .context("endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(RPC_TIMEOUT)
        .connect_lazy())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_changes_nothing() -> Result<()> {
    let sandbox = Sandbox::new("bad-input")?;
    sandbox.run(Duration::from_secs(240), story(&sandbox)).await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1; seed three ready jobs (one claimed) and a paused schedule");
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
            ..Default::default()
        })
        .await
        .context("seed claim")?
        .into_inner();
    let held = match claimed.grants.first().and_then(|g| g.lease.as_ref()) {
        Some(lease) => v1::LeaseRef { job_id: lease.job_id, token: lease.token },
        None => bail!("seed claim granted nothing: {claimed:?}"),
    };
    node.schedules_stub()?
        .put(v1::PutScheduleRequest { spec: Some(schedules::seeded_spec()) })
        .await
        .context("seed schedule")?;

    phase("snapshot the node before the table, once it reports ready");
    wait_ready(&node).await?;
    let observer = Observer {
        queue: node.stub()?,
        schedules: node.schedules_stub()?,
        cluster: node.cluster_stub()?,
        http: node.http,
        held_job: held.job_id,
    };
    let before = observer.look().await?;
    ensure!(
        before.stats.last_job_id == 3
            && before.stats.last_token == held.token
            && before.schedules.len() == 1
            && before.members.len() == 1
            && before.readyz == 200,
        "unexpected seed state: {before:?}"
    );

    phase("send every bad request, comparing the snapshot after each");
    let mut cases = queue::cases(held);
    cases.extend(schedules::cases());
    let member_addr = before.members.first().map(|m| m.1.clone()).unwrap_or_default();
    cases.extend(cluster::cases(&member_addr));
    cases.extend(peer::cases()?);
    cases.extend(raft::cases()?);
    let cases = with_proofless_twins(cases);
    let public_rpcs: Vec<&str> =
        EVERY_RPC.iter().copied().filter(|p| !p.starts_with("/leasehold.v1.Faults/")).collect();
    check_coverage("bad input, node 1", &public_rpcs, &cases)?;
    let total = cases.len();
    let channel = channel(&node)?;
    let mut mismatches = run_table(&channel, cases, || observer.look()).await?;
    let after = observer.look().await?;
    if after != before {
        mismatches.push(format!("the table changed state:\nbefore {before:?}\nafter  {after:?}"));
    }

    phase("the bus holds no claim from the refused bus messages");
    // A valid claim answers every claim the node holds for the key; only
    // this one may be there (it is the first message the bus took).
    let at_ms = peer::unix_ms()?;
    let control = rpc::bus(peer::signed_bus(&peer::claim(PROBE_NODE, at_ms)));
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.context("channel")?;
    let mut request = tonic::Request::new(control.bytes);
    request.metadata_mut().insert(NODE_PROOF_HEADER, node_proof(PROBE_NODE)?);
    let reply = grpc
        .unary(request, PathAndQuery::from_static(control.path), RawCodec)
        .await
        .context("a valid bus claim")?
        .into_inner();
    let reply = <v1::BusReply as prost::Message>::decode(reply.as_slice())?;
    let only_this = [v1::BusClaim { key: peer::BUS_KEY.into(), node: PROBE_NODE, at_ms }];
    if reply.claims != only_this || reply.released {
        mismatches.push(format!("the bus kept something of a refused message: {reply:?}"));
    }

    phase("a message of exactly each decode limit is decoded, not refused for its size");
    for (call, code) in edge_calls() {
        let limit = limit_of(call.path);
        let call = call.padded_to(limit);
        let answer = send(&channel, &call, node_only(call.path).then_some(PROBE_NODE)).await;
        let got = answer.as_ref().err().map_or(Code::Ok, |status| status.code());
        if got != code {
            mismatches.push(format!(
                "{} at exactly {limit} bytes: got {answer:?}; expected {code:?}",
                call.path
            ));
        }
    }
    ensure!(observer.look().await? == after, "a message at the limit changed state");

    phase("health, open to anyone, and reflection take 64 KiB at most, like Cluster");
    let health = "/grpc.health.v1.Health/Check";
    let check = Call::encode(health, &tonic_health::pb::HealthCheckRequest::default());
    if let Err(status) = send(&channel, &check.clone().padded_to(SMALL_LIMIT_BYTES), None).await {
        mismatches.push(format!("{health} at exactly {SMALL_LIMIT_BYTES} bytes: {status:?}"));
    }
    let limit = SMALL_LIMIT_BYTES.to_string();
    let over_health = send(&channel, &check.padded_to(SMALL_LIMIT_BYTES + 1), None).await;
    let refused = over_health.as_ref().err().is_some_and(|status| {
        status.code() == Code::ResourceExhausted && status.message().contains(&limit)
    });
    if !refused {
        mismatches.push(format!(
            "{health} at {SMALL_LIMIT_BYTES} + 1 bytes: got {over_health:?}; expected \
             RESOURCE_EXHAUSTED naming {limit}"
        ));
    }
    // Reflection is a stream: tonic's reflection service ends it without
    // a word when a request does not decode, so an oversized list of the
    // services gets no answer at all (within the limit it gets the list).
    let list = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    for path in [
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        let within = Call::encode(path, &list).padded_to(SMALL_LIMIT_BYTES);
        if let Err(status) = send(&channel, &within, None).await {
            mismatches.push(format!("{path} at exactly {SMALL_LIMIT_BYTES} bytes: {status:?}"));
        }
        let over = Call::encode(path, &list).padded_to(SMALL_LIMIT_BYTES + 1);
        if let Ok(()) = send(&channel, &over, None).await {
            mismatches.push(format!("{path} at {SMALL_LIMIT_BYTES} + 1 bytes was answered"));
        }
    }
    ensure!(observer.look().await? == after, "a health or reflection call changed state");

    phase("the field limits' edges are accepted");
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

    phase("judge the table");
    ensure!(
        mismatches.is_empty(),
        "{} of {total} bad requests were not refused as specified:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    Ok(())
}

/// One harmless call per service, to be padded to exactly the decode
/// limit, and what it must answer then.
fn edge_calls() -> Vec<(Call, Code)> {
    vec![
        (rpc::stats(v1::StatsRequest { queue: None, stale: true }), Code::Ok),
        (rpc::list_schedules(v1::ListSchedulesRequest { stale: true }), Code::Ok),
        (rpc::status(v1::StatusRequest { local_only: true }), Code::Ok),
        // Judged by the service, not the size: the body is no advert.
        (rpc::advertise(peer::signed_advert_body(b"not an advert")), Code::InvalidArgument),
        (rpc::vote(v1::RaftEnvelope { data: b"not json".to_vec() }), Code::InvalidArgument),
    ]
}

/// What no refused Faults call may change: the queues, readiness (the
/// probe fault) and whether a write still commits (the store fault), and
/// the node's clock (checked after the table).
#[derive(Debug, PartialEq)]
struct FaultWorld {
    stats: StatsSnapshot,
    readyz: u16,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fault_input_changes_nothing() -> Result<()> {
    let sandbox = Sandbox::new("bad-fault-input")?;
    sandbox.run(Duration::from_secs(90), fault_story(&sandbox)).await
}

async fn fault_story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1 with fault injection; one job");
    let config = sandbox.path().join("faults.toml");
    std::fs::write(&config, "fault_injection = true\n").context("writing the config")?;
    let mut node = Node::new(sandbox, NODE_ID, Some(config), None)?;
    node.launch(sandbox)?;
    let mut stub = node.stub()?;
    wait_until("node 1 to serve linearizable reads", deadline_in(Duration::from_secs(30)), || {
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
    stub.enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, b"seed")] }).await.context("seed")?;
    wait_ready(&node).await?;
    let look = || {
        let mut stub = stub.clone();
        let http = node.http;
        async move {
            let stats = stats_snapshot(&mut stub).await?;
            let readyz = http_get(http, "/readyz").await?.status;
            Ok(FaultWorld { stats, readyz })
        }
    };
    let before = look().await?;
    ensure!(before.readyz == 200, "not ready before the table: {before:?}");

    phase("send every bad Faults request, comparing the snapshot after each");
    let cases = faults::cases();
    let fault_rpcs: Vec<&str> =
        EVERY_RPC.iter().copied().filter(|p| p.starts_with("/leasehold.v1.Faults/")).collect();
    check_coverage("bad input, Faults", &fault_rpcs, &cases)?;
    let total = cases.len();
    let channel = channel(&node)?;
    let mut mismatches = run_table(&channel, cases, look).await?;

    phase("a Faults message of exactly 64 KiB is decoded: turning a fault off is a no-op");
    let edge = rpc::set_probe_fault(v1::SetFaultRequest { on: false }).padded_to(SMALL_LIMIT_BYTES);
    if let Err(status) = send(&channel, &edge, None).await {
        mismatches.push(format!("SetProbeFault at exactly 64 KiB: {status:?}"));
    }

    phase("the store still takes writes, and the clock was not skewed");
    let wrote = stub
        .enqueue(v1::EnqueueRequest { jobs: vec![job(QUEUE, b"after")] })
        .await
        .context("a write after the table (the store fault must be off)")?;
    ensure!(wrote.get_ref().results.len() == 1, "{wrote:?}");
    let stats = stub
        .stats(v1::StatsRequest { queue: None, stale: false })
        .await
        .context("stats")?
        .into_inner();
    let wall_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| anyhow!("clock before 1970: {e}"))?
            .as_millis(),
    )?;
    ensure!(
        stats.cluster_time_ms.abs_diff(wall_ms) < 60_000,
        "cluster time {} is off the wall clock {wall_ms}: a refused SetClock skewed it",
        stats.cluster_time_ms
    );

    phase("judge the table");
    ensure!(
        mismatches.is_empty(),
        "{} of {total} bad Faults requests were not refused as specified:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    Ok(())
}
