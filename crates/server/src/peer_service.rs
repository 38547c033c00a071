//! The internal `leasehold.v1.Peer` service: takes peers' adverts into the
//! registry and answers bus claims and releases. Messages that are not
//! authentic are dropped, counted, and answered UNAUTHENTICATED.

use leasehold_proto::v1;
use leasehold_proto::v1::peer_server::Peer;
use tonic::{Request, Response, Status};

use crate::adverts::Rejection;
use crate::gate::Gate;

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
        match self.gate.accept_advert(request.get_ref()) {
            Ok(_) => Ok(Response::new(v1::AdvertAck {})),
            Err(Rejection::BadMac) => {
                Err(Status::unauthenticated("mac: advert is not signed with the cluster secret"))
            }
            Err(Rejection::Malformed) => Err(Status::invalid_argument("body: not a valid advert")),
            Err(Rejection::FromSelf) => {
                Err(Status::invalid_argument("body.node_id: an advert from this node itself"))
            }
            // A replay is harmless (dropped); answering OK keeps a peer whose
            // clock stepped back from retrying in a loop.
            Err(Rejection::Replay) => Ok(Response::new(v1::AdvertAck {})),
        }
    }

    async fn bus(&self, request: Request<v1::Signed>) -> Result<Response<v1::BusReply>, Status> {
        match self.gate.serve_bus(request.get_ref()) {
            Ok(Some(reply)) => Ok(Response::new(reply)),
            Ok(None) => Err(Status::unauthenticated(
                "mac: bus message is not signed with the cluster secret",
            )),
            Err(error) => Err(Status::internal(error.to_string())),
        }
    }
}
