//! openraft wiring for leasehold: the type configuration shared by storage,
//! server and node, and (as the cluster grows) the tonic network between
//! peers.

pub mod types;

pub use types::{NodeId, Raft, TypeConfig};
