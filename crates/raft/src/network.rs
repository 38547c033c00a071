//! The Raft network over tonic: openraft's requests travel to peers as a
//! serde (JSON) envelope inside the small `RaftEnvelope` proto message, on the
//! peer's public gRPC port.
//!
//! One channel per peer address is created lazily and reused for every RPC
//! (openraft asks the factory for a client often, e.g. on every linearizable
//! read), and every call carries the deadline openraft gives it.
//!
//! Every channel a node opens to a peer carries the node's credentials
//! ([`PeerSecurity`]): with TLS, its node certificate (and it accepts only
//! a peer whose certificate names a node); without TLS, its node proof on
//! every call. The same channels serve forwarded writes, status fan-out and
//! adverts, so every internal call a node makes is a node's call.
//!
//! The connections under the channels are the operating system's TCP,
//! unless a [`Connector`] is given ([`NetworkFactory::with_connector`]):
//! then every channel dials through it, so a simulation can carry the
//! same gRPC calls over its own simulated network. The node never sets
//! one.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use leasehold_proto::v1::RaftEnvelope;
use leasehold_proto::v1::raft_client::RaftClient;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Uri};

use leasehold_security::secret::{NODE_PROOF_HEADER, TARGET_NODE_HEADER};

use crate::envelope;
use crate::stream::Links;
use crate::types::{NodeId, TypeConfig};

/// How long a connection attempt to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 keepalive, so a silent peer is noticed even between RPCs.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Deadline when openraft does not give one.
const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(2);

/// How a node proves itself to its peers.
#[derive(Clone, Default)]
pub struct PeerSecurity {
    /// TLS: the node's certificate as client identity, and the verifier
    /// that accepts only node certificates from the cluster's CA.
    pub tls: Option<PeerTls>,
    /// The node proof sent on every call (needed without TLS; harmless with).
    pub node_proof: Option<AsciiMetadataValue>,
}

/// The TLS half of [`PeerSecurity`].
#[derive(Clone)]
pub struct PeerTls {
    /// The client side: the node certificate as identity.
    pub config: ClientTlsConfig,
    /// Checks the peer's certificate (CA, address, and that it names a node).
    pub verifier: Arc<dyn rustls::client::danger::ServerCertVerifier>,
}

/// Adds the node proof to every call on a peer channel.
#[derive(Clone)]
pub struct NodeProof(Option<AsciiMetadataValue>);

impl Interceptor for NodeProof {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(proof) = &self.0 {
            request.metadata_mut().insert(NODE_PROOF_HEADER, proof.clone());
        }
        Ok(request)
    }
}

/// A channel to a peer that carries this node's credentials.
pub type PeerChannel = InterceptedService<Channel, NodeProof>;

/// Told how long each AppendEntries round trip that carried entries took
/// (the replication stage of a commit round; heartbeats are left out).
pub type ReplicationObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// A byte stream to a peer, as a [`Connector`] opens it: any tokio
/// reader and writer (a simulated TCP stream, say). The channel speaks
/// HTTP/2 over it, and TLS first when the factory has TLS.
pub trait PeerStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerStream for T {}

/// Opening one connection to a peer: its stream, or why it failed (the
/// channel then answers the call UNAVAILABLE and dials again on the next).
pub type PeerDial = Pin<Box<dyn Future<Output = std::io::Result<Box<dyn PeerStream>>> + Send>>;

/// Opens the connections of every peer channel in place of the operating
/// system's TCP. It is given the peer's URI (`http://host:port`, the
/// member's address) each time a channel (re)connects. The channel's
/// connect timeout still bounds it.
pub type Connector = Arc<dyn Fn(Uri) -> PeerDial + Send + Sync>;

/// Builds peer clients; keeps one channel per peer address.
#[derive(Clone, Default)]
pub struct NetworkFactory {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    security: Arc<RwLock<PeerSecurity>>,
    local_address: Option<IpAddr>,
    /// Dials peers instead of the OS's TCP when set (a simulation's).
    connector: Option<Connector>,
    wires: envelope::PeerWires,
    replication: Arc<std::sync::OnceLock<ReplicationObserver>>,
    ahead: Arc<AheadAnswers>,
    links: Arc<Links>,
}

impl NetworkFactory {
    /// A factory with no channels yet and no credentials (tests).
    pub fn new() -> Self {
        Self::default()
    }

