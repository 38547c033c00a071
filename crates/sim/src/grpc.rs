//! The node's own gRPC between simulated hosts: tonic over turmoil's
//! simulated TCP. [`peers`] is a node's peer network
//! (`leasehold_raft::NetworkFactory`) dialling through [`connector`];
//! [`serve_raft`] answers the real `leasehold.v1.Raft` service
//! (`leasehold_server::raft_service::RaftService`) behind the node's own
//! auth layer on [`GRPC_PORT`], and [`serve`] the real `leasehold.v1.Peer`
//! service of a host's gate beside it (adverts and bus messages).
//!
//! A follower's `Journal` built on [`peers`] forwards writes and
//! read-index requests to the leader as a node does: the same envelope,
//! the same `Raft.Forward` call, the same handler behind the same auth
//! layer. The bytes travel over turmoil instead of the operating system,
//! and the server here leaves out the node's per-call deadline, stream
//! and header limits and request size layer.
//!
//! Security is a node's without TLS: every host holds the same cluster
//! secret ([`cluster_secret`]), its channels carry its node proof, and the
//! server's auth layer admits a call only with a valid one, as on a real
//! node with no TLS and no tokens file. Nothing here weakens that check.
//!
//! Openraft's own messages still travel on the simulation's framing
//! ([`crate::net`]) on [`crate::net::RAFT_PORT`]; this port carries the
//! node-to-node calls of the replica runtime.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use leasehold_client::Client;
use leasehold_proto::v1::peer_server::PeerServer;
use leasehold_proto::v1::queue_server::QueueServer;
use leasehold_proto::v1::raft_server::RaftServer;
use leasehold_raft::network::{Connector, PeerSecurity, PeerStream, dial};
use leasehold_raft::{NetworkFactory, NodeId};
use leasehold_replica::{Gate, Journal};
use leasehold_security::ClusterSecret;
use leasehold_security::secret::NODE_PROOF_HEADER;
use leasehold_server::auth::{AuthConfig, AuthLayer};
use leasehold_server::incoming::ConnectionInfo;
use leasehold_server::limits::{
    MAX_QUEUE_REQUEST_BYTES, MAX_QUEUE_RESPONSE_BYTES, MAX_RAFT_MESSAGE_BYTES,
    MAX_SMALL_REQUEST_BYTES,
};
use leasehold_server::peer_service::PeerService;
use leasehold_server::queue_service::QueueService;
use leasehold_server::raft_service::RaftService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Uri;
use tonic::transport::server::Connected;
use turmoil::net::{TcpListener, TcpStream};

use crate::net::host_name;

/// The port every simulated host serves its gRPC on (not the simulated
/// Raft network's [`crate::net::RAFT_PORT`]).
pub const GRPC_PORT: u16 = 7001;

/// The text of the cluster secret every simulated host shares. Fixed, so
/// node proofs are the same in every run of a seed.
const CLUSTER_SECRET_TEXT: &str = "the simulated cluster's shared secret";

