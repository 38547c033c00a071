//! A worker session ([`Client::session`]): enqueues, claims, refreshes,
//! acks, nacks and releases as frames on one long-lived gRPC stream
//! (`Queue.Session`), instead of one HTTP/2 stream, with its headers and
//! trailers, per call. Each call is checked and applied by the node exactly
//! as the unary call of its name; what a session saves is the per-call
//! framing, on both sides.
//!
//! Calls on one session may run concurrently (clone nothing: `&Session`
//! is enough); each waits for its own answer. At most as many are sent
//! and unanswered as the node runs at once (16); a further call waits
//! here, unsent, for a place. A session is not retried:
//! when it ends (its node stops, the connection drops, it idled for ten
//! minutes) every waiting call fails, and so does every later one, with
//! the node's status when it gave one and UNAVAILABLE otherwise. Open
//! another session, and repeat what is safe to repeat: a claim keeps its
//! request id, an ack is answered the same when it already applied.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_proto::v1;
use leasehold_proto::v1::session_request::Call;
use leasehold_proto::v1::session_response::Result as Answer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, ClientError};

/// Frames the client queues before a call waits to send its own.
const FRAMES_QUEUED: usize = 64;

/// The largest frame a node takes (its Queue service's request limit): a
/// larger one would end the whole session (RESOURCE_EXHAUSTED), failing
/// every call on it, so the SDK refuses such a call alone, unsent.
const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Calls of one session sent and not yet answered: as many as the node
/// runs at once (its `MAX_SESSION_IN_FLIGHT`). A call beyond them waits
/// here, unsent, rather than in the node's unread frames: a frame the node
/// reads only after its caller gave up would still run there, and a claim
/// would grant leases nobody holds.
const IN_FLIGHT: usize = 16;

/// A call waiting for its answer.
type Waiting = oneshot::Sender<Result<Answer, ClientError>>;

/// What the session's calls and its reader share.
#[derive(Default)]
struct Shared {
    /// Calls sent and not yet answered, by frame id.
    waiting: HashMap<u64, Waiting>,
    /// A place among the [`IN_FLIGHT`] for each frame sent and not yet
    /// answered, by frame id: given back when its answer comes (or the
    /// session ends), not when its caller stops waiting, since the node
    /// still runs the frame then.
    in_flight: HashMap<u64, OwnedSemaphorePermit>,
    /// Why the session ended, once it has.
    ended: Option<tonic::Status>,
}

/// A session on one node (see the module doc). Dropping it closes the
/// client's side: the node still runs what it was sent (nobody reads the
/// answers), then ends the stream.
pub struct Session {
    frames: mpsc::Sender<v1::SessionRequest>,
    shared: Arc<Mutex<Shared>>,
    places: Arc<Semaphore>,
    next_id: AtomicU64,
    call_timeout: Duration,
}

impl Client {
    /// Opens a session on the current node. When that node names another
    /// of this client's addresses as the leader, the session is opened
    /// there instead, so its writes skip the forwarding hop.
    /// Opening waits at most the client's call timeout.
    pub async fn session(&self) -> Result<Session, ClientError> {
        let (session, metadata) = self.open_session().await?;
        if self.moved_to_leader(&metadata) {
            // The leader's session, or else the one already open.
            if let Ok((on_leader, _)) = self.open_session().await {
                return Ok(on_leader);
            }
        }
        Ok(session)
    }

    async fn open_session(&self) -> Result<(Session, tonic::metadata::MetadataMap), ClientError> {
        let (frames, outgoing) = mpsc::channel(FRAMES_QUEUED);
        let mut stub = self.queue_stub();
        let opening = stub.session(ReceiverStream::new(outgoing));
        let response =
            tokio::time::timeout(self.call_timeout(), opening).await.map_err(|_| {
                tonic::Status::deadline_exceeded(format!(
                    "the session did not open within {} ms",
                    self.call_timeout().as_millis()
                ))
            })??;
        let (metadata, answers, _) = response.into_parts();
        let shared = Arc::new(Mutex::new(Shared::default()));
        // The reader ends with the stream: when the node has answered
        // everything after the client's side closed, or the session broke.
        tokio::spawn(read_answers(answers, shared.clone()));
        let session = Session {
            frames,
            shared,
            places: Arc::new(Semaphore::new(IN_FLIGHT)),
            next_id: AtomicU64::new(1),
            call_timeout: self.call_timeout(),
        };
        Ok((session, metadata))
    }
}

