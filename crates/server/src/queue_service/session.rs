//! `Queue.Session`: the worker calls of the Queue service as frames on one
//! long-lived stream (queue.proto). Each frame is admitted as a call of
//! its own by the auth layer's rules against the credentials in force now
//! ([`Readmission`]), then run by that call's own handler, so a frame is
//! validated, authorized, proposed and answered exactly as the call would
//! be; only the HTTP/2 stream, its headers and its trailers are shared.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use leasehold_proto::v1;
use leasehold_proto::v1::session_request::Call;
use leasehold_proto::v1::session_response::Result as Answer;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Response as Reply, Status, Streaming};

use super::QueueService;
use crate::auth::{Caller, Readmission};
use crate::limits;

/// Frames of one session that run at once. While this many are running,
/// or an answer waits for the client to read it, the node reads no further
/// frame, so a client that sends faster than it reads is held back by
/// HTTP/2 flow control. Sessions share a connection's stream limit
/// ([`limits::MAX_STREAMS_PER_CONNECTION`]), so a connection holds at most
/// that many times this in frames.
pub const MAX_SESSION_IN_FLIGHT: usize = 16;
/// Answers of a session queued for sending while the client reads.
const ANSWERS_QUEUED: usize = 8;
/// A session with nothing running and no frame for this long, or whose
/// ready answer has waited this long for the client to read, ends
/// (UNAVAILABLE): a stream nobody uses or reads does not hold a node's
/// task and buffers for ever. The answers still queued for it are dropped
/// then, not kept for a client that may never read them. Long-polls count
/// as running.
pub const SESSION_IDLE: Duration = Duration::from_secs(600);
/// How long a session goes on after the node starts to shut down: it
/// reads no further frame, but the frames already running finish and
/// their answers are sent (an ack or a claim that took effect is
/// answered, not cut off with "shutting down"), for at most this long.
/// Whatever runs longer is dropped. Long-poll claims stop at once (a
/// node shutting down grants nothing more). Below the node's own grace
/// for its serving tasks (5 s), and longer than a write's round on a slow
/// disk.
pub const SESSION_CLOSE_GRACE: Duration = Duration::from_secs(3);

/// The answers of a session, as tonic sends them.
pub type SessionStream = Pin<Box<dyn Stream<Item = Result<v1::SessionResponse, Status>> + Send>>;

type Answers = mpsc::Sender<Result<v1::SessionResponse, Status>>;
type Queued = mpsc::Receiver<Result<v1::SessionResponse, Status>>;

/// What tonic streams back on a session: the queued answers, then the
/// node's reason when the node ended the session. The session's task may
/// drop the answers still queued ([`Discard`]); the reason still follows.
struct Outgoing {
    queued: Arc<Mutex<Option<Queued>>>,
    ended: Option<oneshot::Receiver<Status>>,
    /// The node's reason, heard and not yet sent: answers the task queued
    /// before it go first.
    reason: Option<Status>,
    /// The reason was sent: nothing follows it.
    done: bool,
}

/// Drops the answers a session still has queued, from the session's task
/// (the stream itself is polled only when the client has room to read).
struct Discard(Arc<Mutex<Option<Queued>>>);

impl Discard {
    fn now(&self) {
        let queued = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(queued);
    }
}

fn outgoing(queued: Queued, ended: oneshot::Receiver<Status>) -> (Outgoing, Discard) {
    let queued = Arc::new(Mutex::new(Some(queued)));
    let stream = Outgoing { queued: queued.clone(), ended: Some(ended), reason: None, done: false };
    (stream, Discard(queued))
}

