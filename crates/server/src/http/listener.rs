//! The HTTP port's connections, bounded like the gRPC port's: at most
//! [`PER_CLIENT`] open from one client address (more are closed at once,
//! logged as `limit.refuse`), at most [`TOTAL`] in all (further ones wait:
//! up to 64 accepted here, the rest in the kernel's backlog), and each
//! closed once the client has sent nothing
//! for [`IDLE`] while the node waits on the connection: a client that
//! stops reading its answer, or reads it a little at a time (each write
//! the node makes used to count as activity, so a reader taking a byte
//! now and then held its connection for ever), holds a connection for
//! that long after its request, no longer. (A client that sends
//! nothing, half a request or a request a byte at a time is closed sooner,
//! by hyper's header-read timeout; see `serve_connections` in the HTTP
//! module. This close stays behind it.)

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;

use crate::incoming::{Connection, ConnectionLimits, Incoming, incoming};

/// Most open connections from one client address. Probes and scrapers
/// keep one or two; a browser keeps a few per open page.
pub const PER_CLIENT: usize = 64;
/// Most open connections in all.
pub const TOTAL: usize = 1_024;
/// A connection the client has sent nothing on for this long, while the
/// node waits to read or to write, is closed. A probe, a scrape or a
/// page's poll comes far more often than this, and none of the port's
/// answers takes as long to make or to read.
pub const IDLE: Duration = Duration::from_secs(30);

/// The connections of the HTTP port, as axum serves them.
pub struct Bounded {
    incoming: Incoming,
    local: SocketAddr,
    open: Arc<Semaphore>,
    /// Told why, when the listener fails and nothing more will come.
    failed: Option<oneshot::Sender<io::Error>>,
}

impl Bounded {
    /// The connections accepted on `listener`, bounded as the module says,
    /// and a receiver told why if accepting stops for good (axum's listener
    /// cannot fail, so the server must hear of it this way).
    pub fn new(listener: TcpListener) -> io::Result<(Bounded, oneshot::Receiver<io::Error>)> {
        let local = listener.local_addr()?;
        let limits = ConnectionLimits { per_client: PER_CLIENT, ..ConnectionLimits::default() };
        let (failed, failure) = oneshot::channel();
        let bounded = Bounded {
            incoming: incoming(listener, None, limits),
            local,
            open: Arc::new(Semaphore::new(TOTAL)),
            failed: Some(failed),
        };
        Ok((bounded, failure))
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Idle;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Idle, SocketAddr) {
        // A slot first, so past the total nothing more is accepted.
        let Ok(slot) = self.open.clone().acquire_owned().await else {
            return std::future::pending().await;
        };
        match self.incoming.next().await {
            Some(Ok(connection)) => {
                let remote = connection.connect_info().remote.unwrap_or(self.local);
                (Idle::new(connection, slot, IDLE), remote)
            }
            // The listener failed: nothing more will come.
            Some(Err(error)) => {
                if let Some(failed) = self.failed.take() {
                    let _ = failed.send(error);
                }
                std::future::pending().await
            }
            None => {
                if let Some(failed) = self.failed.take() {
                    let _ = failed.send(io::Error::other("the HTTP listener stopped"));
                }
                std::future::pending().await
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// A connection that fails with `TimedOut` once, waiting to read or to
/// write, it has read nothing for its idle time (what it writes does not
/// count: the client decides how fast that goes), holding its place among
/// the open ones.
pub struct Idle {
    connection: Connection,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Idle {
    fn new(connection: Connection, slot: OwnedSemaphorePermit, idle: Duration) -> Idle {
        let deadline = Box::pin(tokio::time::sleep(idle));
        Idle { connection, idle, deadline, _slot: slot }
    }

    fn moved(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// `Pending`, or the idle time's error once it has run out.
    fn pending_or_idle<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("nothing read for {} s", self.idle.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.connection).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => this.pending_or_idle(cx),
        }
    }
}

impl AsyncWrite for Idle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.connection).poll_write(cx, buf) {
            Poll::Pending => this.pending_or_idle(cx),
            ready => ready,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.connection).poll_flush(cx) {
            Poll::Pending => this.pending_or_idle(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A client that takes its answer a little at a time (256 KiB every 20
    /// ms, about 13 MB/s, so the writes go on moving well within the idle
    /// time) loses the connection once it has sent nothing for the idle
    /// time: the node's writes, which the client paces, do not keep it.
    #[tokio::test]
    async fn a_slow_reader_does_not_keep_its_connection() -> io::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let limits = ConnectionLimits { per_client: PER_CLIENT, ..ConnectionLimits::default() };
        let mut accepted = incoming(listener, None, limits);
        let mut client = tokio::net::TcpStream::connect(addr).await?;
        let Some(Ok(connection)) = accepted.next().await else {
            return Err(io::Error::other("no connection accepted"));
        };
        let slot = Arc::new(Semaphore::new(1)).acquire_owned().await.map_err(io::Error::other)?;
        let mut idle = Idle::new(connection, slot, Duration::from_secs(1));
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 256 << 10];
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if !matches!(client.read(&mut buf).await, Ok(read) if read > 0) {
                    return;
                }
            }
        });
        let answer = vec![7u8; 96 << 20];
        let written = tokio::time::timeout(Duration::from_secs(5), idle.write_all(&answer)).await;
        reader.abort();
        match written {
            Ok(Err(error)) => assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}"),
            Ok(Ok(())) => panic!("96 MiB written to a client reading 13 MB a second"),
            Err(_) => panic!("still writing after 5 s: the slow reads kept the connection"),
        }
        Ok(())
    }
}
