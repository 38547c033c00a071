//! The storage crate's error type. Every failure names what was being done
//! and, for a bad record, the tree and key that hold it, so an operator can
//! find the damage with nothing but the message.
//!
//! Display strings never repeat their cause: the cause is reachable through
//! [`std::error::Error::source`] (openraft's `AnyError` keeps that chain when
//! the error crosses into Raft).

use std::path::PathBuf;

/// What went wrong in the stores (the raft log, sled, the snapshot file).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}")]
    CreateDir {
        /// The directory asked for.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A file the stores keep beside sled's (the snapshot) or one of
    /// sled's blob files could not be read, written or synced.
    #[error("cannot {what} {path}")]
    Io {
        /// What was being done: "write", "fsync", "rename", ...
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The raft log (raft-log's write-ahead log) failed an operation: an
    /// I/O error (a full disk, a failed fsync), a damaged record found on
    /// open, or a write it refused (a vote or log id going backwards).
    #[error("raft log in {path}: cannot {what}")]
    Log {
        /// What was being done: "append", "save the vote", "open", ...
        what: &'static str,
        /// The raft log's directory.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The raft log's writer failed earlier and has stopped: raft-log does
    /// not resume after a failed write or fsync, so nothing more is
    /// written until the node restarts (which reopens the log and drops an
    /// incomplete tail record).
    #[error("raft log in {path} stopped after a failed write ({first}); restart the node")]
    LogStopped {
        /// The raft log's directory.
        path: PathBuf,
        /// The first failure, as reported then.
        first: String,
    },
    /// A panic while the raft log was locked: its memory may be half
    /// changed, so it is not used again.
    #[error("raft log lock poisoned by a panic")]
    LogPoisoned,
    /// The raft log was written by a build with a newer layout.
    #[error("raft log in {path} has layout version {found}; this build reads {supported}")]
    LogFormat {
        /// The raft log's directory.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version this build writes and reads.
        supported: u32,
    },
    /// The data directory was used (its raft log was created, or it holds a
    /// snapshot) but its raft log is gone or empty: starting on a new, empty
    /// log would forget the node's vote and let it vote twice in a term.
    #[error(
        "data directory {path}: the raft log in {log} is missing or empty, but this directory \
         was used before ({why}): a node started on a new log would forget its vote and \
         could vote twice in one term. Restore the whole data directory from its backup, or \
         replace the node as after a lost disk: `leasehold cluster remove ID` on a live node, \
         delete this data directory, and start the node again with --join \
         (docs/operations.md, \"Removing and replacing nodes\")"
    )]
    LogMissing {
        /// The data directory.
        path: PathBuf,
        /// The raft log's directory.
        log: PathBuf,
        /// What shows the directory was used.
        why: &'static str,
    },
    /// The log is purged past the state the snapshot on disk holds: the
    /// entries between are gone from both. openraft 0.9 purges the log a
    /// received snapshot covers without waiting for the snapshot to be
    /// written, so a crash while one was installed leaves this. The node
    /// cannot rebuild its state; it must be wiped and join again.
    #[error(
        "data directory {path}: the raft log is purged up to entry {purged}, but the snapshot \
         on disk ends at entry {snapshot}, so the entries between are lost (the node stopped \
         while it installed a snapshot from the leader). Replace the node as after a lost \
         disk: `leasehold cluster remove ID` on a live node, delete this data directory, and \
         start the node again with --join (docs/operations.md, \"Removing and replacing \
         nodes\")"
    )]
    PurgedPastSnapshot {
        /// The data directory.
        path: PathBuf,
        /// The last purged log index.
        purged: u64,
        /// The last log index the snapshot on disk covers (0: none).
        snapshot: u64,
    },
    /// A snapshot build lost its view of the state half way (a snapshot
    /// was installed meanwhile, or another build started); nothing was
    /// replaced. openraft 0.9 treats any build error as fatal and stops
    /// Raft, so this must not happen: a build holds the snapshot write lock
    /// for its whole write, and an install and a digest wait for it. It is
    /// an error, not a panic, so that a bug here stops the node cleanly.
    #[error("snapshot build interrupted")]
    SnapshotInterrupted(#[from] leasehold_core::state::FrozenViewLost),
    /// sled reported an IO or internal error.
    #[error("sled operation failed")]
    Sled(#[from] sled::Error),
    /// A value could not be encoded (a bug: every stored type is plain serde).
    #[error("cannot encode {what}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's complaint.
        #[source]
        source: bincode::Error,
    },
    /// A stored record does not decode: the disk holds bytes we never wrote.
    #[error("corrupt record in tree `{tree}` under key {key}")]
    Corrupt {
        /// The sled tree.
        tree: &'static str,
        /// The key, in readable form (a log index, or a meta key name).
        key: String,
        /// The decoder's complaint.
        #[source]
        source: bincode::Error,
    },
    /// A stored record decodes but contradicts where it is stored or what
    /// stands next to it (an entry under another index's key, a snapshot
    /// whose body disagrees with its meta).
    #[error("inconsistent record in tree `{tree}` under key {key}: {detail}")]
    Inconsistent {
        /// The sled tree.
        tree: &'static str,
        /// The key, in readable form.
        key: String,
        /// What disagrees with what.
        detail: String,
    },
    /// An entry arrived for apply at or below the last applied index: applying
    /// it would run a command twice, so the store refuses.
    #[error("entry {index} is not after the last applied entry {last_applied}")]
    ApplyOutOfOrder {
        /// Index of the refused entry.
        index: u64,
        /// Index of the last applied entry.
        last_applied: u64,
    },
    /// A previous apply panicked while holding the state lock, so the state
    /// may be half-changed; nothing more is applied on top of it.
    #[error("state machine lock poisoned by a panic during apply")]
    Poisoned,
    /// The readiness probe read back something other than what it wrote.
    #[error("probe read back {found:?}, wrote {wrote:?}")]
    ProbeMismatch {
        /// Bytes written.
        wrote: Vec<u8>,
        /// Bytes read back (`None`: the record vanished).
        found: Option<Vec<u8>>,
    },
    /// The test failpoint is on: the store behaves as if the disk failed.
    #[error("injected storage fault (failpoint on)")]
    Fault,
}
