//! Opening the raft log, and moving an older version's log out of sled.
//!
//! Versions before the raft log kept entries in sled's [`LOG_TREE`] and the
//! vote, committed and last purged log ids in [`META_TREE`]. On open, a data
//! directory whose sled still holds either is migrated:
//!
//! 1. any raft log directory without the completion mark (a migration that
//!    did not finish) is removed, and a new one created;
//! 2. the purge mark, every entry after it, the vote and the committed log
//!    id are copied into it, and fdatasynced;
//! 3. the completion mark ([`LogFormat`] in the log's own state) is written
//!    and fdatasynced;
//! 4. only then are the two sled trees cleared.
//!
//! A crash before step 3 leaves sled untouched and no mark: the next open
//! starts over from step 1. A crash after it leaves a marked log and sled
//! trees not yet cleared: the next open only clears them. So a migration
//! runs to its end exactly once, whatever stops it on the way.

use std::path::Path;
use std::sync::Arc;

use leasehold_raft::{NodeId, TypeConfig};
use openraft::{Entry, LogId, Vote};
use raft_log::RaftLog;
use raft_log::api::raft_log_writer::RaftLogWriter;
use serde::de::DeserializeOwned;

use crate::StorageError;
use crate::codec::decode;
use crate::durable::sync_dir;
use crate::layout::{
    COMMITTED_KEY, LAST_PURGED_KEY, LOG_ISSUED_KEY, LOG_ISSUED_TREE, LOG_TREE, META_TREE,
    SNAPSHOT_FILE, SNAPSHOT_TREE, VOTE_KEY, log_index,
};
use crate::log_store::log_config;
use crate::wal::{Flushed, Health, LOG_FORMAT_VERSION, LogFormat, LogTypes, Stored, StoredEntry};

/// Encoded entry bytes handed to the log's writer at a time while copying
/// (written out without a sync; one sync at the end covers them), so a
/// large old log never sits in memory whole.
const COPY_BATCH_BYTES: u64 = 8 * 1024 * 1024;

/// Opens the raft log in `dir` (inside `data_dir`), creating it, or
/// migrating an older version's log from `db`, or finishing a migration
/// that stopped part way (see the module docs).
pub(crate) fn open_log(
    db: &sled::Db,
    data_dir: &Path,
    dir: &Path,
    health: &Arc<Health>,
) -> Result<RaftLog<LogTypes>, StorageError> {
    let logs = db.open_tree(LOG_TREE)?;
    let meta = db.open_tree(META_TREE)?;
    let legacy = !logs.is_empty() || !meta.is_empty();

    if legacy && dir.exists() {
        let log = open_raw(dir)?;
        if mark(&log, dir)?.is_some() {
            // Copied and marked before a crash; only the clearing is left.
            clear_legacy(db, &logs, &meta)?;
            record_created(db)?;
            return Ok(log);
        }
        drop(log); // joins its writer and releases its lock
        tracing::warn!(dir = %dir.display(), "removing an unfinished migration of the raft log");
        std::fs::remove_dir_all(dir).map_err(|source| StorageError::Io {
            what: "remove",
            path: dir.to_path_buf(),
            source,
        })?;
        sync_dir(data_dir)?;
    }

    // Whether this directory held a log before: then a missing or empty
    // one is refused rather than started anew (it would forget the vote).
    let issued = db.open_tree(LOG_ISSUED_TREE)?;
    let used = if issued.contains_key(LOG_ISSUED_KEY)? {
        Some("it recorded creating that log")
    } else if data_dir.join(SNAPSHOT_FILE).exists() || !db.open_tree(SNAPSHOT_TREE)?.is_empty() {
        Some("it holds a snapshot")
    } else {
        None
    };
    create(data_dir, dir)?;
    let mut log = open_raw(dir)?;
    if legacy {
        let migrated_entries = copy_legacy(&mut log, &logs, &meta, dir, health)?;
        write_mark(&mut log, dir, health, Some(migrated_entries))?;
        clear_legacy(db, &logs, &meta)?;
        let state = log.log_state();
        tracing::info!(
            event = "storage.migrate",
            entries = migrated_entries,
            last_log = ?state.last().map(|last| last.0),
            purged = ?state.purged().map(|purged| purged.0),
            dir = %dir.display(),
            "raft log migrated from sled"
        );
    } else if mark(&log, dir)?.is_none() {
        // A new log (or one whose creation stopped before its mark).
        if let Some(why) = used {
            return Err(StorageError::LogMissing {
                path: data_dir.to_path_buf(),
                log: dir.to_path_buf(),
                why,
            });
        }
        write_mark(&mut log, dir, health, None)?;
    }
    record_created(db)?;
    Ok(log)
}