impl Session {
    /// Enqueues jobs atomically (as [`Client::enqueue`], without retries).
    pub async fn enqueue(
        &self,
        jobs: Vec<v1::JobSpec>,
    ) -> Result<Vec<v1::EnqueueResult>, ClientError> {
        match self.call(Call::Enqueue(v1::EnqueueRequest { jobs }), self.call_timeout).await? {
            Answer::Enqueue(reply) => Ok(reply.results),
            other => Err(mismatch("enqueue", &other)),
        }
    }

    /// Claims up to `max` jobs, long-polling up to `wait_ms`; answers the
    /// grants and how long the node held the call (`waited_ms`). To repeat
    /// the claim on a new session after this one broke and get the same
    /// leases, set `request_id` yourself ([`crate::new_request_id`]) and
    /// repeat the same request. Without one the node remembers nothing of
    /// the claim (a session is not retried, so an id made here could never
    /// be used, and each would be kept in the replicated state for ten
    /// minutes).
    pub async fn claim(&self, request: v1::ClaimRequest) -> Result<v1::ClaimResponse, ClientError> {
        let timeout = self.call_timeout + Duration::from_millis(request.wait_ms);
        match self.call(Call::Claim(request), timeout).await? {
            Answer::Claim(reply) => Ok(reply),
            other => Err(mismatch("claim", &other)),
        }
    }

    /// Extends leases; answers the renewed ones and the lost ones.
    pub async fn refresh(
        &self,
        request: v1::RefreshRequest,
    ) -> Result<v1::RefreshResponse, ClientError> {
        match self.call(Call::Refresh(request), self.call_timeout).await? {
            Answer::Refresh(reply) => Ok(reply),
            other => Err(mismatch("refresh", &other)),
        }
    }

    /// Finishes a job held under `token`.
    pub async fn ack(&self, job_id: u64, token: u64) -> Result<(), ClientError> {
        self.ack_with_result(job_id, token, Vec::new()).await
    }

    /// Finishes a job, keeping `result` on it (at most 16 KiB).
    pub async fn ack_with_result(
        &self,
        job_id: u64,
        token: u64,
        result: Vec<u8>,
    ) -> Result<(), ClientError> {
        let request = v1::AckRequest { job_id, token, result };
        match self.call(Call::Ack(request), self.call_timeout).await? {
            Answer::Ack(_) => Ok(()),
            other => Err(mismatch("ack", &other)),
        }
    }

    /// Fails an attempt: the job is retried after backoff, or dead.
    pub async fn nack(&self, request: v1::NackRequest) -> Result<v1::NackResponse, ClientError> {
        match self.call(Call::Nack(request), self.call_timeout).await? {
            Answer::Nack(reply) => Ok(reply),
            other => Err(mismatch("nack", &other)),
        }
    }

    /// Gives a job back without charging an attempt.
    pub async fn release(&self, job_id: u64, token: u64) -> Result<(), ClientError> {
        let request = v1::ReleaseRequest { job_id, token };
        match self.call(Call::Release(request), self.call_timeout).await? {
            Answer::Release(_) => Ok(()),
            other => Err(mismatch("release", &other)),
        }
    }

