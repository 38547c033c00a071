//! Appends on one long-lived stream per follower (`AppendStream`).
//!
//! Every AppendEntries a leader sends (openraft's own, the messages sent
//! ahead, the commit messages) goes to a follower that serves the call
//! (wire format 2 or later, by its adverts) as one message on a stream
//! opened once: two HTTP/2 data frames a round instead of a call's
//! headers, data and trailers each way, with no task per call on either
//! side. The follower answers each message with one message, in the
//! order sent, so the n-th answer belongs to the n-th message.
//!
//! What a unary call gave, a stream keeps:
//! - **A deadline per message.** The caller waits for its answer as long
//!   as openraft's deadline (or the sender's) allows. When it gives up
//!   (or openraft's own timer drops it), the stream is closed, so a later
//!   message never waits behind an answer that is not coming; the next
//!   message opens a new stream. A stream this node closed answers its
//!   waiting messages ABORTED, which openraft takes as a failed call to
//!   send again, not as a peer down to back off from.
//! - **Failure is seen.** When the stream ends or fails, every message
//!   still waiting is answered with the stream's status (UNAVAILABLE when
//!   it just ended), which the network reports to openraft as it would a
//!   failed call; the next message opens a new stream.
//! - **Identity.** The stream is one call on the peer channel, so it
//!   carries the node's credentials, and the follower checks every
//!   message's vote against them as it does a unary append's.
//! - **Bounds.** A message is bounded like a unary one (the channel's
//!   message limits); messages wait in an unbounded queue, but only as
//!   many as callers wait on, each for its deadline at most.
//!
//! A follower of an earlier build answers the call UNIMPLEMENTED (its
//! adverts may be stale: it was downgraded, say); the message then goes
//! as a unary call, and so do the next ones to that follower for
//! [`UNARY_AFTER_UNIMPLEMENTED`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use leasehold_proto::v1::RaftEnvelope;
use leasehold_proto::v1::raft_client::RaftClient;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Status;

use crate::envelope::MAX_ENVELOPE_BYTES;
use crate::network::PeerChannel;
use crate::types::NodeId;

/// How long appends to a follower that answered `AppendStream`
/// UNIMPLEMENTED go as unary calls before the stream is tried again.
pub const UNARY_AFTER_UNIMPLEMENTED: Duration = Duration::from_secs(30);

/// One message's answer: the envelope's bytes, or why there is none.
type Answer = Result<Vec<u8>, Status>;

/// The open streams of a node, one per follower.
#[derive(Default)]
pub(crate) struct Links {
    links: Mutex<HashMap<NodeId, Arc<Link>>>,
    /// Followers that answered UNIMPLEMENTED, and until when they are
    /// sent unary calls.
    unary: Mutex<HashMap<NodeId, Instant>>,
    opened: std::sync::atomic::AtomicU64,
}

/// One stream: the messages sent and not yet answered, oldest first, and
/// the sending end of its requests; `None` once closed.
struct Link {
    /// The peer's address it was opened to.
    addr: String,
    open: Mutex<Option<Open>>,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
}

