//! A userspace TCP proxy in front of one node, controllable at run time.
//!
//! The kernel here has no `tc netem`, and iptables needs root, so network
//! faults come from the harness itself: every node advertises its proxy's
//! address to its peers, and clients also connect through the proxies. Each
//! node's outgoing peer connections leave from the node's own loopback IP
//! (127.0.0.(base + id)), so the proxy in front of node M learns from a
//! connection's source IP which node is calling (anything else is a client).
//! One inbound proxy per node is then enough for per-link faults: the rule
//! for "source N at proxy M" governs the link N→M, separately per direction:
//!
//! - `up`: bytes from the source to this proxy's node (requests);
//! - `down`: bytes from this proxy's node back to the source (responses).
//!
//! Modes per direction: pass; blackhole (accept and hold silently: bytes are
//! swallowed, and a connection that lost bytes is reset once the rule lifts,
//! since its stream is corrupt); hold (buffer, deliver late when the rule
//! lifts: stale messages arrive after the fact); reset (close connections
//! with RST and refuse new ones); delay with jitter (order kept, as TCP
//! would). Every buffer is bounded.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What happens to bytes travelling one way on a link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum Mode {
    /// Delivered at once.
    #[default]
    Pass,
    /// Swallowed silently; the connection is reset when the rule lifts.
    Blackhole,
    /// Buffered, and delivered when the rule lifts.
    Hold,
    /// Connections are closed with RST; new ones are refused.
    Reset,
    /// Delivered after `base_ms` plus up to `jitter_ms`, in order.
    Delay {
        /// Fixed part of the delay.
        base_ms: u64,
        /// Random extra, uniform in `0..=jitter_ms`.
        jitter_ms: u64,
    },
}

/// Who is calling: a node (known by its source IP) or a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Source {
    /// A peer node.
    Node(u64),
    /// Anything that is not a node (workloads, the CLI).
    Client,
}

/// The rule for one link, per direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkRule {
    /// Source → this node.
    pub up: Mode,
    /// This node → source.
    pub down: Mode,
}

impl LinkRule {
    /// Both directions in `mode`.
    pub fn both(mode: Mode) -> LinkRule {
        LinkRule { up: mode, down: mode }
    }
}

/// Rules per source; sources not named pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    per_source: BTreeMap<Source, LinkRule>,
}

