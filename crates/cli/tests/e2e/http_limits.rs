//! Goal: the HTTP port bounds its connections as the gRPC port does
//! (docs/security.md, "Limits"): at most 64 open from one client address,
//! the next closed at once while other addresses are still served, and a
//! connection that sends nothing, half a request, or a request a byte at a
//! time closed once its request head has taken 10 s (the idle close, 30 s
//! with nothing read from the client, stays behind it for an answer the client
//! does not read).
//!
//! Method: one real `leasehold serve`. Requests naming a host other than a
//! loopback name are refused with 421 (a page that rebinds its name to
//! 127.0.0.1 must not read the port), except `/livez`. A request whose
//! headers come a byte a second must be closed within 20 s; HTTP/2's
//! preface is refused (it has no header timeout). From 127.0.0.1, 63
//! connections that send nothing and one that sends half a request; the
//! 65th from that address must be closed by the node within seconds, while
//! a request from 127.0.0.2 is answered. Then every connection left open
//! must be closed by the node within the idle time and a margin.
//!
//! Mutation checks (each run once against a deliberately broken build): with
//! no per-address limit the 65th connection stays open; without the host
//! check the status answers the attacker's host; served by axum's own
//! `serve` (no timer for hyper) the trickle keeps its connection. (Before
//! the header timeout, the silent connections were closed by the idle
//! close, and removing it failed this story.)

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::support::{Node, Sandbox, phase};

/// The node's limit per client address (`listener::PER_CLIENT`).
const PER_CLIENT: usize = 64;
/// How long the trickle may go on: the node's header-read timeout (10 s)
/// and a margin, well under the idle time a trickle never reaches.
const TRICKLE_FOR_SECONDS: usize = 20;
/// The node's idle time (`listener::IDLE`) and a margin for a busy machine.
const IDLE_AND_MARGIN: Duration = Duration::from_secs(30 + 15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_bounds_connections_per_client_and_closes_idle_ones() -> Result<()> {
    let sandbox = Sandbox::new("http-limits")?;
    sandbox.run(Duration::from_secs(120), story(&sandbox)).await
}

/// A connection to `to` from the loopback address `from`.
async fn connect(from: [u8; 4], to: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    Ok(socket.connect(to).await?)
}

/// Whether the node closes `stream` within `within` (a read that ends or
/// fails), rather than keeping it open.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // An answer (to half a request: none is due); keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("a node");
    let node = Node::start(sandbox).await?;
    let http = node.http;

    phase("a request for another host name is refused (DNS rebinding); loopback names are served");
    for (host, path, status) in [
        ("attacker.example", "/api/status", "421"),
        ("attacker.example:7080", "/metrics", "421"),
        ("127.0.0.1", "/api/status", "200"),
        ("localhost", "/metrics", "200"),
        ("attacker.example", "/livez", "200"),
    ] {
        let mut stream = connect([127, 0, 0, 3], http).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
            .await
            .context("no answer")??;
        ensure!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{path} for host {host}: {}",
            answer.lines().next().unwrap_or_default()
        );
    }

    phase("a request trickled a byte a second is closed after the header timeout");
    let mut trickle = connect([127, 0, 0, 4], http).await?;
    let started = std::time::Instant::now();
    let head = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    let mut closed = false;
    for byte in head.iter().chain(std::iter::repeat(&b'a')).take(TRICKLE_FOR_SECONDS) {
        // A write to a closed connection fails, or the read sees the close;
        // the read's wait paces the trickle.
        if trickle.write_all(&[*byte]).await.is_err()
            || closed_within(&mut trickle, Duration::from_secs(1)).await
        {
            closed = true;
            break;
        }
    }
    ensure!(closed, "a trickled request kept its connection for {:?}", started.elapsed());

    phase("HTTP/2 is not spoken: its preface is refused and the connection closed");
    let mut h2 = connect([127, 0, 0, 4], http).await?;
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    ensure!(closed_within(&mut h2, Duration::from_secs(5)).await, "an HTTP/2 client was served");

    phase("63 silent connections and one with half a request from 127.0.0.1");
    let mut open = Vec::new();
    for _ in 0..PER_CLIENT - 1 {
        open.push(connect([127, 0, 0, 1], http).await?);
    }
    let mut half = connect([127, 0, 0, 1], http).await?;
    half.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n").await?;
    // The node accepts in order; give it a moment to count them all.
    tokio::time::sleep(Duration::from_millis(500)).await;

    phase("the next from that address is closed at once; another address is served");
    let mut over = connect([127, 0, 0, 1], http).await?;
    ensure!(
        closed_within(&mut over, Duration::from_secs(5)).await,
        "connection {} from one address was kept open",
        PER_CLIENT + 1
    );
    let mut other = connect([127, 0, 0, 2], http).await?;
    other.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), other.read_to_string(&mut answer))
        .await
        .context("no answer from another address")??;
    ensure!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok\n"), "{answer:?}");

    phase("connections the client sends nothing on are closed after the idle time");
    // Half a request goes at the header timeout, the silent ones at the
    // idle time: the first is given the whole idle time and a margin, the
    // others, opened with it, only a little more.
    ensure!(closed_within(&mut half, IDLE_AND_MARGIN).await, "half a request kept its connection");
    for (index, stream) in open.iter_mut().enumerate() {
        let within = if index == 0 { IDLE_AND_MARGIN } else { Duration::from_secs(5) };
        ensure!(
            closed_within(stream, within).await,
            "silent connection {index} was kept open past the idle time"
        );
    }
    Ok(())
}
