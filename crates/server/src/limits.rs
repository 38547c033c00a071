//! Bounds on what one call may bring: the largest request each service
//! decodes, and the limits of the gRPC server (streams per connection,
//! header size, a deadline on every call). Bounds on connections are in
//! [`crate::incoming`]; bounds on what a request may ask for (jobs per
//! enqueue, page sizes, long-poll waits) are validated by the services.
//!
//! tonic refuses a message over a service's decode limit with OUT_OF_RANGE
//! and its own wording; [`SizeLimitLayer`] turns that into
//! RESOURCE_EXHAUSTED naming the service and the limit, as every other
//! size refusal of leasehold reads.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Largest request the Queue service decodes: 64 jobs of the largest
/// payload. A larger enqueue is refused whole; split it.
pub const MAX_QUEUE_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Largest answer the Queue service sends (a claim of many large payloads).
pub const MAX_QUEUE_RESPONSE_BYTES: usize = 512 * 1024 * 1024;
/// Largest request the Schedules service decodes (a template's payload
/// plus names).
pub const MAX_SCHEDULES_REQUEST_BYTES: usize = 1024 * 1024;
/// Largest request the Cluster, Peer and Faults services decode: they
/// carry ids, addresses and flags only; and the health and reflection
/// services (a service name, a symbol).
pub const MAX_SMALL_REQUEST_BYTES: usize = 64 * 1024;
/// Largest Raft envelope a node decodes (only nodes reach the Raft
/// service: the limit bounds what a peer may send, not a stranger).
pub const MAX_RAFT_MESSAGE_BYTES: usize = leasehold_raft::envelope::MAX_ENVELOPE_BYTES;
/// Concurrent calls (HTTP/2 streams) one connection may have open.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Largest block of call metadata (headers) accepted.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Every unary call ends by this deadline, whatever the client asked for:
/// above the longest wait a call may legitimately have (a join's catch-up
/// of up to 120 s; a claim's long-poll is capped at 30 s). A worker
/// session is meant to last: it is bounded instead by its frames in
/// flight and its idle time (`queue_service::MAX_SESSION_IN_FLIGHT`,
/// `queue_service::SESSION_IDLE`). So is a leader's append stream to a
/// follower (only nodes open one): it carries one message at a time, and
/// ends when the leader closes it or its connection drops.
pub const CALL_DEADLINE: Duration = Duration::from_secs(130);

/// The decode limit of `service` (`leasehold.v1.Queue`), for messages.
pub fn request_limit(service: &str) -> Option<usize> {
    match service {
        "leasehold.v1.Queue" => Some(MAX_QUEUE_REQUEST_BYTES),
        "leasehold.v1.Schedules" => Some(MAX_SCHEDULES_REQUEST_BYTES),
        "leasehold.v1.Cluster"
        | "leasehold.v1.Peer"
        | "leasehold.v1.Faults"
        | "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => Some(MAX_SMALL_REQUEST_BYTES),
        "leasehold.v1.Raft" => Some(MAX_RAFT_MESSAGE_BYTES),
        _ => None,
    }
}

/// The prefix of tonic's message for a message over the decode limit.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large: found ";

/// Rewrites tonic's "message too large" refusal (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct SizeLimitLayer;

impl<S> tower::Layer<S> for SizeLimitLayer {
    type Service = SizeLimit<S>;

    fn layer(&self, inner: S) -> SizeLimit<S> {
        SizeLimit { inner }
    }
}

/// [`SizeLimitLayer`]'s service.
#[derive(Clone, Debug)]
pub struct SizeLimit<S> {
    inner: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for SizeLimit<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service =
            request.uri().path().trim_start_matches('/').split('/').next().unwrap_or_default();
        let service = service.to_string();
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let future = inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            rewrite_too_large(&service, response.headers_mut());
            Ok(response)
        })
    }
}

/// In a trailers-only answer (the status in the headers, as tonic sends a
/// refusal made before any reply), replaces tonic's OUT_OF_RANGE for an
/// oversized message with RESOURCE_EXHAUSTED naming the limit.
fn rewrite_too_large(service: &str, headers: &mut http::HeaderMap) {
    let Some(status) = tonic::Status::from_header_map(headers) else { return };
    let Some(replacement) = too_large(service, &status) else { return };
    headers.remove("grpc-message");
    headers.remove("grpc-status-details-bin");
    if replacement.add_header(headers).is_err() {
        tracing::warn!(service, "could not rewrite an oversize refusal");
    }
}

/// tonic's refusal of a message over `service`'s decode limit, as
/// RESOURCE_EXHAUSTED naming the limit; `None` for any other status. For
/// the stream of a session, whose oversized frame ends it mid-stream.
pub fn too_large(service: &str, status: &tonic::Status) -> Option<tonic::Status> {
    if status.code() != tonic::Code::OutOfRange || !status.message().starts_with(TONIC_TOO_LARGE) {
        return None;
    }
    let found = status.message()[TONIC_TOO_LARGE.len()..]
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string();
    let limit = request_limit(service)
        .map(|l| l.to_string())
        .unwrap_or_else(|| "the configured number of".to_string());
    Some(tonic::Status::resource_exhausted(format!(
        "request too large: {found} bytes; {service} accepts at most {limit} bytes per message \
         (max request size)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_oversize_refusal_becomes_resource_exhausted_naming_the_limit() {
        let tonic_says = tonic::Status::out_of_range(format!(
            "{TONIC_TOO_LARGE}20000000 bytes, the limit is: 16777216 bytes"
        ));
        let mut headers = http::HeaderMap::new();
        tonic_says.add_header(&mut headers).expect("ascii status");
        rewrite_too_large("leasehold.v1.Queue", &mut headers);
        let status = tonic::Status::from_header_map(&headers).expect("a status");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("20000000"), "{}", status.message());
        assert!(status.message().contains(&MAX_QUEUE_REQUEST_BYTES.to_string()));
        assert!(status.message().contains("leasehold.v1.Queue"));
    }

    #[test]
    fn other_statuses_are_left_alone() {
        for status in [
            tonic::Status::out_of_range("page beyond the end"),
            tonic::Status::invalid_argument("queue: must not be empty"),
        ] {
            let mut headers = http::HeaderMap::new();
            status.add_header(&mut headers).expect("ascii status");
            let before = headers.clone();
            rewrite_too_large("leasehold.v1.Queue", &mut headers);
            assert_eq!(headers, before);
        }
    }
}
