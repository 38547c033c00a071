//! openraft's network over turmoil's simulated TCP: [`SimNetwork`] is the
//! `RaftNetworkFactory` of a simulated node, [`serve`] answers its peers.
//!
//! The bytes are leasehold's own Raft envelope (`leasehold_raft::envelope`,
//! the binary layout the nodes speak), one request per connection, framed
//! as a method byte and a big-endian `u32` length; the answer is the
//! envelope of openraft's `Result`, as the gRPC service seals it. What is
//! not the real code here is the gRPC layer itself: openraft's messages do
//! not go through the node's `Raft` service. The replica runtime's calls
//! between nodes (a follower's forwarded writes and read-index requests)
//! do, over turmoil, in [`crate::grpc`].
//!
//! One-way cuts ([`OneWayCuts`]) are made here, per message, not in
//! turmoil: its TCP needs packets both ways to connect, so a one-way
//! partition there fails every exchange on the link in both directions.
//! Here a cut from A to B loses what A sends B and nothing else: A's
//! requests to B never arrive (A times out), and B's requests reach A and
//! take effect there, but A's answers are lost (B times out). That is what
//! a one-way loss does to an exchange over an established connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_raft::envelope::{self, MAX_ENVELOPE_BYTES, Wire};
use leasehold_raft::{NodeId, Raft, TypeConfig};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turmoil::net::{TcpListener, TcpStream};

/// The port every simulated node listens on for its peers.
pub const RAFT_PORT: u16 = 7000;

/// The deadline of one RPC when openraft sets none.
const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(2);

const APPEND: u8 = 1;
const VOTE: u8 = 2;
const SNAPSHOT: u8 = 3;

/// The host name of node `id` in the simulation.
pub fn host_name(id: NodeId) -> String {
    format!("n{id}")
}

/// The links cut in one direction: what a node sends another over a cut
/// link is lost. Shared by every host of a run and the driver that cuts
/// and repairs them; counts what each cut lost.
#[derive(Clone, Debug, Default)]
pub struct OneWayCuts(Arc<Mutex<Cuts>>);

#[derive(Debug, Default)]
struct Cuts {
    cut: BTreeSet<(NodeId, NodeId)>,
    lost: BTreeMap<(NodeId, NodeId), Lost>,
}

/// What a one-way cut lost, in its direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Requests that never reached the peer.
    pub requests: u64,
    /// Answers to requests the peer sent, which took effect here.
    pub answers: u64,
}

impl OneWayCuts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cuts> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cuts (`cut`) or repairs the direction `from` → `to`.
    pub fn set(&self, from: NodeId, to: NodeId, cut: bool) {
        let mut cuts = self.lock();
        if cut {
            cuts.cut.insert((from, to));
        } else {
            cuts.cut.remove(&(from, to));
        }
    }

    /// What was lost so far from `from` to `to`.
    pub fn lost(&self, from: NodeId, to: NodeId) -> Lost {
        self.lock().lost.get(&(from, to)).copied().unwrap_or_default()
    }

    /// Whether a request `from` sends `to` now is lost (and counts it).
    fn loses_request(&self, from: NodeId, to: NodeId) -> bool {
        self.loses(from, to, |lost| lost.requests += 1)
    }

    /// Whether an answer `from` sends `to` now is lost (and counts it).
    fn loses_answer(&self, from: NodeId, to: NodeId) -> bool {
        self.loses(from, to, |lost| lost.answers += 1)
    }

    /// Whether what `from` sends `to` now is lost; `count` records it.
    fn loses(&self, from: NodeId, to: NodeId, count: impl FnOnce(&mut Lost)) -> bool {
        let mut cuts = self.lock();
        let lost = cuts.cut.contains(&(from, to));
        if lost {
            count(cuts.lost.entry((from, to)).or_default());
        }
        lost
    }
}

/// Builds clients to peers; each call dials the peer afresh (simulated
/// connections cost nothing, and a partition then shows on the next call).
#[derive(Clone, Debug)]
pub struct SimNetwork {
    /// The node these clients belong to.
    from: NodeId,
    cuts: OneWayCuts,
}

impl SimNetwork {
    /// Clients of node `from`, whose messages `cuts` may lose.
    pub fn new(from: NodeId, cuts: OneWayCuts) -> Self {
        SimNetwork { from, cuts }
    }
}