    /// A factory whose connections carry `security` and leave from
    /// `local_address`, so a peer (or a test proxy in front of it) can tell
    /// which node is calling.
    pub fn with_security(security: PeerSecurity, local_address: Option<IpAddr>) -> Self {
        NetworkFactory {
            local_address,
            security: Arc::new(RwLock::new(security)),
            channels: Arc::default(),
            connector: None,
            wires: envelope::PeerWires::default(),
            replication: Arc::default(),
            ahead: Arc::default(),
            links: Arc::default(),
        }
    }

    /// This factory, with every channel it makes from now on dialled
    /// through `connector` rather than the operating system's TCP (which
    /// also makes the local address moot). Credentials, the connect
    /// timeout and the HTTP/2 keepalives are the same either way; the TCP
    /// settings (no delay, TCP keepalive) are the connector's to make.
    pub fn with_connector(mut self, connector: Connector) -> Self {
        self.connector = Some(connector);
        self
    }

    /// Sets who hears the replication round trips of every client this
    /// factory (and its clones) made or will make; the first call wins.
    pub fn observe_replication(&self, observer: ReplicationObserver) {
        let _ = self.replication.set(observer);
    }

    /// The answers of the messages replication ahead sent (see
    /// [`crate::ahead`]), shared by every client of this factory.
    pub fn ahead_answers(&self) -> &AheadAnswers {
        &self.ahead
    }

    /// How many append streams this factory opened to its peers, each
    /// reconnection counted (see [`crate::stream`]).
    pub fn append_streams_opened(&self) -> u64 {
        self.links.opened()
    }

    /// The envelope layout each peer reads, kept current from its adverts;
    /// every client of this factory sends by it.
    pub fn wires(&self) -> &envelope::PeerWires {
        &self.wires
    }

    /// Replaces the credentials (rotated certificates) and drops every
    /// cached channel, so the next call to each peer dials with them.
    pub fn set_security(&self, security: PeerSecurity) {
        match self.security.write() {
            Ok(mut guard) => *guard = security,
            Err(poisoned) => *poisoned.into_inner() = security,
        }
        match self.channels.lock() {
            Ok(mut guard) => guard.clear(),
            Err(poisoned) => poisoned.into_inner().clear(),
        }
        self.links.close_all();
    }

    fn security(&self) -> PeerSecurity {
        match self.security.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The cached channel to `addr`, created lazily (no IO here).
    pub fn channel(&self, addr: &str) -> Result<PeerChannel, tonic::transport::Error> {
        let security = self.security();
        let proof = NodeProof(security.node_proof.clone());
        let mut channels = match self.channels.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(channel) = channels.get(addr) {
            return Ok(InterceptedService::new(channel.clone(), proof));
        }
        let endpoint = endpoint(addr, security.tls.as_ref())?;
        let channel = match &self.connector {
            Some(connector) => endpoint.connect_with_connector_lazy(dial(connector.clone())),
            None => endpoint.local_address(self.local_address).connect_lazy(),
        };
        channels.insert(addr.to_string(), channel.clone());
        Ok(InterceptedService::new(channel, proof))
    }
}

/// `connector` as the service a channel dials with
/// ([`Endpoint::connect_with_connector_lazy`]): hyper reads and writes the
/// stream through its tokio adapter. The peer channels use it; so can a
/// client's channels to a simulated node.
pub fn dial(
    connector: Connector,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<Box<dyn PeerStream>>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<Box<dyn PeerStream>>>> + Send,
> + Send
+ 'static {
    tower::service_fn(move |uri: Uri| {
        let opening = connector(uri);
        async move { opening.await.map(TokioIo::new) }
    })
}

/// An endpoint for a peer's gRPC address (`host:port` or a URL), with the
/// connection timeouts and keepalives every peer link uses, and TLS when
/// `tls` is given (the address is then dialled as `https://`, whatever
/// scheme it was written with).
pub fn endpoint(addr: &str, tls: Option<&PeerTls>) -> Result<Endpoint, tonic::transport::Error> {
    let host_port = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{host_port}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_INTERVAL)
        .keep_alive_while_idle(true);
    match tls {
        Some(tls) => endpoint.tls_config_with_verifier(tls.config.clone(), tls.verifier.clone()),
        None => Ok(endpoint),
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            wires: self.wires.clone(),
            replication: self.replication.clone(),
            ahead: self.ahead.clone(),
            factory: self.clone(),
        }
    }
}

