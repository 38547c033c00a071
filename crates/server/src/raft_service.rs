//! The internal `leasehold.v1.Raft` service: hands peers' Raft messages to
//! openraft and serves forwarded writes and read-index requests.
//!
//! Only nodes reach it ([`crate::auth`]), and a vote request or an append
//! must come from the node it names as candidate or leader: a node cannot
//! speak for another.

use leasehold_proto::v1::RaftEnvelope;
use leasehold_proto::v1::raft_server::Raft as RaftRpc;
use leasehold_raft::envelope;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::forward::ForwardRequest;
use crate::journal::Journal;

/// Serves `leasehold.v1.Raft`.
#[derive(Clone)]
pub struct RaftService {
    journal: Journal,
}

impl RaftService {
    /// A service feeding `journal`'s Raft instance.
    pub fn new(journal: Journal) -> Self {
        RaftService { journal }
    }
}

fn open<T: DeserializeOwned>(request: Request<RaftEnvelope>) -> Result<T, Status> {
    envelope::decode(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("data: {e}")))
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

fn seal<T: Serialize>(value: &T) -> Result<Response<RaftEnvelope>, Status> {
    let data = envelope::encode(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftEnvelope { data }))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        let rpc: openraft::raft::AppendEntriesRequest<leasehold_raft::TypeConfig> = open(request)?;
        from_its_sender(caller, &rpc.vote, "an append")?;
        seal(&self.journal.raft().append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftEnvelope>) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        let rpc: openraft::raft::VoteRequest<u64> = open(request)?;
        from_its_sender(caller, &rpc.vote, "a vote request")?;
        seal(&self.journal.raft().vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<Response<RaftEnvelope>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        let rpc: openraft::raft::InstallSnapshotRequest<leasehold_raft::TypeConfig> =
            open(request)?;
        from_its_sender(caller, &rpc.vote, "a snapshot")?;
        seal(&self.journal.raft().install_snapshot(rpc).await)
    }

    async fn forward(
        &self,
        request: Request<RaftEnvelope>,
    ) -> Result<Response<RaftEnvelope>, Status> {
        Caller::node_of(&request)?;
        let forwarded: ForwardRequest = open(request)?;
        seal(&self.journal.serve_forwarded(forwarded).await)
    }
}