impl Rules {
    /// The rule for `source`.
    pub fn get(&self, source: Source) -> LinkRule {
        self.per_source.get(&source).copied().unwrap_or_default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

impl Direction {
    fn mode(self, rule: LinkRule) -> Mode {
        match self {
            Direction::Up => rule.up,
            Direction::Down => rule.down,
        }
    }
}

/// Counters of what the proxy did (for the summary).
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections closed by a reset rule (or because a blackhole corrupted them).
    pub resets: AtomicU64,
    /// Bytes swallowed by a blackhole.
    pub bytes_dropped: AtomicU64,
    /// Bytes held and delivered late.
    pub bytes_held: AtomicU64,
    /// Bytes delayed.
    pub bytes_delayed: AtomicU64,
}

/// Largest amount one direction of one connection may hold before the
/// connection is treated as blackholed (and reset when the rule lifts).
const HOLD_LIMIT_BYTES: usize = 32 * 1024 * 1024;
/// Chunks in flight between a direction's reader and writer.
const CHUNKS_IN_FLIGHT: usize = 256;
/// How long connecting to the node may take.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Read buffer size.
const CHUNK_BYTES: usize = 16 * 1024;

/// A running proxy. Dropping it stops accepting and closes every connection.
pub struct Proxy {
    listen: SocketAddr,
    rules: watch::Sender<Rules>,
    stats: Arc<ProxyStats>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl Proxy {
    /// Starts a proxy on `listener` forwarding to `upstream`. `nodes` maps
    /// source IPs to node ids.
    pub fn start(
        listener: TcpListener,
        upstream: SocketAddr,
        nodes: BTreeMap<IpAddr, u64>,
    ) -> anyhow::Result<Proxy> {
        let listen = listener.local_addr()?;
        let (rules, rules_rx) = watch::channel(Rules::default());
        let stats = Arc::new(ProxyStats::default());
        let accept_task =
            tokio::spawn(accept_loop(listener, upstream, nodes, rules_rx, stats.clone()));
        Ok(Proxy { listen, rules, stats, accept_task })
    }

    /// The address to connect to (the node's advertised address).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Sets the rule for one source.
    pub fn set(&self, source: Source, rule: LinkRule) {
        self.rules.send_modify(|rules| {
            if rule == LinkRule::default() {
                rules.per_source.remove(&source);
            } else {
                rules.per_source.insert(source, rule);
            }
        });
    }

    /// Changes one direction of one source's rule, keeping the other.
    pub fn set_direction(&self, source: Source, up: Option<Mode>, down: Option<Mode>) {
        let mut rule = self.rules.borrow().get(source);
        if let Some(up) = up {
            rule.up = up;
        }
        if let Some(down) = down {
            rule.down = down;
        }
        self.set(source, rule);
    }

    /// Every link passes again (held bytes are delivered, corrupted
    /// connections reset).
    pub fn heal(&self) {
        self.rules.send_modify(|rules| rules.per_source.clear());
    }

    /// The current rules.
    pub fn rules(&self) -> Rules {
        self.rules.borrow().clone()
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    nodes: BTreeMap<IpAddr, u64>,
    rules: watch::Receiver<Rules>,
    stats: Arc<ProxyStats>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = listener.accept().await;
        // Reap finished connection tasks so the set stays small.
        while connections.try_join_next().is_some() {}
        let (inbound, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let source = nodes.get(&peer.ip()).map(|id| Source::Node(*id)).unwrap_or(Source::Client);
        connections.spawn(serve_connection(
            inbound,
            source,
            upstream,
            rules.clone(),
            stats.clone(),
        ));
    }
}

/// What a direction's reader ended with.
enum PumpEnd {
    /// The source closed its side; the end was passed on.
    Eof,
    /// A rule (or corruption) says: reset the whole connection.
    Reset,
    /// A socket failed.
    Broken,
}

enum Chunk {
    Data { deliver_at: Instant, bytes: Vec<u8> },
    Eof,
}

async fn serve_connection(
    inbound: TcpStream,
    source: Source,
    upstream: SocketAddr,
    mut rules: watch::Receiver<Rules>,
    stats: Arc<ProxyStats>,
) {
    let rule = rules.borrow_and_update().get(source);
    // Every close of a proxied connection is abrupt (RST), as a crashed or
    // partitioned peer's would be.
    let _ = inbound.set_zero_linger();
    let _ = inbound.set_nodelay(true);
    if rule.up == Mode::Reset || rule.down == Mode::Reset {
        stats.resets.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let outbound =
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
            Ok(Ok(stream)) => stream,
            // The node is down: close the client's connection, as a refused
            // connection would end it.
            _ => return,
        };
    let _ = outbound.set_zero_linger();
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let (up_tx, up_rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let (down_tx, down_rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let mut tasks = JoinSet::new();
    tasks.spawn(pump(in_read, up_tx, Direction::Up, source, rules.clone(), stats.clone()));
    tasks.spawn(pump(out_read, down_tx, Direction::Down, source, rules, stats.clone()));
    tasks.spawn(deliver(out_write, up_rx));
    tasks.spawn(deliver(in_write, down_rx));
    let mut eofs = 0;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(PumpEnd::Eof) => {
                eofs += 1;
                // Both readers and both writers finished cleanly.
                if eofs == 4 {
                    break;
                }
            }
            Ok(PumpEnd::Reset) => {
                stats.resets.fetch_add(1, Ordering::Relaxed);
                break;
            }
            Ok(PumpEnd::Broken) | Err(_) => break,
        }
    }
    // Dropping the halves (zero linger) sends RST both ways.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// Reads one direction and forwards chunks according to the live rule.
async fn pump(
    mut reader: OwnedReadHalf,
    tx: mpsc::Sender<Chunk>,
    direction: Direction,
    source: Source,
    mut rules: watch::Receiver<Rules>,
    stats: Arc<ProxyStats>,
) -> PumpEnd {
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut held_bytes = 0usize;
    let mut held_eof = false;
    let mut tainted = false;
    let mut last_deliver = Instant::now();
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let mut source_open = true;
    loop {
        let mode = direction.mode(rules.borrow_and_update().get(source));
        if mode == Mode::Reset || (tainted && mode != Mode::Blackhole) {
            return PumpEnd::Reset;
        }
        if mode != Mode::Hold && (!held.is_empty() || held_eof) {
            // The hold lifted: deliver what was held, late and in order.
            for bytes in held.drain(..) {
                let deliver_at = Instant::now();
                if tx.send(Chunk::Data { deliver_at, bytes }).await.is_err() {
                    return PumpEnd::Broken;
                }
            }
            held_bytes = 0;
            if held_eof {
                let _ = tx.send(Chunk::Eof).await;
                return PumpEnd::Eof;
            }
        }
        if !source_open {
            // Only a rule change can matter now (a held EOF to release).
            if rules.changed().await.is_err() {
                return PumpEnd::Broken;
            }
            continue;
        }
        let read = tokio::select! {
            read = reader.read(&mut buffer) => read,
            changed = rules.changed() => {
                if changed.is_err() {
                    return PumpEnd::Broken;
                }
                continue;
            }
        };
        let count = match read {
            Ok(count) => count,
            Err(_) => return PumpEnd::Broken,
        };
        if count == 0 {
            source_open = false;
            match mode {
                Mode::Hold => {
                    held_eof = true;
                    continue;
                }
                Mode::Blackhole => continue,
                _ => {
                    let _ = tx.send(Chunk::Eof).await;
                    return PumpEnd::Eof;
                }
            }
        }
        let bytes = buffer[..count].to_vec();
        match mode {
            Mode::Pass | Mode::Reset => {
                last_deliver = Instant::now().max(last_deliver);
                if tx.send(Chunk::Data { deliver_at: last_deliver, bytes }).await.is_err() {
                    return PumpEnd::Broken;
                }
            }
            Mode::Delay { base_ms, jitter_ms } => {
                let extra =
                    if jitter_ms == 0 { 0 } else { rand::thread_rng().gen_range(0..=jitter_ms) };
                let at = Instant::now() + Duration::from_millis(base_ms + extra);
                // TCP keeps order: a chunk never overtakes an earlier one.
                last_deliver = at.max(last_deliver);
                stats.bytes_delayed.fetch_add(count as u64, Ordering::Relaxed);
                if tx.send(Chunk::Data { deliver_at: last_deliver, bytes }).await.is_err() {
                    return PumpEnd::Broken;
                }
            }
            Mode::Blackhole => {
                tainted = true;
                stats.bytes_dropped.fetch_add(count as u64, Ordering::Relaxed);
            }
            Mode::Hold => {
                if held_bytes + count > HOLD_LIMIT_BYTES {
                    // Too much to hold: the rest is lost, so the stream is
                    // corrupt and will be reset when the rule lifts.
                    tainted = true;
                    stats.bytes_dropped.fetch_add((held_bytes + count) as u64, Ordering::Relaxed);
                    held.clear();
                    held_bytes = 0;
                } else {
                    held_bytes += count;
                    stats.bytes_held.fetch_add(count as u64, Ordering::Relaxed);
                    held.push(bytes);
                }
            }
        }
    }
}

/// Writes one direction's chunks when they are due.
async fn deliver(mut writer: OwnedWriteHalf, mut rx: mpsc::Receiver<Chunk>) -> PumpEnd {
    while let Some(chunk) = rx.recv().await {
        match chunk {
            Chunk::Data { deliver_at, bytes } => {
                tokio::time::sleep_until(deliver_at).await;
                if writer.write_all(&bytes).await.is_err() {
                    return PumpEnd::Broken;
                }
            }
            Chunk::Eof => {
                let _ = writer.shutdown().await;
                return PumpEnd::Eof;
            }
        }
    }
    PumpEnd::Eof
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on 127.0.0.1, answering each read with the same bytes.
    async fn echo_server() -> anyhow::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(count) = stream.read(&mut buffer).await {
                        if count == 0 || stream.write_all(&buffer[..count]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(addr)
    }

    async fn proxy_to_echo() -> anyhow::Result<Proxy> {
        let upstream = echo_server().await?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Proxy::start(listener, upstream, BTreeMap::new())
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8], wait: Duration) -> Option<Vec<u8>> {
        stream.write_all(text).await.ok()?;
        let mut buffer = vec![0u8; text.len()];
        match tokio::time::timeout(wait, stream.read_exact(&mut buffer)).await {
            Ok(Ok(_)) => Some(buffer),
            _ => None,
        }
    }

    #[tokio::test]
    async fn pass_blackhole_and_reset() -> anyhow::Result<()> {
        let proxy = proxy_to_echo().await?;
        let mut stream = TcpStream::connect(proxy.listen_addr()).await?;
        let wait = Duration::from_millis(300);
        assert_eq!(round_trip(&mut stream, b"one", wait).await.as_deref(), Some(&b"one"[..]));

        // Blackhole the way in: nothing comes back.
        proxy.set(Source::Client, LinkRule { up: Mode::Blackhole, down: Mode::Pass });
        assert_eq!(round_trip(&mut stream, b"two", wait).await, None);
        // Lifting it resets the corrupted connection.
        proxy.heal();
        let mut buffer = [0u8; 8];
        let after = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buffer)).await;
        assert!(matches!(after, Ok(Ok(0)) | Ok(Err(_))), "{after:?}");

        // A fresh connection passes again; a reset rule closes it.
        let mut stream = TcpStream::connect(proxy.listen_addr()).await?;
        assert_eq!(round_trip(&mut stream, b"six", wait).await.as_deref(), Some(&b"six"[..]));
        proxy.set(Source::Client, LinkRule::both(Mode::Reset));
        let after = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buffer)).await;
        assert!(matches!(after, Ok(Ok(0)) | Ok(Err(_))), "{after:?}");
        assert!(proxy.stats().resets.load(Ordering::Relaxed) >= 1);
        Ok(())
    }

