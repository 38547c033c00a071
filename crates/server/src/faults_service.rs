//! The `leasehold.v1.Faults` service: clock skew and store faults for tests
//! and chaos runs. Registered only when the node runs with fault injection.

use leasehold_proto::v1;
use leasehold_proto::v1::faults_server::Faults;
use tonic::{Request, Response, Status};

use leasehold_replica::Journal;

/// Serves `leasehold.v1.Faults`.
#[derive(Clone)]
pub struct FaultsService {
    journal: Journal,
}

impl FaultsService {
    /// Faults for `journal`'s node.
    pub fn new(journal: Journal) -> Self {
        FaultsService { journal }
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
        self.journal.log_store().set_fault(on);
        Ok(self.reply())
    }
}
