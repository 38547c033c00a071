//! The Raft type configuration: log payloads are [`leasehold_core::Proposal`]s
//! and apply answers are [`leasehold_core::Response`]s.

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
        SnapshotData = crate::snapshot_data::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft handle for leasehold.
pub type Raft = openraft::Raft<TypeConfig>;

/// What applying one committed entry does to the replicated state and the
/// membership a state machine keeps, and the one response it answers
/// (Raft-internal entries included): the one apply rule of every state
/// machine, the node's and the simulation's.
pub fn apply_entry(
    state: &mut leasehold_core::State,
    membership: &mut openraft::StoredMembership<NodeId, openraft::BasicNode>,
    entry: &openraft::Entry<TypeConfig>,
) -> Response {
    match &entry.payload {
        // The epoch of a lease is the term of the leader that committed
        // the entry carrying the claim.
        openraft::EntryPayload::Normal(proposal) => {
            state.apply(entry.log_id.leader_id.term, proposal)
        }
        openraft::EntryPayload::Blank => Response::Empty,
        openraft::EntryPayload::Membership(changed) => {
            *membership = openraft::StoredMembership::new(Some(entry.log_id), changed.clone());
            Response::Empty
        }
    }
}
