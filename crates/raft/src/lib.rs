//! openraft wiring for leasehold: the type configuration shared by storage,
//! server and node, the serde envelope, and the tonic network between peers.

pub mod envelope;
pub mod network;
pub mod types;

pub use network::{NetworkFactory, PeerChannel, PeerSecurity, PeerTls};
pub use types::{NodeId, Raft, TypeConfig};
