//! Entries, log ids and helpers shared by the test modules.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_core::{Command, JobSpec, Proposal};
use leasehold_raft::{NodeId, TypeConfig};
use leasehold_storage::{LogStore, StateMachineStore, StorageError};
use openraft::{Entry, EntryPayload, LogId};

/// The leader every test entry claims to come from.
pub const LEADER: NodeId = 1;

/// A log id of `LEADER` at `term` and `index`.
pub fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    openraft::testing::log_id(term, LEADER, index)
}

/// A blank entry (what a new leader appends first).
pub fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry { log_id: log_id(term, index), payload: EntryPayload::Blank }
}

/// A membership entry making `voters` the voters.
pub fn membership(term: u64, index: u64, voters: &[NodeId]) -> Entry<TypeConfig> {
    let voters: BTreeSet<NodeId> = voters.iter().copied().collect();
    openraft::testing::membership_ent::<TypeConfig>(term, LEADER, index, vec![voters])
}

/// An entry carrying an Enqueue of `jobs` default jobs into queue `q`.
pub fn enqueue(term: u64, index: u64, jobs: usize) -> Entry<TypeConfig> {
    let spec = JobSpec {
        queue: "q".into(),
        payload: format!("payload of entry {index}").into_bytes(),
        ..Default::default()
    };
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Proposal {
            now_ms: 1_000 * index,
            command: Command::Enqueue { jobs: vec![spec; jobs] },
        }),
    }
}

/// Opens the stores at `path`, retrying for a bounded time: a database just
/// dropped by this process may still be closing (sled's flusher thread holds
/// the file lock until it has joined).
pub fn reopen(path: &Path) -> Result<(LogStore, StateMachineStore), StorageError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match leasehold_storage::open(path) {
            Ok(stores) => return Ok(stores),
            Err(error) if Instant::now() < deadline => {
                eprintln!("database not reopened yet ({error}), retrying");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => return Err(error),
        }
    }
}