/// Why the simulated gRPC could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// The cluster secret was refused.
    #[error(transparent)]
    Secret(#[from] leasehold_security::secret::SecretError),
    /// A node proof is not a valid header value.
    #[error("node proof of node {node}: {source}")]
    NodeProof {
        /// The node.
        node: NodeId,
        /// Why it is not a header value.
        #[source]
        source: tonic::metadata::errors::InvalidMetadataValue,
    },
    /// The listener could not be bound.
    #[error("binding the gRPC port: {0}")]
    Bind(#[source] io::Error),
    /// tonic's server failed.
    #[error("serving gRPC: {0}")]
    Serve(#[source] tonic::transport::Error),
    /// A client could not be built.
    #[error("client of node {node}: {source}")]
    Client {
        /// The node.
        node: NodeId,
        /// Why.
        #[source]
        source: leasehold_client::ClientError,
    },
}

/// Node `id`'s gRPC address, as its member entry names it (`n1:7001`):
/// what a follower's journal dials when it forwards to that node.
pub fn grpc_address(id: NodeId) -> String {
    format!("{}:{GRPC_PORT}", host_name(id))
}

/// The cluster secret every simulated host holds.
pub fn cluster_secret() -> Result<ClusterSecret, GrpcError> {
    Ok(ClusterSecret::from_text(CLUSTER_SECRET_TEXT)?)
}

/// Dials a peer's URI (`http://n2:7001`) over turmoil's TCP, from the
/// host whose runtime makes the call.
pub fn connector() -> Connector {
    Arc::new(|uri: Uri| {
        Box::pin(async move {
            let Some(host) = uri.host() else {
                let problem = format!("no host in the peer address {uri}");
                return Err(io::Error::new(io::ErrorKind::InvalidInput, problem));
            };
            let port = uri.port_u16().unwrap_or(GRPC_PORT);
            let stream = TcpStream::connect((host.to_string(), port)).await?;
            Ok(Box::new(stream) as Box<dyn PeerStream>)
        })
    })
}

/// Node `id`'s peer network: channels dialled over turmoil ([`connector`])
/// that carry `id`'s node proof under `secret`, as a node without TLS
/// calls its peers.
pub fn peers(id: NodeId, secret: &ClusterSecret) -> Result<NetworkFactory, GrpcError> {
    let node_proof: AsciiMetadataValue = secret
        .node_proof(id)
        .parse()
        .map_err(|source| GrpcError::NodeProof { node: id, source })?;
    let security = PeerSecurity { tls: None, node_proof: Some(node_proof) };
    Ok(NetworkFactory::with_security(security, None).with_connector(connector()))
}

/// A client of node `id`'s own gRPC port, as that node: its node proof
/// under `secret`, dialled over turmoil ([`connector`]) — what the node's
/// built-in executor calls its node with.
pub fn own_client(id: NodeId, secret: &ClusterSecret) -> Result<Client, GrpcError> {
    let connector = connector();
    Client::builder(&grpc_address(id))
        .header(NODE_PROOF_HEADER, secret.node_proof(id))
        .build_with(|endpoint| endpoint.connect_with_connector_lazy(dial(connector.clone())))
        .map_err(|source| GrpcError::Client { node: id, source })
}

/// One accepted simulated connection, labelled for the auth layer as the
/// node's own listener labels a plain TCP one (no TLS, no certificate).
struct SimConnection {
    stream: TcpStream,
    remote: SocketAddr,
}

impl Connected for SimConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo { remote: Some(self.remote), identity: None, tls: false }
    }
}

impl AsyncRead for SimConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Serves the real `leasehold.v1.Raft` service of `journal` on this
/// host's [`GRPC_PORT`], behind the node's auth layer checking node proofs
/// under `secret`, until the host is crashed (turmoil then drops this
/// future with the host's runtime).
pub async fn serve_raft(journal: Journal, secret: ClusterSecret) -> Result<(), GrpcError> {
    serve(journal, None, secret).await
}

/// [`serve_raft`] and the real `leasehold.v1.Queue` service (what a
/// node's executor claims and acks through), and with `gate` the real
/// `leasehold.v1.Peer` service too (adverts and bus messages, into that
/// gate), as a node serves them all on its one port.
pub async fn serve(
    journal: Journal,
    gate: Option<Gate>,
    secret: ClusterSecret,
) -> Result<(), GrpcError> {
    let listener =
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, GRPC_PORT)).await.map_err(GrpcError::Bind)?;
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await;
        let connection = accepted.map(|(stream, remote)| SimConnection { stream, remote });
        Some((connection, listener))
    });
    let auth = AuthLayer::new(
        AuthConfig { tls: false, secret, tokens: None },
        journal.metrics().auth_refused.clone(),
    );
    let raft = RaftServer::new(RaftService::new(journal.clone()))
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
    let peer = gate.map(|gate| {
        PeerServer::new(PeerService::new(gate)).max_decoding_message_size(MAX_SMALL_REQUEST_BYTES)
    });
    let queue = QueueServer::new(QueueService::new(journal))
        .max_decoding_message_size(MAX_QUEUE_REQUEST_BYTES)
        .max_encoding_message_size(MAX_QUEUE_RESPONSE_BYTES);
    tonic::transport::Server::builder()
        .layer(auth)
        .add_service(raft)
        .add_service(queue)
        .add_optional_service(peer)
        .serve_with_incoming(incoming)
        .await
        .map_err(GrpcError::Serve)
}
