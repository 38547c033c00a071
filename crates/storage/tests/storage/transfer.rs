//! Goal: a snapshot moves between nodes as chunks of its file, is installed
//! from a file on the receiver (never whole in memory), and a received body
//! that is not a snapshot, or a chunk that leaves a gap, changes nothing.
//! Method: drive the stores through openraft's traits as its chunked
//! transport does: read the sender's current snapshot a chunk at a time,
//! seek and write each chunk into the data the receiver began, install.

use std::io::SeekFrom;
use std::path::Path;

use leasehold_raft::{NodeId, SnapshotData, TypeConfig};
use leasehold_storage::StateMachineStore;
use openraft::storage::RaftStateMachine;
use openraft::{BasicNode, RaftSnapshotBuilder, Snapshot, SnapshotMeta};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::support::{blank, enqueue, log_id, membership, reopen};

/// openraft's default chunk is 3 MiB; a small one makes many chunks.
const CHUNK: usize = 4 * 1024;

/// A snapshot's chunks as sent: each one's offset and bytes.
type Chunks = Vec<(u64, Vec<u8>)>;

/// Some of a snapshot's chunks.
type Body<'a> = &'a [(u64, Vec<u8>)];

/// A snapshot's meta.
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// A store at `dir` with `entries` enqueue entries of 20 jobs applied and a
/// snapshot built.
async fn sender(
    dir: &Path,
    entries: u64,
) -> anyhow::Result<(StateMachineStore, Snapshot<TypeConfig>)> {
    let (_log, mut state_machine) = leasehold_storage::open(dir)?;
    let mut written = vec![membership(1, 1, &[1, 2, 3])];
    written.extend((2..entries + 2).map(|index| enqueue(1, index, 20)));
    state_machine.apply(written).await?;
    state_machine.get_snapshot_builder().await.build_snapshot().await?;
    let current = state_machine.get_current_snapshot().await?;
    let current = current.ok_or_else(|| anyhow::anyhow!("no current snapshot"))?;
    Ok((state_machine, current))
}

/// The chunks openraft would send of `snapshot`.
async fn chunks(snapshot: &mut Snapshot<TypeConfig>) -> anyhow::Result<Chunks> {
    let end = snapshot.snapshot.seek(SeekFrom::End(0)).await?;
    let mut chunks = Vec::new();
    let mut offset = 0;
    while offset < end {
        snapshot.snapshot.seek(SeekFrom::Start(offset)).await?;
        let mut chunk = vec![0u8; CHUNK];
        let mut filled = 0;
        while filled < CHUNK {
            let read = snapshot.snapshot.read(&mut chunk[filled..]).await?;
            if read == 0 {
                break;
            }
            filled += read;
        }
        chunk.truncate(filled);
        chunks.push((offset, chunk));
        offset += filled as u64;
    }
    Ok(chunks)
}

/// Writes `chunks` into `data` as openraft's receiver does.
async fn receive(data: &mut SnapshotData, chunks: &[(u64, Vec<u8>)]) -> std::io::Result<()> {
    for (offset, chunk) in chunks {
        data.seek(SeekFrom::Start(*offset)).await?;
        data.write_all(chunk).await?;
    }
    data.shutdown().await
}

/// The names in `dir` of snapshots being received.
fn receiving_files(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("snapshot.receiving") {
            names.push(name);
        }
    }
    Ok(names)
}

#[tokio::test]
async fn a_snapshot_sent_in_chunks_is_installed_from_a_file() -> anyhow::Result<()> {
    let from = tempfile::tempdir()?;
    let to = tempfile::tempdir()?;
    let (sender, mut snapshot) = sender(from.path(), 40).await?;
    let chunks = chunks(&mut snapshot).await?;
    assert!(chunks.len() > 5, "{} chunks", chunks.len());

    let (_log, mut receiver) = leasehold_storage::open(to.path())?;
    let mut data = receiver.begin_receiving_snapshot().await?;
    assert_eq!(receiving_files(to.path())?.len(), 1, "the body is received into a file");
    // A chunk sent again (a retry after a lost answer) is written in place.
    receive(&mut data, &chunks[..3]).await?;
    receive(&mut data, &chunks[2..]).await?;
    receiver.install_snapshot(&snapshot.meta, data).await?;

    assert_eq!(receiver.digest(), sender.digest());
    assert_eq!(receiver.last_applied_index(), sender.last_applied_index());
    assert_eq!(receiving_files(to.path())?, Vec::<String>::new(), "the received file is gone");
    let current = receiver.get_current_snapshot().await?;
    assert_eq!(current.map(|current| current.meta), Some(snapshot.meta.clone()));
    drop((receiver, _log));
    let (_log, reopened) = reopen(to.path())?;
    assert_eq!(reopened.digest(), sender.digest(), "the installed snapshot is on disk");
    Ok(())
}

