//! The internal Raft service's bad requests: envelopes whose JSON is empty,
//! not JSON, missing a field, or has a field of the wrong type, messages
//! that speak for another node, and forwarded writes carrying a command the
//! journal would refuse. None is a message a leader could act on, so the
//! single node's term and log stay as they are.

use anyhow::Result;
use leasehold_core::{Command, JobSpec, Proposal};
use leasehold_proto::v1;
use serde_json::{Value, json};
use tonic::Code;

use super::wire::{Call, rpc};
use super::{Case, PROBE_NODE};

type AppendEntries = openraft::raft::AppendEntriesRequest<leasehold_raft::TypeConfig>;
type InstallSnapshot = openraft::raft::InstallSnapshotRequest<leasehold_raft::TypeConfig>;

fn envelope(data: impl Into<Vec<u8>>) -> v1::RaftEnvelope {
    v1::RaftEnvelope { data: data.into() }
}

fn json_envelope(value: &Value) -> Result<v1::RaftEnvelope> {
    Ok(envelope(serde_json::to_vec(value)?))
}

/// A vote of term 1 for `node`.
fn vote_of(node: u64) -> openraft::Vote<u64> {
    openraft::Vote::new(1, node)
}

fn append_of(node: u64) -> Result<Value> {
    let append = AppendEntries {
        vote: vote_of(node),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    Ok(serde_json::to_value(append)?)
}

fn vote_request_of(node: u64) -> Result<Value> {
    Ok(serde_json::to_value(openraft::raft::VoteRequest::new(vote_of(node), None))?)
}

fn snapshot_of(node: u64) -> Result<Value> {
    let snapshot = InstallSnapshot {
        vote: vote_of(node),
        meta: openraft::SnapshotMeta::default(),
        offset: 0,
        data: Vec::new(),
        done: true,
    };
    Ok(serde_json::to_value(snapshot)?)
}

/// `value` with the field at `path` (keys from the root) set to `to`.
fn with(mut value: Value, path: &[&str], to: Value) -> Value {
    let mut at = &mut value;
    for key in path {
        at = &mut at[*key];
    }
    *at = to;
    value
}

/// A forwarded write of `command`, as a follower's journal sends it.
fn forward_write(command: Command) -> Result<v1::RaftEnvelope> {
    let proposal = serde_json::to_value(Proposal { now_ms: 1, command })?;
    json_envelope(&json!({ "Write": proposal }))
}

fn bad_enqueue() -> Command {
    let spec = JobSpec {
        queue: String::new(),
        payload: b"x".to_vec(),
        priority: 0,
        not_before_ms: None,
        max_attempts: None,
        backoff: None,
        lease_ttl_ms: None,
        idempotency_key: None,
        tags: Vec::new(),
    };
    Command::Enqueue { jobs: vec![spec] }
}

/// The Raft cases; each speaks as [`PROBE_NODE`].
pub fn cases() -> Result<Vec<Case>> {
    use Code::{InvalidArgument as Invalid, PermissionDenied};
    let bad = Case::malformed;
    let other = PROBE_NODE + 1;
    type Rpc = fn(v1::RaftEnvelope) -> Call;
    let every: [(&str, Rpc); 4] = [
        ("append entries", rpc::append_entries),
        ("vote", rpc::vote),
        ("install snapshot", rpc::install_snapshot),
        ("forward", rpc::forward),
    ];
    let mut cases = Vec::new();
    for (name, call) in every {
        cases.extend([
            bad(&format!("{name}: empty data"), call(envelope("")), Invalid, "data"),
            bad(
                &format!("{name}: data that is not JSON"),
                call(envelope("not json")),
                Invalid,
                "data",
            ),
            bad(&format!("{name}: a JSON number"), call(envelope("7")), Invalid, "data"),
        ]);
    }
    let term = ["vote", "leader_id", "term"];
    let vote_value = serde_json::to_value(vote_of(PROBE_NODE))?;
    cases.extend([
        // AppendEntries
        bad("append entries: no vote", rpc::append_entries(envelope("{}")), Invalid, "vote"),
        bad(
            "append entries: a term that is a string",
            rpc::append_entries(json_envelope(&with(append_of(PROBE_NODE)?, &term, json!("one")))?),
            Invalid,
            "data.vote.leader_id.term",
        ),
        bad(
            "append entries: entries that are not a list",
            rpc::append_entries(json_envelope(&with(
                append_of(PROBE_NODE)?,
                &["entries"],
                json!(5),
            ))?),
            Invalid,
            "data.entries",
        ),
        bad(
            "append entries: an append for another leader",
            rpc::append_entries(json_envelope(&append_of(other)?)?),
            PermissionDenied,
            "data.vote",
        ),
        // Vote
        bad(
            "vote: a negative term",
            rpc::vote(json_envelope(&with(vote_request_of(PROBE_NODE)?, &term, json!(-1)))?),
            Invalid,
            "data.vote.leader_id.term",
        ),
        bad(
            "vote: a last_log_id that is a string",
            rpc::vote(json_envelope(&with(
                vote_request_of(PROBE_NODE)?,
                &["last_log_id"],
                json!("x"),
            ))?),
            Invalid,
            "data.last_log_id",
        ),
        bad(
            "vote: a vote request for another candidate",
            rpc::vote(json_envelope(&vote_request_of(other)?)?),
            PermissionDenied,
            "data.vote",
        ),
        // InstallSnapshot
        bad(
            "install snapshot: no meta",
            rpc::install_snapshot(json_envelope(&json!({
                "vote": vote_value,
                "offset": 0,
                "data": [],
                "done": true,
            }))?),
            Invalid,
            "meta",
        ),
        bad(
            "install snapshot: an offset that is a string",
            rpc::install_snapshot(json_envelope(&with(
                snapshot_of(PROBE_NODE)?,
                &["offset"],
                json!("x"),
            ))?),
            Invalid,
            "data.offset",
        ),
        bad(
            "install snapshot: a snapshot from another leader",
            rpc::install_snapshot(json_envelope(&snapshot_of(other)?)?),
            PermissionDenied,
            "data.vote",
        ),
        // Forward
        bad(
            "forward: an unknown request",
            rpc::forward(json_envelope(&json!({ "Steal": null }))?),
            Invalid,
            "unknown variant",
        ),
        bad(
            "forward: a write without a command",
            rpc::forward(json_envelope(&json!({ "Write": { "now_ms": 1 } }))?),
            Invalid,
            "command",
        ),
        bad(
            "forward: a write of an invalid command",
            rpc::forward(forward_write(bad_enqueue())?),
            Invalid,
            "jobs[0].queue",
        ),
        bad(
            "forward: a write of an empty batch",
            rpc::forward(forward_write(Command::Batch { commands: Vec::new() })?),
            Invalid,
            "commands",
        ),
        bad(
            "forward: a write of a nested batch",
            rpc::forward(forward_write(Command::Batch {
                commands: vec![Command::Batch { commands: vec![Command::Sweep] }],
            })?),
            Invalid,
            "commands[0]",
        ),
        bad(
            "forward: a batch with an invalid command",
            rpc::forward(forward_write(Command::Batch {
                commands: vec![Command::Sweep, bad_enqueue()],
            })?),
            Invalid,
            "commands[1].jobs[0].queue",
        ),
        bad(
            "forward: a valid write from a node that is not a member",
            rpc::forward(forward_write(Command::Sweep)?),
            Code::Unavailable,
            "caller",
        ),
        bad(
            "forward: a hand-over for another leader",
            rpc::forward(json_envelope(&json!({ "HandOver": { "leader": other, "term": 1 } }))?),
            PermissionDenied,
            "data.leader",
        ),
        bad(
            "forward: a hand-over with a term that is a string",
            rpc::forward(json_envelope(
                &json!({ "HandOver": { "leader": PROBE_NODE, "term": "one" } }),
            )?),
            Invalid,
            "data.HandOver.term",
        ),
    ]);
    // Every RPC: a message over the 64 MiB limit, and bytes that are no
    // message. Under the limit the appends, votes and snapshots would be
    // refused for speaking for another node and the read-index forward
    // answered, so a limit that did not hold shows.
    let harmless = [
        rpc::append_entries(json_envelope(&append_of(other)?)?),
        rpc::vote(json_envelope(&vote_request_of(other)?)?),
        rpc::install_snapshot(json_envelope(&snapshot_of(other)?)?),
        rpc::forward(json_envelope(&json!("ReadIndex"))?),
    ];
    for call in harmless {
        cases.push(Case::garbage(call.path));
        cases.push(Case::over_limit(call));
    }
    Ok(cases)
}
