//! Goal: the single-node half of the security issue's acceptance — safe by
//! default (a gRPC port beyond loopback without TLS and tokens refuses to
//! start and names the flags; the loopback default needs none), tokens and
//! certificates rotate on SIGHUP without a restart, and a plaintext node
//! takes internal calls only with a valid node proof, while a node that is
//! to join without TLS and without the cluster's secret refuses to start.
//!
//! Method: real `leasehold serve` processes; credentials from the real
//! `leasehold dev-certs`; callers are raw tonic clients with exactly the
//! identity, token and proof under test, so the test sees what the server
//! answered. Rotation is judged by the same caller failing before the
//! SIGHUP and succeeding after it (and the reverse for a removed token),
//! even while a TLS file is broken.
//!
//! The rotation story ends with the node's certificate replaced by one of
//! a new CA and the old CA dropped, every connection to the node cut (`ss
//! -K`, as root), and a command job that the built-in executor must run:
//! it connects again only with the reloaded material.
//!
//! Mutation checks (each run once against a deliberately broken build): a
//! SIGHUP handler that does not reload fails the rotation story at the new
//! token; a reload that takes nothing when a TLS file is broken fails it at
//! the token added beside the broken key; a reload that leaves the
//! executor's client on its start-time material fails it at the executor's
//! command. (An exposure check that looks only for TLS is caught by the
//! config unit test instead, which needs no node on 0.0.0.0.)

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::peer_client::PeerClient;
use leasehold_proto::v1::queue_client::QueueClient;
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_security::secret::{NODE_PROOF_HEADER, TARGET_NODE_HEADER};
use leasehold_security::tokens::{Role, toml_entry};
use nix::sys::signal::Signal;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::support::{
    CLUSTER_SECRET, Check, Node, Process, RPC_TIMEOUT, Sandbox, binary, deadline_in, dev_certs,
    free_port, job, phase, tls_config, wait_until,
};

