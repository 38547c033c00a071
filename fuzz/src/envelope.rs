//! The `envelope` target: bytes a peer sends, through the Raft envelope's
//! `decode`.
//!
//! Goal: decoding never panics, whatever a peer (or a corrupted frame)
//! sends; a message that decodes re-encodes to bytes that decode to the
//! same message; and every proposal a decoded message carries — log
//! entries of an AppendEntries, a forwarded write — applies to a state
//! without breaking its invariants.
//!
//! Method: the first byte picks the message type ([`KINDS`]), the rest is
//! the envelope. The target only knows "bytes in → `envelope::decode`", so
//! it keeps working if the envelope's encoding changes; the committed seeds
//! are then regenerated with `cargo run --bin seeds` (the replay test
//! notices seeds that no longer decode).

use leasehold_core::{Proposal, Response, State};
use leasehold_raft::envelope;
use leasehold_raft::{NodeId, TypeConfig};
use openraft::EntryPayload;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The messages the envelope carries, by the kind byte that selects them.
pub const KINDS: [&str; 8] = [
    "append-entries-request",
    "vote-request",
    "install-snapshot-request",
    "append-entries-reply",
    "vote-reply",
    "install-snapshot-reply",
    "forwarded-proposal",
    "forwarded-response",
];

/// Runs one input; panics on a violation.
pub fn check(data: &[u8]) {
    check_decoded(data);
}

/// Runs one input and answers whether it decoded as the message its kind
/// byte selects; panics on a violation.
pub fn check_decoded(data: &[u8]) -> bool {
    let Some((&kind, bytes)) = data.split_first() else {
        return false;
    };
    match usize::from(kind) % KINDS.len() {
        0 => round_trip::<AppendEntriesRequest<TypeConfig>>(bytes)
            .map(|request| {
                let proposals = request.entries.iter().filter_map(|entry| match &entry.payload {
                    EntryPayload::Normal(proposal) => Some((entry.log_id.leader_id.term, proposal)),
                    EntryPayload::Blank | EntryPayload::Membership(_) => None,
                });
                apply_all(proposals);
            })
            .is_some(),
        1 => round_trip::<VoteRequest<NodeId>>(bytes).is_some(),
        2 => round_trip::<InstallSnapshotRequest<TypeConfig>>(bytes).is_some(),
        3 => round_trip::<AppendEntriesReply>(bytes).is_some(),
        4 => round_trip::<VoteReply>(bytes).is_some(),
        5 => round_trip::<InstallSnapshotReply>(bytes).is_some(),
        6 => round_trip::<Proposal>(bytes).map(|proposal| apply_all([(1, &proposal)])).is_some(),
        _ => round_trip::<Response>(bytes).is_some(),
    }
}

/// What a peer answers an AppendEntries with.
pub type AppendEntriesReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
/// What a peer answers a Vote with.
pub type VoteReply = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
/// What a peer answers an InstallSnapshot with.
pub type InstallSnapshotReply =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// Decodes `bytes`; when that succeeds, checks that the value's encoding
/// is stable (encoding, decoding and encoding again gives the same bytes:
/// openraft's messages do not all compare, their encodings do), and
/// returns it.
pub fn round_trip<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let value: T = envelope::decode(bytes).ok()?;
    let encoded = envelope::encode(&value).expect("a decoded message encodes");
    let again: T = envelope::decode(&encoded).expect("an encoded message decodes");
    let encoded_again = envelope::encode(&again).expect("a decoded message encodes");
    assert!(encoded == encoded_again, "a message changed over a round trip");
    Some(value)
}

/// Applies proposals, each at its epoch, to one fresh state, checking the
/// state's invariants after each.
fn apply_all<'a>(proposals: impl IntoIterator<Item = (u64, &'a Proposal)>) {
    let mut state = State::new();
    for (epoch, proposal) in proposals {
        let response = state.apply(epoch, proposal);
        if let Err(violation) = state.check_invariants() {
            panic!("{proposal:?} -> {response:?}: {violation}");
        }
    }
}
