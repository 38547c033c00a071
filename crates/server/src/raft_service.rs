//! The internal `leasehold.v1.Raft` service: hands peers' Raft messages to
//! openraft and serves forwarded writes and read-index requests.
//!
//! Only nodes reach it ([`crate::auth`]), and a vote request or an append
//! must come from the node it names as candidate or leader: a node cannot
//! speak for another. Appends come as unary calls or, from a leader of a
//! newer build, as messages of one long-lived `AppendStream`, each judged
//! as a unary append is.

use std::pin::Pin;

use futures::Stream;
use leasehold_core::{Command, Limits, ValidationError, validate_command};
use leasehold_proto::v1::RaftEnvelope;
use leasehold_proto::v1::raft_server::Raft as RaftRpc;
use leasehold_raft::envelope::{self, Wire};
use openraft::raft::AppendEntriesResponse;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status, Streaming};

use leasehold_security::secret::TARGET_NODE_HEADER;

use crate::auth::Caller;
use crate::error::Error;
use crate::limits::too_large;
use leasehold_replica::Journal;
use leasehold_replica::forward::ForwardRequest;
use leasehold_replica::metrics::Stage;

/// The service's name, as paths and limits spell it.
const RAFT_SERVICE: &str = "leasehold.v1.Raft";

/// The `call` label of a message that came as a call of its own.
const UNARY: &str = "unary";
/// The `call` label of a message of an append stream.
const STREAM: &str = "stream";

/// Serves `leasehold.v1.Raft`.
#[derive(Clone)]
pub struct RaftService {
    journal: Journal,
    /// Set when the node shuts down: open append streams end.
    closing: Option<tokio::sync::watch::Receiver<bool>>,
}

impl RaftService {
    /// A service feeding `journal`'s Raft instance.
    pub fn new(journal: Journal) -> Self {
        RaftService { journal, closing: None }
    }

    /// The same service, ending its open append streams when `closing`
    /// turns true (a long-lived stream would otherwise hold the server's
    /// graceful shutdown open; the server takes no new call from then on
    /// either).
    pub fn with_shutdown(mut self, closing: tokio::sync::watch::Receiver<bool>) -> Self {
        self.closing = Some(closing);
        self
    }

    /// Resolves once the node shuts down (its signal turned true, or its
    /// sender is gone); never without a signal.
    async fn closed(&self) {
        match self.closing.clone() {
            // Either way the node is stopping.
            Some(mut closing) => drop(closing.wait_for(|closed| *closed).await),
            None => std::future::pending().await,
        }
    }
}

/// The message in an envelope, or INVALID_ARGUMENT naming the field of
/// `data` it fails at (`data.vote.leader_id.term: invalid type: …`).
/// The layout it came in is the layout to answer in (a peer of an earlier
/// build sends and reads JSON only).
fn open<T: DeserializeOwned>(data: &[u8]) -> Result<(T, Wire), Status> {
    if data.is_empty() {
        return Err(Status::invalid_argument(
            "data: must not be empty (an openraft message, binary or JSON)",
        ));
    }
    envelope::decode_with_wire(data).map_err(|error| {
        let field = match error.path() {
            "" => "data".to_string(),
            path => format!("data.{path}"),
        };
        Status::invalid_argument(format!("{field}: {}", error.cause()))
    })
}

/// Checks a forwarded write as `apply` will (against the default limits),
/// so a command the journal would refuse is refused here, before it is
/// proposed, with the field it fails at. A batch is checked command by
/// command (`commands[2].jobs[0].queue`): a follower's journal only
/// batches commands its services validated, so one that fails here came
/// from no healthy follower, and it must not sink the leader's batch it
/// would join.
pub fn check_forwarded(command: &Command) -> Result<(), ValidationError> {
    if matches!(command, Command::Ruled { .. }) {
        // The leader records its own limits; a forwarder's are not taken.
        return Err(ValidationError::invalid("command", "only the leader rules a command"));
    }
    let limits = Limits::default();
    validate_command(command, &limits)?;
    if let Command::Batch { commands } = command {
        for (index, inner) in commands.iter().enumerate() {
            validate_command(inner, &limits).map_err(|error| ValidationError {
                field: format!("commands[{index}].{}", error.field),
                ..error
            })?;
        }
    }
    Ok(())
}

