//! The gRPC listener's connections: accepted, bounded per client address,
//! put through the TLS handshake when TLS is on, and labelled with who is
//! on the other end ([`ConnectionInfo`]), which tonic hands to every call
//! on the connection as a request extension.
//!
//! TLS is terminated here with tokio-rustls rather than by tonic's own
//! server TLS, because tonic builds its acceptor once: certificates could
//! not rotate without a restart. Each handshake takes the configuration
//! current at that moment ([`SharedServerConfig`]).
//!
//! A connection without TLS must open its HTTP/2 session (the client's
//! preface and first frame) within the same time a TLS handshake has, so
//! silent connections cannot pile up on a plain port either; and all
//! connections together are bounded, whatever addresses they come from.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use leasehold_security::{Identity, SharedServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Bounds on connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Most open connections from one client address; more are closed at
    /// once. Every node keeps one or two channels to each peer, and a
    /// client one per process, so this is far above honest use.
    pub per_client: usize,
    /// Most TLS handshakes in progress at once (a slow handshake holds one).
    pub handshakes: usize,
    /// Most of those from one client address, so that one address cannot
    /// hold every handshake (silent connections, each for the timeout) and
    /// shut out peers and clients that bring a certificate. A quarter of
    /// the pool: a machine starting a few dozen workers at once still
    /// connects them all.
    pub handshakes_per_client: usize,
    /// A handshake not done within this is abandoned: TLS's, or without
    /// TLS (with `http2_opening`) the client's HTTP/2 preface and first
    /// frame.
    pub handshake_timeout: Duration,
    /// The port speaks HTTP/2 only (gRPC): a plain connection must open its
    /// session within `handshake_timeout`. Off for the HTTP/1 port, which
    /// bounds a request's head itself.
    pub http2_opening: bool,
    /// Most open connections (handshakes included) from all addresses
    /// together; more are closed at once. Each holds buffers and a file
    /// descriptor, and without TLS a client of many addresses (any of
    /// `127.0.0.0/8` on loopback) is bounded by nothing else.
    pub total: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            per_client: 256,
            handshakes: 128,
            handshakes_per_client: 32,
            handshake_timeout: Duration::from_secs(10),
            http2_opening: false,
            total: 4_096,
        }
    }
}

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// The verified identity of its certificate (TLS only).
    pub identity: Option<Identity>,
    /// Whether the connection is TLS.
    pub tls: bool,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// One accepted connection, holding its slot in the per-client count and
/// its place in the total.
pub struct Connection {
    io: Io,
    info: ConnectionInfo,
    /// Until a plain connection's HTTP/2 session is open.
    opening: Option<Opening>,
    _slot: Slot,
    _place: tokio::sync::OwnedSemaphorePermit,
}

/// The first bytes of a plain connection: the 24-byte HTTP/2 preface, then
/// the client's first frame (its SETTINGS), a 9-byte head and the length
/// that head states.
const OPENING_HEAD: usize = 24 + 9;

/// A plain connection still opening its HTTP/2 session: reading fails once
/// `deadline` passes before the opening bytes are in. The deadline is
/// polled with every read, so it wakes the reader of a silent connection.
struct Opening {
    deadline: Pin<Box<tokio::time::Sleep>>,
    head: [u8; OPENING_HEAD],
    read: usize,
}

impl Opening {
    fn new(timeout: Duration) -> Opening {
        Opening {
            deadline: Box::pin(tokio::time::sleep(timeout)),
            head: [0; OPENING_HEAD],
            read: 0,
        }
    }