struct Open {
    waiting: VecDeque<oneshot::Sender<Answer>>,
    requests: mpsc::UnboundedSender<RaftEnvelope>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Links {
    /// Whether appends to `target` go on a stream now (they do unless it
    /// answered UNIMPLEMENTED lately).
    pub(crate) fn streaming(&self, target: NodeId) -> bool {
        let mut unary = lock(&self.unary);
        match unary.get(&target) {
            Some(until) if Instant::now() < *until => false,
            Some(_) => {
                unary.remove(&target);
                true
            }
            None => true,
        }
    }

    /// How many streams were opened (each reconnection counts).
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `data` to `target` on its stream (opened on the channel
    /// `channel` gives, to `addr`, if there is none to that address) and
    /// waits for its answer, `deadline` at most. A message not answered
    /// in time closes the stream, and so does a caller that stops waiting
    /// (openraft's own timer, say): no later message waits behind an
    /// answer nobody wants. UNIMPLEMENTED means the follower does not
    /// serve the call: it is then sent unary calls for a while (see
    /// [`Links::streaming`]).
    ///
    /// A stream this node closed answers ABORTED, its own missed deadline
    /// included: the peer is not known to be down, so openraft should
    /// send again at once rather than back off as it does for an
    /// unreachable peer (which would leave the follower without
    /// heartbeats for long enough to start an election).
    pub(crate) async fn call(
        &self,
        target: NodeId,
        addr: &str,
        channel: impl FnOnce() -> Option<PeerChannel>,
        data: Vec<u8>,
        deadline: Duration,
    ) -> Answer {
        let (answered, answer) = oneshot::channel();
        let link = self.send(target, addr, channel, RaftEnvelope { data }, answered)?;
        let mut waiting = Waiting { links: self, target, link: Some(link) };
        let answer = match tokio::time::timeout(deadline, answer).await {
            Ok(Ok(answer)) => {
                waiting.link = None;
                answer
            }
            Ok(Err(_)) => Err(Status::aborted("the append stream closed")),
            // `waiting` closes the stream as it goes.
            Err(_) => Err(Status::aborted(format!(
                "no answer on the append stream in {} ms",
                deadline.as_millis()
            ))),
        };
        drop(waiting);
        if matches!(&answer, Err(status) if status.code() == tonic::Code::Unimplemented) {
            lock(&self.unary).insert(target, Instant::now() + UNARY_AFTER_UNIMPLEMENTED);
        }
        answer
    }

    /// Queues `envelope` on `target`'s open stream to `addr`, or on a
    /// new one (a stream to an address the member no longer has is
    /// closed).
    fn send(
        &self,
        target: NodeId,
        addr: &str,
        channel: impl FnOnce() -> Option<PeerChannel>,
        envelope: RaftEnvelope,
        answered: oneshot::Sender<Answer>,
    ) -> Result<Arc<Link>, Status> {
        let mut links = lock(&self.links);
        let (envelope, answered) = match links.get(&target) {
            Some(link) if link.addr == addr => match link.push(envelope, answered) {
                Ok(()) => return Ok(link.clone()),
                Err(unsent) => unsent,
            },
            Some(moved) => {
                moved.close(Status::aborted("the member's address changed"));
                (envelope, answered)
            }
            None => (envelope, answered),
        };
        let Some(channel) = channel() else {
            return Err(Status::unavailable(format!("bad address {addr} for node {target}")));
        };
        let link = Link::open(target, addr, channel);
        self.opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A new link is open until its reader runs, which it has not yet.
        if let Err((_, answered)) = link.push(envelope, answered) {
            let _ = answered.send(Err(Status::aborted("the append stream closed")));
        }
        links.insert(target, link.clone());
        Ok(link)
    }

    /// Closes `link` and forgets it, if it is still `target`'s.
    fn close(&self, target: NodeId, link: &Arc<Link>) {
        let mut links = lock(&self.links);
        if links.get(&target).is_some_and(|current| Arc::ptr_eq(current, link)) {
            links.remove(&target);
        }
        drop(links);
        link.close(Status::aborted("the append stream was closed"));
    }

    /// Closes every stream (the credentials changed: the next message
    /// opens a stream on a channel that carries the new ones).
    pub(crate) fn close_all(&self) {
        let links: Vec<Arc<Link>> = lock(&self.links).drain().map(|(_, link)| link).collect();
        for link in links {
            link.close(Status::aborted("the node's credentials changed"));
        }
    }
}

/// A message waiting for its answer: if it stops waiting before the
/// answer came (`link` still set), its stream is closed.
struct Waiting<'a> {
    links: &'a Links,
    target: NodeId,
    link: Option<Arc<Link>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            self.links.close(self.target, &link);
        }
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        for link in lock(&self.links).values() {
            link.close(Status::aborted("the node's network is gone"));
        }
    }
}