#[tokio::test]
async fn a_received_body_that_is_not_the_snapshot_changes_nothing() -> anyhow::Result<()> {
    let from = tempfile::tempdir()?;
    let to = tempfile::tempdir()?;
    let (_sender, mut snapshot) = sender(from.path(), 40).await?;
    let chunks = chunks(&mut snapshot).await?;
    // The receiver has a state and a snapshot of its own.
    let (receiver, mut own) = sender(to.path(), 3).await?;
    let mut receiver = receiver;
    let before = (receiver.digest(), receiver.last_applied_index());
    let own_chunks = crate::transfer::chunks(&mut own).await?;

    let last = chunks.len() - 1;
    let mut trailing = chunks.clone();
    trailing[last].1.extend_from_slice(b"more");
    let mut other_meta = snapshot.meta.clone();
    other_meta.last_log_id = own.meta.last_log_id;
    // The membership's node map near the start: three nodes, the first
    // (id 1) with an empty address. Its address is made to claim a
    // terabyte, which must be refused before anything is allocated for it.
    let mut lying = chunks.clone();
    let map = [3u64, 1, 0].iter().flat_map(|n| n.to_le_bytes()).collect::<Vec<_>>();
    let at = lying[0]
        .1
        .windows(map.len())
        .position(|window| window == map)
        .ok_or_else(|| anyhow::anyhow!("no node map in the first chunk"))?;
    lying[0].1[at + 16..at + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let cases: [(&str, Body<'_>, Meta); 4] = [
        ("a body cut short", &chunks[..last], snapshot.meta.clone()),
        ("a body with bytes after it", &trailing, snapshot.meta.clone()),
        ("a body of another log position", &chunks, other_meta),
        ("a body with a text claiming a terabyte", &lying, snapshot.meta.clone()),
    ];
    for (case, body, meta) in cases {
        let mut data = receiver.begin_receiving_snapshot().await?;
        receive(&mut data, body).await?;
        let refused = receiver.install_snapshot(&meta, data).await;
        assert!(refused.is_err(), "{case}: installed");
        assert_eq!((receiver.digest(), receiver.last_applied_index()), before, "{case}");
        assert_eq!(receiving_files(to.path())?, Vec::<String>::new(), "{case}: file left");
        let mut current = receiver.get_current_snapshot().await?;
        let current = current.as_mut().ok_or_else(|| anyhow::anyhow!("{case}: no snapshot"))?;
        assert_eq!(current.meta, own.meta, "{case}: the persisted snapshot was replaced");
        assert_eq!(crate::transfer::chunks(current).await?, own_chunks, "{case}");
    }
    Ok(())
}

#[tokio::test]
async fn a_chunk_past_what_was_received_is_refused() -> anyhow::Result<()> {
    let from = tempfile::tempdir()?;
    let to = tempfile::tempdir()?;
    let (_sender, mut snapshot) = sender(from.path(), 40).await?;
    let chunks = chunks(&mut snapshot).await?;
    let (_log, mut receiver) = leasehold_storage::open(to.path())?;
    let mut data = receiver.begin_receiving_snapshot().await?;
    receive(&mut data, &chunks[..1]).await?;
    let gap = data.seek(SeekFrom::Start(chunks[2].0)).await;
    assert_eq!(gap.err().map(|error| error.kind()), Some(std::io::ErrorKind::InvalidInput));
    drop(data);
    assert_eq!(receiving_files(to.path())?, Vec::<String>::new(), "a receive given up is removed");
    Ok(())
}

#[tokio::test]
async fn a_receive_cut_by_a_crash_is_cleaned_up_on_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    drop(leasehold_storage::open(dir.path())?);
    std::fs::write(dir.path().join("snapshot.receiving.7"), b"half a snapshot")?;
    // A build cut by a crash (or by a full disk) leaves its temporary file.
    std::fs::write(dir.path().join("snapshot.tmp"), b"half a build")?;
    let _stores = reopen(dir.path())?;
    assert_eq!(receiving_files(dir.path())?, Vec::<String>::new());
    assert!(!dir.path().join("snapshot.tmp").exists(), "the build's temporary file is removed");
    Ok(())
}

#[tokio::test]
async fn a_log_purged_past_the_snapshot_on_disk_is_refused_by_name() -> anyhow::Result<()> {
    use leasehold_storage::StorageError;
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};

    let from = tempfile::tempdir()?;
    let to = tempfile::tempdir()?;
    let (_sender, mut snapshot) = sender(from.path(), 40).await?;
    let chunks = chunks(&mut snapshot).await?;
    {
        let (mut log, mut receiver) = leasehold_storage::open(to.path())?;
        log.blocking_append((1..=5).map(|index| blank(1, index))).await?;
        leasehold_storage::check_purged_within_snapshot(&log, &receiver, to.path())?;
        // openraft hands the install over and purges what the snapshot
        // covers at once; the node stops before the install is written.
        let mut data = receiver.begin_receiving_snapshot().await?;
        receive(&mut data, &chunks).await?;
        log.purge(log_id(1, 41)).await?;
    }
    let (log, receiver) = reopen(to.path())?;
    match leasehold_storage::check_purged_within_snapshot(&log, &receiver, to.path()) {
        Err(StorageError::PurgedPastSnapshot { purged: 41, snapshot: 0, .. }) => {}
        other => anyhow::bail!("a log purged past its snapshot was answered {other:?}"),
    }
    drop((log, receiver));

    // Installed before the purge, as a node that did not stop: accepted.
    let whole = tempfile::tempdir()?;
    let (mut log, mut receiver) = leasehold_storage::open(whole.path())?;
    log.blocking_append((1..=5).map(|index| blank(1, index))).await?;
    let mut data = receiver.begin_receiving_snapshot().await?;
    receive(&mut data, &chunks).await?;
    receiver.install_snapshot(&snapshot.meta, data).await?;
    log.purge(log_id(1, 41)).await?;
    drop((log, receiver));
    let (log, receiver) = reopen(whole.path())?;
    leasehold_storage::check_purged_within_snapshot(&log, &receiver, whole.path())?;
    Ok(())
}