    /// Notes bytes read; true once the preface and the first frame are in.
    fn saw(&mut self, bytes: &[u8]) -> bool {
        if let Some(room) = self.head.get_mut(self.read..) {
            let taken = room.len().min(bytes.len());
            room[..taken].copy_from_slice(&bytes[..taken]);
        }
        self.read = self.read.saturating_add(bytes.len());
        if self.read < OPENING_HEAD {
            return false;
        }
        let [a, b, c] = [self.head[24], self.head[25], self.head[26]].map(usize::from);
        self.read >= OPENING_HEAD + (a << 16 | b << 8 | c)
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let stream = match &mut this.io {
            Io::Plain(stream) => stream,
            Io::Tls(stream) => return Pin::new(stream.as_mut()).poll_read(cx, buf),
        };
        let Some(opening) = &mut this.opening else {
            return Pin::new(stream).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        match Pin::new(stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if opening.saw(&buf.filled()[before..]) {
                    this.opening = None;
                }
                Poll::Ready(result)
            }
            // Nothing to read: past the deadline that ends the connection,
            // and before it the deadline's timer wakes this reader then.
            Poll::Pending => match opening.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the HTTP/2 preface and first frame did not arrive within the handshake \
                     timeout",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(stream) => stream.is_write_vectored(),
            Io::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

/// Open connections per client address.
#[derive(Clone, Default)]
struct Counts {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A connection's place in [`Counts`]; given back when dropped.
struct Slot {
    counts: Counts,
    ip: IpAddr,
}

impl Counts {
    fn take(&self, ip: IpAddr, limit: usize) -> Option<Slot> {
        let mut open = match self.open.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let count = open.entry(ip).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(Slot { counts: self.clone(), ip })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = match self.counts.open.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The stream of connections tonic serves (see [`incoming`]). It owns the
/// accepting task: dropping the stream (the server stopped) ends it, and
/// with it every handshake still in progress.
pub struct Incoming {
    connections: ReceiverStream<io::Result<Connection>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.connections).poll_next(cx)
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// The connections accepted on `listener`. Accepting runs in a task of its
/// own, owned by the returned stream, that ends when the stream is dropped
/// or the listener fails; handshakes run concurrently in a set that task
/// owns, bounded, so a slow or silent client delays nobody else.
pub fn incoming(
    listener: TcpListener,
    tls: Option<SharedServerConfig>,
    limits: ConnectionLimits,
) -> Incoming {
    let (sender, receiver) = mpsc::channel(64);
    let accepting = tokio::spawn(accept_loop(listener, tls, limits, sender));
    Incoming { connections: ReceiverStream::new(receiver), accepting }
}

/// Logs a connection closed at once because `limit` (of `max`) is reached.
fn refuse(limit: &'static str, client: IpAddr, max: usize) {
    tracing::warn!(
        event = "limit.refuse",
        limit,
        %client,
        max,
        "a connection limit is reached; closing the new connection"
    );
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<SharedServerConfig>,
    limits: ConnectionLimits,
    sender: mpsc::Sender<io::Result<Connection>>,
) {
    let counts = Counts::default();
    let in_handshake = Counts::default();
    let handshakes = Arc::new(Semaphore::new(limits.handshakes.max(1)));
    let places = Arc::new(Semaphore::new(limits.total.max(1)));
    // Dropped (aborting every handshake) when this task ends.
    let mut in_progress = tokio::task::JoinSet::new();
    loop {
        while in_progress.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = sender.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if is_transient(&error) => {
                tracing::debug!(%error, "accept failed; going on");
                if error.raw_os_error().is_some_and(|code| [23, 24, 105, 12].contains(&code)) {
                    // Out of file descriptors or memory: give closing
                    // connections a moment instead of spinning on accept.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
            Err(error) => {
                let _ = sender.send(Err(error)).await;
                return;
            }
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            refuse("connections", remote.ip(), limits.total);
            continue;
        };
        let Some(slot) = counts.take(remote.ip(), limits.per_client) else {
            refuse("connections_per_client", remote.ip(), limits.per_client);
            continue;
        };
        // Without Nagle a reply does not wait for the peer's delayed ACK
        // (about 40 ms stalls, measured by the bench).
        let _ = stream.set_nodelay(true);
        let Some(config) = tls.as_ref().map(SharedServerConfig::current) else {
            let info = ConnectionInfo { remote: Some(remote), identity: None, tls: false };
            let connection = Connection {
                io: Io::Plain(stream),
                info,
                opening: limits.http2_opening.then(|| Opening::new(limits.handshake_timeout)),
                _slot: slot,
                _place: place,
            };
            if sender.send(Ok(connection)).await.is_err() {
                return;
            }
            continue;
        };
        let Some(handshaking) = in_handshake.take(remote.ip(), limits.handshakes_per_client) else {
            refuse("tls_handshakes_per_client", remote.ip(), limits.handshakes_per_client);
            continue;
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            refuse("tls_handshakes", remote.ip(), limits.handshakes);
            continue;
        };
        let sender = sender.clone();
        let timeout = limits.handshake_timeout;
        in_progress.spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let handshake = tokio::time::timeout(timeout, acceptor.accept(stream)).await;
            drop((permit, handshaking));
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::info!(
                        event = "auth.refuse",
                        client = %remote,
                        %error,
                        "TLS handshake refused"
                    );
                    return;
                }
                Err(_) => {
                    tracing::info!(event = "auth.refuse", client = %remote, "TLS handshake timed out");
                    return;
                }
            };
            let identity = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| Identity::from_der(leaf.as_ref()));
            let identity = match identity {
                Some(Ok(identity)) => identity,
                Some(Err(error)) => {
                    tracing::info!(event = "auth.refuse", client = %remote, %error, "unreadable client certificate");
                    return;
                }
                // The verifier demands a certificate, so this cannot
                // happen; refuse rather than serve an unnamed peer.
                None => return,
            };
            let info = ConnectionInfo { remote: Some(remote), identity: Some(identity), tls: true };
            let connection = Connection {
                io: Io::Tls(Box::new(stream)),
                info,
                opening: None,
                _slot: slot,
                _place: place,
            };
            let _ = sender.send(Ok(connection)).await;
        });
    }
}

/// Accept errors that concern one connection (or a momentary lack of file
/// descriptors), not the listener.
fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || error.raw_os_error().is_some_and(|code| RETRY_ACCEPT_ON.contains(&code))
}

/// Linux `accept(2)` errors that concern the connection being accepted or
/// a passing shortage, after which accepting goes on: EMFILE, ENFILE,
/// ENOBUFS and ENOMEM (out of descriptors or memory for a moment), and the
/// network errors the man page says to treat like EAGAIN (EPROTO, ENOPROTOOPT,
/// EHOSTDOWN, ENONET, EHOSTUNREACH, EOPNOTSUPP, ENETUNREACH, ENETDOWN).
const RETRY_ACCEPT_ON: [i32; 12] = [24, 23, 105, 12, 71, 92, 112, 64, 113, 95, 101, 100];

#[cfg(test)]
mod tests {
    use leasehold_security::TlsFiles;
    use leasehold_security::devcerts::DevCerts;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpSocket;

