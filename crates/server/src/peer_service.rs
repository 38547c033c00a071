//! The internal `leasehold.v1.Peer` service: takes peers' adverts into the
//! registry and answers bus claims and releases. Only nodes reach it (see
//! [`crate::auth`]); a message that is not authentic, or that speaks for
//! another node than its sender, is dropped, counted, and refused.

use leasehold_proto::v1;
use leasehold_proto::v1::peer_server::Peer;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::raft_service::meant_for;
use leasehold_replica::Gate;
use leasehold_replica::adverts::{MAX_TEXT_BYTES, Rejection, Sender};
use leasehold_replica::bus::BusRefusal;

/// Serves `leasehold.v1.Peer`.
#[derive(Clone)]
pub struct PeerService {
    gate: Gate,
}

impl PeerService {
    /// A service feeding `gate`.
    pub fn new(gate: Gate) -> Self {
        PeerService { gate }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn advertise(
        &self,
        request: Request<v1::Signed>,
    ) -> Result<Response<v1::AdvertAck>, Status> {
        let (node, by_certificate) = Caller::node_of(&request)?;
        // Answered with this node's clock, which the sender records as the
        // clock of the node it meant: not if it meant another.
        meant_for(self.gate.node_id(), &request)?;
        let sender = Sender { node, by_certificate };
        match self.gate.accept_advert(request.get_ref(), sender) {
            Ok(_) => Ok(Response::new(v1::AdvertAck { now_ms: self.gate.now_ms() })),
            Err(Rejection::BadMac) => {
                Err(Status::unauthenticated("mac: advert is not signed with the cluster secret"))
            }
            Err(Rejection::Malformed { field, problem }) => {
                Err(Status::invalid_argument(format!("{field}: {problem}")))
            }
            Err(Rejection::TooLong { field }) => Err(Status::resource_exhausted(format!(
                "{field}: longer than {MAX_TEXT_BYTES} bytes"
            ))),
            Err(Rejection::FromSelf) => {
                Err(Status::invalid_argument("body.node_id: an advert from this node itself"))
            }
            Err(Rejection::NotSender) => Err(Status::permission_denied(format!(
                "body.node_id: node {node} may only advertise itself"
            ))),
            // A replay is harmless (dropped); answering OK keeps a peer whose
            // clock stepped back from retrying in a loop.
            Err(Rejection::Replay) => {
                Ok(Response::new(v1::AdvertAck { now_ms: self.gate.now_ms() }))
            }
        }
    }

    async fn bus(&self, request: Request<v1::Signed>) -> Result<Response<v1::BusReply>, Status> {
        let (node, by_certificate) = Caller::node_of(&request)?;
        meant_for(self.gate.node_id(), &request)?;
        let sender = Sender { node, by_certificate };
        match self.gate.serve_bus(request.get_ref(), sender) {
            Ok(reply) => Ok(Response::new(reply)),
            Err(refusal @ BusRefusal::BadMac) => Err(Status::unauthenticated(refusal.to_string())),
            Err(refusal @ BusRefusal::NotSender { .. }) => {
                Err(Status::permission_denied(refusal.to_string()))
            }
            Err(
                refusal @ (BusRefusal::Malformed
                | BusRefusal::NoKind
                | BusRefusal::EmptyKey { .. }
                | BusRefusal::Replay { .. }),
            ) => Err(Status::invalid_argument(refusal.to_string())),
            Err(refusal @ BusRefusal::KeyTooLong { .. }) => {
                Err(Status::resource_exhausted(refusal.to_string()))
            }
            Err(BusRefusal::Store(error)) => Err(Status::internal(error.to_string())),
        }
    }
}