/// How long a refused start may take to give up.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Adds fixed metadata (a token, a node proof) to every call.
#[derive(Clone, Default)]
struct Headers(Vec<(&'static str, tonic::metadata::AsciiMetadataValue)>);

impl tonic::service::Interceptor for Headers {
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

type Wire = InterceptedService<Channel, Headers>;

fn wire(
    addr: &str,
    tls: Option<ClientTlsConfig>,
    headers: &[(&'static str, String)],
) -> Result<Wire> {
    let mut endpoint = Endpoint::from_shared(addr.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(RPC_TIMEOUT);
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    let mut metadata = Vec::new();
    for (key, value) in headers {
        metadata.push((*key, value.parse()?));
    }
    Ok(InterceptedService::new(endpoint.connect_lazy(), Headers(metadata)))
}

/// The first answer on an append stream that sends `message` and then
/// waits: the stream's status when it refused the call or the message.
async fn first_streamed_answer(
    channel: Wire,
    message: v1::RaftEnvelope,
) -> Result<v1::RaftEnvelope, tonic::Status> {
    let messages = futures::stream::iter([message]).chain(futures::stream::pending());
    let mut answers = RaftClient::new(channel).append_stream(messages).await?.into_inner();
    match tokio::time::timeout(RPC_TIMEOUT, answers.message()).await {
        Ok(Ok(Some(answer))) => Ok(answer),
        Ok(Ok(None)) => Err(tonic::Status::unknown("the stream ended without an answer")),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer on the append stream")),
    }
}

fn bearer(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

/// Starts `leasehold serve ARGS` and expects it to refuse: answers its log.
async fn refused_start(sandbox: &Sandbox, label: &str, args: &[&str]) -> Result<String> {
    let mut command = Command::new(binary());
    command.arg("serve");
    if !args.contains(&"--http") {
        command.args(["--http", &format!("127.0.0.1:{}", free_port()?)]);
    }
    command
        .arg("--data")
        .arg(sandbox.path().join(format!("data-{label}")))
        .args(args)
        .env_remove("LEASEHOLD_CLUSTER_SECRET")
        .env_remove("LEASEHOLD_TOKENS")
        .env_remove("LEASEHOLD_INSECURE")
        .env("NO_COLOR", "1");
    let log = sandbox.log_file(label);
    let mut process = Process::spawn(label, command, &log)?;
    let status = process.wait_exit(deadline_in(REFUSAL_TIMEOUT)).await?;
    let output = std::fs::read_to_string(&log).context("reading the refused node's log")?;
    ensure!(!status.success(), "{label}: the node started ({status}); log {output:?}");
    Ok(output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_beyond_loopback_needs_tls_and_tokens_and_the_default_needs_nothing() -> Result<()> {
    let sandbox = Sandbox::new("secure-defaults")?;
    sandbox.run(Duration::from_secs(120), defaults_story(&sandbox)).await
}

async fn defaults_story(sandbox: &Sandbox) -> Result<()> {
    phase("the loopback default starts with no security flag at all");
    let node = Node::start(sandbox).await?;
    node.client()?.stats(None, false).await.context("the default node serves")?;

    phase("a gRPC address beyond loopback without TLS and tokens refuses, naming the flags");
    let output = refused_start(sandbox, "exposed", &["--grpc", "0.0.0.0:0"]).await?;
    for flag in ["--tls-ca", "--tls-cert", "--tls-key", "--tokens", "--insecure", "0.0.0.0:0"] {
        ensure!(output.contains(flag), "the refusal does not name {flag}: {output:?}");
    }

    phase("an HTTP address beyond loopback without tokens refuses: the status page is there");
    let output = refused_start(sandbox, "exposed-http", &["--http", "0.0.0.0:0"]).await?;
    for named in ["http", "0.0.0.0:0", "--tokens", "/api/status", "--insecure"] {
        ensure!(output.contains(named), "the refusal does not name {named}: {output:?}");
    }

    phase("TLS without tokens is not enough either");
    let certs = sandbox.path().join("certs");
    dev_certs(sandbox, &certs, 1).await?;
    let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
    let (ca, cert, key) = (file("ca.pem"), file("node-1.pem"), file("node-1.key"));
    let tls = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    let mut args = vec!["--grpc", "0.0.0.0:0"];
    args.extend(tls);
    let output = refused_start(sandbox, "tls-only", &args).await?;
    ensure!(
        output.contains("--tokens") && !output.contains("(mutual TLS)"),
        "the refusal should ask for tokens only: {output:?}"
    );

    phase("a node certificate must name this node's id");
    let mut args = vec!["--id", "2", "--grpc", "127.0.0.1:0"];
    args.extend(tls);
    let output = refused_start(sandbox, "wrong-id", &args).await?;
    ensure!(output.contains("leasehold://node/2"), "the refusal does not say why: {output:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_certificates_rotate_on_sighup() -> Result<()> {
    let sandbox = Sandbox::new("secure-rotation")?;
    sandbox.run(Duration::from_secs(120), rotation_story(&sandbox)).await
}

/// Writes a tokens file holding `tokens` (name, token), each admin.
fn write_tokens(path: &Path, tokens: &[(&str, &str)]) -> Result<()> {
    let text: Vec<String> =
        tokens.iter().map(|(name, token)| toml_entry(name, &[Role::Admin], token)).collect();
    std::fs::write(path, text.join("\n")).context("writing the tokens file")
}

/// Waits until `call` answers `ok` (after a SIGHUP the node reloads at
/// once, but the signal is asynchronous).
async fn until<F, Fut>(what: &str, mut call: F, ok: bool) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    wait_until(what, deadline_in(Duration::from_secs(20)), || {
        let answer = call();
        async move {
            Ok(match answer.await {
                Ok(()) if ok => Check::Done(()),
                Err(_) if !ok => Check::Done(()),
                Ok(()) => Check::NotYet("still accepted".to_string()),
                Err(status) => Check::NotYet(format!("{:?}: {}", status.code(), status.message())),
            })
        }
    })
    .await
}

async fn rotation_story(sandbox: &Sandbox) -> Result<()> {
    phase("one TLS node whose tokens file holds token 'first'");
    let certs = sandbox.path().join("certs");
    let next = sandbox.path().join("next-ca");
    dev_certs(sandbox, &certs, 1).await?;
    dev_certs(sandbox, &next, 1).await?;
    let tokens = certs.join("tokens.toml");
    let (first, second) = ("lh_first-token-of-the-story", "lh_second-token-of-the-story");
    write_tokens(&tokens, &[("first", first)])?;
    let mut node = Node::new(sandbox, 1, None, None)?;
    node.secure = Some(certs.clone());
    node.launch(sandbox)?;
    let addr = node.addr();
    let client_tls = || tls_config(&certs, "client");
    let stats = |token: &str, tls: ClientTlsConfig| -> Result<_> {
        let channel = wire(&addr, Some(tls), &[bearer(token)])?;
        Ok(move || {
            let mut stub = QueueClient::new(channel.clone());
            async move { stub.stats(v1::StatsRequest::default()).await.map(drop) }
        })
    };
    until("the node to serve token 'first'", stats(first, client_tls()?)?, true).await?;
    let answer = stats(second, client_tls()?)?().await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::Unauthenticated),
        "an unknown token was answered {answer:?}"
    );

    phase("add 'second' and SIGHUP: it works without a restart");
    write_tokens(&tokens, &[("first", first), ("second", second)])?;
    node.signal(Signal::SIGHUP)?;
    until("token 'second' to be accepted", stats(second, client_tls()?)?, true).await?;

    phase("remove 'first' and SIGHUP: it is refused");
    write_tokens(&tokens, &[("second", second)])?;
    node.signal(Signal::SIGHUP)?;
    until("token 'first' to be refused", stats(first, client_tls()?)?, false).await?;

    phase("a broken tokens file is not taken: the tokens in force stay");
    std::fs::write(&tokens, "this is [[not a tokens file")?;
    node.signal(Signal::SIGHUP)?;
    wait_until("the node to log the failed reload", deadline_in(Duration::from_secs(20)), || {
        let log = node.log().map(std::fs::read_to_string);
        async move {
            let log = log.context("a log")?.context("reading the log")?;
            Ok(if log.contains("reload failed") {
                Check::Done(())
            } else {
                Check::NotYet(String::new())
            })
        }
    })
    .await?;
    stats(second, client_tls()?)?().await.context("the kept token after a bad reload")?;
    write_tokens(&tokens, &[("second", second)])?;

    phase("a broken TLS key does not hold back the tokens file: 'second' removed, 'third' added");
    let key = certs.join("node-1.key");
    let good_key = std::fs::read(&key)?;
    std::fs::write(&key, "not a key")?;
    let third = "lh_third-token-of-the-story";
    write_tokens(&tokens, &[("third", third)])?;
    node.signal(Signal::SIGHUP)?;
    until("token 'third' to be accepted", stats(third, client_tls()?)?, true).await?;
    until("token 'second' to be refused", stats(second, client_tls()?)?, false).await?;
    std::fs::write(&key, good_key)?;
    write_tokens(&tokens, &[("second", second)])?;
    node.signal(Signal::SIGHUP)?;
    until("token 'second' to be accepted again", stats(second, client_tls()?)?, true).await?;

    phase("a client certificate of a new CA: refused, then accepted once the CA bundle has it");
    let first_ca = ca_of(&certs)?;
    let next_client = || tls_config(&next, "client").map(|t| t.ca_certificate(first_ca.clone()));
    let answer = stats(second, next_client()?)?().await;
    ensure!(answer.is_err(), "a certificate of an unknown CA was accepted");
    let bundle =
        [std::fs::read(certs.join("ca.pem"))?, std::fs::read(next.join("ca.pem"))?].concat();
    std::fs::write(certs.join("ca.pem"), bundle)?;
    node.signal(Signal::SIGHUP)?;
    until("the new CA's client certificate to be accepted", stats(second, next_client()?)?, true)
        .await?;
    stats(second, client_tls()?)?().await.context("the old CA's client after the rotation")?;

    phase(
        "the node's certificate from the new CA, then the old CA dropped: the executor's own connection follows",
    );
    executor_story(sandbox, &node, &certs, &next, second).await?;
    node.ensure_running()?;
    Ok(())
}

/// The client-side ports of the connections established to `port`.
fn connections_to(port: u16) -> Result<BTreeSet<String>> {
    let filter = format!("dport = :{port}");
    let output = Command::new("ss").args(["-Htn", "state", "established", &filter]).output()?;
    ensure!(output.status.success(), "ss: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_string))
        .collect())
}

/// The rest of the certificate rotation, with the built-in executor
/// judged: the node's certificate is replaced by one of the new CA, the
/// old CA leaves the bundle (a SIGHUP each), and every connection to the
/// node is cut, so the executor must connect again. It runs a command only
/// if it connects with the reloaded material: with what the node started
/// with, its handshake fails (the old CA does not sign the node's new
/// certificate, and the node no longer takes the old one's).
async fn executor_story(
    sandbox: &Sandbox,
    node: &Node,
    certs: &Path,
    next: &Path,
    token: &str,
) -> Result<()> {
    let addr = node.addr();
    let next_only = || tls_config(next, "client");
    // A connection of its own for each call: an open one keeps the
    // handshake it made before the reload.
    let stats = |tls: ClientTlsConfig| -> Result<_> {
        let addr = addr.clone();
        let token = token.to_string();
        Ok(move || {
            let channel = wire(&addr, Some(tls.clone()), &[bearer(&token)]);
            async move {
                let channel = channel.map_err(|e| tonic::Status::internal(e.to_string()))?;
                QueueClient::new(channel).stats(v1::StatsRequest::default()).await.map(drop)
            }
        })
    };
    std::fs::copy(next.join("node-1.pem"), certs.join("node-1.pem"))?;
    std::fs::copy(next.join("node-1.key"), certs.join("node-1.key"))?;
    node.signal(Signal::SIGHUP)?;
    until("the node to present the new CA's certificate", stats(next_only()?)?, true).await?;
    std::fs::copy(next.join("ca.pem"), certs.join("ca.pem"))?;
    node.signal(Signal::SIGHUP)?;
    let old_client = tls_config(certs, "client")?;
    until("the old CA's client certificate to be refused", stats(old_client)?, false).await?;

    // Whatever the executor holds now (made with the old material, or
    // already with the new), it must connect again after the cut.
    let port = node.grpc.port();
    let before = connections_to(port)?;
    let filter = format!("( dport = :{port} or sport = :{port} )");
    let cut = Command::new("ss").args(["-K", "state", "established", &filter]).output()?;
    let complaint = String::from_utf8_lossy(&cut.stderr);
    // Without CAP_NET_ADMIN (or a kernel without socket destroy) ss still
    // exits 0, having cut nothing.
    ensure!(
        cut.status.success() && !complaint.contains("SOCK_DESTROY"),
        "ss -K could not cut connections (it needs root with CAP_NET_ADMIN): {complaint}"
    );
    let left = connections_to(port)?;
    ensure!(
        before.is_disjoint(&left),
        "connections from before the cut are still up ({before:?} then {left:?})"
    );

    let ran = sandbox.path().join("executor-ran");
    let command = format!("echo ran > {}", ran.display());
    let mut queue = QueueClient::new(wire(&addr, Some(next_only()?), &[bearer(token)])?);
    queue
        .enqueue(v1::EnqueueRequest { jobs: vec![job("exec", command.as_bytes())] })
        .await
        .context("enqueueing the executor's command")?;
    wait_until("the executor to run the command", deadline_in(Duration::from_secs(30)), || {
        let done = ran.exists();
        async move { Ok(if done { Check::Done(()) } else { Check::NotYet(String::new()) }) }
    })
    .await?;
    Ok(())
}

fn ca_of(certs: &Path) -> Result<tonic::transport::Certificate> {
    Ok(tonic::transport::Certificate::from_pem(std::fs::read(certs.join("ca.pem"))?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_node_takes_internal_calls_only_with_the_node_proof() -> Result<()> {
    let sandbox = Sandbox::new("secure-proof")?;
    sandbox.run(Duration::from_secs(120), proof_story(&sandbox)).await
}

async fn proof_story(sandbox: &Sandbox) -> Result<()> {
    phase("a plaintext node with the cluster secret");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let secret = |text: &str| {
        leasehold_security::ClusterSecret::from_text(text).map_err(|e| anyhow::anyhow!("{e}"))
    };
    let proof = secret(CLUSTER_SECRET)?.node_proof(2);
    let forged = secret("the secret of some other cluster")?.node_proof(2);
    let garbage = v1::RaftEnvelope { data: b"not an envelope".to_vec() };

    phase("without a proof, or with another cluster's, Raft and Join are unauthenticated");
    for (label, headers) in
        [("no proof", vec![]), ("a forged proof", vec![(NODE_PROOF_HEADER, forged)])]
    {
        let channel = wire(&addr, None, &headers)?;
        let answer = RaftClient::new(channel.clone()).append_entries(garbage.clone()).await;
        ensure!(
            matches!(&answer, Err(s) if s.code() == tonic::Code::Unauthenticated
                && s.message().contains(NODE_PROOF_HEADER)),
            "{label}: an append was answered {answer:?}"
        );
        let join = v1::JoinRequest { id: 2, addr: "127.0.0.1:9".into(), ..Default::default() };
        let answer = ClusterClient::new(channel).join(join).await;
        ensure!(
            matches!(&answer, Err(s) if s.code() == tonic::Code::Unauthenticated),
            "{label}: a join was answered {answer:?}"
        );
    }

    phase("with the proof the call reaches the service, which judges the body");
    let proven = wire(&addr, None, &[(NODE_PROOF_HEADER, proof)])?;
    let answer = RaftClient::new(proven.clone()).append_entries(garbage.clone()).await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::InvalidArgument),
        "a proven node's malformed append was answered {answer:?}"
    );

    phase("an append stream: opened only with the proof, each message judged as a call");
    let unproven = wire(&addr, None, &[])?;
    let answer = first_streamed_answer(unproven, garbage.clone()).await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::Unauthenticated),
        "an append stream without a proof was answered {answer:?}"
    );
    let answer = first_streamed_answer(proven.clone(), garbage).await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::InvalidArgument
            && s.message().starts_with("data")),
        "a malformed message on an append stream was answered {answer:?}"
    );
    // Node 2's proof, an append in node 3's name: refused, whatever it says.
    let impostor = openraft::raft::AppendEntriesRequest::<leasehold_raft::TypeConfig> {
        vote: openraft::Vote::new_committed(7, 3),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let impostor = v1::RaftEnvelope { data: serde_json::to_vec(&impostor)? };
    let answer = first_streamed_answer(proven, impostor).await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::PermissionDenied
            && s.message().starts_with("data.vote")),
        "an append in another node's name on a stream was answered {answer:?}"
    );

    phase("a Raft call meant for another node is refused, before its body is read");
    // This node is node 1: the header names whom the sender meant.
    let proof = secret(CLUSTER_SECRET)?.node_proof(2);
    let misrouted =
        wire(&addr, None, &[(NODE_PROOF_HEADER, proof.clone()), (TARGET_NODE_HEADER, "5".into())])?;
    let garbage = v1::RaftEnvelope { data: b"not an envelope".to_vec() };
    fn is_misrouted<T>(answer: &Result<T, tonic::Status>) -> bool {
        matches!(answer, Err(s) if s.code() == tonic::Code::FailedPrecondition
            && s.message().contains(TARGET_NODE_HEADER) && s.message().contains("node 5"))
    }
    let answer = RaftClient::new(misrouted.clone()).append_entries(garbage.clone()).await;
    ensure!(is_misrouted(&answer), "an append meant for node 5 was answered {answer:?}");
    let answer = RaftClient::new(misrouted.clone()).vote(garbage.clone()).await;
    ensure!(is_misrouted(&answer), "a vote request meant for node 5 was answered {answer:?}");
    let answer = RaftClient::new(misrouted.clone()).install_snapshot(garbage.clone()).await;
    ensure!(is_misrouted(&answer), "a snapshot meant for node 5 was answered {answer:?}");
    let answer = first_streamed_answer(misrouted.clone(), garbage.clone()).await;
    ensure!(is_misrouted(&answer), "an append stream meant for node 5 was answered {answer:?}");
    // So are a peer's advert (answered with this node's clock, which the
    // sender would record as node 5's) and bus message, and a cluster
    // call passed on to node 5.
    let mut peer = PeerClient::new(misrouted.clone());
    let answer = peer.advertise(v1::Signed::default()).await;
    ensure!(is_misrouted(&answer), "an advert meant for node 5 was answered {answer:?}");
    let answer = peer.bus(v1::Signed::default()).await;
    ensure!(is_misrouted(&answer), "a bus message meant for node 5 was answered {answer:?}");
    let flags = v1::SetFlagsRequest { id: 1, journal_lease: None, dry_run: None };
    let answer = ClusterClient::new(misrouted).set_flags(flags).await;
    ensure!(is_misrouted(&answer), "flags passed on to node 5 were answered {answer:?}");
    let meant =
        wire(&addr, None, &[(NODE_PROOF_HEADER, proof.clone()), (TARGET_NODE_HEADER, "1".into())])?;
    let answer = RaftClient::new(meant.clone()).append_entries(garbage).await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::InvalidArgument),
        "an append meant for this node was not judged by its body: {answer:?}"
    );

    phase("only the leader may ask for an election without naming itself and its term");
    let campaign = v1::RaftEnvelope { data: b"\"Campaign\"".to_vec() };
    let answer = RaftClient::new(meant).forward(campaign).await;
    ensure!(
        matches!(&answer, Err(s) if s.code() == tonic::Code::PermissionDenied
            && s.message().contains("does not lead")),
        "node 2 (no leader) asking node 1 to campaign was answered {answer:?}"
    );

    phase("a node joining without TLS and without the cluster's secret refuses to start");
    let grpc = format!("127.0.0.1:{}", free_port()?);
    let join = node.grpc.to_string();
    let output =
        refused_start(sandbox, "no-secret", &["--id", "2", "--grpc", &grpc, "--join", &join])
            .await?;
    ensure!(
        output.contains("cluster_secret") && output.contains("cluster-secret"),
        "the refusal does not say how to give the secret: {output:?}"
    );
    Ok(())
}