    use super::*;

    /// A connection from `ip` that sends nothing.
    async fn silent(ip: [u8; 4], to: SocketAddr) -> io::Result<TcpStream> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((ip, 0)))?;
        socket.connect(to).await
    }

    /// Whether the node closed `stream` within a moment (read EOF or reset).
    async fn closed_soon(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(300), stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }

    #[tokio::test]
    async fn one_address_cannot_hold_every_tls_handshake() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        DevCerts { dir: dir.path().to_path_buf(), nodes: 1, hosts: Vec::new() }.write()?;
        let files = TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("node-1.pem"),
            key: dir.path().join("node-1.key"),
        };
        let tls = SharedServerConfig::new(files.load()?.server_config()?);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let limits = ConnectionLimits {
            handshakes: 16,
            handshakes_per_client: 4,
            ..ConnectionLimits::default()
        };
        let _incoming = incoming(listener, Some(tls), limits);
        // One address opens more silent connections than there are handshakes.
        let mut flood = Vec::new();
        for _ in 0..20 {
            flood.push(silent([127, 0, 0, 2], addr).await?);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut refused = 0;
        for stream in &mut flood {
            refused += usize::from(closed_soon(stream).await);
        }
        assert_eq!(refused, 16, "all but the per-address share are closed at once");
        // Another address still gets a handshake: its connection stays open.
        let mut other = silent([127, 0, 0, 3], addr).await?;
        assert!(!closed_soon(&mut other).await, "another client was shut out");
        Ok(())
    }

    /// The node's side of the next connection: what reading it until it
    /// fails or `within` passes gives (bytes read, and the error if any).
    async fn served(
        incoming: &mut Incoming,
        within: Duration,
    ) -> Result<(usize, Option<io::ErrorKind>), Box<dyn std::error::Error>> {
        use tokio_stream::StreamExt;
        let mut connection = incoming.next().await.ok_or("the listener ended")??;
        let mut read = 0;
        let mut buffer = [0u8; 64];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, connection.read(&mut buffer)).await {
                Err(_) => return Ok((read, None)),
                Ok(Ok(0)) => return Ok((read, Some(io::ErrorKind::UnexpectedEof))),
                Ok(Ok(count)) => read += count,
                Ok(Err(error)) => return Ok((read, Some(error.kind()))),
            }
        }
    }

    #[tokio::test]
    async fn a_plain_connection_must_open_its_session_in_time()
    -> Result<(), Box<dyn std::error::Error>> {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let limits = ConnectionLimits {
            handshake_timeout: Duration::from_millis(300),
            http2_opening: true,
            ..Default::default()
        };
        let mut incoming = incoming(listener, None, limits);
        let wait = Duration::from_millis(900);

        let _silent = silent([127, 0, 0, 2], addr).await?;
        assert_eq!(served(&mut incoming, wait).await?, (0, Some(io::ErrorKind::TimedOut)));

        // The preface and the head of a SETTINGS frame saying 6 bytes follow,
        // then nothing: still opening when the deadline passes.
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let settings_head = [0, 0, 6, 4, 0, 0, 0, 0, 0];
        let mut short = silent([127, 0, 0, 3], addr).await?;
        short.write_all(&[&preface[..], &settings_head].concat()).await?;
        assert_eq!(served(&mut incoming, wait).await?, (33, Some(io::ErrorKind::TimedOut)));

        // The whole first frame: the session is open, and stays so idle.
        let mut opened = silent([127, 0, 0, 4], addr).await?;
        opened.write_all(&[&preface[..], &settings_head, &[0, 3, 0, 0, 0, 100]].concat()).await?;
        assert_eq!(served(&mut incoming, wait).await?, (39, None));

        // A port that is not HTTP/2 only (the HTTP/1 port) has no such
        // deadline: its request heads are bounded by its own server.
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let limits = ConnectionLimits { http2_opening: false, ..limits };
        let mut incoming = super::incoming(listener, None, limits);
        let mut http1 = silent([127, 0, 0, 5], addr).await?;
        http1.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await?;
        assert_eq!(served(&mut incoming, wait).await?, (42, None));
        Ok(())
    }

    #[tokio::test]
    async fn connections_from_many_addresses_are_bounded_together()
    -> Result<(), Box<dyn std::error::Error>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mut incoming =
            incoming(listener, None, ConnectionLimits { total: 3, ..Default::default() });
        let mut open = Vec::new();
        for last in 2..7u8 {
            open.push(silent([127, 0, 0, last], addr).await?);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut refused = 0;
        for stream in &mut open {
            refused += usize::from(closed_soon(stream).await);
        }
        assert_eq!(refused, 2, "five addresses, one connection each, three places");
        // The node closes one it holds.
        drop(tokio_stream::StreamExt::next(&mut incoming).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut again = silent([127, 0, 0, 9], addr).await?;
        assert!(!closed_soon(&mut again).await, "a closed connection gives back its place");
        Ok(())
    }

    #[test]
    fn slots_bound_connections_per_client_and_come_back() {
        let counts = Counts::default();
        let ip: IpAddr = [127, 0, 0, 9].into();
        let other: IpAddr = [127, 0, 0, 10].into();
        let first = counts.take(ip, 2);
        let second = counts.take(ip, 2);
        assert!(first.is_some() && second.is_some());
        assert!(counts.take(ip, 2).is_none(), "a third from the same address is refused");
        assert!(counts.take(other, 2).is_some(), "another address has its own count");
        drop(first);
        assert!(counts.take(ip, 2).is_some(), "a closed connection frees its slot");
    }
}