impl Link {
    /// A stream to `target` behind `channel` (at `addr`), read by a task
    /// of its own.
    fn open(target: NodeId, addr: &str, channel: PeerChannel) -> Arc<Link> {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            addr: addr.to_string(),
            open: Mutex::new(Some(Open { waiting: VecDeque::new(), requests })),
            reader: Mutex::new(None),
        });
        let client = RaftClient::new(channel)
            .max_decoding_message_size(MAX_ENVELOPE_BYTES)
            .max_encoding_message_size(MAX_ENVELOPE_BYTES);
        let reader = tokio::spawn(read(link.clone(), client, target, outgoing));
        *lock(&link.reader) = Some(reader.abort_handle());
        link
    }

    /// Queues a message and who waits for its answer, in one step so the
    /// answers' order is the messages'; gives both back if closed.
    fn push(
        &self,
        envelope: RaftEnvelope,
        answered: oneshot::Sender<Answer>,
    ) -> Result<(), (RaftEnvelope, oneshot::Sender<Answer>)> {
        let mut open = lock(&self.open);
        let Some(stream) = open.as_mut() else {
            return Err((envelope, answered));
        };
        match stream.requests.send(envelope) {
            Ok(()) => {
                stream.waiting.push_back(answered);
                Ok(())
            }
            Err(mpsc::error::SendError(envelope)) => Err((envelope, answered)),
        }
    }

    /// Hands an answer to the oldest waiting message; `false` when no
    /// message waits for one (the peer answered more than it was sent),
    /// or the link is closed.
    fn answer(&self, data: Vec<u8>) -> bool {
        let mut open = lock(&self.open);
        let Some(waiting) = open.as_mut().and_then(|stream| stream.waiting.pop_front()) else {
            return false;
        };
        // The caller may have given up waiting: nothing to do then.
        let _ = waiting.send(Ok(data));
        true
    }

    /// Ends the stream: every waiting message is answered `status`, no
    /// message is taken from now on, the requests end, and the reader
    /// stops.
    fn close(&self, status: Status) {
        let closed = lock(&self.open).take();
        if let Some(stream) = closed {
            for waiting in stream.waiting {
                let _ = waiting.send(Err(status.clone()));
            }
        }
        if let Some(reader) = lock(&self.reader).take() {
            reader.abort();
        }
    }
}

