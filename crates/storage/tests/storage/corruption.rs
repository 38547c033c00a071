//! Goal: a damaged record is reported as an error naming where it is, never
//! skipped or replaced by a default. Method: damage the raft log's chunk
//! file in the middle and reopen; write bytes directly into an older
//! version's sled trees under its keys, and open (which migrates them).

use leasehold_storage::layout::{LOG_TREE, META_TREE, RAFT_LOG_DIR, VOTE_KEY, log_key};
use openraft::storage::RaftLogStorageExt;

use crate::support::{blank, enqueue};

/// The raft log's chunk files, oldest first.
fn chunk_files(data: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut chunks: Vec<_> = std::fs::read_dir(data.join(RAFT_LOG_DIR))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    chunks.retain(|path| path.extension().is_some_and(|ext| ext == "wal"));
    chunks.sort();
    Ok(chunks)
}

/// A log of four entries (the second, third and fourth enqueues), its one
/// chunk file and that file's bytes.
async fn four_entries() -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf, Vec<u8>)> {
    let dir = tempfile::tempdir()?;
    {
        let (mut log_store, _state_machine) = leasehold_storage::open(dir.path())?;
        log_store
            .blocking_append([blank(1, 0), enqueue(1, 1, 1), enqueue(1, 2, 1), enqueue(1, 3, 1)])
            .await?;
    }
    let chunks = chunk_files(dir.path())?;
    let [chunk] = chunks.as_slice() else { anyhow::bail!("one chunk expected: {chunks:?}") };
    let bytes = std::fs::read(chunk)?;
    Ok((dir, chunk.clone(), bytes))
}

/// Where `pattern` first is in `bytes`.
fn find(bytes: &[u8], pattern: &[u8]) -> anyhow::Result<usize> {
    bytes
        .windows(pattern.len())
        .position(|window| window == pattern)
        .ok_or_else(|| anyhow::anyhow!("entry 2 not found in the chunk"))
}

/// Reopens and requires the open to fail, naming the damage; `why` says
/// what opening would have meant.
fn the_open_fails(path: &std::path::Path, why: &str) -> anyhow::Result<()> {
    let error = match reopen_once(path) {
        Ok(_) => anyhow::bail!("{why}"),
        Err(error) => error,
    };
    let text = format!("{:#}", anyhow::Error::new(error));
    assert!(text.contains("raft log in") && text.contains("cannot open"), "{text}");
    Ok(())
}

#[tokio::test]
async fn a_damaged_log_record_stops_the_open_with_an_error() -> anyhow::Result<()> {
    let (dir, chunk, mut bytes) = four_entries().await?;
    // --- flip a byte inside entry 2's payload, in the middle of the chunk
    let at = find(&bytes, b"payload of entry 2")?;
    bytes[at] ^= 0x55;
    std::fs::write(&chunk, &bytes)?;
    // --- the log does not open: it names the damage, and serves nothing
    the_open_fails(dir.path(), "a damaged record in the middle of the log must fail the open")
}

#[tokio::test]
async fn a_damaged_record_length_in_the_newest_file_stops_the_open() -> anyhow::Result<()> {
    let (dir, chunk, mut bytes) = four_entries().await?;
    // --- entry 2's value starts with its log id (term, leader, index as
    // fixed-width little-endian numbers) after its 9-byte header (a marker,
    // the length, the length's complement): flip one bit of the length
    // that makes it 1 MiB longer, past the end of the file, as one
    // damaged bit of the disk would
    let log_id: Vec<u8> =
        [1u64, crate::support::LEADER, 2].iter().flat_map(|n| n.to_le_bytes()).collect();
    let at = find(&bytes, &log_id)?;
    let length = at.checked_sub(8).ok_or_else(|| anyhow::anyhow!("no length before entry 2"))?;
    bytes[length + 1] ^= 0x10;
    std::fs::write(&chunk, &bytes)?;
    // --- the newest file is not cut at the damage: the open fails
    the_open_fails(dir.path(), "a damaged length opened as a torn tail, dropping entries 2 and 3")
}

/// The error an open ends with once sled has let go of an earlier handle's
/// file lock (it does so from a background thread, so on a loaded machine
/// the first opens can meet it still held): only errors without
/// `expected` in them are retried, for up to 10 s.
fn open_error_naming(path: &std::path::Path, expected: &str) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match reopen_once(path) {
            Ok(_) => anyhow::bail!("opened"),
            Err(error) if error.to_string().contains(expected) => return Ok(error.to_string()),
            Err(error) if std::time::Instant::now() >= deadline => {
                anyhow::bail!("the open never failed on {expected:?}: {error}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// One open, without the retries `reopen` makes for a lock still held.
fn reopen_once(
    path: &std::path::Path,
) -> Result<
    (leasehold_storage::LogStore, leasehold_storage::StateMachineStore),
    leasehold_storage::StorageError,
> {
    leasehold_storage::open(path)
}

#[tokio::test]
async fn a_corrupt_record_in_an_old_sled_log_stops_the_migration() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let db = sled::Config::new().path(dir.path()).open()?;
        let logs = db.open_tree(LOG_TREE)?;
        for entry in [blank(1, 0), enqueue(1, 1, 1)] {
            logs.insert(log_key(entry.log_id.index), bincode::serialize(&entry)?)?;
        }
        logs.insert(log_key(2), &b"not an entry"[..])?;
        db.flush()?;
    }
    let error = open_error_naming(dir.path(), "under key 2")?;
    assert!(error.contains("under key 2"), "{error}");

    // Nothing was lost: the old tree is still there to repair and retry.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let db = loop {
        match sled::Config::new().path(dir.path()).open() {
            Ok(db) => break db,
            Err(error) if std::time::Instant::now() >= deadline => return Err(error.into()),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    assert_eq!(db.open_tree(LOG_TREE)?.len(), 3);
    Ok(())
}

#[tokio::test]
async fn a_corrupt_old_vote_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let db = sled::Config::new().path(dir.path()).open()?;
        db.open_tree(META_TREE)?.insert(VOTE_KEY, &b"??"[..])?;
        db.flush()?;
    }
    let error = open_error_naming(dir.path(), "under key vote")?;
    assert!(error.contains("under key vote"), "{error}");
    Ok(())
}
