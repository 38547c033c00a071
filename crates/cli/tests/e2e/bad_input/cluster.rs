//! The Cluster service's bad requests. Join is node-only: its cases carry
//! the proof of [`PROBE_NODE`] (or of node 1, a voter, where a voter's
//! join is the point) and are sent again without it.

use leasehold_proto::v1;
use tonic::Code;

use super::wire::rpc;
use super::{Case, NODE_ID, PROBE_NODE};

/// A node id that is no member.
const UNKNOWN_NODE: u64 = 7;

/// The Cluster cases; `member_addr` is node 1's address as membership
/// holds it.
pub fn cases(member_addr: &str) -> Vec<Case> {
    use Code::{
        AlreadyExists, FailedPrecondition, InvalidArgument as Invalid, NotFound, PermissionDenied,
    };
    let bad = Case::malformed;
    let join = |id, addr: &str| {
        rpc::join(v1::JoinRequest {
            id,
            addr: addr.to_string(),
            log_format: leasehold_core::command::LOG_FORMAT,
        })
    };
    let long_addr = format!("{}.example:7070", "h".repeat(300));
    let mut cases = vec![
        // Join
        bad("join: id 0", join(0, "127.0.0.1:7999"), Invalid, "id"),
        bad("join: empty addr", join(PROBE_NODE, ""), Invalid, "addr"),
        bad("join: blank addr", join(PROBE_NODE, "   "), Invalid, "addr"),
        bad("join: addr that is no address", join(PROBE_NODE, "not an address"), Invalid, "addr"),
        bad("join: addr without a port", join(PROBE_NODE, "127.0.0.1"), Invalid, "addr"),
        bad("join: addr with port 0", join(PROBE_NODE, "127.0.0.1:0"), Invalid, "addr"),
        bad("join: addr with a path", join(PROBE_NODE, "http://127.0.0.1:7999/x"), Invalid, "addr"),
        bad(
            "join: addr of another scheme",
            join(PROBE_NODE, "ftp://127.0.0.1:7999"),
            Invalid,
            "addr",
        ),
        Case::too_large("join: a 313-byte addr", join(PROBE_NODE, &long_addr), Invalid, "addr"),
        bad("join: another member's addr", join(PROBE_NODE, member_addr), AlreadyExists, "addr"),
        bad(
            "join: a build older than the log format the cluster writes",
            rpc::join(v1::JoinRequest {
                id: PROBE_NODE,
                addr: "127.0.0.1:7999".to_string(),
                log_format: 0,
            }),
            FailedPrecondition,
            "log_format",
        ),
        bad(
            "join: as another node",
            join(PROBE_NODE + 1, "127.0.0.1:7999"),
            PermissionDenied,
            "id",
        ),
        bad(
            "join: a member's id at another addr",
            join(NODE_ID, "127.0.0.1:7999"),
            AlreadyExists,
            "id",
        )
        .sent_by(NODE_ID),
        // Remove, Drain, SetFlags: ids start at 1; an id that is no member
        // is NOT_FOUND naming it.
        bad("remove: id 0", rpc::remove(v1::RemoveRequest { id: 0 }), Invalid, "id"),
        bad(
            "remove: unknown node",
            rpc::remove(v1::RemoveRequest { id: UNKNOWN_NODE }),
            NotFound,
            "node 7",
        ),
        bad(
            "remove: the last voter",
            rpc::remove(v1::RemoveRequest { id: NODE_ID }),
            FailedPrecondition,
            "id",
        ),
        bad("drain: id 0", rpc::drain(v1::DrainRequest { id: 0 }), Invalid, "id"),
        bad(
            "drain: unknown node",
            rpc::drain(v1::DrainRequest { id: UNKNOWN_NODE }),
            NotFound,
            "node 7",
        ),
        bad(
            "set flags: id 0",
            rpc::set_flags(v1::SetFlagsRequest {
                id: 0,
                journal_lease: Some(false),
                dry_run: None,
            }),
            Invalid,
            "id",
        ),
        bad(
            "set flags: unknown node",
            rpc::set_flags(v1::SetFlagsRequest {
                id: UNKNOWN_NODE,
                journal_lease: Some(false),
                dry_run: None,
            }),
            NotFound,
            "node 7",
        ),
    ];
    // Every RPC: a message over the 64 KiB limit (the set-flags one would
    // otherwise turn node 1's journal lease off), and bytes that are no
    // message at all.
    let harmless = [
        rpc::status(v1::StatusRequest { local_only: true }),
        join(PROBE_NODE, "127.0.0.1:7999"),
        rpc::remove(v1::RemoveRequest { id: UNKNOWN_NODE }),
        rpc::drain(v1::DrainRequest { id: UNKNOWN_NODE }),
        rpc::set_flags(v1::SetFlagsRequest {
            id: NODE_ID,
            journal_lease: Some(false),
            dry_run: None,
        }),
    ];
    for call in harmless {
        cases.push(Case::garbage(call.path));
        cases.push(Case::over_limit(call));
    }
    cases
}