/// Opens the stream and hands each answer to the oldest waiting message,
/// until the stream ends or fails; then closes the link with the reason.
async fn read(
    link: Arc<Link>,
    mut client: RaftClient<PeerChannel>,
    target: NodeId,
    outgoing: mpsc::UnboundedReceiver<RaftEnvelope>,
) {
    let mut request = tonic::Request::new(UnboundedReceiverStream::new(outgoing));
    crate::network::addressed_to(&mut request, target);
    let ended = match client.append_stream(request).await {
        Ok(response) => {
            let mut answers = response.into_inner();
            loop {
                match answers.message().await {
                    Ok(Some(envelope)) => {
                        if !link.answer(envelope.data) {
                            break Status::internal(
                                "an answer on the append stream for no message",
                            );
                        }
                    }
                    Ok(None) => break Status::unavailable("the peer ended the append stream"),
                    Err(status) => break status,
                }
            }
        }
        Err(status) => status,
    };
    // Taken so closing does not abort this task while it closes.
    lock(&link.reader).take();
    link.close(ended);
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::pin::Pin;

    use leasehold_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
    use openraft::error::RaftError;
    use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
    use openraft::{BasicNode, Vote};
    use tokio_stream::Stream;
    use tonic::{Request, Response, Streaming};

    use leasehold_security::secret::TARGET_NODE_HEADER;

    use super::*;
    use crate::envelope::{self, Wire};
    use crate::network::NetworkFactory;
    use crate::types::TypeConfig;

    /// A peer's Raft service for these tests. On its append stream it
    /// answers each message with its bytes reversed, one at a time; it
    /// waits two seconds before answering `slow`, and ends the stream
    /// with INVALID_ARGUMENT on `refuse`. Without `streams` it is an
    /// earlier build: the stream is UNIMPLEMENTED, and a unary append is
    /// answered `Success`.
    #[derive(Clone)]
    struct Peer {
        streams: bool,
        /// Answers nothing on its append stream for two seconds.
        stalls: bool,
    }

    type Answers = Pin<Box<dyn Stream<Item = Result<RaftEnvelope, Status>> + Send>>;

    async fn answer(data: Vec<u8>) -> Result<RaftEnvelope, Status> {
        match data.as_slice() {
            b"slow" => tokio::time::sleep(Duration::from_secs(2)).await,
            b"refuse" => return Err(Status::invalid_argument("data: refused by the test")),
            _ => {}
        }
        Ok(RaftEnvelope { data: data.into_iter().rev().collect() })
    }

    /// The test's peer is node 2: a call meant for another is refused, as
    /// a node does (every test here sends to node 2, so each checks that
    /// its calls name their recipient).
    fn meant_for_node_2<T>(request: &Request<T>) -> Result<(), Status> {
        let named = request.metadata().get(TARGET_NODE_HEADER).and_then(|v| v.to_str().ok());
        match named {
            Some("2") => Ok(()),
            other => Err(Status::failed_precondition(format!("meant for node {other:?}"))),
        }
    }

    #[tonic::async_trait]
    impl RaftRpc for Peer {
        async fn append_entries(
            &self,
            request: Request<RaftEnvelope>,
        ) -> Result<Response<RaftEnvelope>, Status> {
            meant_for_node_2(&request)?;
            let answer: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
                Ok(AppendEntriesResponse::Success);
            let data = envelope::encode_as(Wire::Binary, &answer)
                .map_err(|e| Status::internal(e.to_string()))?;
            Ok(Response::new(RaftEnvelope { data }))
        }

        type AppendStreamStream = Answers;

        async fn append_stream(
            &self,
            request: Request<Streaming<RaftEnvelope>>,
        ) -> Result<Response<Answers>, Status> {
            if !self.streams {
                return Err(Status::unimplemented("an earlier build"));
            }
            meant_for_node_2(&request)?;
            let answers = answer_each(request.into_inner(), self.stalls);
            Ok(Response::new(answers))
        }

        async fn vote(&self, _: Request<RaftEnvelope>) -> Result<Response<RaftEnvelope>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn install_snapshot(
            &self,
            _: Request<RaftEnvelope>,
        ) -> Result<Response<RaftEnvelope>, Status> {
            Err(Status::unimplemented("not in this test"))
        }

        async fn forward(
            &self,
            _: Request<RaftEnvelope>,
        ) -> Result<Response<RaftEnvelope>, Status> {
            Err(Status::unimplemented("not in this test"))
        }
    }

    /// The answers to `messages`, one at a time, ending after a refusal.
    fn answer_each(messages: Streaming<RaftEnvelope>, stalls: bool) -> Answers {
        let (answers, stream) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = messages;
            while let Ok(Some(envelope)) = messages.message().await {
                if stalls {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let answered = answer(envelope.data).await;
                let refused = answered.is_err();
                if answers.send(answered).is_err() || refused {
                    break;
                }
            }
        });
        Box::pin(UnboundedReceiverStream::new(stream))
    }

    /// Serves `peer` on a port of 127.0.0.1 until the handle is aborted.
    async fn serve(peer: Peer) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(RaftServer::new(peer))
                .serve_with_incoming(incoming)
                .await;
            if let Err(error) = served {
                eprintln!("the test's peer stopped: {error}");
            }
        });
        Ok((addr, server))
    }

    /// Sends `data` on the stream to node 2 at `addr`.
    async fn call(
        links: &Links,
        factory: &NetworkFactory,
        addr: &str,
        data: &[u8],
        deadline: Duration,
    ) -> anyhow::Result<Answer> {
        let channel = factory.channel(addr)?;
        Ok(links.call(2, addr, || Some(channel), data.to_vec(), deadline).await)
    }

    #[tokio::test]
    async fn each_answer_reaches_its_own_message_on_one_stream() -> anyhow::Result<()> {
        let (addr, server) = serve(Peer { streams: true, stalls: false }).await?;
        let addr = addr.to_string();
        let (links, factory) = (Links::default(), NetworkFactory::new());
        let messages: Vec<Vec<u8>> = (0..32u8)
            .map(|n| vec![n; usize::from(n) + 1])
            .map(|mut m| {
                m.push(0xff);
                m
            })
            .collect();
        let calls = messages
            .iter()
            .map(|message| call(&links, &factory, &addr, message, Duration::from_secs(5)));
        let answers = futures::future::join_all(calls).await;
        for (message, answer) in messages.iter().zip(answers) {
            let reversed: Vec<u8> = message.iter().rev().copied().collect();
            assert_eq!(answer?.map_err(|s| s.to_string()), Ok(reversed));
        }
        assert_eq!(links.opened(), 1, "every message went on one stream");
        server.abort();
        Ok(())
    }

    #[tokio::test]
    async fn a_message_not_answered_in_time_closes_its_stream() -> anyhow::Result<()> {
        let (addr, server) = serve(Peer { streams: true, stalls: false }).await?;
        let addr = addr.to_string();
        let (links, factory) = (Links::default(), NetworkFactory::new());
        let slow = call(&links, &factory, &addr, b"slow", Duration::from_millis(200)).await?;
        assert_eq!(slow.map_err(|s| s.code()), Err(tonic::Code::Aborted));
        // The next message does not wait behind the answer still to come:
        // it goes on a new stream and is answered at once.
        let started = Instant::now();
        let next = call(&links, &factory, &addr, b"ab", Duration::from_secs(1)).await?;
        assert_eq!(next.map_err(|s| s.to_string()), Ok(b"ba".to_vec()));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(links.opened(), 2);
        // A caller that stops waiting (as openraft's own timer drops a
        // call) closes its stream just the same.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(200),
            call(&links, &factory, &addr, b"slow", Duration::from_secs(5)),
        )
        .await;
        assert!(gave_up.is_err(), "the slow message was answered: {gave_up:?}");
        let started = Instant::now();
        let next = call(&links, &factory, &addr, b"cd", Duration::from_secs(1)).await?;
        assert_eq!(next.map_err(|s| s.to_string()), Ok(b"dc".to_vec()));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(links.opened(), 3);
        server.abort();
        Ok(())
    }

    #[tokio::test]
    async fn a_stream_the_peer_ends_fails_its_message_and_the_next_opens_another()
    -> anyhow::Result<()> {
        let (addr, server) = serve(Peer { streams: true, stalls: false }).await?;
        let addr = addr.to_string();
        let (links, factory) = (Links::default(), NetworkFactory::new());
        let refused = call(&links, &factory, &addr, b"refuse", Duration::from_secs(5)).await?;
        assert_eq!(refused.map_err(|s| s.code()), Err(tonic::Code::InvalidArgument));
        let next = call(&links, &factory, &addr, b"xy", Duration::from_secs(5)).await?;
        assert_eq!(next.map_err(|s| s.to_string()), Ok(b"yx".to_vec()));
        assert_eq!(links.opened(), 2);
        server.abort();
        Ok(())
    }

    /// A factory whose node 2, at `addr`, advertises streams; a client
    /// to it; and a heartbeat of node 1's to send it.
    async fn streaming_client(
        addr: SocketAddr,
    ) -> (NetworkFactory, crate::network::PeerClient, AppendEntriesRequest<TypeConfig>) {
        let mut factory = NetworkFactory::new();
        factory.wires().set(2, crate::envelope::WIRE_FORMAT);
        let client = factory.new_client(2, &BasicNode::new(addr.to_string())).await;
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        (factory, client, rpc)
    }

    #[tokio::test]
    async fn a_stream_closed_on_a_missed_deadline_is_no_unreachable_peer() -> anyhow::Result<()> {
        let (addr, server) = serve(Peer { streams: true, stalls: true }).await?;
        let (_factory, mut client, rpc) = streaming_client(addr).await;
        // openraft backs off from an unreachable peer (no heartbeat for
        // 500 ms); a message this node gave up on must not read as one.
        let option = RPCOption::new(Duration::from_millis(200));
        let answer = client.append_entries(rpc, option).await;
        assert!(matches!(answer, Err(openraft::error::RPCError::Network(_))), "{answer:?}");
        server.abort();
        Ok(())
    }

    #[tokio::test]
    async fn a_peer_of_an_earlier_build_is_sent_unary_appends() -> anyhow::Result<()> {
        let (addr, server) = serve(Peer { streams: false, stalls: false }).await?;
        // Its advert says it streams (stale: it was downgraded since).
        let (factory, mut client, rpc) = streaming_client(addr).await;
        let option = RPCOption::new(Duration::from_secs(2));
        for _ in 0..2 {
            let answer = client.append_entries(rpc.clone(), option.clone()).await;
            assert!(matches!(answer, Ok(AppendEntriesResponse::Success)), "{answer:?}");
        }
        // The first append tried the stream; the second went unary at once.
        assert_eq!(factory.append_streams_opened(), 1);
        server.abort();
        Ok(())
    }
}
