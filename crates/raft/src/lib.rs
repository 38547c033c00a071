//! openraft wiring for leasehold: the type configuration shared by storage,
//! the replica runtime and the node, the serde envelope, and the tonic
//! network between peers — one channel per peer address, each carrying this
//! node's credentials (its node certificate with TLS, its node proof
//! without), appends on one long-lived stream per follower — and
//! replication ahead of the leader's own log sync.
//!
//! It dials peers and serves nothing: the Raft service that receives their
//! calls is the edge's (`leasehold-server`), and what a replica does with
//! its log is the replica runtime's (`leasehold-replica`).

pub mod ahead;
pub mod envelope;
pub mod network;
pub mod snapshot_data;
pub mod stream;
pub mod types;

pub use network::{NetworkFactory, PeerChannel, PeerSecurity, PeerTls};
pub use snapshot_data::{Received, ReceivedFile, SnapshotData};
pub use types::{NodeId, Raft, TypeConfig, apply_entry};