/// Records, once the log is marked (and for a directory of an earlier
/// build, on its first open here), that this directory's raft log exists,
/// flushed: a log missing after this is refused by [`open_log`].
fn record_created(db: &sled::Db) -> Result<(), StorageError> {
    let issued = db.open_tree(LOG_ISSUED_TREE)?;
    if !issued.contains_key(LOG_ISSUED_KEY)? {
        issued.insert(LOG_ISSUED_KEY, &[])?;
        issued.flush()?;
    }
    Ok(())
}

/// Creates the log's directory and makes its name durable.
fn create(data_dir: &Path, dir: &Path) -> Result<(), StorageError> {
    if !dir.exists() {
        std::fs::create_dir_all(dir)
            .map_err(|source| StorageError::CreateDir { path: dir.to_path_buf(), source })?;
        sync_dir(data_dir)?;
    }
    Ok(())
}

fn open_raw(dir: &Path) -> Result<RaftLog<LogTypes>, StorageError> {
    RaftLog::open(Arc::new(log_config(dir)?)).map_err(|source| StorageError::Log {
        what: "open",
        path: dir.to_path_buf(),
        source,
    })
}

/// The log's completion mark, checked against this build's layout.
fn mark(log: &RaftLog<LogTypes>, dir: &Path) -> Result<Option<LogFormat>, StorageError> {
    match &log.log_state().user_data {
        None => Ok(None),
        Some(Stored(format)) if format.version == LOG_FORMAT_VERSION => Ok(Some(format.clone())),
        Some(Stored(format)) => Err(StorageError::LogFormat {
            path: dir.to_path_buf(),
            found: format.version,
            supported: LOG_FORMAT_VERSION,
        }),
    }
}

fn write_mark(
    log: &mut RaftLog<LogTypes>,
    dir: &Path,
    health: &Arc<Health>,
    migrated_entries: Option<u64>,
) -> Result<(), StorageError> {
    let format = LogFormat { version: LOG_FORMAT_VERSION, migrated_entries };
    log.save_user_data(Some(Stored(format))).map_err(|source| StorageError::Log {
        what: "mark the log complete",
        path: dir.to_path_buf(),
        source,
    })?;
    sync(log, dir, health, "mark the log complete")
}

/// Flushes `log` and waits for the fdatasync (opening runs outside any
/// async runtime: the node opens its stores on a blocking thread).
pub(crate) fn sync(
    log: &mut RaftLog<LogTypes>,
    dir: &Path,
    health: &Arc<Health>,
    what: &'static str,
) -> Result<(), StorageError> {
    let error = |source| StorageError::Log { what, path: dir.to_path_buf(), source };
    let (callback, synced) = Flushed::blocking(health.clone());
    log.flush(true, Some(callback)).map_err(error)?;
    match synced.recv() {
        Ok(result) => result.map_err(error),
        Err(_) => Err(error(std::io::Error::other("the flush worker dropped the request"))),
    }
}