/// FAILED_PRECONDITION when the call names another node than `own` as the
/// one it is meant for ([`TARGET_NODE_HEADER`]). A call naming none (an
/// earlier build's) is taken: its sender judges by the address alone.
pub(crate) fn meant_for<T>(own: u64, request: &Request<T>) -> Result<(), Status> {
    let Some(value) = request.metadata().get(TARGET_NODE_HEADER) else {
        return Ok(());
    };
    match value.to_str().ok().and_then(|text| text.parse::<u64>().ok()) {
        Some(target) if target == own => Ok(()),
        Some(target) => Err(Status::failed_precondition(format!(
            "{TARGET_NODE_HEADER}: this is node {own}, not node {target}: the member's \
             address reaches another node"
        ))),
        None => Err(Status::invalid_argument(format!("{TARGET_NODE_HEADER}: not a node id"))),
    }
}

/// PERMISSION_DENIED unless the message's vote names `caller`.
fn from_its_sender(caller: u64, vote: &openraft::Vote<u64>, what: &str) -> Result<(), Status> {
    match vote.leader_id().voted_for() {
        Some(named) if named == caller => Ok(()),
        named => Err(Status::permission_denied(format!(
            "data.vote: node {caller} sent {what} for node {}",
            named.map(|n| n.to_string()).unwrap_or_else(|| "none".into())
        ))),
    }
}

impl RaftService {
    /// Opens `request` (see [`open`]) and counts its layout.
    fn open<T: DeserializeOwned>(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<(T, Wire), Status> {
        self.open_data(&request.into_inner().data, UNARY)
    }

    /// Opens an envelope's bytes that came by `call` (see [`open`]) and
    /// counts its layout.
    fn open_data<T: DeserializeOwned>(
        &self,
        data: &[u8],
        call: &'static str,
    ) -> Result<(T, Wire), Status> {
        let (value, wire) = open(data)?;
        let label = match wire {
            Wire::Binary => "binary",
            Wire::Json => "json",
        };
        self.journal
            .metrics()
            .raft_envelopes
            .get_or_create(&leasehold_replica::metrics::WireLabels { wire: label, call })
            .inc();
        Ok((value, wire))
    }
}

fn seal<T: Serialize>(wire: Wire, value: &T) -> Result<Response<RaftEnvelope>, Status> {
    Ok(Response::new(seal_envelope(wire, value)?))
}

fn seal_envelope<T: Serialize>(wire: Wire, value: &T) -> Result<RaftEnvelope, Status> {
    let data = envelope::encode_as(wire, value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(RaftEnvelope { data })
}

impl RaftService {
    /// Hands `caller`'s append in `data`, which came by `call`, to
    /// openraft: the answer, sealed in the layout it came in, or why it
    /// was refused.
    async fn append(
        &self,
        caller: u64,
        data: &[u8],
        call: &'static str,
    ) -> Result<RaftEnvelope, Status> {
        let started = std::time::Instant::now();
        let (rpc, wire): (openraft::raft::AppendEntriesRequest<leasehold_raft::TypeConfig>, _) =
            self.open_data(data, call)?;
        from_its_sender(caller, &rpc.vote, "an append")?;
        let leader_commit = rpc.leader_commit;
        let carries_entries = !rpc.entries.is_empty();
        let answer = self.journal.raft().append_entries(rpc).await;
        // Noted only from an append whose vote openraft accepted: readiness
        // compares it with what this node applied, and one from a stale
        // vote (a deposed leader, a node of another cluster) must not hold
        // this node not ready. A conflict is the current leader's, probing
        // for where the logs match: its commit index counts.
        if let Some(committed) = leader_commit
            && matches!(&answer, Ok(response) if !matches!(response, AppendEntriesResponse::HigherVote(_)))
        {
            self.journal.note_leader_commit(committed.index);
        }
        let sealed = seal_envelope(wire, &answer);
        if carries_entries {
            self.journal.metrics().observe_stage(Stage::FollowerAppend, started.elapsed());
        }
        sealed
    }
}

/// The answers of an `AppendStream`: one per message, in order, each
/// message taken only once the one before is answered. A message refused
/// (malformed, or not from the caller) ends the stream with its status.
pub type AppendAnswers = Pin<Box<dyn Stream<Item = Result<RaftEnvelope, Status>> + Send>>;

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        meant_for(self.journal.node_id(), &request)?;
        let answer = self.append(caller, &request.into_inner().data, UNARY).await?;
        Ok(Response::new(answer))
    }

    type AppendStreamStream = AppendAnswers;

