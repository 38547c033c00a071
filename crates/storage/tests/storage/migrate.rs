//! Goal: a data directory written by the version that kept the Raft log in
//! sled opens with its log, vote, committed and purge mark intact, in the
//! raft log, and the migration runs once. Method: write the old sled trees
//! directly, as the old store did (layout keys, plain bincode), open, and
//! compare; then put an old record back (a crash between marking the new
//! log complete and clearing sled) and check a reopen only clears it.

use std::path::Path;

use leasehold_storage::layout::{
    COMMITTED_KEY, LAST_PURGED_KEY, LOG_TREE, META_TREE, RAFT_LOG_DIR, VOTE_KEY, log_key,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{LogState, RaftLogReader, Vote};

use crate::support::{LEADER, blank, enqueue, log_id, membership, reopen};

fn old_entries() -> Vec<openraft::Entry<leasehold_raft::TypeConfig>> {
    let mut entries = vec![membership(1, 0, &[1]), blank(1, 1), enqueue(1, 2, 2)];
    entries.extend((3..=9).map(|index| enqueue(2, index, 1)));
    entries
}

/// Writes `entries` and the meta records the way the sled log store did.
fn write_old_layout(
    dir: &Path,
    entries: &[openraft::Entry<leasehold_raft::TypeConfig>],
) -> anyhow::Result<()> {
    let db = sled::Config::new().path(dir).open()?;
    let logs = db.open_tree(LOG_TREE)?;
    for entry in entries {
        logs.insert(log_key(entry.log_id.index), bincode::serialize(entry)?)?;
    }
    let meta = db.open_tree(META_TREE)?;
    meta.insert(VOTE_KEY, bincode::serialize(&Vote::new_committed(2, LEADER))?)?;
    meta.insert(COMMITTED_KEY, bincode::serialize(&log_id(2, 7))?)?;
    meta.insert(LAST_PURGED_KEY, bincode::serialize(&log_id(1, 1))?)?;
    db.flush()?;
    Ok(())
}

fn old_trees_len(dir: &Path) -> anyhow::Result<(usize, usize)> {
    let db = sled::Config::new().path(dir).open()?;
    Ok((db.open_tree(LOG_TREE)?.len(), db.open_tree(META_TREE)?.len()))
}

#[tokio::test]
async fn a_sled_log_is_migrated_once_and_completely() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The old store wrote the purge mark before it removed what it covers:
    // entry 1 is still there under the mark of (1, 1), and must not return.
    write_old_layout(dir.path(), &old_entries()[1..])?;
    assert!(!dir.path().join(RAFT_LOG_DIR).exists());

    // --- open: everything after the mark, the vote and committed, in the raft log
    {
        let (mut log_store, _state_machine) = reopen(dir.path())?;
        assert_eq!(
            log_store.get_log_state().await?,
            LogState { last_purged_log_id: Some(log_id(1, 1)), last_log_id: Some(log_id(2, 9)) }
        );
        assert_eq!(log_store.try_get_log_entries(..).await?, old_entries()[2..].to_vec());
        // Read back uncommitted: a restarted node does not lead its old term.
        assert_eq!(log_store.read_vote().await?, Some(Vote::new(2, LEADER)));
        assert_eq!(log_store.read_committed().await?, Some(log_id(2, 7)));
        // --- the new log takes writes where the old one stopped
        log_store.blocking_append([blank(3, 10)]).await?;
    }
    assert!(dir.path().join(RAFT_LOG_DIR).is_dir());
    assert_eq!(old_trees_len(dir.path())?, (0, 0), "sled's old trees are cleared");

    // --- a crash after the mark but before sled was cleared: put a record back
    write_old_layout(dir.path(), &[enqueue(9, 50, 1)])?;
    let (mut log_store, _state_machine) = reopen(dir.path())?;
    let mut expected = old_entries()[2..].to_vec();
    expected.push(blank(3, 10));
    assert_eq!(log_store.try_get_log_entries(..).await?, expected, "not migrated a second time");
    assert_eq!(log_store.read_committed().await?, Some(log_id(2, 7)));
    drop((log_store, _state_machine));
    assert_eq!(old_trees_len(dir.path())?, (0, 0), "the leftover trees are cleared");
    Ok(())
}

#[tokio::test]
async fn a_data_dir_holding_only_an_old_vote_migrates_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let db = sled::Config::new().path(dir.path()).open()?;
        db.open_tree(META_TREE)?.insert(VOTE_KEY, bincode::serialize(&Vote::new(4, LEADER))?)?;
        db.flush()?;
    }
    let (mut log_store, _state_machine) = reopen(dir.path())?;
    assert_eq!(log_store.read_vote().await?, Some(Vote::new(4, LEADER)));
    assert_eq!(log_store.get_log_state().await?, LogState::default());
    Ok(())
}
