//! grpc.health.v1 from the same readiness as `/readyz`, read when asked.
//!
//! A push reporter copied once a second let `/readyz` and the health
//! service disagree for up to that second after start, a drain or a store
//! fault. Here `Check` reads [`Readiness::report`] itself (the report is
//! cached about a second and a drain is seen at once, for both), so the two
//! agree by construction; `Watch` sends the status at once and then each
//! change, looked for every [`WATCH_EVERY`].
//!
//! The node's services answer: `""` (the node) and `leasehold.v1.Queue`
//! with its readiness; any other name is NOT_FOUND (`Check`) or
//! SERVICE_UNKNOWN (`Watch`), as the protocol asks.

use std::pin::Pin;
use std::time::Duration;

use leasehold_replica::Readiness;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// How often a `Watch` looks at readiness for a change.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The names whose status is the node's readiness.
const SERVICES: [&str; 2] = ["", "leasehold.v1.Queue"];

/// The health service of one node.
#[derive(Clone)]
pub struct HealthService {
    readiness: Readiness,
    /// Set when the node shuts down: open `Watch` streams end.
    closing: Option<tokio::sync::watch::Receiver<bool>>,
}

impl HealthService {
    /// The health of the node `readiness` describes.
    pub fn new(readiness: Readiness) -> Self {
        HealthService { readiness, closing: None }
    }

    /// Ends every `Watch` stream (after a last NOT_SERVING) when `closing`
    /// turns true, so an open stream does not hold the server's graceful
    /// shutdown until its deadline.
    pub fn with_shutdown(mut self, closing: tokio::sync::watch::Receiver<bool>) -> Self {
        self.closing = Some(closing);
        self
    }

    /// This service as a tonic service.
    pub fn into_server(self) -> HealthServer<HealthService> {
        HealthServer::new(self)
    }

    async fn status(&self, service: &str) -> ServingStatus {
        if !SERVICES.contains(&service) {
            return ServingStatus::ServiceUnknown;
        }
        if self.readiness.report().await.ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    }
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: status as i32 }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        match self.status(&service).await {
            ServingStatus::ServiceUnknown => Err(Status::not_found(format!(
                "service: {service:?} is not served here (ask for \"\" or leasehold.v1.Queue)"
            ))),
            status => Ok(Response::new(answer(status))),
        }
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let (send, receive) = tokio::sync::mpsc::channel(4);
        let this = self.clone();
        // Ends when the caller goes away (the send fails) or the node stops.
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                if closing.as_ref().is_some_and(|closing| *closing.borrow()) {
                    let _ = send.send(Ok(answer(ServingStatus::NotServing))).await;
                    return;
                }
                let status = this.status(&service).await;
                if last != Some(status) {
                    if send.send(Ok(answer(status))).await.is_err() {
                        return;
                    }
                    last = Some(status);
                }
                let closed = async {
                    match closing.as_mut() {
                        Some(closing) => {
                            // A sender gone for good is no shutdown.
                            if closing.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = send.closed() => return,
                    _ = closed => {}
                    _ = tokio::time::sleep(WATCH_EVERY) => {}
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receive))))
    }
}
