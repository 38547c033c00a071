//! The bytes of a snapshot as openraft moves them: the body of a snapshot
//! file on disk, read in chunks while it is sent to a follower or written
//! chunk by chunk while one is received, or a body in memory (the
//! simulation's disk, and snapshots an older version kept in sled).
//!
//! A body in a file is never read into memory whole: the sender reads the
//! chunk it sends, and the receiver writes each chunk where it belongs and
//! hands the finished file to the state machine, which decodes it as a
//! stream. So sending or installing a snapshot of a million jobs costs the
//! state it decodes to, not a second copy of its bytes.
//!
//! A received snapshot is input from the network. Its chunks must follow
//! one another: a chunk that starts past the bytes received so far is
//! refused, so a peer cannot make a receiver write (or, in memory, fill)
//! a gap it never sent. A received file is removed when its data is
//! dropped, unless the state machine took it.

use std::io::{self, Cursor, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, AsyncWriteExt, ReadBuf};

/// A snapshot's body as openraft reads (sends) and writes (receives) it;
/// the type configuration's `SnapshotData`.
#[derive(Debug)]
pub struct SnapshotData {
    body: Body,
    /// Whether this is a snapshot being received (writable); a snapshot
    /// being sent is read only.
    receiving: bool,
    /// The position in the body, as the last seek, read or write left it.
    position: u64,
    /// The end of what was written so far (received snapshots).
    written: u64,
    /// A seek requested by `start_seek` and not yet completed.
    seeking: bool,
}

#[derive(Debug)]
enum Body {
    Memory(Cursor<Vec<u8>>),
    File(FileBody),
}

#[derive(Debug)]
struct FileBody {
    file: tokio::fs::File,
    /// Where the body starts in the file (after a header).
    base: u64,
    /// A received file's removal when it is dropped.
    received: Option<RemoveOnDrop>,
}

/// Removes a received snapshot's file when dropped: one received in part,
/// or refused, or installed (its bytes were copied into the snapshot file).
#[derive(Debug)]
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        // A file already gone is what is wanted.
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A finished snapshot's body in a file, read from the start of the body.
/// A received file is removed when this is dropped.
#[derive(Debug)]
pub struct ReceivedFile {
    file: std::fs::File,
    /// Where the body starts in the file.
    base: u64,
    /// A received file's path, removed on drop.
    received: Option<RemoveOnDrop>,
}

impl ReceivedFile {
    /// The file, positioned at the start of the body.
    pub fn file(&mut self) -> &mut std::fs::File {
        &mut self.file
    }

    /// Where the body starts in the file: 0 for a received file, past the
    /// header for a persisted snapshot's file handed over whole.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Where a received file is (`None` for a persisted snapshot's).
    pub fn path(&self) -> Option<&Path> {
        self.received.as_ref().map(|received| received.0.as_path())
    }
}

/// What a finished snapshot's data holds, for the state machine to install.
#[derive(Debug)]
pub enum Received {
    /// The body, in memory.
    Memory(Vec<u8>),
    /// The body in a received file.
    File(ReceivedFile),
}

impl SnapshotData {
    /// A body held in memory (to send, or one received in memory).
    pub fn in_memory(bytes: Vec<u8>) -> Self {
        SnapshotData::new(Body::Memory(Cursor::new(bytes)), false)
    }

    /// An empty body in memory, to receive a snapshot into.
    pub fn receive_in_memory() -> Self {
        SnapshotData::new(Body::Memory(Cursor::new(Vec::new())), true)
    }

    /// The body of a snapshot file that starts `base` bytes into `file`,
    /// to be sent: read only, read from its start.
    pub async fn file_to_send(file: std::fs::File, base: u64) -> io::Result<Self> {
        let mut file = tokio::fs::File::from_std(file);
        seek_to(&mut file, base).await?;
        Ok(SnapshotData::new(Body::File(FileBody { file, base, received: None }), false))
    }

    /// A new, empty file at `path` to receive a snapshot into; the file is
    /// removed when the data is dropped, unless [`SnapshotData::finish`]
    /// hands it on.
    pub async fn receive_into_file(path: PathBuf) -> io::Result<Self> {
        // Read back after it is received, so opened for both.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        let received = Some(RemoveOnDrop(path));
        Ok(SnapshotData::new(Body::File(FileBody { file, base: 0, received }), true))
    }

    fn new(body: Body, receiving: bool) -> Self {
        SnapshotData { body, receiving, position: 0, written: 0, seeking: false }
    }

    /// The body's bytes, if it is held in memory (the simulation's).
    pub fn into_memory(self) -> Option<Vec<u8>> {
        match self.into_body() {
            Body::Memory(cursor) => Some(cursor.into_inner()),
            Body::File(_) => None,
        }
    }

    /// Finishes a snapshot: every write of a received file is on its way to
    /// the disk (an error of any write is reported here), and the body is
    /// handed over, read from its start. A persisted snapshot's file can be
    /// handed over too (one store's snapshot installed into another).
    pub async fn finish(mut self) -> io::Result<Received> {
        self.flush().await?;
        match self.into_body() {
            Body::Memory(cursor) => Ok(Received::Memory(cursor.into_inner())),
            Body::File(FileBody { mut file, base, received }) => {
                seek_to(&mut file, base).await?;
                Ok(Received::File(ReceivedFile { file: file.into_std().await, base, received }))
            }
        }
    }