/// What an AppendEntries sent ahead carried: enough to tell whether a
/// request of openraft's is the same message.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AheadKey {
    vote: Vote<NodeId>,
    prev_log_id: Option<LogId<NodeId>>,
    entries: Vec<LogId<NodeId>>,
}

impl AheadKey {
    fn of(rpc: &AppendEntriesRequest<TypeConfig>) -> AheadKey {
        AheadKey {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            entries: rpc.entries.iter().map(|entry| entry.log_id).collect(),
        }
    }
}

/// The last message replication ahead sent each follower, and how to
/// learn its answer: whether the follower took it (answered `Success`,
/// which openraft's follower does only once the entries are synced).
struct AheadSent {
    key: AheadKey,
    answer: tokio::sync::oneshot::Receiver<bool>,
}

/// What the network knows of one follower for replication ahead.
#[derive(Default)]
struct Follower {
    /// The message sent ahead last, until taken or stale.
    sent: Option<AheadSent>,
    /// The newest commit index a message of openraft's brought it, as
    /// far as the network saw it taken (with its vote).
    committed: Option<(Vote<NodeId>, Option<LogId<NodeId>>)>,
}

/// The answers of the messages sent ahead, one per follower (the last
/// one sent to it), for openraft's replication stream to take as the
/// answer to the same message (see [`crate::ahead`]).
#[derive(Default)]
pub struct AheadAnswers {
    followers: Mutex<HashMap<NodeId, Follower>>,
    taken: std::sync::atomic::AtomicU64,
}

impl AheadAnswers {
    /// Notes that `rpc` is being sent ahead to `target`; the returned
    /// sender is told whether the follower took it. Replaces what was
    /// noted for `target` before.
    pub(crate) fn sending(
        &self,
        target: NodeId,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) -> tokio::sync::oneshot::Sender<bool> {
        let (answered, answer) = tokio::sync::oneshot::channel();
        let sent = AheadSent { key: AheadKey::of(rpc), answer };
        self.lock().entry(target).or_default().sent = Some(sent);
        answered
    }

    /// The answer to come for `target` if the message sent ahead to it
    /// last is `rpc` (same vote, same entry before, same entries' log
    /// ids); it is handed out once. A noted message that `rpc` shows to
    /// be stale (another vote, or entries up to or past its own) is
    /// dropped; one still ahead of `rpc` is kept for its own request.
    fn take(
        &self,
        target: NodeId,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) -> Option<tokio::sync::oneshot::Receiver<bool>> {
        let mut followers = self.lock();
        let follower = followers.get_mut(&target)?;
        let noted = &follower.sent.as_ref()?.key;
        let same = noted.vote == rpc.vote
            && noted.prev_log_id == rpc.prev_log_id
            && noted.entries.len() == rpc.entries.len()
            && noted.entries.iter().zip(&rpc.entries).all(|(id, entry)| *id == entry.log_id);
        let ahead_of_rpc = noted.vote == rpc.vote
            && noted.entries.last().map(|id| id.index)
                > rpc.entries.last().map(|entry| entry.log_id.index);
        if same || !ahead_of_rpc {
            return follower.sent.take().filter(|_| same).map(|sent| sent.answer);
        }
        None
    }

    /// Notes that `target` took a message of openraft's carrying
    /// `leader_commit` under `vote`.
    fn committed(&self, target: NodeId, vote: Vote<NodeId>, leader_commit: Option<LogId<NodeId>>) {
        let mut followers = self.lock();
        let follower = followers.entry(target).or_default();
        if is_news(follower.committed, vote, leader_commit) {
            follower.committed = Some((vote, leader_commit));
        }
    }

    /// Whether `leader_commit` under `vote` is newer than any commit
    /// index `target` is known to have been brought.
    fn commit_is_news(
        &self,
        target: NodeId,
        vote: Vote<NodeId>,
        leader_commit: Option<LogId<NodeId>>,
    ) -> bool {
        let known = self.lock().get(&target).and_then(|follower| follower.committed);
        is_news(known, vote, leader_commit)
    }

