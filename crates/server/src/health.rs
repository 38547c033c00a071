//! grpc.health.v1 from the same readiness as `/readyz`, read when asked.
//!
//! A push reporter copied once a second let `/readyz` and the health
//! service disagree for up to that second after start, a drain or a store
//! fault. Here `Check` reads [`Readiness::report`] itself (the report is
//! cached about a second and a drain is seen at once, for both), so the two
//! agree by construction; `Watch` sends the status at once and then each
//! change, looked for every [`WATCH_EVERY`] by one poller that every open
//! `Watch` shares (a poller per stream let a caller opening thousands of
//! streams, which health asks no token for, make the node read its
//! readiness thousands of times a second).
//!
//! The node's services answer: `""` (the node) and `leasehold.v1.Queue`
//! with its readiness; any other name is NOT_FOUND (`Check`) or
//! SERVICE_UNKNOWN (`Watch`), as the protocol asks.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
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
    /// Whether the node is ready, as the one poller of every `Watch` last
    /// read it (`None` before its first read, and while no stream is
    /// open); started by the first `Watch`.
    watched: Arc<OnceLock<Arc<tokio::sync::watch::Sender<Option<bool>>>>>,
}

impl HealthService {
    /// The health of the node `readiness` describes.
    pub fn new(readiness: Readiness) -> Self {
        HealthService { readiness, closing: None, watched: Arc::default() }
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

    /// The shared poller's view of readiness, starting the poller if no
    /// `Watch` did yet. It runs until the node shuts down, and reads
    /// readiness only while a stream is open.
    fn watched(&self) -> tokio::sync::watch::Receiver<Option<bool>> {
        self.watched
            .get_or_init(|| {
                let publish = Arc::new(tokio::sync::watch::channel(None).0);
                let readiness = self.readiness.clone();
                let mut closing = self.closing.clone();
                let poller = publish.clone();
                tokio::spawn(async move {
                    loop {
                        if poller.receiver_count() == 0 {
                            // Nobody watches: what a later stream sees
                            // first is the next read, not an old one.
                            poller.send_replace(None);
                        } else {
                            let ready = Some(readiness.report().await.ready);
                            poller.send_if_modified(|seen| std::mem::replace(seen, ready) != ready);
                        }
                        let closed = async {
                            match closing.as_mut() {
                                Some(closing) => {
                                    // A sender gone for good is no shutdown.
                                    if closing.wait_for(|stop| *stop).await.is_err() {
                                        std::future::pending::<()>().await;
                                    }
                                }
                                None => std::future::pending::<()>().await,
                            }
                        };
                        tokio::select! {
                            () = closed => return,
                            () = tokio::time::sleep(WATCH_EVERY) => {}
                        }
                    }
                });
                publish
            })
            .subscribe()
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
        // Subscribed before the first status is read, so a change after
        // that read is seen.
        let mut watched = self.watched();
        watched.borrow_and_update();
        let first = self.status(&service).await;
        // Ends when the caller goes away (the send fails) or the node stops.
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            let mut status = first;
            let mut last = None;
            // A name not served here stays unknown; the others follow the
            // node's readiness.
            let mut watching = status != ServingStatus::ServiceUnknown;
            loop {
                if closing.as_ref().is_some_and(|closing| *closing.borrow()) {
                    let _ = send.send(Ok(answer(ServingStatus::NotServing))).await;
                    return;
                }
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
                    changed = watched.changed(), if watching => {
                        if changed.is_err() {
                            // The poller stopped: the node is shutting
                            // down, which `closing` tells.
                            watching = false;
                            continue;
                        }
                        status = match *watched.borrow_and_update() {
                            Some(true) => ServingStatus::Serving,
                            Some(false) => ServingStatus::NotServing,
                            // Not read since the poller was last idle.
                            None => status,
                        };
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receive))))
    }
}
