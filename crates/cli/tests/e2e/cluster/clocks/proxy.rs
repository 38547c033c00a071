//! A small TCP proxy in front of one node, for the clock stories' slow and
//! lossy links between a client and a node: answers (node → client) are
//! delivered a fixed delay late, in order, or, once cut, never (their bytes
//! are swallowed from then on, so the connection is dead that way, as
//! behind a failed link, while requests still reach the node). Listens on
//! 127.0.0.1 only; connections, chunks in flight, chunk sizes and the
//! proxy's lifetime are bounded, and [`Proxy::stop`] (or dropping the
//! proxy) closes everything.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Most connections the proxy serves at once; more are refused.
const MAX_CONNECTIONS: usize = 16;
/// Chunks in flight between a connection's answer reader and its writer.
const CHUNKS_IN_FLIGHT: usize = 64;
/// Read buffer size.
const CHUNK_BYTES: usize = 16 * 1024;
/// How long connecting to the node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a proxy runs at most: longer than any story that uses one, so
/// a story that forgets to stop it cannot leave it running for good.
const LIFETIME: Duration = Duration::from_secs(300);

/// A running proxy; stopping or dropping it stops accepting and closes
/// every connection.
pub struct Proxy {
    listen: SocketAddr,
    answers_pass: Arc<AtomicBool>,
    // Owns the accept loop, which owns every connection's tasks.
    tasks: JoinSet<()>,
}

impl Proxy {
    /// A proxy to `node` that delivers every answer `answer_delay` late.
    pub async fn start(node: SocketAddr, answer_delay: Duration) -> Result<Proxy> {
        Proxy::start_on((std::net::Ipv4Addr::LOCALHOST, 0).into(), node, answer_delay).await
    }

    /// The same, listening on `listen` (a stopped proxy's address, so its
    /// clients reach the new one).
    pub async fn start_on(
        listen: SocketAddr,
        node: SocketAddr,
        answer_delay: Duration,
    ) -> Result<Proxy> {
        let listener = TcpListener::bind(listen).await.context("binding the proxy")?;
        let listen = listener.local_addr().context("the proxy's address")?;
        let answers_pass = Arc::new(AtomicBool::new(true));
        let mut tasks = JoinSet::new();
        let accepting = accept(listener, node, answer_delay, answers_pass.clone());
        tasks.spawn(async move {
            let _ = tokio::time::timeout(LIFETIME, accepting).await;
        });
        eprintln!("proxy {listen} -> {node}, answers {} ms late", answer_delay.as_millis());
        Ok(Proxy { listen, answers_pass, tasks })
    }

    /// The address the proxy listens on (for [`Proxy::start_on`]; the SDK
    /// stories use it, the clock stories do not).
    #[allow(dead_code)]
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// The proxy's address as a URI, for a client.
    pub fn addr(&self) -> String {
        format!("http://{}", self.listen)
    }

    /// From now on, bytes from the node never reach the client.
    pub fn cut_answers(&self) {
        self.answers_pass.store(false, Ordering::SeqCst);
    }

    /// Stops accepting, closes every connection and waits until all the
    /// proxy's tasks have ended.
    pub async fn stop(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Accepts connections and relays each; dropping this future (the proxy
/// stopping, or its lifetime ending) drops every relay with it.
async fn accept(
    listener: TcpListener,
    node: SocketAddr,
    answer_delay: Duration,
    answers_pass: Arc<AtomicBool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else { return };
        while connections.try_join_next().is_some() {}
        if connections.len() >= MAX_CONNECTIONS {
            eprintln!("proxy: refusing a connection past {MAX_CONNECTIONS}");
            continue;
        }
        connections.spawn(relay(client, node, answer_delay, answers_pass.clone()));
    }
}

/// Relays one connection until either side closes it.
async fn relay(
    client: TcpStream,
    node: SocketAddr,
    answer_delay: Duration,
    answers_pass: Arc<AtomicBool>,
) {
    let upstream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(node)).await {
        Ok(Ok(upstream)) => upstream,
        _ => return,
    };
    // Small writes must not wait for Nagle: the delay is the proxy's alone.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut node_read, mut node_write) = upstream.into_split();
    let requests = async move {
        let mut buffer = vec![0_u8; CHUNK_BYTES];
        loop {
            let read = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            if node_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    // Answers are stamped when they arrive from the node and written once
    // their delay has passed, in order.
    let (chunks, mut delayed) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT);
    let answers_in = async move {
        let mut buffer = vec![0_u8; CHUNK_BYTES];
        loop {
            let read = match node_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            if !answers_pass.load(Ordering::SeqCst) {
                continue;
            }
            if chunks.send((Instant::now() + answer_delay, buffer[..read].to_vec())).await.is_err()
            {
                return;
            }
        }
    };
    let answers_out = async move {
        while let Some((due, chunk)) = delayed.recv().await {
            tokio::time::sleep_until(due).await;
            if client_write.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // The connection ends when the client's side ends, or once the node's
    // side has ended and what it sent has been delivered.
    tokio::select! {
        () = requests => {}
        _ = async { tokio::join!(answers_in, answers_out) } => {}
    }
}