    #[tokio::test]
    async fn hold_delivers_late_and_delay_delays() -> anyhow::Result<()> {
        let proxy = proxy_to_echo().await?;
        let mut stream = TcpStream::connect(proxy.listen_addr()).await?;
        assert!(round_trip(&mut stream, b"warm", Duration::from_millis(300)).await.is_some());

        proxy.set(Source::Client, LinkRule { up: Mode::Hold, down: Mode::Pass });
        assert_eq!(round_trip(&mut stream, b"late", Duration::from_millis(300)).await, None);
        proxy.heal();
        let mut buffer = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut buffer)).await??;
        assert_eq!(&buffer, b"late");

        proxy.set(Source::Client, LinkRule::both(Mode::Delay { base_ms: 150, jitter_ms: 20 }));
        let started = Instant::now();
        let echoed = round_trip(&mut stream, b"slow", Duration::from_secs(2)).await;
        assert_eq!(echoed.as_deref(), Some(&b"slow"[..]));
        // Both directions are delayed.
        assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
        Ok(())
    }

    #[tokio::test]
    async fn rules_are_per_source() -> anyhow::Result<()> {
        let proxy = proxy_to_echo().await?;
        // A rule for a node does not touch clients.
        proxy.set(Source::Node(2), LinkRule::both(Mode::Blackhole));
        let mut stream = TcpStream::connect(proxy.listen_addr()).await?;
        let echoed = round_trip(&mut stream, b"client", Duration::from_millis(300)).await;
        assert_eq!(echoed.as_deref(), Some(&b"client"[..]));
        proxy.set_direction(Source::Node(2), None, Some(Mode::Pass));
        assert_eq!(
            proxy.rules().get(Source::Node(2)),
            LinkRule { up: Mode::Blackhole, down: Mode::Pass }
        );
        Ok(())
    }
}