    fn into_body(self) -> Body {
        self.body
    }
}

async fn seek_to(file: &mut tokio::fs::File, position: u64) -> io::Result<()> {
    tokio::io::AsyncSeekExt::seek(file, SeekFrom::Start(position)).await.map(|_| ())
}

fn read_only() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "a snapshot being sent is read only")
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match &mut this.body {
            Body::Memory(cursor) => ready!(Pin::new(cursor).poll_read(cx, buf))?,
            Body::File(body) => ready!(Pin::new(&mut body.file).poll_read(cx, buf))?,
        }
        let read = buf.filled().len().saturating_sub(before);
        this.position = this.position.saturating_add(read as u64);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !this.receiving {
            return Poll::Ready(Err(read_only()));
        }
        let written = match &mut this.body {
            Body::Memory(cursor) => ready!(Pin::new(cursor).poll_write(cx, buf))?,
            Body::File(body) => ready!(Pin::new(&mut body.file).poll_write(cx, buf))?,
        };
        this.position = this.position.saturating_add(written as u64);
        this.written = this.written.max(this.position);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().body {
            Body::Memory(cursor) => Pin::new(cursor).poll_flush(cx),
            Body::File(body) => Pin::new(&mut body.file).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Shutting a snapshot down is flushing it: the state machine still
        // reads it afterwards.
        self.poll_flush(cx)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        if this.receiving
            && let SeekFrom::Start(offset) = position
            && offset > this.written
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "snapshot chunk offset {offset} is past the {} bytes received",
                    this.written
                ),
            ));
        }
        if this.receiving && !matches!(position, SeekFrom::Start(_)) {
            // Only openraft's receiver seeks a received snapshot, and only
            // to a chunk's offset; anything else could leave a gap.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a received snapshot is only sought to a chunk's offset",
            ));
        }
        this.seeking = true;
        match &mut this.body {
            Body::Memory(cursor) => Pin::new(cursor).start_seek(position),
            Body::File(body) => {
                let position = match position {
                    SeekFrom::Start(offset) => SeekFrom::Start(body.base.saturating_add(offset)),
                    other => other,
                };
                Pin::new(&mut body.file).start_seek(position)
            }
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        let position = match &mut this.body {
            Body::Memory(cursor) => ready!(Pin::new(cursor).poll_complete(cx))?,
            Body::File(body) => {
                let absolute = ready!(Pin::new(&mut body.file).poll_complete(cx))?;
                absolute.checked_sub(body.base).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "seek before the snapshot body")
                })?
            }
        };
        if this.seeking {
            this.seeking = false;
            this.position = position;
        }
        Poll::Ready(Ok(position))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    use super::*;

    #[tokio::test]
    async fn a_file_body_is_read_from_past_its_header() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("snap");
        std::fs::write(&path, b"HEADERbody bytes")?;
        let mut data = SnapshotData::file_to_send(std::fs::File::open(&path)?, 6).await?;
        assert_eq!(data.seek(SeekFrom::End(0)).await?, 10, "the body's length");
        data.seek(SeekFrom::Start(5)).await?;
        let mut rest = String::new();
        data.read_to_string(&mut rest).await?;
        assert_eq!(rest, "bytes");
        assert!(data.write_all(b"x").await.is_err(), "a snapshot being sent is read only");
        assert_eq!(std::fs::read(&path)?, b"HEADERbody bytes");
        Ok(())
    }

    #[tokio::test]
    async fn a_received_file_takes_chunks_in_order_and_refuses_a_gap() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("receiving");
        let mut data = SnapshotData::receive_into_file(path.clone()).await?;
        data.seek(SeekFrom::Start(0)).await?;
        data.write_all(b"first ").await?;
        // A chunk sent again from where it started is fine.
        data.seek(SeekFrom::Start(0)).await?;
        data.write_all(b"first ").await?;
        data.write_all(b"second").await?;
        let gap = data.seek(SeekFrom::Start(100)).await;
        assert_eq!(gap.err().map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
        data.shutdown().await?;
        let Received::File(mut received) = data.finish().await? else {
            anyhow::bail!("a file was received");
        };
        let mut body = String::new();
        std::io::Read::read_to_string(received.file(), &mut body)?;
        assert_eq!(body, "first second");
        assert_eq!(received.path(), Some(path.as_path()));
        drop(received);
        assert!(!path.exists(), "the received file goes with its handle");
        Ok(())
    }

    #[tokio::test]
    async fn a_receive_given_up_leaves_no_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("receiving");
        let mut data = SnapshotData::receive_into_file(path.clone()).await?;
        data.write_all(b"half").await?;
        data.flush().await?;
        assert!(path.exists());
        drop(data);
        assert!(!path.exists());
        Ok(())
    }

    #[tokio::test]
    async fn a_body_received_in_memory_refuses_a_gap_too() -> anyhow::Result<()> {
        let mut data = SnapshotData::receive_in_memory();
        data.write_all(b"abc").await?;
        assert!(data.seek(SeekFrom::Start(1 << 40)).await.is_err(), "no terabyte of zeros");
        data.seek(SeekFrom::Start(3)).await?;
        data.write_all(b"def").await?;
        let Received::Memory(bytes) = data.finish().await? else {
            anyhow::bail!("received in memory");
        };
        assert_eq!(bytes, b"abcdef");
        Ok(())
    }
}
