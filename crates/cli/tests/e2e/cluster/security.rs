//! Goal: the security issue's acceptance on a real three-node cluster with
//! mutual TLS and tokens from `leasehold dev-certs` — whoever merely
//! reaches a port can do nothing: strangers do not get past the handshake,
//! a client certificate without a token is unauthenticated, each token does
//! what its role allows and no more, and no client identity ever reaches
//! the internal services (Join, Peer, Raft); and every refusal changes
//! nothing.
//!
//! Method: `leasehold dev-certs` writes the cluster's CA, node and client
//! certificates and tokens, and a second, unrelated set (another CA). The
//! nodes run with `--tls-*` and `--tokens`. Each caller is a real tonic
//! client with exactly the identity and token under test, and no retries,
//! so the test sees what the server answered. Before and after every
//! refusal the test reads what a refusal must not change: the queues'
//! counts, the schedules and the membership.
//!
//! Mutation checks (each run once against a deliberately broken build):
//! an auth layer that admits every caller fails both stories (a call
//! without a token is served; a client certificate joins as a voter); a
//! layer that takes a node proof header on a TLS connection as a node
//! identity fails the internal-services story (the client certificate
//! holding node 1's proof joins node 4); a join that does not compare the
//! caller with the id it asks for fails it too (node 4's certificate adds
//! node 5).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::peer_client::PeerClient;
use leasehold_proto::v1::queue_client::QueueClient;
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_proto::v1::schedules_client::SchedulesClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use leasehold_security::secret::NODE_PROOF_HEADER;

use super::super::support::{
    CLUSTER_SECRET, Cluster, ClusterOptions, RPC_TIMEOUT, Sandbox, StatsSnapshot, dev_certs,
    http_get, job, phase, stats_snapshot, tls_config,
};
use super::cluster_slot;

/// What a refused call must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct World {
    stats: StatsSnapshot,
    schedules: Vec<String>,
    voters: Vec<u64>,
    members: Vec<u64>,
}

async fn world(cluster: &Cluster) -> Result<World> {
    let node = cluster.node(1)?;
    let stats = stats_snapshot(&mut node.stub()?).await?;
    let schedules = node
        .schedules_stub()?
        .list(v1::ListSchedulesRequest { stale: false })
        .await
        .context("list schedules")?
        .into_inner()
        .schedules
        .into_iter()
        .filter_map(|s| s.spec.map(|spec| spec.name))
        .collect();
    let status = node.cluster_stub()?.status(v1::StatusRequest { local_only: false }).await?;
    let status = status.into_inner();
    let voters = status.nodes.iter().filter(|n| n.voter).map(|n| n.id).collect();
    let members = status.nodes.iter().map(|n| n.id).collect();
    Ok(World { stats, schedules, voters, members })
}

/// Adds a bearer token and other metadata (a node proof) to every call.
#[derive(Clone, Default)]
struct Bearer(Vec<(&'static str, tonic::metadata::AsciiMetadataValue)>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        for (key, value) in &self.0 {
            request.metadata_mut().insert(*key, value.clone());
        }
        Ok(request)
    }
}

type Wire = InterceptedService<Channel, Bearer>;

/// One caller: a channel with exactly the TLS identity and token under
/// test (a scheme of `http` means plaintext).
struct Caller {
    channel: Wire,
}

impl Caller {
    fn new(addr: &str, tls: Option<ClientTlsConfig>, token: Option<String>) -> Result<Caller> {
        Caller::with_proof(addr, tls, token, None)
    }

    /// Also sends the node proof of `node` (keyed by the cluster secret the
    /// harness gives every node): with TLS it must count for nothing.
    fn with_proof(
        addr: &str,
        tls: Option<ClientTlsConfig>,
        token: Option<String>,
        node: Option<u64>,
    ) -> Result<Caller> {
        let mut endpoint = Endpoint::from_shared(addr.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .timeout(RPC_TIMEOUT);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls)?;
        }
        let mut metadata = Vec::new();
        if let Some(token) = token {
            metadata.push(("authorization", format!("Bearer {}", token.trim()).parse()?));
        }
        if let Some(node) = node {
            let secret = leasehold_security::ClusterSecret::from_text(CLUSTER_SECRET)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            metadata.push((NODE_PROOF_HEADER, secret.node_proof(node).parse()?));
        }
        Ok(Caller { channel: InterceptedService::new(endpoint.connect_lazy(), Bearer(metadata)) })
    }

    fn queue(&self) -> QueueClient<Wire> {
        QueueClient::new(self.channel.clone())
    }

    fn schedules(&self) -> SchedulesClient<Wire> {
        SchedulesClient::new(self.channel.clone())
    }

    fn cluster(&self) -> ClusterClient<Wire> {
        ClusterClient::new(self.channel.clone())
    }
}