    /// How many of openraft's AppendEntries were answered by a message
    /// sent ahead, so never sent themselves.
    pub fn taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Follower>> {
        self.followers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `leader_commit` under `vote` is more than `known`, the commit
/// index (and its vote) a follower is known to have been brought.
fn is_news(
    known: Option<(Vote<NodeId>, Option<LogId<NodeId>>)>,
    vote: Vote<NodeId>,
    leader_commit: Option<LogId<NodeId>>,
) -> bool {
    match known {
        Some((known_vote, known)) => known_vote != vote || leader_commit > known,
        None => leader_commit.is_some(),
    }
}

/// Whether an answer to a message sent ahead is one openraft's request for
/// the same entries may take: only `Success`. A conflict, a newer vote or
/// an error is left for openraft's own message to meet.
pub(crate) fn took_ahead(
    answer: &RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>>,
) -> bool {
    matches!(answer, Ok(AppendEntriesResponse::Success))
}

/// A client for one peer.
pub struct PeerClient {
    target: NodeId,
    addr: String,
    wires: envelope::PeerWires,
    replication: Arc<std::sync::OnceLock<ReplicationObserver>>,
    ahead: Arc<AheadAnswers>,
    /// Its append streams (shared by every client of the factory), and
    /// where a new one takes its channel from.
    factory: NetworkFactory,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        // The channel of the credentials now in force, every call: openraft
        // keeps a client (its snapshot client above all) for as long as the
        // leader and membership stay, across certificate rotations, and a
        // channel made with the old credentials redials with them.
        let Ok(channel) = self.factory.channel(&self.addr) else {
            let problem = std::io::Error::other(format!(
                "bad address {} for node {}",
                self.addr, self.target
            ));
            return Err(RPCError::Unreachable(Unreachable::new(&problem)));
        };
        let wire = self.wires.of(self.target);
        let data = envelope::encode_as(wire, request)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let ttl = option.hard_ttl();
        let deadline = if ttl.is_zero() { DEFAULT_RPC_TIMEOUT } else { ttl };
        let streamed = matches!(method, Method::Append)
            && self.wires.streams(self.target)
            && self.factory.links.streaming(self.target);
        let reply = if streamed {
            let started = std::time::Instant::now();
            // A new stream goes on the channel of the credentials now in
            // force.
            let current = || self.factory.channel(&self.addr).ok();
            match self.factory.links.call(self.target, &self.addr, current, data, deadline).await {
                // A follower of an earlier build: this message goes unary,
                // in what is left of its deadline.
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    let left = deadline.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Err(RPCError::Network(NetworkError::new(&status)));
                    }
                    let data = envelope::encode_as(wire, request)
                        .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                    unary(channel, self.target, method, data, left).await
                }
                reply => reply,
            }
        } else {
            unary(channel, self.target, method, data, deadline).await
        };
        let reply = reply.map_err(|status| match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                RPCError::Unreachable(Unreachable::new(&status))
            }
            _ => RPCError::Network(NetworkError::new(&status)),
        })?;
        let answer: Result<Resp, E> =
            envelope::decode(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e)))
    }
}

