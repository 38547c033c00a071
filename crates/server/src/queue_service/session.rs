//! `Queue.Session`: the worker calls of the Queue service as frames on one
//! long-lived stream (queue.proto). Each frame goes through the same role
//! table as the unary call of its name ([`crate::auth::requirement`]) and
//! then through that call's own handler, so a frame is validated,
//! authorized, proposed and answered exactly as the call would be; only
//! the HTTP/2 stream, its headers and its trailers are shared.

use std::pin::Pin;

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use leasehold_proto::v1;
use leasehold_proto::v1::session_request::Call;
use leasehold_proto::v1::session_response::Result as Answer;
use leasehold_replica::metrics::AuthLabels;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response as Reply, Status, Streaming};

use super::QueueService;
use crate::auth::{Caller, Requirement, requirement};
use crate::limits;

/// Frames of one session that run at once. While this many are running
/// the node reads no further frame, so a client that sends faster than
/// its calls complete is held back by HTTP/2 flow control.
pub const MAX_SESSION_IN_FLIGHT: usize = 64;

/// The answers of a session, as tonic sends them.
pub type SessionStream = Pin<Box<dyn Stream<Item = Result<v1::SessionResponse, Status>> + Send>>;

impl QueueService {
    /// Opens a session: its frames are served by a task of their own, and
    /// the answers go back as they complete.
    pub(super) async fn session_call(
        &self,
        request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Reply<SessionStream>, Status> {
        let caller = Caller::of(&request)?.clone();
        let frames = request.into_inner();
        let (answers, outgoing) = mpsc::channel(MAX_SESSION_IN_FLIGHT);
        tokio::spawn(self.clone().serve_session(caller, frames, answers));
        Ok(Reply::new(Box::pin(ReceiverStream::new(outgoing)) as SessionStream))
    }

    /// Reads frames and runs up to [`MAX_SESSION_IN_FLIGHT`] of them at a
    /// time until the client closes its side (then answers what is still
    /// running), the client goes away, the frames break off, or the node
    /// shuts down.
    async fn serve_session(
        self,
        caller: Caller,
        mut frames: Streaming<v1::SessionRequest>,
        answers: mpsc::Sender<Result<v1::SessionResponse, Status>>,
    ) {
        let mut running = FuturesUnordered::new();
        let closing = closed(self.closing.clone());
        tokio::pin!(closing);
        let mut reading = true;
        loop {
            if !reading && running.is_empty() {
                return;
            }
            tokio::select! {
                frame = frames.message(), if reading && running.len() < MAX_SESSION_IN_FLIGHT => {
                    match frame {
                        Ok(Some(frame)) => running.push(self.frame(&caller, frame)),
                        Ok(None) => reading = false,
                        Err(status) => {
                            // The frames broke off (the client reset the
                            // stream, or sent what cannot be decoded): say
                            // why, if anyone is still listening.
                            let status = limits::too_large(super::SERVICE, &status).unwrap_or(status);
                            let _ = answers.send(Err(status)).await;
                            return;
                        }
                    }
                }
                Some(answer) = running.next(), if !running.is_empty() => {
                    if answers.send(Ok(answer)).await.is_err() {
                        return;
                    }
                }
                () = &mut closing => {
                    let status = Status::unavailable(
                        "node shutting down: the session ended; open one on another node",
                    );
                    let _ = answers.send(Err(status)).await;
                    return;
                }
                () = answers.closed() => return,
            }
        }
    }

    /// Runs one frame and names its answer with the frame's id.
    async fn frame(&self, caller: &Caller, frame: v1::SessionRequest) -> v1::SessionResponse {
        let answer = match frame.call {
            Some(call) => self.run_frame(caller, call).await,
            None => Err(Status::invalid_argument(
                "call: a session frame carries one of enqueue, claim, refresh, ack, nack or \
                 release",
            )),
        };
        let result = answer.unwrap_or_else(|status| {
            if status.code() == tonic::Code::PermissionDenied {
                self.count_refusal(&status);
            }
            Answer::Error(v1::CallError {
                code: status.code() as i32,
                message: status.message().into(),
            })
        });
        v1::SessionResponse { id: frame.id, result: Some(result) }
    }

    /// Checks the caller against the role of the unary call of the same
    /// name, then runs that call's handler, counted and timed under its
    /// name (a frame's answer carries no leader hint: the session's
    /// opening did).
    ///
    /// Each handler is awaited right here rather than handed to a wrapper:
    /// rustc keeps a future passed by value to another async fn twice, and
    /// every frame's future is moved into the session's running set, so
    /// each layer of wrapping would be copied per frame.
    async fn run_frame(&self, caller: &Caller, call: Call) -> Result<Answer, Status> {
        let (method, metric) = match &call {
            Call::Enqueue(_) => ("Enqueue", "enqueue"),
            Call::Claim(_) => ("Claim", "claim"),
            Call::Refresh(_) => ("Refresh", "refresh"),
            Call::Ack(_) => ("Ack", "ack"),
            Call::Nack(_) => ("Nack", "nack"),
            Call::Release(_) => ("Release", "release"),
        };
        authorize(caller, method)?;
        let started = std::time::Instant::now();
        let answer = match call {
            Call::Enqueue(r) => self
                .enqueue_call(as_caller(caller, r))
                .await
                .map(|r| Answer::Enqueue(r.into_inner())),
            Call::Claim(r) => {
                self.claim_call(as_caller(caller, r)).await.map(|r| Answer::Claim(r.into_inner()))
            }
            Call::Refresh(r) => self
                .refresh_call(as_caller(caller, r))
                .await
                .map(|r| Answer::Refresh(r.into_inner())),
            Call::Ack(r) => {
                self.ack_call(as_caller(caller, r)).await.map(|r| Answer::Ack(r.into_inner()))
            }
            Call::Nack(r) => {
                self.nack_call(as_caller(caller, r)).await.map(|r| Answer::Nack(r.into_inner()))
            }
            Call::Release(r) => self
                .release_call(as_caller(caller, r))
                .await
                .map(|r| Answer::Release(r.into_inner())),
        };
        let code = answer.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        self.journal.metrics().observe_rpc(metric, code, started.elapsed());
        answer
    }

    /// Counts and logs a frame's role refusal as the auth layer does a
    /// call's.
    fn count_refusal(&self, status: &Status) {
        self.journal
            .metrics()
            .auth_refused
            .get_or_create(&AuthLabels { service: super::SERVICE.into(), reason: "role".into() })
            .inc();
        tracing::info!(
            event = "auth.refuse",
            method = "/leasehold.v1.Queue/Session",
            reason = "role",
            message = %status.message(),
            "session frame refused"
        );
    }
}

/// PERMISSION_DENIED unless `caller` may make the unary call `method`.
fn authorize(caller: &Caller, method: &str) -> Result<(), Status> {
    match requirement(&format!("/{}/{method}", super::SERVICE)) {
        Requirement::Open => Ok(()),
        Requirement::Role(role) if caller.may(role) => Ok(()),
        Requirement::Role(role) => caller.require(role, &format!("session frame {method}")),
        Requirement::Node if caller.node_id().is_some() => Ok(()),
        Requirement::Node => Err(Status::permission_denied(format!(
            "session frame {method} is for cluster nodes only"
        ))),
    }
}

/// `message` as a request from `caller`, as the auth layer would have
/// made it.
fn as_caller<T>(caller: &Caller, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.extensions_mut().insert(caller.clone());
    request
}

/// Resolves when `closing` says the node is shutting down (or its sender
/// is gone); never without one.
async fn closed(closing: Option<watch::Receiver<bool>>) {
    match closing {
        Some(mut closing) => {
            let _ = closing.wait_for(|closing| *closing).await;
        }
        None => std::future::pending().await,
    }
}