fn token(certs: &Path, role: &str) -> Result<String> {
    Ok(std::fs::read_to_string(certs.join(format!("token-{role}")))?.trim().to_string())
}

fn command_schedule(name: &str) -> v1::PutScheduleRequest {
    v1::PutScheduleRequest {
        spec: Some(v1::ScheduleSpec {
            name: name.to_string(),
            cron: "@hourly".to_string(),
            template: Some(v1::JobTemplate {
                command: Some("true".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A refused call: `call` must fail with `expected`, and `world` must read
/// the same after it as before.
async fn refused<T, F>(
    cluster: &Cluster,
    what: &str,
    expected: Option<tonic::Code>,
    call: F,
) -> Result<()>
where
    F: std::future::Future<Output = Result<T, tonic::Status>>,
    T: std::fmt::Debug,
{
    let before = world(cluster).await?;
    let answer = call.await;
    match (expected, &answer) {
        (Some(code), Err(status)) => ensure!(
            status.code() == code,
            "{what}: answered {:?} ({}), expected {code:?}",
            status.code(),
            status.message()
        ),
        (None, Err(_)) => {}
        (_, Ok(reply)) => anyhow::bail!("{what}: accepted ({reply:?})"),
    }
    if let Err(status) = &answer {
        eprintln!("{what}: refused {:?}: {}", status.code(), status.message());
    }
    let after = world(cluster).await?;
    ensure!(before == after, "{what} changed the cluster: {before:?} -> {after:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_cluster_admits_only_the_roles_each_call_needs() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("secure-roles")?;
    sandbox.run(Duration::from_secs(240), roles_story(&sandbox)).await
}

async fn roles_story(sandbox: &Sandbox) -> Result<()> {
    phase("dev-certs: the cluster's CA and another one; three nodes with TLS and tokens");
    let certs = sandbox.path().join("certs");
    let other = sandbox.path().join("other-ca");
    dev_certs(sandbox, &certs, 3).await?;
    dev_certs(sandbox, &other, 3).await?;
    let options = ClusterOptions { secure: Some(certs.clone()), ..Default::default() };
    let cluster = Cluster::start_with(sandbox, 3, options).await?;
    let https = cluster.node(1)?.addr();
    let http = https.replacen("https://", "http://", 1);
    let ca = Certificate::from_pem(std::fs::read(certs.join("ca.pem"))?);

    phase("strangers: plaintext, TLS without a certificate, a certificate of another CA");
    let plaintext = Caller::new(&http, None, Some(token(&certs, "admin")?))?;
    refused(
        &cluster,
        "plaintext stats",
        None,
        plaintext.queue().stats(v1::StatsRequest::default()),
    )
    .await?;
    let anonymous_tls = ClientTlsConfig::new().ca_certificate(ca.clone());
    let anonymous = Caller::new(&https, Some(anonymous_tls), Some(token(&certs, "admin")?))?;
    refused(&cluster, "no client certificate", None, anonymous.queue().enqueue(enqueue("emails")))
        .await?;
    let foreign = tls_config(&other, "client")?.ca_certificate(ca.clone());
    let foreign = Caller::new(&https, Some(foreign), Some(token(&certs, "admin")?))?;
    refused(&cluster, "another CA's certificate", None, foreign.queue().enqueue(enqueue("emails")))
        .await?;

    phase("a client certificate without a token, or with an unknown one, is unauthenticated");
    let client_tls = || tls_config(&certs, "client");
    let no_token = Caller::new(&https, Some(client_tls()?), None)?;
    let unauthenticated = Some(tonic::Code::Unauthenticated);
    refused(&cluster, "no token", unauthenticated, no_token.queue().enqueue(enqueue("emails")))
        .await?;
    refused(
        &cluster,
        "no token, stats",
        unauthenticated,
        no_token.queue().stats(v1::StatsRequest::default()),
    )
    .await?;
    let unknown = Caller::new(&https, Some(client_tls()?), Some("lh_not-a-token".into()))?;
    refused(
        &cluster,
        "unknown token",
        unauthenticated,
        unknown.cluster().status(v1::StatusRequest::default()),
    )
    .await?;

    phase("a worker token can neither put a schedule nor enqueue a command");
    let denied = Some(tonic::Code::PermissionDenied);
    let worker = Caller::new(&https, Some(client_tls()?), Some(token(&certs, "worker")?))?;
    refused(
        &cluster,
        "worker puts a schedule",
        denied,
        worker.schedules().put(command_schedule("w")),
    )
    .await?;
    refused(&cluster, "worker enqueues on exec", denied, worker.queue().enqueue(enqueue("exec")))
        .await?;
    refused(&cluster, "worker enqueues", denied, worker.queue().enqueue(enqueue("emails"))).await?;

    phase("a producer token enqueues, but not a command, and cannot change the cluster");
    let producer = Caller::new(&https, Some(client_tls()?), Some(token(&certs, "producer")?))?;
    let before = world(&cluster).await?;
    producer.queue().enqueue(enqueue("emails")).await.context("producer enqueue")?;
    let after = world(&cluster).await?;
    ensure!(after.stats.last_job_id == before.stats.last_job_id + 1, "{before:?} -> {after:?}");
    refused(
        &cluster,
        "producer enqueues on exec",
        denied,
        producer.queue().enqueue(enqueue("exec")),
    )
    .await?;
    refused(
        &cluster,
        "producer enqueues on exec.gpu",
        denied,
        producer.queue().enqueue(enqueue("exec.gpu")),
    )
    .await?;
    refused(
        &cluster,
        "producer removes node 3",
        denied,
        producer.cluster().remove(v1::RemoveRequest { id: 3 }),
    )
    .await?;
    refused(
        &cluster,
        "producer sets flags",
        denied,
        producer.cluster().set_flags(v1::SetFlagsRequest {
            id: 2,
            journal_lease: Some(false),
            dry_run: None,
        }),
    )
    .await?;
    refused(
        &cluster,
        "producer drains",
        denied,
        producer.cluster().drain(v1::DrainRequest { id: 2 }),
    )
    .await?;
    refused(
        &cluster,
        "producer puts a schedule",
        denied,
        producer.schedules().put(command_schedule("p")),
    )
    .await?;
    let metrics = http_get(cluster.node(1)?.http, "/metrics").await?.body;
    let counted = metrics.lines().any(|line| {
        line.starts_with("leasehold_auth_refused_total{")
            && line.contains("service=\"leasehold.v1.Queue\"")
            && line.contains("reason=\"role\"")
            && !line.ends_with(" 0")
    });
    ensure!(counted, "the service's own role refusals are not counted: {metrics}");
    let reader = Caller::new(&https, Some(client_tls()?), Some(token(&certs, "reader")?))?;
    refused(&cluster, "reader enqueues", denied, reader.queue().enqueue(enqueue("emails"))).await?;
    reader.queue().stats(v1::StatsRequest::default()).await.context("reader stats")?;

    phase("an admin token does both");
    let admin = Caller::new(&https, Some(client_tls()?), Some(token(&certs, "admin")?))?;
    admin.schedules().put(command_schedule("nightly")).await.context("admin puts a schedule")?;
    admin.queue().enqueue(enqueue("exec")).await.context("admin enqueues a command")?;
    let status = admin.cluster().status(v1::StatusRequest::default()).await?.into_inner();
    ensure!(status.nodes.len() == 3, "admin status: {status:?}");
    let end = world(&cluster).await?;
    ensure!(end.schedules == vec!["nightly".to_string()], "{end:?}");

    phase("the CLI speaks TLS with tokens from the environment");
    let env = [
        ("LEASEHOLD_ADDR", cluster.addrs()),
        ("LEASEHOLD_TLS_CA", path_text(&certs.join("ca.pem"))?),
        ("LEASEHOLD_TLS_CERT", path_text(&certs.join("client.pem"))?),
        ("LEASEHOLD_TLS_KEY", path_text(&certs.join("client.key"))?),
        ("LEASEHOLD_TOKEN", token(&certs, "reader")?),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let run =
        super::super::support::run_cli(sandbox, &["cluster", "status", "--output", "json"], &env)
            .await?
            .success()?;
    ensure!(run.json()?["nodes"].as_array().is_some_and(|n| n.len() == 3), "{}", run.stdout);
    let denied_run =
        super::super::support::run_cli(sandbox, &["cron", "pause", "nightly"], &env).await?;
    ensure!(
        !denied_run.status.success() && denied_run.stderr.contains("admin"),
        "a reader paused a schedule: {} {}",
        denied_run.status,
        denied_run.stderr
    );
    // A worker whose token lacks the role ends, naming the refusal, rather
    // than asking on (run_cli gives up on it after 30 s).
    let worker_run = super::super::support::run_cli(
        sandbox,
        &["worker", "--queue", "emails", "--", "true"],
        &env,
    )
    .await?;
    ensure!(
        worker_run.status.code() == Some(1)
            && worker_run.stderr.contains("claims refused")
            && worker_run.stderr.contains("worker role"),
        "a worker without the role: {} {}",
        worker_run.status,
        worker_run.stderr
    );
    Ok(())
}

fn path_text(path: &Path) -> Result<String> {
    path.to_str().map(str::to_string).context("a UTF-8 path")
}

fn enqueue(queue: &str) -> v1::EnqueueRequest {
    v1::EnqueueRequest {
        jobs: vec![job(queue, if queue.starts_with("exec") { b"true" } else { b"x" })],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_identity_reaches_the_internal_services() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("secure-internal")?;
    sandbox.run(Duration::from_secs(240), internal_story(&sandbox)).await
}

async fn internal_story(sandbox: &Sandbox) -> Result<()> {
    phase("three nodes with TLS and tokens; a foreign CA with its own node certificates");
    let certs = sandbox.path().join("certs");
    let other = sandbox.path().join("other-ca");
    // A fourth node certificate of the cluster's own CA, for a node that
    // is not a member.
    dev_certs(sandbox, &certs, 4).await?;
    dev_certs(sandbox, &other, 4).await?;
    let options = ClusterOptions { secure: Some(certs.clone()), ..Default::default() };
    let cluster = Cluster::start_with(sandbox, 3, options).await?;
    let https = cluster.node(1)?.addr();
    let ca = Certificate::from_pem(std::fs::read(certs.join("ca.pem"))?);

    phase("a client certificate, even with the admin token and a node proof, cannot call them");
    let admin = Some(token(&certs, "admin")?);
    let client_tls = Some(tls_config(&certs, "client")?);
    let client = Caller::with_proof(&https, client_tls, admin.clone(), Some(1))?;
    let denied = Some(tonic::Code::PermissionDenied);
    refused(
        &cluster,
        "client joins as node 4",
        denied,
        client.cluster().join(v1::JoinRequest {
            id: 4,
            addr: "127.0.0.1:9".into(),
            ..Default::default()
        }),
    )
    .await?;
    let mut peer = PeerClient::new(client.channel.clone());
    let advert = v1::Advert { node_id: 4, journal_lease: Some(false), ..Default::default() };
    let signed = v1::Signed { body: prost::Message::encode_to_vec(&advert), mac: Vec::new() };
    refused(&cluster, "client sends an advert", denied, peer.advertise(signed.clone())).await?;
    refused(&cluster, "client sends a bus claim", denied, peer.bus(signed.clone())).await?;
    let mut raft = RaftClient::new(client.channel.clone());
    let envelope = v1::RaftEnvelope { data: b"{}".to_vec() };
    refused(&cluster, "client appends entries", denied, raft.append_entries(envelope.clone()))
        .await?;
    refused(&cluster, "client asks for a vote", denied, raft.vote(envelope.clone())).await?;
    refused(
        &cluster,
        "client installs a snapshot",
        denied,
        raft.install_snapshot(envelope.clone()),
    )
    .await?;
    refused(&cluster, "client forwards a write", denied, raft.forward(envelope.clone())).await?;

    phase("a node certificate of another CA does not get past the handshake");
    let foreign_node = tls_config(&other, "node-4")?.ca_certificate(ca);
    let foreign = Caller::new(&https, Some(foreign_node), None)?;
    let mut raft = RaftClient::new(foreign.channel.clone());
    refused(&cluster, "foreign node appends entries", None, raft.append_entries(envelope.clone()))
        .await?;
    refused(
        &cluster,
        "foreign node joins",
        None,
        foreign.cluster().join(v1::JoinRequest {
            id: 4,
            addr: "127.0.0.1:9".into(),
            ..Default::default()
        }),
    )
    .await?;

    phase("a node that is not a voter may join only as itself");
    let four = Caller::new(&https, Some(tls_config(&certs, "node-4")?), None)?;
    refused(
        &cluster,
        "node 4 joins as node 5",
        denied,
        four.cluster().join(v1::JoinRequest {
            id: 5,
            addr: "127.0.0.1:9".into(),
            ..Default::default()
        }),
    )
    .await?;

    phase("node 3's certificate cannot speak for node 2 in Raft");
    let three = Caller::new(&https, Some(tls_config(&certs, "node-3")?), None)?;
    let mut raft = RaftClient::new(three.channel.clone());
    let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(99, 2), None);
    let vote = v1::RaftEnvelope { data: leasehold_raft::envelope::encode(&vote)? };
    refused(&cluster, "node 3 asks for votes as node 2", denied, raft.vote(vote)).await?;

    phase("a real node process with another CA's node certificate cannot join");
    let before = world(&cluster).await?;
    let mut stranger = cluster.spare_node(sandbox, 4)?;
    stranger.secure = Some(other.clone());
    stranger.launch(sandbox)?;
    let deadline = super::super::support::deadline_in(Duration::from_secs(30));
    let exit = stranger.wait_exit(deadline).await?;
    // A TLS failure is final: the node says why at once instead of retrying.
    ensure!(!exit.success(), "the foreign node exited {exit}");
    let log = std::fs::read_to_string(stranger.log().context("a log")?)?;
    ensure!(log.contains("join"), "the foreign node's log does not say why: {log}");
    let after = world(&cluster).await?;
    ensure!(before == after, "the foreign node changed the cluster: {before:?} -> {after:?}");
    Ok(())
}