impl Stream for Outgoing {
    type Item = Result<v1::SessionResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let answers_left = {
            let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(answers) = queued.as_mut() {
                match answers.poll_recv(cx) {
                    Poll::Ready(Some(answer)) => return Poll::Ready(Some(answer)),
                    // Every answer sent: the task is done.
                    Poll::Ready(None) => *queued = None,
                    // None yet (this poll is woken by the next): the task
                    // may also end without another, with a reason.
                    Poll::Pending => {}
                }
            }
            queued.is_some()
        };
        if self.reason.is_none()
            && let Some(ended) = self.ended.as_mut()
        {
            match Pin::new(ended).poll(cx) {
                Poll::Ready(Ok(reason)) => {
                    self.ended = None;
                    self.reason = Some(reason);
                }
                // The task ended without a word (the client went away, or
                // closed its side): the answers are all that is left.
                Poll::Ready(Err(_)) => self.ended = None,
                Poll::Pending => return Poll::Pending,
            }
        }
        if let Some(reason) = self.reason.take() {
            // The task queues its last answer before it sends its reason, so
            // an answer that came in since the look above is queued now.
            let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(answer) = queued.as_mut().and_then(|answers| answers.try_recv().ok()) {
                drop(queued);
                self.reason = Some(reason);
                return Poll::Ready(Some(answer));
            }
            drop(queued);
            self.done = true;
            return Poll::Ready(Some(Err(reason)));
        }
        if answers_left { Poll::Pending } else { Poll::Ready(None) }
    }
}