/// Copies the old trees into the empty `log` and syncs; answers the
/// entries copied.
fn copy_legacy(
    log: &mut RaftLog<LogTypes>,
    logs: &sled::Tree,
    meta: &sled::Tree,
    dir: &Path,
    health: &Arc<Health>,
) -> Result<u64, StorageError> {
    let vote: Option<Vote<NodeId>> = read_meta(meta, VOTE_KEY)?;
    let committed: Option<LogId<NodeId>> = read_meta(meta, COMMITTED_KEY)?;
    let purged: Option<LogId<NodeId>> = read_meta(meta, LAST_PURGED_KEY)?;
    let error = |what: &'static str| {
        let path = dir.to_path_buf();
        move |source| StorageError::Log { what, path, source }
    };

    if let Some(purged) = purged {
        log.purge(Stored(purged)).map_err(error("copy the purge mark"))?;
    }
    let mut copied = 0_u64;
    let mut unflushed_bytes = 0_u64;
    for item in logs.iter() {
        let (key, value) = item?;
        let entry = decode_entry(&key, &value)?;
        // The old store wrote the purge mark before removing what it
        // covers: entries at or below it may still be there, and are gone.
        if purged.is_some_and(|purged| entry.log_id.index <= purged.index) {
            continue;
        }
        let stored = StoredEntry::new(entry)?;
        unflushed_bytes += stored.encoded_bytes;
        // raft-log refuses a gap or a step back here: the old log is
        // damaged, and the migration stops rather than copy a hole.
        log.append([(Stored(stored.entry.log_id), stored)]).map_err(error("copy an entry"))?;
        copied += 1;
        if unflushed_bytes >= COPY_BATCH_BYTES {
            log.flush(false, None).map_err(error("copy an entry"))?;
            unflushed_bytes = 0;
        }
    }
    if let Some(vote) = vote {
        log.save_vote(Stored(vote)).map_err(error("copy the vote"))?;
    }
    // A committed id the copied log does not reach is not one raft-log
    // can record; an older one (or none) only means re-applying less.
    let last = log.log_state().last().map(|last| last.0);
    if let Some(committed) = committed.filter(|committed| Some(*committed) <= last) {
        log.commit(Stored(committed)).map_err(error("copy the committed log id"))?;
    }
    sync(log, dir, health, "copy the old log")?;
    Ok(copied)
}

/// Empties the old trees, once the raft log holds what they held. Not
/// synced: if the clearing is lost, the next open sees the mark and clears
/// them again.
fn clear_legacy(db: &sled::Db, logs: &sled::Tree, meta: &sled::Tree) -> Result<(), StorageError> {
    logs.clear()?;
    meta.clear()?;
    db.flush()?;
    Ok(())
}

fn read_meta<T: DeserializeOwned>(
    meta: &sled::Tree,
    key: &'static str,
) -> Result<Option<T>, StorageError> {
    match meta.get(key)? {
        Some(bytes) => Ok(Some(decode(META_TREE, key, &bytes)?)),
        None => Ok(None),
    }
}

