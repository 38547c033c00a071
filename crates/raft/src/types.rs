//! The Raft type configuration: log payloads are [`leasehold_core::Proposal`]s
//! and apply answers are [`leasehold_core::Response`]s.

use std::io::Cursor;

use leasehold_core::{Proposal, Response};

/// A node's id in the Raft group.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// leasehold's openraft type configuration.
    pub TypeConfig:
        D = Proposal,
        R = Response,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft handle for leasehold.
pub type Raft = openraft::Raft<TypeConfig>;