impl QueueService {
    /// Opens a session: its frames are served by a task of their own, and
    /// the answers go back as they complete.
    pub(super) async fn session_call(
        &self,
        request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Reply<SessionStream>, Status> {
        let credentials = request
            .extensions()
            .get::<Readmission>()
            .cloned()
            .ok_or_else(|| Status::internal("no credentials on this session"))?;
        let frames = request.into_inner();
        let (answers, queued) = mpsc::channel(ANSWERS_QUEUED);
        // Why the session ended, when the node ended it: sent after every
        // queued answer, however full the queue was, unless the session
        // dropped them (it idled out).
        let (end, ended) = oneshot::channel::<Status>();
        let (outgoing, discard) = outgoing(queued, ended);
        tokio::spawn(self.clone().serve_session(credentials, frames, answers, end, discard));
        Ok(Reply::new(Box::pin(outgoing) as SessionStream))
    }

    /// Reads frames and runs up to [`MAX_SESSION_IN_FLIGHT`] of them at a
    /// time until the client closes its side (then answers what is still
    /// running), the client goes away, the frames break off, the session
    /// idles out, or the node shuts down (then it answers what is still
    /// running, for at most [`SESSION_CLOSE_GRACE`], and ends saying why).
    /// Every wait is a branch of one `select!`, so shutdown and a departed
    /// client are seen even while an answer waits for a client that does
    /// not read.
    async fn serve_session(
        self,
        credentials: Readmission,
        mut frames: Streaming<v1::SessionRequest>,
        answers: Answers,
        end: oneshot::Sender<Status>,
        discard: Discard,
    ) {
        let mut running = FuturesUnordered::new();
        // An answer that is ready and waits for room in `answers`.
        let mut ready: Option<v1::SessionResponse> = None;
        let closing = closed(self.closing.clone());
        tokio::pin!(closing);
        let idle = tokio::time::sleep(SESSION_IDLE);
        tokio::pin!(idle);
        // Armed when the node starts to shut down.
        let close_by = tokio::time::sleep(SESSION_IDLE);
        tokio::pin!(close_by);
        let mut shutting_down = false;
        let mut reading = true;
        loop {
            if !reading && running.is_empty() && ready.is_none() {
                if shutting_down {
                    let _ = end.send(shutting_down_status());
                }
                return;
            }
            tokio::select! {
                frame = frames.message(),
                    if reading && ready.is_none() && running.len() < MAX_SESSION_IN_FLIGHT =>
                {
                    match frame {
                        Ok(Some(frame)) => {
                            idle.as_mut().reset(tokio::time::Instant::now() + SESSION_IDLE);
                            running.push(self.frame(&credentials, frame));
                        }
                        Ok(None) => reading = false,
                        Err(status) => {
                            // The frames broke off (the client reset the
                            // stream, or sent what cannot be decoded): say
                            // why, if anyone is still listening.
                            let status =
                                limits::too_large(super::SERVICE, &status).unwrap_or(status);
                            let _ = end.send(status);
                            return;
                        }
                    }
                }
                Some(answer) = running.next(), if ready.is_none() && !running.is_empty() => {
                    ready = Some(answer);
                    idle.as_mut().reset(tokio::time::Instant::now() + SESSION_IDLE);
                }
                permit = answers.reserve(), if ready.is_some() => match (permit, ready.take()) {
                    (Ok(permit), Some(answer)) => {
                        permit.send(Ok(answer));
                        if running.is_empty() {
                            idle.as_mut().reset(tokio::time::Instant::now() + SESSION_IDLE);
                        }
                    }
                    // The client went away.
                    _ => return,
                },
                () = &mut idle, if ready.is_some() || running.is_empty() => {
                    let idle_for = SESSION_IDLE.as_secs();
                    let status = Status::unavailable(format!(
                        "session idle for {idle_for} s (no frame, or an answer unread): it \
                         ended; open another"
                    ));
                    discard.now();
                    let _ = end.send(status);
                    return;
                }
                () = &mut closing, if !shutting_down => {
                    shutting_down = true;
                    reading = false;
                    close_by.as_mut().reset(tokio::time::Instant::now() + SESSION_CLOSE_GRACE);
                }
                () = &mut close_by, if shutting_down => {
                    let _ = end.send(shutting_down_status());
                    return;
                }
                () = answers.closed() => return,
            }
        }
    }

    /// Runs one frame and names its answer with the frame's id.
    async fn frame(
        &self,
        credentials: &Readmission,
        frame: v1::SessionRequest,
    ) -> v1::SessionResponse {
        let answer = match frame.call {
            Some(call) => self.run_frame(credentials, call).await,
            None => Err(Status::invalid_argument(
                "call: a session frame carries one of enqueue, claim, refresh, ack, nack or \
                 release",
            )),
        };
        let result = answer.unwrap_or_else(|status| {
            Answer::Error(v1::CallError {
                code: status.code() as i32,
                message: status.message().into(),
            })
        });
        v1::SessionResponse { id: frame.id, result: Some(result) }
    }

    /// Admits the frame as the unary call of the same name, then runs that
    /// call's handler, counted and timed under its name (a frame's answer
    /// carries no leader hint: the session's opening did).
    ///
    /// Each handler is awaited right here rather than handed to a wrapper:
    /// rustc keeps a future passed by value to another async fn twice, and
    /// every frame's future is moved into the session's running set, so
    /// each layer of wrapping would be copied per frame.
    async fn run_frame(&self, credentials: &Readmission, call: Call) -> Result<Answer, Status> {
        let (path, metric) = match &call {
            Call::Enqueue(_) => ("/leasehold.v1.Queue/Enqueue", "enqueue"),
            Call::Claim(_) => ("/leasehold.v1.Queue/Claim", "claim"),
            Call::Refresh(_) => ("/leasehold.v1.Queue/Refresh", "refresh"),
            Call::Ack(_) => ("/leasehold.v1.Queue/Ack", "ack"),
            Call::Nack(_) => ("/leasehold.v1.Queue/Nack", "nack"),
            Call::Release(_) => ("/leasehold.v1.Queue/Release", "release"),
        };
        let caller = credentials.admit(path)?;
        let started = std::time::Instant::now();
        let answer = match call {
            Call::Enqueue(r) => self
                .enqueue_call(as_caller(&caller, r))
                .await
                .map(|r| Answer::Enqueue(r.into_inner())),
            Call::Claim(r) => {
                self.claim_call(as_caller(&caller, r)).await.map(|r| Answer::Claim(r.into_inner()))
            }
            Call::Refresh(r) => self
                .refresh_call(as_caller(&caller, r))
                .await
                .map(|r| Answer::Refresh(r.into_inner())),
            Call::Ack(r) => {
                self.ack_call(as_caller(&caller, r)).await.map(|r| Answer::Ack(r.into_inner()))
            }
            Call::Nack(r) => {
                self.nack_call(as_caller(&caller, r)).await.map(|r| Answer::Nack(r.into_inner()))
            }
            Call::Release(r) => self
                .release_call(as_caller(&caller, r))
                .await
                .map(|r| Answer::Release(r.into_inner())),
        };
        let code = answer.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        self.journal.metrics().observe_rpc(metric, code, started.elapsed());
        if code == tonic::Code::PermissionDenied
            && let Err(status) = &answer
        {
            credentials.record_role_refusal(path, status);
        }
        answer
    }
}

/// Why a session ended when its node shut down.
fn shutting_down_status() -> Status {
    Status::unavailable("node shutting down: the session ended; open one on another node")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: u64) -> Result<v1::SessionResponse, Status> {
        Ok(v1::SessionResponse { id, result: Some(Answer::Ack(v1::AckResponse {})) })
    }