/// Decodes an old log record and checks it is stored under its own index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
    let Some(index) = log_index(key) else {
        return Err(StorageError::Inconsistent {
            tree: LOG_TREE,
            key: format!("{key:02x?}"),
            detail: "log key is not an 8-byte index".to_string(),
        });
    };
    let entry: Entry<TypeConfig> = decode(LOG_TREE, index, value)?;
    if entry.log_id.index != index {
        return Err(StorageError::Inconsistent {
            tree: LOG_TREE,
            key: index.to_string(),
            detail: format!("holds the entry of index {}", entry.log_id.index),
        });
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{RAFT_LOG_DIR, log_key};

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Blank,
        }
    }

    #[test]
    fn an_unfinished_migration_starts_over() -> anyhow::Result<()> {
        let data = tempfile::tempdir()?;
        let db = sled::Config::new().path(data.path()).open()?;
        let logs = db.open_tree(LOG_TREE)?;
        for index in 0..5 {
            logs.insert(log_key(index), bincode::serialize(&blank(index))?)?;
        }
        let meta = db.open_tree(META_TREE)?;
        meta.insert(VOTE_KEY, bincode::serialize(&Vote::new(1, 1_u64))?)?;
        let dir = data.path().join(RAFT_LOG_DIR);
        let health = Arc::new(Health::default());

        // --- a first run copies everything, then stops before the mark
        create(data.path(), &dir)?;
        let mut log = open_raw(&dir)?;
        assert_eq!(copy_legacy(&mut log, &logs, &meta, &dir, &health)?, 5);
        drop(log);
        assert_eq!(logs.len(), 5, "sled is untouched until the new log is marked");

        // --- the next open starts over: each entry once, marked, sled cleared
        let log = open_log(&db, data.path(), &dir, &health)?;
        let indexes = log
            .read(0, u64::MAX)
            .map(|item| item.map(|(log_id, _)| log_id.0.index))
            .collect::<Result<Vec<_>, _>>()?;
        assert_eq!(indexes, vec![0, 1, 2, 3, 4]);
        assert_eq!(log.log_state().vote().map(|vote| vote.0), Some(Vote::new(1, 1)));
        let marked = mark(&log, &dir)?;
        assert_eq!(marked, Some(LogFormat { version: 1, migrated_entries: Some(5) }));
        assert!(logs.is_empty() && meta.is_empty());
        assert!(db.open_tree(LOG_ISSUED_TREE)?.contains_key(LOG_ISSUED_KEY)?, "recorded");

        // --- marked, then a crash before sled was cleared (put back here):
        // the next open only clears it, and records the log as created
        drop(log);
        logs.insert(log_key(0), bincode::serialize(&blank(0))?)?;
        db.drop_tree(LOG_ISSUED_TREE)?;
        drop(open_log(&db, data.path(), &dir, &health)?);
        assert!(logs.is_empty(), "cleared");
        assert!(db.open_tree(LOG_ISSUED_TREE)?.contains_key(LOG_ISSUED_KEY)?, "recorded");
        Ok(())
    }

    #[test]
    fn a_log_gone_from_a_used_directory_is_refused_not_started_anew() -> anyhow::Result<()> {
        let data = tempfile::tempdir()?;
        let db = sled::Config::new().path(data.path()).open()?;
        let dir = data.path().join(RAFT_LOG_DIR);
        let health = Arc::new(Health::default());
        let mut log = open_log(&db, data.path(), &dir, &health)?;
        log.save_vote(Stored(Vote::new(7, 2_u64)))?;
        sync(&mut log, &dir, &health, "test")?;
        drop(log);

        // The log deleted (or its chunk files): refused, naming the way out.
        std::fs::remove_dir_all(&dir)?;
        let refused = open_log(&db, data.path(), &dir, &health).err();
        let Some(StorageError::LogMissing { why, .. }) = &refused else {
            panic!("a used directory without its log opened: {refused:?}");
        };
        assert_eq!(*why, "it recorded creating that log");
        let message = refused.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("vote twice") && message.contains("--join"), "{message}");
        // The empty log directory the refused open left is refused again.
        assert!(open_log(&db, data.path(), &dir, &health).is_err(), "refused once only");
        Ok(())
    }

    #[test]
    fn a_directory_of_an_earlier_build_is_judged_by_its_snapshot() -> anyhow::Result<()> {
        // Its log exists but the record of creating it does not: the first
        // open here records it, so a later loss is refused.
        let data = tempfile::tempdir()?;
        let db = sled::Config::new().path(data.path()).open()?;
        let dir = data.path().join(RAFT_LOG_DIR);
        let health = Arc::new(Health::default());
        drop(open_log(&db, data.path(), &dir, &health)?);
        db.drop_tree(LOG_ISSUED_TREE)?;
        drop(open_log(&db, data.path(), &dir, &health)?);
        assert!(db.open_tree(LOG_ISSUED_TREE)?.contains_key(LOG_ISSUED_KEY)?, "recorded");

        // No record, no log, but a snapshot file: used all the same.
        db.drop_tree(LOG_ISSUED_TREE)?;
        std::fs::remove_dir_all(&dir)?;
        std::fs::write(data.path().join(SNAPSHOT_FILE), b"a snapshot")?;
        let refused = open_log(&db, data.path(), &dir, &health).err();
        assert!(
            matches!(refused, Some(StorageError::LogMissing { why: "it holds a snapshot", .. })),
            "{refused:?}"
        );
        Ok(())
    }

    #[test]
    fn a_new_log_is_marked_and_a_newer_layout_refused() -> anyhow::Result<()> {
        let data = tempfile::tempdir()?;
        let db = sled::Config::new().path(data.path()).open()?;
        let dir = data.path().join(RAFT_LOG_DIR);
        let health = Arc::new(Health::default());
        let mut log = open_log(&db, data.path(), &dir, &health)?;
        assert_eq!(mark(&log, &dir)?, Some(LogFormat { version: 1, migrated_entries: None }));

        let newer = LogFormat { version: LOG_FORMAT_VERSION + 1, migrated_entries: None };
        log.save_user_data(Some(Stored(newer)))?;
        sync(&mut log, &dir, &health, "test")?;
        drop(log);
        let refused = open_log(&db, data.path(), &dir, &health).err();
        assert!(matches!(refused, Some(StorageError::LogFormat { found: 2, .. })), "{refused:?}");
        Ok(())
    }
}
