//! The `leasehold.v1.Faults` service: clock skew and store faults for tests
//! and chaos runs. Registered only when the node runs with fault injection.

use std::sync::Arc;

use leasehold_proto::v1;
use leasehold_proto::v1::faults_server::Faults;
use tonic::{Request, Response, Status};

use leasehold_replica::Journal;

/// Turns the node's store write fault on or off: while on, the store's
/// probe and every durable write fail as a broken disk would. The node's
/// stores own the switch, not the journal, which only reads them.
pub type StoreFault = Arc<dyn Fn(bool) + Send + Sync>;

/// Serves `leasehold.v1.Faults`.
#[derive(Clone)]
pub struct FaultsService {
    journal: Journal,
    store_fault: StoreFault,
}

impl FaultsService {
    /// Faults for `journal`'s node, whose stores' write fault `store_fault`
    /// switches.
    pub fn new(journal: Journal, store_fault: StoreFault) -> Self {
        FaultsService { journal, store_fault }
    }

    fn reply(&self) -> Response<v1::FaultReply> {
        Response::new(v1::FaultReply { now_ms: self.journal.clock().now_ms() })
    }
}

#[tonic::async_trait]
impl Faults for FaultsService {
    async fn set_clock(
        &self,
        request: Request<v1::SetClockRequest>,
    ) -> Result<Response<v1::FaultReply>, Status> {
        let request = request.into_inner();
        let rate = if request.rate == 0.0 { 1.0 } else { request.rate };
        if !rate.is_finite() || rate <= 0.0 {
            return Err(Status::invalid_argument("rate: must be a positive number"));
        }
        tracing::warn!(offset_ms = request.offset_ms, rate, "fault injection: clock skewed");
        self.journal.clock().set_skew(request.offset_ms, rate);
        Ok(self.reply())
    }

    async fn set_probe_fault(
        &self,
        request: Request<v1::SetFaultRequest>,
    ) -> Result<Response<v1::FaultReply>, Status> {
        let on = request.into_inner().on;
        tracing::warn!(on, "fault injection: store probe fault");
        self.journal.set_probe_fault(on);
        Ok(self.reply())
    }

    async fn set_store_fault(
        &self,
        request: Request<v1::SetFaultRequest>,
    ) -> Result<Response<v1::FaultReply>, Status> {
        let on = request.into_inner().on;
        tracing::warn!(on, "fault injection: store write fault");
        (self.store_fault)(on);
        Ok(self.reply())
    }
}