    fn id(item: Option<Result<v1::SessionResponse, Status>>) -> Result<u64, String> {
        match item {
            Some(Ok(answer)) => Ok(answer.id),
            other => Err(format!("{other:?}")),
        }
    }

    #[tokio::test]
    async fn queued_answers_come_before_the_nodes_reason() {
        let (answers, queued) = mpsc::channel(ANSWERS_QUEUED);
        let (end, ended) = oneshot::channel();
        let (mut stream, _discard) = outgoing(queued, ended);
        answers.send(answer(1)).await.expect("queued");
        answers.send(answer(2)).await.expect("queued");
        end.send(Status::unavailable("node shutting down")).expect("sent");
        drop(answers);
        assert_eq!(id(stream.next().await), Ok(1));
        assert_eq!(id(stream.next().await), Ok(2));
        let reason = stream.next().await.and_then(Result::err).map(|s| s.message().to_string());
        assert_eq!(reason.as_deref(), Some("node shutting down"));
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_discard_drops_the_queued_answers_and_the_reason_comes_first() {
        let (answers, queued) = mpsc::channel(ANSWERS_QUEUED);
        let (end, ended) = oneshot::channel();
        let (mut stream, discard) = outgoing(queued, ended);
        answers.send(answer(1)).await.expect("queued");
        answers.send(answer(2)).await.expect("queued");
        discard.now();
        assert!(answers.is_closed(), "the queue and its answers are gone");
        end.send(Status::unavailable("session idle")).expect("sent");
        let reason = stream.next().await.and_then(Result::err).map(|s| s.message().to_string());
        assert_eq!(reason.as_deref(), Some("session idle"));
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_session_that_ends_without_a_word_ends_the_stream_after_its_answers() {
        let (answers, queued) = mpsc::channel(ANSWERS_QUEUED);
        let (end, ended) = oneshot::channel::<Status>();
        let (mut stream, _discard) = outgoing(queued, ended);
        answers.send(answer(7)).await.expect("queued");
        drop(end);
        assert_eq!(id(stream.next().await), Ok(7));
        // The task still holds its sender: nothing more yet, and no end.
        let early = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
        assert!(early.is_err(), "the stream ended while the task could still answer: {early:?}");
        drop(answers);
        let last = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
        assert!(matches!(last, Ok(None)), "{last:?}");
    }

    #[tokio::test]
    async fn an_answer_sent_after_a_look_found_none_comes_before_the_reason() {
        let (answers, queued) = mpsc::channel(ANSWERS_QUEUED);
        let (end, ended) = oneshot::channel();
        let (mut stream, _discard) = outgoing(queued, ended);
        // The stream looks and finds nothing; then the task answers and
        // ends, before the stream looks again.
        let first = futures::poll!(stream.next());
        assert!(first.is_pending(), "{first:?}");
        answers.send(answer(9)).await.expect("queued");
        end.send(Status::unavailable("node shutting down")).expect("sent");
        assert_eq!(id(stream.next().await), Ok(9), "the answer went missing");
        let reason = stream.next().await.and_then(Result::err).map(|s| s.message().to_string());
        assert_eq!(reason.as_deref(), Some("node shutting down"));
        assert!(stream.next().await.is_none(), "nothing after the reason");
        drop(answers);
    }

    #[tokio::test]
    async fn a_waiting_stream_wakes_for_the_reason() {
        let (answers, queued) = mpsc::channel::<Result<v1::SessionResponse, Status>>(1);
        let (end, ended) = oneshot::channel();
        let (mut stream, discard) = outgoing(queued, ended);
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            discard.now();
            let _ = end.send(Status::unavailable("session idle"));
            drop(answers);
        });
        let item = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
        let reason = item.ok().flatten().and_then(Result::err).map(|s| s.message().to_string());
        assert_eq!(reason.as_deref(), Some("session idle"));
        task.await.expect("task");
    }
}