    /// Sends `call` as a frame and waits up to `timeout` for its answer,
    /// sending included (a node that stops reading holds the send back).
    /// Before that it waits, up to `timeout` too, for a place among the
    /// session's calls in flight; a call that gets none is not sent.
    async fn call(&self, call: Call, timeout: Duration) -> Result<Answer, ClientError> {
        // The call's bytes, and at most 16 for the frame's id and field
        // header around it.
        let bytes = call.encoded_len().saturating_add(16);
        if bytes > MAX_FRAME_BYTES {
            return Err(tonic::Status::resource_exhausted(format!(
                "the call is {bytes} bytes as a session frame, over the node's limit of \
                 {MAX_FRAME_BYTES}: not sent (the session goes on); send less at once"
            ))
            .into());
        }
        let place = match tokio::time::timeout(timeout, self.places.clone().acquire_owned()).await {
            Ok(Ok(place)) => place,
            Ok(Err(_)) => return Err(tonic::Status::unavailable("the session is closed").into()),
            Err(_) => {
                return Err(tonic::Status::deadline_exceeded(format!(
                    "{IN_FLIGHT} calls of this session were in flight for {} ms; this one was \
                     not sent",
                    timeout.as_millis()
                ))
                .into());
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answered, answer) = oneshot::channel();
        {
            let mut shared = lock(&self.shared);
            if let Some(ended) = &shared.ended {
                return Err(ended_error(ended));
            }
            shared.waiting.insert(id, answered);
            shared.in_flight.insert(id, place);
        }
        // However this call ends (answered, failed, timed out, or dropped
        // by its caller), its entry goes; and its place, unless its frame
        // went to the node (the answer gives that back).
        let mut forget = Forget { shared: &self.shared, id, sent: false };
        let exchange = async {
            let frame = v1::SessionRequest { id, call: Some(call) };
            if self.frames.send(frame).await.is_err() {
                return Err(tonic::Status::unavailable("the session is closed").into());
            }
            forget.sent = true;
            match answer.await {
                Ok(answer) => answer,
                Err(_) => Err(tonic::Status::unavailable("the session ended").into()),
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer on the session within {} ms",
                timeout.as_millis()
            ))
            .into()),
        }
    }
}

/// Removes a call's entry from the waiting calls when the call ends, and
/// its place in flight if its frame was never sent.
struct Forget<'a> {
    shared: &'a Mutex<Shared>,
    id: u64,
    sent: bool,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let mut shared = lock(self.shared);
        shared.waiting.remove(&self.id);
        if !self.sent {
            shared.in_flight.remove(&self.id);
        }
    }
}

/// Hands each answer to the call waiting for it; when the stream ends,
/// fails every call still waiting and every later one.
async fn read_answers(
    mut answers: tonic::Streaming<v1::SessionResponse>,
    shared: Arc<Mutex<Shared>>,
) {
    let ended = loop {
        match answers.message().await {
            Ok(Some(answer)) => {
                let waiting = {
                    let mut shared = lock(&shared);
                    shared.in_flight.remove(&answer.id);
                    shared.waiting.remove(&answer.id)
                };
                // An answer nobody waits for (its call timed out) is dropped.
                if let Some(waiting) = waiting {
                    let _ = waiting.send(answer_of(answer.result));
                }
            }
            Ok(None) => break tonic::Status::unavailable("the node ended the session"),
            Err(status) => break status,
        }
    };
    let mut shared = lock(&shared);
    for (_, waiting) in shared.waiting.drain() {
        let _ = waiting.send(Err(ended_error(&ended)));
    }
    shared.in_flight.clear();
    shared.ended = Some(ended);
}

/// A frame's answer, or its refusal as the status the unary call would
/// have ended with.
fn answer_of(result: Option<Answer>) -> Result<Answer, ClientError> {
    match result {
        Some(Answer::Error(error)) => {
            Err(tonic::Status::new(tonic::Code::from(error.code), error.message).into())
        }
        Some(answer) => Ok(answer),
        None => Err(tonic::Status::internal("the node sent an empty session answer").into()),
    }
}

/// The error of a call on a session that ended with `ended`. A status
/// the node sent keeps its code; a broken connection is UNAVAILABLE, so
/// callers treat it as they would a node that went away.
fn ended_error(ended: &tonic::Status) -> ClientError {
    let code = match ended.code() {
        tonic::Code::Unknown | tonic::Code::Cancelled => tonic::Code::Unavailable,
        code => code,
    };
    tonic::Status::new(code, format!("session ended: {}", ended.message())).into()
}

fn mismatch(asked: &str, answer: &Answer) -> ClientError {
    tonic::Status::internal(format!("the node answered a session {asked} with {answer:?}")).into()
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}