/// A client for one peer.
#[derive(Debug)]
pub struct SimPeer {
    from: NodeId,
    target: NodeId,
    cuts: OneWayCuts,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = SimPeer;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> SimPeer {
        SimPeer { from: self.from, target, cuts: self.cuts.clone() }
    }
}

async fn write_frame(
    stream: &mut TcpStream,
    method: Option<(u8, NodeId)>,
    bytes: &[u8],
) -> std::io::Result<()> {
    let length = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    if let Some((method, from)) = method {
        stream.write_u8(method).await?;
        stream.write_u64(from).await?;
    }
    stream.write_u32(length).await?;
    stream.write_all(bytes).await?;
    stream.flush().await
}

async fn read_body(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let length = stream.read_u32().await? as usize;
    if length > MAX_ENVELOPE_BYTES {
        return Err(std::io::Error::other(format!("frame of {length} bytes is too large")));
    }
    let mut bytes = vec![0; length];
    stream.read_exact(&mut bytes).await?;
    Ok(bytes)
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl SimPeer {
    async fn call<Req, Resp, E>(
        &self,
        method: u8,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let data = envelope::encode_as(Wire::Binary, request)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let ttl = option.hard_ttl();
        let ttl = if ttl.is_zero() { DEFAULT_RPC_TIMEOUT } else { ttl };
        let exchange = async {
            if self.cuts.loses_request(self.from, self.target) {
                // The request is lost on the way: nothing comes back.
                std::future::pending::<()>().await;
            }
            let mut stream = TcpStream::connect((host_name(self.target), RAFT_PORT)).await?;
            write_frame(&mut stream, Some((method, self.from)), &data).await?;
            read_body(&mut stream).await
        };
        let reply = match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => return Err(RPCError::Unreachable(Unreachable::new(&error))),
            Err(elapsed) => return Err(RPCError::Unreachable(Unreachable::new(&elapsed))),
        };
        let answer: Result<Resp, E> =
            envelope::decode(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for SimPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.call(APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.call(SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(VOTE, &rpc, &option).await
    }
}

/// Answers peers' RPCs with node `id`'s `raft` until the host is crashed
/// (turmoil then drops this future with the host's runtime); an answer to
/// a peer that `cuts` cuts `id` off from is lost.
pub async fn serve(id: NodeId, raft: Raft, cuts: OneWayCuts) -> std::io::Result<()> {
    let listener = TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, RAFT_PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (raft, cuts) = (raft.clone(), cuts.clone());
        // Each exchange owns its connection and ends with it.
        tokio::spawn(async move {
            if let Err(error) = answer(id, stream, raft, cuts).await {
                tracing::debug!(%error, "simulated peer exchange failed");
            }
        });
    }
}

async fn answer(
    id: NodeId,
    mut stream: TcpStream,
    raft: Raft,
    cuts: OneWayCuts,
) -> std::io::Result<()> {
    let method = stream.read_u8().await?;
    let from = stream.read_u64().await?;
    let body = read_body(&mut stream).await?;
    let bad = |e: envelope::EnvelopeError| std::io::Error::other(e.to_string());
    let reply = match method {
        APPEND => {
            let rpc: AppendEntriesRequest<TypeConfig> = envelope::decode(&body).map_err(bad)?;
            envelope::encode_as(Wire::Binary, &raft.append_entries(rpc).await)
        }
        VOTE => {
            let rpc: VoteRequest<NodeId> = envelope::decode(&body).map_err(bad)?;
            envelope::encode_as(Wire::Binary, &raft.vote(rpc).await)
        }
        SNAPSHOT => {
            let rpc: InstallSnapshotRequest<TypeConfig> = envelope::decode(&body).map_err(bad)?;
            envelope::encode_as(Wire::Binary, &raft.install_snapshot(rpc).await)
        }
        other => return Err(std::io::Error::other(format!("unknown method {other}"))),
    }
    .map_err(bad)?;
    if cuts.loses_answer(id, from) {
        // The request took effect; its answer is lost on the way back, and
        // the caller's deadline ends the exchange first.
        tokio::time::sleep(DEFAULT_RPC_TIMEOUT).await;
        return Ok(());
    }
    write_frame(&mut stream, None, &reply).await
}
