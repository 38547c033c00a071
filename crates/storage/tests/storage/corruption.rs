//! Goal: a damaged record is reported as an error naming where it is, never
//! skipped or replaced by a default. Method: write bytes directly into the
//! sled trees under the stores' keys, then read through the openraft traits.

use leasehold_storage::layout::{LOG_TREE, META_TREE, VOTE_KEY, log_key};
use openraft::RaftLogReader;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};

use crate::support::{blank, enqueue};

#[tokio::test]
async fn a_corrupt_log_record_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = sled::Config::new().path(dir.path()).open()?;
    let (mut log_store, _state_machine) = leasehold_storage::open_db(db.clone(), dir.path())?;
    log_store
        .blocking_append([blank(1, 0), enqueue(1, 1, 1), enqueue(1, 2, 1), enqueue(1, 3, 1)])
        .await?;
    let logs = db.open_tree(LOG_TREE)?;

    // --- garbage under index 2
    logs.insert(log_key(2), &b"not an entry"[..])?;
    let error = log_store
        .try_get_log_entries(0..4)
        .await
        .expect_err("a corrupt entry in range must fail the read");
    assert!(error.to_string().contains("under key 2"), "{error}");
    assert!(log_store.try_get_log_entries(2..3).await.is_err());
    assert!(log_store.limited_get_log_entries(1, 4).await.is_err());
    assert_eq!(log_store.try_get_log_entries(0..2).await?.len(), 2);

    // --- a valid entry stored under the wrong index
    let entry_3 = logs.get(log_key(3))?.ok_or_else(|| anyhow::anyhow!("entry 3 missing"))?;
    logs.insert(log_key(2), entry_3)?;
    let error = log_store
        .try_get_log_entries(2..3)
        .await
        .expect_err("a misplaced entry must fail the read");
    assert!(error.to_string().contains("holds the entry of index 3"), "{error}");

    // --- the last entry damaged: the log state cannot be known
    logs.insert(log_key(3), &b"\xff"[..])?;
    assert!(log_store.get_log_state().await.is_err());
    Ok(())
}

#[tokio::test]
async fn a_corrupt_vote_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = sled::Config::new().path(dir.path()).open()?;
    let (mut log_store, _state_machine) = leasehold_storage::open_db(db.clone(), dir.path())?;
    db.open_tree(META_TREE)?.insert(VOTE_KEY, &b"??"[..])?;
    let error = log_store.read_vote().await.expect_err("a corrupt vote must not read as no vote");
    assert!(error.to_string().contains("under key vote"), "{error}");
    Ok(())
}