impl PeerClient {
    /// Whether the follower already took `rpc`, sent ahead (see
    /// [`crate::ahead`]): it waits for that message's answer, for half
    /// the call's deadline at most. `false` when no such message was sent, or it
    /// failed, was refused or did not answer in time: then `rpc` is sent
    /// as usual.
    async fn answered_ahead(
        &self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> bool {
        if rpc.entries.is_empty() {
            return false;
        }
        let Some(answer) = self.ahead.take(self.target, rpc) else {
            return false;
        };
        // Half the call's deadline at most, so the request itself can
        // still go out in time when the answer is late.
        let ttl = option.hard_ttl();
        let wait = if ttl.is_zero() { DEFAULT_RPC_TIMEOUT } else { ttl } / 2;
        let took = matches!(tokio::time::timeout(wait, answer).await, Ok(Ok(true)));
        if took {
            self.ahead.taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        took
    }

    /// The answer to `rpc` once the follower took its entries sent ahead:
    /// `Success`, after bringing the follower `rpc`'s commit index when
    /// no message of openraft's brought it yet (the message sent ahead
    /// carries none, and openraft may have folded the heartbeat that
    /// would have into `rpc`). That takes a message without entries,
    /// after the last of `rpc`'s; a newer vote in its answer is passed on,
    /// anything else leaves the commit index to openraft's next message.
    async fn bring_commit(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        if !self.ahead.commit_is_news(self.target, rpc.vote, rpc.leader_commit) {
            return Ok(AppendEntriesResponse::Success);
        }
        let commit = AppendEntriesRequest::<TypeConfig> {
            vote: rpc.vote,
            prev_log_id: rpc.entries.last().map(|entry| entry.log_id),
            leader_commit: rpc.leader_commit,
            entries: Vec::new(),
        };
        let answer: RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
            self.call(Method::Append, &commit, option).await;
        if matches!(answer, Ok(AppendEntriesResponse::Success)) {
            self.ahead.committed(self.target, rpc.vote, rpc.leader_commit);
        }
        Ok(commit_answer(answer))
    }

    /// Sends an AppendEntries that openraft's replication stream did not
    /// ask for (see [`crate::ahead`]): its round trip is not a replication
    /// stage, so no observer hears it.
    pub(crate) async fn append_ahead(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.call(Method::Append, rpc, option).await
    }
}

/// What openraft is told of an append whose entries the follower took
/// when they were sent ahead, from the answer to the message that then
/// brought it the commit index. A newer vote is passed on, and so is a
/// follower that no longer holds the entries after all (a conflict: told
/// `Success`, openraft would count entries the follower lacks). A failed
/// message loses only the commit index, which openraft's next brings.
fn commit_answer(
    answer: RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>>,
) -> AppendEntriesResponse<NodeId> {
    match answer {
        Ok(refused @ (AppendEntriesResponse::HigherVote(_) | AppendEntriesResponse::Conflict)) => {
            refused
        }
        Ok(AppendEntriesResponse::PartialSuccess(matching)) => {
            AppendEntriesResponse::PartialSuccess(matching)
        }
        Ok(AppendEntriesResponse::Success) | Err(_) => AppendEntriesResponse::Success,
    }
}

/// One message to `target` as its own gRPC call, with `deadline`.
async fn unary(
    channel: PeerChannel,
    target: NodeId,
    method: Method,
    data: Vec<u8>,
    deadline: Duration,
) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::Request::new(RaftEnvelope { data });
    grpc.set_timeout(deadline);
    addressed_to(&mut grpc, target);
    let mut client = RaftClient::new(channel)
        .max_decoding_message_size(envelope::MAX_ENVELOPE_BYTES)
        .max_encoding_message_size(envelope::MAX_ENVELOPE_BYTES);
    let reply = match method {
        Method::Append => client.append_entries(grpc).await,
        Method::Vote => client.vote(grpc).await,
        Method::Snapshot => client.install_snapshot(grpc).await,
    };
    reply.map(|reply| reply.into_inner().data)
}

/// Names `target` as the node `request` is meant for
/// ([`TARGET_NODE_HEADER`]), which refuses it if it is another.
pub(crate) fn addressed_to<T>(request: &mut tonic::Request<T>, target: NodeId) {
    request.metadata_mut().insert(TARGET_NODE_HEADER, AsciiMetadataValue::from(target));
}

#[derive(Clone, Copy)]
enum Method {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let carries_entries = !rpc.entries.is_empty();
        let started = std::time::Instant::now();
        let answer = if self.answered_ahead(&rpc, &option).await {
            self.bring_commit(&rpc, &option).await
        } else {
            let answer = self.call(Method::Append, &rpc, &option).await;
            if matches!(
                answer,
                Ok(AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_))
            ) {
                self.ahead.committed(self.target, rpc.vote, rpc.leader_commit);
            }
            answer
        };
        if carries_entries
            && answer.is_ok()
            && let Some(observe) = self.replication.get()
        {
            observe(started.elapsed());
        }
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.call(Method::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(Method::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hosts and ports a test's connector was asked to dial.
    type Dialled = Arc<Mutex<Vec<(String, Option<u16>)>>>;

    /// A connector that notes each host and port it is asked to dial and
    /// fails to connect.
    fn refusing(asked: Dialled) -> Connector {
        Arc::new(move |uri: Uri| {
            let dialled = (uri.host().unwrap_or_default().to_string(), uri.port_u16());
            asked.lock().expect("the test's lock is never poisoned").push(dialled);
            Box::pin(async { Err(std::io::Error::other("refused by the test's connector")) })
        })
    }

    #[test]
    fn a_conflict_after_entries_sent_ahead_is_not_reported_as_success() {
        let vote = Vote::new_committed(3, 1);
        let answer = |reply| commit_answer(Ok(reply));
        assert_eq!(answer(AppendEntriesResponse::Conflict), AppendEntriesResponse::Conflict);
        assert_eq!(
            answer(AppendEntriesResponse::HigherVote(vote)),
            AppendEntriesResponse::HigherVote(vote)
        );
        assert_eq!(answer(AppendEntriesResponse::Success), AppendEntriesResponse::Success);
        // A failed commit message: the entries were taken, only the
        // commit index waits for openraft's next message.
        let lost = std::io::Error::other("the stream closed");
        let failed = commit_answer(Err(RPCError::Unreachable(Unreachable::new(&lost))));
        assert_eq!(failed, AppendEntriesResponse::Success);
    }

    fn append(vote: Vote<NodeId>, prev: u64, indexes: &[u64]) -> AppendEntriesRequest<TypeConfig> {
        let log_id = |index| LogId::new(openraft::CommittedLeaderId::new(3, 1), index);
        AppendEntriesRequest {
            vote,
            prev_log_id: Some(log_id(prev)),
            entries: indexes
                .iter()
                .map(|&index| openraft::Entry {
                    log_id: log_id(index),
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: None,
        }
    }

    #[tokio::test]
    async fn only_the_same_message_takes_an_answer_sent_ahead_and_only_once() {
        let answers = AheadAnswers::default();
        let vote = Vote::new_committed(3, 1);
        let sent = append(vote, 9, &[10, 11]);
        // Another follower, another vote, another entry before, other
        // entries: none is the message sent ahead. A request for entries
        // before the noted ones leaves them for their own request; one
        // up to or past them, or of another vote, shows them stale.
        let other_vote = Vote::new_committed(4, 2);
        for (target, request, kept) in [
            (3, append(vote, 9, &[10, 11]), true),
            (2, append(vote, 9, &[10]), true),
            (2, append(vote, 8, &[9]), true),
            (2, append(other_vote, 9, &[10, 11]), false),
            (2, append(vote, 8, &[9, 10, 11]), false),
            (2, append(vote, 9, &[10, 11, 12]), false),
            (2, append(vote, 11, &[12]), false),
        ] {
            let _answered = answers.sending(2, &sent);
            assert!(answers.take(target, &request).is_none(), "{request:?}");
            let left = answers.take(2, &sent).is_some();
            assert_eq!(left, kept, "after {request:?}");
        }
        let answered = answers.sending(2, &sent);
        let answer = answers.take(2, &sent).expect("the same message");
        assert!(answers.take(2, &sent).is_none(), "handed out twice");
        assert!(answered.send(true).is_ok());
        assert_eq!(answer.await, Ok(true));
    }

    #[test]
    fn only_a_success_ahead_is_taken() {
        let refused: RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
            Err(RPCError::Unreachable(Unreachable::new(&std::io::Error::other("down"))));
        assert!(took_ahead(&Ok(AppendEntriesResponse::Success)));
        assert!(!took_ahead(&Ok(AppendEntriesResponse::Conflict)));
        assert!(!took_ahead(&Ok(AppendEntriesResponse::HigherVote(Vote::new(4, 2)))));
        assert!(!took_ahead(&Ok(AppendEntriesResponse::PartialSuccess(None))));
        assert!(!took_ahead(&refused));
    }

    #[tokio::test]
    async fn a_taken_answer_brings_a_commit_index_the_follower_lacks() {
        let asked = Dialled::default();
        let mut factory = NetworkFactory::new().with_connector(refusing(asked.clone()));
        let vote = Vote::new_committed(3, 1);
        let mut rpc = append(vote, 9, &[10]);
        rpc.leader_commit = Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 9));
        let option = RPCOption::new(Duration::from_secs(1));
        let dialled = || asked.lock().expect("the test's lock is never poisoned").len();
        // Commit 9 is news to the follower: a message without entries
        // goes out for it (and meets the refusing connector, which leaves
        // the entries' answer as it was).
        let answered = factory.ahead_answers().sending(2, &rpc);
        let mut client = factory.new_client(2, &BasicNode::new("peer-2:7001")).await;
        assert!(answered.send(true).is_ok());
        let answer = client.append_entries(rpc.clone(), option.clone()).await;
        assert!(matches!(answer, Ok(AppendEntriesResponse::Success)), "{answer:?}");
        assert_eq!(dialled(), 1);
        // Once a message brought it, nothing goes out.
        factory.ahead_answers().committed(2, vote, rpc.leader_commit);
        let answered = factory.ahead_answers().sending(2, &rpc);
        assert!(answered.send(true).is_ok());
        let answer = client.append_entries(rpc.clone(), option.clone()).await;
        assert!(matches!(answer, Ok(AppendEntriesResponse::Success)), "{answer:?}");
        assert_eq!((dialled(), factory.ahead_answers().taken()), (1, 2));
    }

    #[tokio::test]
    async fn a_request_is_sent_when_its_copy_sent_ahead_was_not_taken_or_has_no_entries() {
        let asked = Dialled::default();
        let mut factory = NetworkFactory::new().with_connector(refusing(asked.clone()));
        let vote = Vote::new_committed(3, 1);
        let rpc = append(vote, 9, &[10]);
        let option = RPCOption::new(Duration::from_secs(1));
        for took in [false, true] {
            let answered = factory.ahead_answers().sending(2, &rpc);
            let mut client = factory.new_client(2, &BasicNode::new("peer-2:7001")).await;
            assert!(answered.send(took).is_ok());
            let answer = client.append_entries(rpc.clone(), option.clone()).await;
            let sent = asked.lock().expect("the test's lock is never poisoned").len();
            if took {
                // The follower took it: its answer is openraft's, and
                // nothing more went out.
                assert!(matches!(answer, Ok(AppendEntriesResponse::Success)), "{answer:?}");
                assert_eq!((sent, factory.ahead_answers().taken()), (1, 1));
            } else {
                // Refused or failed ahead: the request goes out itself
                // (and here meets the refusing connector).
                assert!(matches!(answer, Err(RPCError::Unreachable(_))), "{answer:?}");
                assert_eq!((sent, factory.ahead_answers().taken()), (1, 0));
            }
        }
        // A heartbeat never takes an answer, and a message whose answer
        // will never come (its sender gone) is sent.
        let heartbeat = append(vote, 10, &[]);
        let _answered = factory.ahead_answers().sending(2, &heartbeat);
        let mut client = factory.new_client(2, &BasicNode::new("peer-2:7001")).await;
        assert!(client.append_entries(heartbeat, option.clone()).await.is_err());
        drop(factory.ahead_answers().sending(2, &rpc));
        assert!(client.append_entries(rpc, option).await.is_err());
        let sent = asked.lock().expect("the test's lock is never poisoned").len();
        assert_eq!((sent, factory.ahead_answers().taken()), (3, 1));
    }

    #[tokio::test]
    async fn a_channel_dials_through_the_injected_connector() {
        let asked = Dialled::default();
        let mut factory = NetworkFactory::new().with_connector(refusing(asked.clone()));
        let mut client = factory.new_client(2, &BasicNode::new("peer-2:7001")).await;
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        let answer = client.vote(vote, RPCOption::new(Duration::from_secs(1))).await;
        // The connector's failure is the call's: the peer is unreachable,
        // and nothing went out over the operating system's network.
        assert!(matches!(answer, Err(RPCError::Unreachable(_))), "{answer:?}");
        let asked = asked.lock().expect("the test's lock is never poisoned").clone();
        assert_eq!(asked, vec![("peer-2".to_string(), Some(7001))]);
    }

    /// After a rotation a client openraft made before it calls on a
    /// channel of the new credentials, not on one it kept: the factory
    /// drops its channels on `set_security`, and a call must make a new one.
    #[tokio::test]
    async fn a_client_made_before_a_rotation_calls_with_the_new_credentials() {
        let asked = Dialled::default();
        let mut factory = NetworkFactory::new().with_connector(refusing(asked));
        let mut client = factory.new_client(2, &BasicNode::new("peer-2:7001")).await;
        let cached = |factory: &NetworkFactory| {
            factory.channels.lock().expect("the test's lock is never poisoned").len()
        };
        factory.set_security(PeerSecurity {
            tls: None,
            node_proof: Some(AsciiMetadataValue::from_static("rotated")),
        });
        assert_eq!(cached(&factory), 0, "the rotation dropped every channel");
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        let answer = client.vote(vote, RPCOption::new(Duration::from_secs(1))).await;
        assert!(matches!(answer, Err(RPCError::Unreachable(_))), "{answer:?}");
        assert_eq!(cached(&factory), 1, "the call made a channel with the new credentials");
    }
}
