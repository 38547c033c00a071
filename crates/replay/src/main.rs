//! `leasehold-replay --data DIR`: replays the committed Raft log of a
//! stopped node's data directory, from its first entry, through this build's
//! state machine (the storage crate's apply, on a scratch store), and prints
//! one JSON line: the applied index, the state digest, and the limits this
//! build has compiled in.
//!
//! It is how two builds are compared on one journal: a node of one build
//! writes the log, this tool built with other limits (`--features
//! older-build`) replays it, and the digests must be equal — the log's
//! entries carry the limits their leader judged them by, so no replica
//! re-judges them by its own (docs/decisions.md, "Replicas across
//! versions"). The directory is only read (except that a data directory
//! of a version that kept the Raft log in sled is migrated on open, as the
//! node would); stop the node first (sled and the raft log hold locks on
//! it while the node runs).

use std::path::PathBuf;

use anyhow::{Context, bail};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftStateMachine};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let data = match (args.next().as_deref(), args.next(), args.next()) {
        (Some("--data"), Some(dir), None) => PathBuf::from(dir),
        _ => bail!("usage: leasehold-replay --data DIR (a stopped node's data directory)"),
    };
    if !data.join("db").is_file() {
        bail!("--data {}: no node data there (no `db` file)", data.display());
    }
    let (mut log, _) = leasehold_storage::open(&data).with_context(|| {
        format!("--data {}: cannot open (is the node stopped?)", data.display())
    })?;
    let state = log.get_log_state().await?;
    if let Some(purged) = state.last_purged_log_id {
        bail!(
            "--data {}: the log was purged up to index {} after a snapshot; a replay needs it whole",
            data.display(),
            purged.index
        );
    }
    let Some(committed) = log.read_committed().await? else {
        bail!("--data {}: nothing committed", data.display());
    };
    let scratch = tempfile::tempdir()?;
    let (_, mut replica) = leasehold_storage::open(scratch.path())?;
    let mut next = 0;
    while next <= committed.index {
        let entries = log.try_get_log_entries(next..=committed.index).await?;
        let Some(last) = entries.last() else { break };
        next = last.log_id.index + 1;
        replica.apply(entries).await?;
    }
    let limits = leasehold_core::Limits::default();
    let line = serde_json::json!({
        "applied_index": replica.last_applied_index(),
        "digest": replica.digest(),
        "max_payload_bytes": limits.max_payload_bytes,
        "max_text_bytes": limits.max_text_bytes,
    });
    println!("{line}");
    Ok(())
}