    async fn append_stream(
        &self,
        request: Request<Streaming<RaftEnvelope>>,
    ) -> Result<Response<AppendAnswers>, Status> {
        // Checked once: every message of the stream is this caller's, and
        // meant for this node.
        let (caller, _) = Caller::node_of(&request)?;
        meant_for(self.journal.node_id(), &request)?;
        let messages = request.into_inner();
        let answers =
            futures::stream::unfold(Some((messages, self.clone())), move |state| async move {
                let (mut messages, service) = state?;
                // Only between messages: an append under way is finished.
                let next = tokio::select! {
                    next = messages.message() => next,
                    () = service.closed() => Err(Status::unavailable("node shutting down")),
                };
                let answer = match next {
                    Ok(Some(envelope)) => service.append(caller, &envelope.data, STREAM).await,
                    Ok(None) => return None,
                    Err(status) => Err(too_large(RAFT_SERVICE, &status).unwrap_or(status)),
                };
                // After a refusal the stream ends, with the refusal.
                let next = answer.is_ok().then_some((messages, service));
                Some((answer, next))
            });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn vote(&self, request: Request<RaftEnvelope>) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        meant_for(self.journal.node_id(), &request)?;
        let (rpc, wire): (openraft::raft::VoteRequest<u64>, _) = self.open(request)?;
        from_its_sender(caller, &rpc.vote, "a vote request")?;
        seal(wire, &self.journal.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        meant_for(self.journal.node_id(), &request)?;
        let (rpc, wire): (openraft::raft::InstallSnapshotRequest<leasehold_raft::TypeConfig>, _) =
            self.open(request)?;
        from_its_sender(caller, &rpc.vote, "a snapshot")?;
        seal(wire, &self.journal.raft().install_snapshot(rpc).await)
    }

    async fn forward(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        let (forwarded, wire): (ForwardRequest, _) = self.open(request)?;
        if let ForwardRequest::HandOver { leader, .. } = &forwarded
            && *leader != caller
        {
            return Err(Status::permission_denied(format!(
                "data.leader: node {caller} sent a hand-over for node {leader}"
            )));
        }
        // The bare request comes only from an earlier build's leader as it
        // drains; from anyone else it would depose a healthy leader.
        if let ForwardRequest::Campaign = &forwarded {
            let leader = self.journal.raft().metrics().borrow().current_leader;
            if leader != Some(caller) {
                return Err(Status::permission_denied(format!(
                    "data: node {caller} asked for an election, but it does not lead (node {})",
                    leader.map_or("none".to_string(), |id| id.to_string())
                )));
            }
        }
        if let ForwardRequest::Write(proposal) = &forwarded {
            check_forwarded(&proposal.command).map_err(|error| {
                Status::from(Error::Invalid(ValidationError {
                    problem: format!("{} (in the forwarded command)", error.problem),
                    ..error
                }))
            })?;
            // A removed node keeps its credentials until they are retired,
            // and its executor would go on claiming (and running) command
            // jobs through it: a leader takes writes only from members. A
            // node that does not lead answers as before (the write is not
            // its to take), and the refusal is retryable: a leader's
            // published membership can trail by a moment the entry that
            // added a joining node.
            // Refused early here for a clear status; the batcher judges it
            // again when it stamps the write as leader, since this node may
            // win an election while the write waits.
            let leads =
                self.journal.raft().metrics().borrow().state == openraft::ServerState::Leader;
            if leads && !self.journal.is_member(caller) {
                return Err(
                    Error::Unavailable(leasehold_replica::journal::not_a_member(caller)).into()
                );
            }
        }
        seal(wire, &self.journal.serve_forwarded(forwarded, caller).await)
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::JobSpec;

    use super::*;

    fn enqueue(queue: &str) -> Command {
        let spec = JobSpec {
            queue: queue.to_string(),
            payload: Vec::new(),
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

    fn field(command: &Command) -> Option<String> {
        check_forwarded(command).err().map(|error| error.field)
    }

    #[test]
    fn forwarded_writes_the_journal_would_take_pass() {
        assert_eq!(check_forwarded(&enqueue("emails")), Ok(()));
        let batch = Command::Batch { commands: vec![Command::Sweep, enqueue("emails")] };
        assert_eq!(check_forwarded(&batch), Ok(()));
    }

    #[test]
    fn a_forwarded_write_it_would_refuse_names_its_field() {
        assert_eq!(field(&enqueue("")), Some("jobs[0].queue".into()));
        assert_eq!(field(&Command::Batch { commands: vec![] }), Some("commands".into()));
        let nested = Command::Batch { commands: vec![Command::Batch { commands: vec![] }] };
        assert_eq!(field(&nested), Some("commands[0]".into()));
        let inner = Command::Batch { commands: vec![Command::Sweep, enqueue("Bad Name")] };
        assert_eq!(field(&inner), Some("commands[1].jobs[0].queue".into()));
        // Only the leader records the limits an entry is judged by.
        let ruled = Command::Ruled {
            limits: Limits { max_payload_bytes: usize::MAX, ..Limits::default() },
            command: Box::new(enqueue("emails")),
        };
        assert_eq!(field(&ruled), Some("command".into()));
    }
}
